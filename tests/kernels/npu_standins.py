"""Stand-ins for torch_npu and MindIE SD, for CONTRACT tests (no Ascend device exists here).

These are not hardware and prove nothing about kernels' speed or exact numerics. They encode what
the primary sources document, so that a provider that calls an op outside its contract fails here:

Schemas, the docs' dtype rules and SoC lists, the SoC enum and the ``torch_npu.npu`` signatures are
generated from the wheels users install: ``tools/npu_wheels.py`` reads them out of torch_npu
2.10.0.post6 / 2.14.0 and MindIE SD 3.1.0 into ``npu_contracts.json``, which this module loads.

- `StandInTorchNpu`: each op is an ``OpOverloadPacket``-like callable carrying the schema of the
  torch_npu wheel it stands for (verbatim from its ``libtorch_npu.so``), rejecting keywords the
  schema lacks, as the real packet does; ``torch_npu.npu.<fn>`` binds its arguments to the wheel's
  Python signature. It mirrors the dispatch of op-plugin's C++ (``op_api`` aclnn path only with jit
  compile off and the aclnn symbol present; SoC gates), enforces each path's documented dtype/shape
  contract (the wheel's doc: ``npu_rms_norm`` gamma in x's dtype, ``npu_rotary_mul`` and
  ``npu_swiglu`` on the SoC families their docs list, ``acl_op`` ``npu_rotary_mul`` accepting only "half") and
  reproduces documented behaviour that changes numerics (op_api ``npu_rotary_mul`` casts mixed
  r1/r2 to self's dtype). Results are computed in fp32 from the inputs and returned in the
  documented dtype. Every call is recorded.
- `mindiesd_standin`: registers ``mindiesd::adaln`` with MindIE SD 3.1.0's exact schema (from its
  ``libPTAExtensionOPS.so``) and a CPU kernel that enforces aclnnAdaLayerNorm's contract
  (hicann ops-nn ``norm/ada_layer_norm``: one dtype, scale/shift [B.., H] or [B.., 1, H]).
- `KernelCounter`: a ``TorchDispatchMode`` counting device-op calls: stand-in kernel calls plus
  aten ops dispatched outside them (views excluded: they launch nothing).
- Attention: ``npu::npu_fused_infer_attention_score`` (FIA, and ``_v2``) and
  ``npu::npu_fusion_attention`` registered as ``torch.library`` ops with torch_npu's schemas
  (`FIA_SCHEMAS`, `FUSION_ATTENTION_SCHEMA`) and fake impls, so compiled graphs hold them as the
  real ones do; their CPU kernels enforce the documented contract (BSND, fp16/bf16 for FIA,
  True = masked out, mask and pse_shift shapes, GQA rules, contiguity) and compute the documented
  result in fp32, including FIA's ``softmax_lse`` (fp32 ``(B, N, S, 1)``). `StandInTorchNpu`
  exposes them as ``torch_npu.<op>`` (the ``OpOverloadPacket``), as torch_npu does.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import inspect
import json
import re
import sys
import types
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ..compilation.graph_standins import check_aclop

__all__ = [
    "A2_SOC",
    "A3_SOC",
    "CONTRACTS",
    "FIA_SCHEMAS",
    "FUSION_ATTENTION_SCHEMA",
    "KernelCounter",
    "MINDIESD",
    "SCHEMAS",
    "StandInTorchNpu",
    "WHEELS",
    "api_signature",
    "documented_families",
    "install_torch_npu",
    "mindiesd_standin",
    "npu_attention_ops",
    "soc_family",
]

# Generated from the wheels (tools/npu_wheels.py -> npu_contracts.json): schemas, docs, SoC enum.
CONTRACTS = json.loads((Path(__file__).with_name("npu_contracts.json")).read_text(encoding="utf-8"))
WHEELS: tuple[str, ...] = tuple(CONTRACTS["torch_npu"])  # the torch_npu releases we bind against
NEWEST = max(WHEELS, key=lambda v: tuple(int(p) for p in re.findall(r"\d+", v)))
MINDIESD = CONTRACTS["mindiesd"]["3.1.0"]
_SOCS = CONTRACTS["torch_npu"][NEWEST]["soc_versions"]
SOC_NAMES = {v: k for k, v in _SOCS.items()}
A2_SOC = _SOCS["Ascend910B2"]
A3_SOC = _SOCS["Ascend910_9391"]
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def soc_family(soc: int, wheel: str = NEWEST) -> str:
    """The SoC family the wheel's docs name (``A2``, ``A3``, ``A5``, ``910``, ``310P``, ``310B``): A2/A3/A5 by
    the wheel's own SocVersion ranges, the older parts by their enum names."""
    contract = CONTRACTS["torch_npu"][wheel]
    for fam, (lo, hi) in ((k, v) for k, v in contract["soc_families"].items() if k != "source"):
        if soc >= lo and (hi is None or soc < hi):
            return fam
    name = {v: k for k, v in contract["soc_versions"].items()}.get(soc, "")
    for prefix, fam in (("Ascend310P", "310P"), ("Ascend310B", "310B"), ("Ascend910", "910")):
        if name.startswith(prefix):
            return fam
    return "unknown"


def documented_families(op: str, scenario: str = "*", wheel: str = NEWEST) -> list | None:
    """SoC families the wheel's doc of ``op`` lists (for a jit_compile scenario where it splits them);
    None when the doc names no product."""
    products = CONTRACTS["torch_npu"][wheel]["docs"].get(op, {}).get("products", {})
    return products.get(scenario, products.get("*"))


def gamma_must_match(wheel: str = NEWEST) -> bool:
    """npu_rms_norm's doc: "gamma: dtype must equal self's" (数据类型需要和self保持一致)."""
    return "保持一致" in CONTRACTS["torch_npu"][wheel]["docs"]["npu_rms_norm"]["params"]["gamma"]


def api_signature(name: str, wheel: str = NEWEST) -> inspect.Signature:
    """``torch_npu.npu.<name>``'s signature in ``wheel``, rebuilt from its source text (a class: its
    ``__init__`` without self)."""
    api = CONTRACTS["torch_npu"][wheel]["python_api"][name]
    namespace: dict = {}
    exec(f"def {name}{api['signature']}: pass", {}, namespace)  # noqa: S102  (text from the wheel's own def)
    return inspect.signature(namespace[name])


_OURS = ("npu_rms_norm", "npu_add_rms_norm", "npu_rotary_mul", "npu_gelu", "npu_fast_gelu", "npu_swiglu")
# Schemas per torch_npu wheel, verbatim from its libtorch_npu.so. Two older op-plugin schemas of
# npu_rotary_mul (op_plugin_functions.yaml of the 6.0.0 / 7.0.0 branches; no wheel of the supported
# range ships them) stay to test that the providers handle a stack without the rotary_mode keyword.
SCHEMAS = {version: {op: CONTRACTS["torch_npu"][version]["schemas"][op] for op in _OURS} for version in WHEELS}
SCHEMAS["6.0.0"] = {**SCHEMAS[NEWEST], "npu_rotary_mul": "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2) -> Tensor"}
SCHEMAS["7.0.0"] = {
    **SCHEMAS[NEWEST],
    "npu_rotary_mul": "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor",
}
ALL_ACLNN = frozenset(
    {"aclnnRmsNorm", "aclnnAddRmsNorm", "aclnnRotaryPositionEmbedding", "aclnnAddcmul", "aclnnSwiGlu"}
)


class _Packet:
    """``torch.ops.npu.<op>``-like: ``.default._schema`` and keyword checking against it."""

    def __init__(self, owner: StandInTorchNpu, schema: str, fn):
        self.default = types.SimpleNamespace(_schema=torch._C.parse_schema(schema))
        self._owner, self._fn = owner, fn

    def __call__(self, *args, **kwargs):
        schema = self.default._schema
        names = [a.name for a in schema.arguments]
        kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}
        if len(args) > len(names) - len(kwarg_only):
            raise TypeError(f"{schema.name}() takes {len(names) - len(kwarg_only)} positional arguments")
        bad = [k for k in kwargs if k not in names]
        if bad:
            raise TypeError(f"{schema.name}() got an unexpected keyword argument {bad[0]!r}")
        bound = {a.name: a.default_value for a in schema.arguments}
        bound.update(zip(names, args))
        bound.update(kwargs)
        self._owner.calls.append((schema.name.split("::")[-1], bound))
        with self._owner.inside():
            return self._fn(*(bound[n] for n in names))


class StandInTorchNpu(types.ModuleType):
    """torch_npu as documented, for one (op-plugin release, SoC, compile mode, CANN) combination.

    Args:
        version: the torch_npu wheel whose schemas, docs and Python API it carries (`WHEELS`:
            ``"2.10.0.post6"``, ``"2.14.0"``), or ``"6.0.0"`` / ``"7.0.0"``: the newest wheel with an older
            op-plugin's ``npu_rotary_mul`` schema.
        soc: ``c10_npu::SocVersion`` value (221 = Ascend910B2, 102 = Ascend910A).
        jit_compile: ``torch_npu.npu.set_compile_mode(jit_compile=...)``.
        aclnn: aclnn kernels present in CANN's op-api libraries.
        fp32_gamma: the device takes an fp32 ``npu_rms_norm`` gamma with fp16/bf16 input (the op-plugin
            page says so, the wheels' doc says no: only a device settles it).
    """

    def __init__(
        self,
        version: str = NEWEST,
        soc: int = A2_SOC,
        jit_compile: bool = False,
        aclnn: Iterable[str] = ALL_ACLNN,
        fia: Iterable[str] = ("v1", "v2"),
        fp32_gamma: bool = False,
    ):
        super().__init__("torch_npu")
        self.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
        self.version, self.soc, self.jit, self.aclnn = version, soc, jit_compile, frozenset(aclnn)
        self.fp32_gamma = fp32_gamma
        self.calls: list[tuple[str, dict]] = []
        self.depth = 0
        self.wheel = version if version in WHEELS else NEWEST
        self.family = soc_family(soc, self.wheel)
        self.api_calls: list[tuple[str, dict]] = []  # torch_npu.npu.<fn> calls, bound to the wheel's signature
        impls = dict(
            get_soc_version=lambda: self.soc,
            get_device_name=lambda device_name=None: SOC_NAMES.get(self.soc, f"soc{self.soc}"),
            is_jit_compile_false=lambda: not self.jit,
        )
        self.npu = types.SimpleNamespace(**{name: self._api(name, fn) for name, fn in impls.items()})
        impls = {
            "npu_rms_norm": self._rms_norm,
            "npu_add_rms_norm": self._add_rms_norm,
            "npu_rotary_mul": self._rotary_mul,
            "npu_gelu": self._gelu,
            "npu_fast_gelu": self._fast_gelu,
            "npu_swiglu": self._swiglu,
        }
        for name, schema in SCHEMAS[version].items():
            setattr(self, name, _Packet(self, schema, impls[name]))
        npu_attention_ops(self.wheel)
        self.fia = tuple(fia)
        ops = {"v1": "npu_fused_infer_attention_score", "v2": "npu_fused_infer_attention_score_v2"}
        for v in self.fia:
            setattr(self, ops[v], getattr(torch.ops.npu, ops[v]))
        self.npu_fusion_attention = torch.ops.npu.npu_fusion_attention

    def _api(self, name: str, impl):
        sig = api_signature(name, self.wheel)

        def call(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)  # TypeError where the wheel's function would raise one
            bound.apply_defaults()
            self.api_calls.append((name, dict(bound.arguments)))
            return impl(*bound.args, **bound.kwargs)

        return call

    @contextlib.contextmanager
    def inside(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def _op_api(self, api: str) -> bool:  # torchnpugen dispatch + DO_COMPATIBILITY
        return not self.jit and api in self.aclnn

    def _check_dtype(self, t: torch.Tensor):
        assert t.dtype in _DTYPES, f"dtype {t.dtype} not supported"
        assert t.dtype != torch.bfloat16 or self.soc >= _SOCS["Ascend910B1"], (
            f"bf16 needs SocVersion >= Ascend910B1 ({_SOCS['Ascend910B1']})"
        )

    # -- ops ----------------------------------------------------------------------------------
    def _rms_norm(self, x, gamma, epsilon):
        self._check_dtype(x)
        assert 2 <= x.dim() <= 8 and tuple(gamma.shape) == tuple(x.shape[x.dim() - gamma.dim() :])
        if gamma_must_match(self.wheel) and not self.fp32_gamma:  # the wheel's doc: gamma in self's dtype
            assert gamma.dtype == x.dtype, f"npu_rms_norm: gamma {gamma.dtype} must have self's dtype {x.dtype}"
        else:  # a device found (by probe.rms_norm_fp32_gamma) to take an fp32 gamma too
            assert gamma.dtype in (x.dtype, torch.float32), f"npu_rms_norm: gamma {gamma.dtype} for self {x.dtype}"
        if not self._op_api("aclnnRmsNorm"):
            check_aclop("RmsNorm")
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
        return (xf * rstd * gamma.float()).to(x.dtype), rstd

    def _add_rms_norm(self, x1, x2, gamma, epsilon):
        # The wheels ship a schema and a meta function for it, no doc: (y, rstd, x), y and x in x1's
        # dtype, rstd fp32 over the dims gamma does not cover. One dtype and no broadcasting, as
        # aclnnAddRmsNorm takes them (the rule npu_rms_norm's doc states for gamma, kept here).
        self._check_dtype(x1)
        assert x2.dtype == x1.dtype and gamma.dtype == x1.dtype, (
            f"npu_add_rms_norm: x1 {x1.dtype}, x2 {x2.dtype} and gamma {gamma.dtype} must have one dtype"
        )
        assert x1.shape == x2.shape, f"npu_add_rms_norm: x2 {tuple(x2.shape)} must have x1's shape {tuple(x1.shape)}"
        assert 2 <= x1.dim() <= 8 and tuple(gamma.shape) == tuple(x1.shape[x1.dim() - gamma.dim() :])
        if not self._op_api("aclnnAddRmsNorm"):
            check_aclop("AddRmsNorm")
        xf = x1.float() + x2.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
        return (xf * rstd * gamma.float()).to(x1.dtype), rstd, xf.to(x1.dtype)

    def _rotary_mul(self, x, r1, r2, rotary_mode="half", rotate=None):
        for t in (x, r1, r2):
            self._check_dtype(t)
        assert x.dim() == 4 and r1.dim() == 4 and r2.dim() == 4 and r1.shape == r2.shape
        assert rotary_mode in ("half", "interleave"), "rotary_mode should be half or interleave"
        acl_op = self.soc < _SOCS["Ascend910B1"] or not self._op_api("aclnnRotaryPositionEmbedding")
        scenario = "jit_compile=True" if acl_op else "jit_compile=False"  # the doc's two tables
        assert self.family in documented_families("npu_rotary_mul", scenario, self.wheel), (
            f"npu_rotary_mul ({scenario}) is not documented for {SOC_NAMES.get(self.soc)} ({self.family})"
        )
        if acl_op:
            # acl_op::npu_rotary_mul (RotaryMulKernelNpu.cpp) and the jit_compile=True doc.
            check_aclop("RotaryMul")
            if rotary_mode != "half":
                raise RuntimeError("npu_rotary_mul in aclop only support rotary_mode with half")
            assert x.shape[3] == 128 and r1.dtype == x.dtype, "acl_op RotaryMul: D == 128, one dtype"
        else:
            # op_api: mixed r1/r2 are cast to self's dtype (isRotaryMulMixDtypeSupport).
            r1, r2 = r1.to(x.dtype), r2.to(x.dtype)
            d = x.shape[3]
            assert d % 2 == 0 and d < 896
            if rotary_mode == "interleave":
                assert sum(s != 1 for s in r1.shape[:3]) <= 1, "interleave: r1/r2 must be 11SD / 1S1D / S11D"
        xf = x.float()
        if rotary_mode == "half":
            x1, x2 = torch.chunk(xf, 2, -1)
            rot = torch.cat((-x2, x1), dim=-1)
        else:
            rot = torch.stack((-xf[..., 1::2], xf[..., ::2]), dim=-1).flatten(-2)
        return (r1.float() * xf + r2.float() * rot).to(x.dtype)

    def _gelu(self, x, approximate="none"):
        self._check_dtype(x)
        return F.gelu(x, approximate=approximate)

    def _fast_gelu(self, x):
        self._check_dtype(x)
        xf = x.float()
        return (xf / (1 + torch.exp(-1.702 * xf))).to(x.dtype)  # A2/A3 formula

    def _swiglu(self, x, dim=-1):
        # op_api only (SwigluKernelNpuOpApi.cpp -> aclnnSwiGlu): no acl_op path, so jit_compile
        # does not matter, but the aclnn kernel must exist; the SoCs its doc lists (A2).
        assert "aclnnSwiGlu" in self.aclnn, "aclnnSwiGlu missing from CANN"
        assert self.family in documented_families("npu_swiglu", wheel=self.wheel), (
            f"npu_swiglu is documented for {documented_families('npu_swiglu', wheel=self.wheel)} only, not {self.family}"
        )
        self._check_dtype(x)
        assert 1 <= x.dim() <= 8 and x.numel() > 0, "npu_swiglu: 1-8 dims, not empty"
        assert -x.dim() <= dim < x.dim() and x.shape[dim] % 2 == 0, "npu_swiglu: even size along dim"
        assert x.is_contiguous(), "npu_swiglu: non-contiguous input not supported"
        a, b = x.float().chunk(2, dim)  # A: the first half (gated), B: the second
        return (F.silu(a) * b).to(x.dtype)


def install_torch_npu(monkeypatch, **kw) -> StandInTorchNpu:
    """Puts a `StandInTorchNpu` in ``sys.modules`` and lets the npu providers take CPU tensors
    (undone by ``monkeypatch``); clears the probe caches before and after."""
    from ascend_kernels import npu as npu_providers
    from ascend_kernels.npu import probe

    fake = StandInTorchNpu(**kw)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(npu_providers, "DEVICE_TYPES", ("npu", "cpu"))
    # CANN's op-api libraries do not exist here: answer from the stand-in's set instead of ctypes.
    monkeypatch.setattr(probe, "aclnn_available", lambda api: api in fake.aclnn)
    # What the one-off device probe would find on this (simulated) device: the stand-in's answer.
    monkeypatch.setattr(probe, "rms_norm_fp32_gamma", lambda dtype: fake.fp32_gamma)
    probe.cache_clear()
    return fake


_ADALN_SCHEMA = MINDIESD["schemas"]["adaln"]  # from MindIE SD 3.1.0's libPTAExtensionOPS.so


@contextlib.contextmanager
def mindiesd_standin(calls: list | None = None):
    """Registers ``torch.ops.mindiesd.adaln`` (MindIE SD's schema, a contract-checking CPU kernel)
    and a ``mindiesd`` module in ``sys.modules`` for the duration of the block."""
    calls = [] if calls is None else calls
    lib = torch.library.Library("mindiesd", "DEF")  # noqa: TOR901  (test-only namespace, destroyed below)
    lib.define(_ADALN_SCHEMA)

    def adaln(x, scale, shift, weight=None, bias=None, epsilon=1e-5):
        calls.append(dict(x=x, scale=scale, shift=shift, weight=weight, bias=bias, epsilon=epsilon))
        h, lead = x.shape[-1], tuple(x.shape[:-2])
        assert 2 <= x.dim() <= 8 and x.numel() > 0
        for t in (scale, shift, weight, bias):
            assert t is None or t.dtype == x.dtype, "aclnnAdaLayerNorm: every tensor in x's dtype"
        for t in (scale, shift):
            assert tuple(t.shape) in (lead + (h,), lead + (1, h)), (
                f"scale/shift {tuple(t.shape)} for x {tuple(x.shape)}"
            )
        y = F.layer_norm(
            x.float(), (h,), None if weight is None else weight.float(), None if bias is None else bias.float(), epsilon
        )
        s = scale.float() if scale.dim() == x.dim() else scale.float().unsqueeze(-2)
        b = shift.float() if shift.dim() == x.dim() else shift.float().unsqueeze(-2)
        return (y * (1 + s) + b).to(x.dtype)

    lib.impl("adaln", adaln, "CPU")
    module = types.ModuleType("mindiesd")
    module.__spec__ = importlib.machinery.ModuleSpec("mindiesd", None)
    old = sys.modules.get("mindiesd")
    sys.modules["mindiesd"] = module
    try:
        yield calls
    finally:
        if old is None:
            sys.modules.pop("mindiesd", None)
        else:
            sys.modules["mindiesd"] = old
        # torch 2.10's Library._destroy deletes the cached torch.ops.mindiesd.adaln and then removes
        # its name from the namespace's `_dir`, where a namespace re-created for a second stand-in
        # (torch.ops caches namespaces) no longer lists it: ValueError. Listing it keeps the destroy whole.
        namespace = getattr(torch.ops, "mindiesd", None)
        if namespace is not None and hasattr(namespace, "adaln") and "adaln" not in namespace._dir:
            namespace._dir.append("adaln")
        lib._destroy()


class KernelCounter(TorchDispatchMode):
    """Counts device-op calls: ops dispatched while no stand-in kernel runs (views excluded).

    Each stand-in torch_npu op and each ``mindiesd`` op counts as one call (its own internals are
    the stand-in's emulation, not calls the provider makes).
    """

    def __init__(self, torch_npu: StandInTorchNpu | None = None):
        super().__init__()
        self.torch_npu = torch_npu
        self.ops: list[str] = []
        self._start = 0

    def __enter__(self):
        self._start = len(self.torch_npu.calls) if self.torch_npu is not None else 0
        return super().__enter__()

    def npu_calls(self) -> list[str]:
        return self.torch_npu.names()[self._start :] if self.torch_npu is not None else []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if (self.torch_npu is None or self.torch_npu.depth == 0) and not func.is_view:
            self.ops.append(str(func.overloadpacket._qualified_op_name).replace("::", "."))
        return func(*args, **(kwargs or {}))

    def count(self) -> int:
        return len(self.npu_calls()) + len(self.ops)


# -- attention -----------------------------------------------------------------------------------
# torch_npu's schemas of the attention ops, from the newest wheel's libtorch_npu.so (npu_contracts.json).
FIA_SCHEMAS = {
    v: CONTRACTS["torch_npu"][NEWEST]["schemas"][op]
    for v, op in (("v1", "npu_fused_infer_attention_score"), ("v2", "npu_fused_infer_attention_score_v2"))
}
# What diffusers' "_native_npu" backend calls.
FUSION_ATTENTION_SCHEMA = CONTRACTS["torch_npu"][NEWEST]["schemas"]["npu_fusion_attention"]
_NPU_LIB: dict = {}  # "lib": the Library of the npu:: attention ops, "schemas": the schema strings it defined


def _current() -> StandInTorchNpu | None:
    fake = sys.modules.get("torch_npu")
    return fake if isinstance(fake, StandInTorchNpu) else None


def _record(name: str, bound: dict) -> None:
    fake = _current()
    if fake is not None:
        fake.calls.append((name, bound))


def _undocumented_dead_rows(out, lse):
    """NaN in the output and LSE of a query row its mask leaves no key: neither op's doc says what
    the kernel returns there (FIA's inner_precise only warns that such rows lose precision without
    its "row invalid" correction; npu_fusion_attention forbids them in varlen only), so a caller
    that passes the kernel's value on fails here."""
    dead = lse.isneginf()  # [B, N, S]: every score of the row was -inf
    return out.masked_fill(dead.transpose(1, 2).unsqueeze(-1), float("nan")), lse.masked_fill(dead, float("nan"))


def _bsnd_attention(q, k, v, heads, kv_heads, scale, masked=None, bias=None, kv_len=None):
    """fp32 attention over BSND tensors: (out [B, S, N, D] fp32, lse [B, N, S] fp32)."""
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))  # B, N, S, D
    if kv_heads != heads:  # GQA: query head h reads key/value head h // (heads // kv_heads)
        kf, vf = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (kf, vf))
    scores = qf @ kf.transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias.float()
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    if kv_len is not None:
        keep = torch.arange(scores.shape[-1]) < torch.tensor(list(kv_len)).reshape(-1, 1, 1, 1)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ vf
    return out.transpose(1, 2).contiguous(), lse  # ND format: a contiguous [B, S, N, D]


def _check_fia(
    query, key, value, pse_shift, atten_mask, num_heads, num_key_value_heads, input_layout, actual_seq_lengths
):
    # torch_npu-npu_fused_infer_attention_score.md: parameters and constraints (Q_S > 1 path).
    if input_layout != "BSND":
        raise NotImplementedError(f"the stand-in models input_layout='BSND' only, got {input_layout!r}")
    fake = _current()
    soc = fake.soc if fake is not None else A2_SOC
    for t in (query, key, value):
        assert t.is_contiguous(), "FIA: non-contiguous query/key/value are not supported"
    assert query.dtype in (torch.float16, torch.bfloat16), f"FIA: query dtype {query.dtype} (A2/A3: float16, bfloat16)"
    assert _a2_a3(soc), f"FIA: documented for Atlas A2/A3 only, SoC {soc}"
    assert key.dtype == value.dtype == query.dtype, "FIA: key/value in query's dtype (no quantisation here)"
    assert key.shape == value.shape, "FIA: key and value shapes must be identical"
    b, sq, n, d = query.shape
    _, skv, nkv, _ = key.shape
    assert sq > 1, "the stand-in models the prompt path (Q_S > 1) only"
    assert num_heads == n, "FIA BSND: num_heads must equal query's N"
    kv_heads = nkv if num_key_value_heads == 0 else num_key_value_heads
    assert kv_heads == nkv, "FIA BSND: num_key_value_heads must equal key/value's N"
    assert n % kv_heads == 0 and n // kv_heads <= 64, "FIA GQA: num_heads divisible by num_key_value_heads, ratio <= 64"
    assert b <= 65536 and n <= 256 and d <= 512 and d % 16 == 0, f"FIA limits: B={b} N={n} D={d}"
    assert n * d < 65535, f"FIA BSND: N*D must be < 65535, got {n * d}"
    assert actual_seq_lengths is None or len(actual_seq_lengths) in (1,) or len(actual_seq_lengths) >= b
    masked = None
    if atten_mask is not None:
        assert atten_mask.dtype in (torch.bool, torch.int8, torch.uint8), f"FIA atten_mask dtype {atten_mask.dtype}"
        assert atten_mask.is_contiguous()
        allowed = _fia_shapes(FIA_MASK_SHAPES, b, n, sq, skv)
        assert tuple(atten_mask.shape) in allowed, (
            f"FIA atten_mask shape {tuple(atten_mask.shape)} not in {sorted(allowed)}"
        )
        masked = atten_mask.bool().reshape((1,) * (4 - atten_mask.dim()) + tuple(atten_mask.shape))  # True = masked out
    if pse_shift is not None:
        assert pse_shift.dtype == query.dtype, "FIA pse_shift: query's dtype"
        allowed = _fia_shapes(FIA_PSE_SHAPES, b, n, sq, skv)
        assert tuple(pse_shift.shape) in allowed, (
            f"FIA pse_shift shape {tuple(pse_shift.shape)} not in {sorted(allowed)}"
        )
    return kv_heads, masked


# FIA's mask shapes for Q_S > 1. The wheels' doc (_op_plugin_docs.py) names none; op-plugin's
# docs/context/torch_npu-npu_fused_infer_attention_score.md (Ascend/op-plugin 0adf450) does:
# atten_mask "Q_S不为1时建议shape输入(Q_S, KV_S)、(B, Q_S, KV_S)、(1, Q_S, KV_S)、(B, 1, Q_S, KV_S)、
# (1, 1, Q_S, KV_S)" (no head dimension), pse_shift "(B, N, Q_S, KV_S)或(1, N, Q_S, KV_S)".
FIA_MASK_SHAPES = ("Q_S,KV_S", "B,Q_S,KV_S", "1,Q_S,KV_S", "B,1,Q_S,KV_S", "1,1,Q_S,KV_S")
FIA_PSE_SHAPES = ("B,N,Q_S,KV_S", "1,N,Q_S,KV_S")


def _fia_shapes(names: tuple, b: int, n: int, sq: int, skv: int) -> set:
    sizes = {"B": b, "N": n, "Q_S": sq, "KV_S": skv, "1": 1}
    return {tuple(sizes[d] for d in name.split(",")) for name in names}


def fusion_attention_mask_shapes(wheel: str = NEWEST) -> tuple[str, ...]:
    """npu_fusion_attention's atten_mask shapes as the wheel's doc names them ("输入shape类型支持BNSS格式、
    B1SS格式、11SS格式、SS格式"): ``("BNSS", "B1SS", "11SS", "SS")``."""
    text = CONTRACTS["torch_npu"][wheel]["docs"]["npu_fusion_attention"]["params"]["atten_mask"]
    shapes = tuple(dict.fromkeys(re.findall(r"([BN1S]+)格式", text)))
    assert shapes, f"no atten_mask shapes in the {wheel} doc of npu_fusion_attention: {text!r}"
    return shapes


def _fusion_attention_shapes(bsz: int, n: int, sq: int, skv: int) -> set:
    """The documented layouts as shapes: B, N, 1 as named; the first S is the query's, the second the key's."""
    fake = _current()
    shapes = set()
    for name in fusion_attention_mask_shapes(fake.wheel if fake is not None else NEWEST):
        seqs = iter((sq, skv))
        shapes.add(tuple({"B": bsz, "N": n, "1": 1}[c] if c != "S" else next(seqs) for c in name))
    return shapes


def _bound(name: str, args: tuple, kw: dict) -> dict:
    """The call's arguments by name, defaults from the op's schema filled in (the dispatcher passes
    a Python kernel only the keyword arguments the caller gave)."""
    schema = getattr(torch.ops.npu, name).default._schema
    bound = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    bound.update(zip([a.name for a in schema.arguments], args))
    bound.update(kw)
    return bound


def _fia_v1(*args, **kw):
    b = _bound("npu_fused_infer_attention_score", args, kw)
    return _fia_impl(
        "npu_fused_infer_attention_score",
        b["query"],
        b["key"],
        b["value"],
        b["pse_shift"],
        b["atten_mask"],
        b["actual_seq_lengths"],
        b["actual_seq_lengths_kv"],
        b["num_heads"],
        b["scale"],
        b["input_layout"],
        b["num_key_value_heads"],
        b["softmax_lse_flag"],
        b,
    )


def _fia_v2(*args, **kw):
    b = _bound("npu_fused_infer_attention_score_v2", args, kw)
    return _fia_impl(
        "npu_fused_infer_attention_score_v2",
        b["query"],
        b["key"],
        b["value"],
        b["pse_shift"],
        b["atten_mask"],
        b["actual_seq_qlen"],
        b["actual_seq_kvlen"],
        b["num_query_heads"],
        b["softmax_scale"],
        b["input_layout"],
        b["num_key_value_heads"],
        b["return_softmax_lse"],
        b,
    )


def _fia_impl(
    name, query, key, value, pse_shift, atten_mask, seq, seq_kv, heads, scale, layout, kv_heads, lse_flag, bound
):
    _record(name, bound)
    kv_heads, masked = _check_fia(query, key, value, pse_shift, atten_mask, heads, kv_heads, layout, seq)
    out, lse = _bsnd_attention(query, key, value, heads, kv_heads, scale, masked, pse_shift, seq_kv)
    out, lse = _undocumented_dead_rows(out, lse)
    lse = lse.unsqueeze(-1) if lse_flag else torch.zeros(1)  # (B, N, S, 1) fp32; [1] of 0 when not asked
    return out.to(query.dtype), lse


def _fia_fake(query, key, value, *args, **kw):
    flag = kw.get("softmax_lse_flag", kw.get("return_softmax_lse", False))
    b, s, n, _ = query.shape
    return torch.empty_like(query), query.new_empty((b, n, s, 1) if flag else (1,), dtype=torch.float32)


def _a2_a3(soc: int) -> bool:
    return 220 <= soc < 240 or 250 <= soc < 260


def _fusion_attention(*args, **kw):
    # The wheel's npu_fusion_attention doc: BSND here; q/k/v float16/bfloat16/float32, one dtype,
    # key.shape == value.shape, D 1~768, Nq 1~256 with Nq/Nkv an integer; atten_mask bool/uint8,
    # True (1) = masked out, shaped BNSS/B1SS/11SS/SS; sparse_mode 0 with a mask keeps only the band
    # pre_tockens/next_tockens around the diagonal; keep_prob 1 = no dropout; Atlas A2.
    b = _bound("npu_fusion_attention", args, kw)
    _record("npu_fusion_attention", b)
    query, key, value, head_num = b["query"], b["key"], b["value"], b["head_num"]
    fake = _current()
    assert _a2_a3(fake.soc if fake is not None else A2_SOC), "npu_fusion_attention: Atlas A2"
    assert b["input_layout"] == "BSND" and head_num == query.shape[2] and b["keep_prob"] == 1.0
    assert query.dtype in _DTYPES and key.dtype == value.dtype == query.dtype, "one of float16/bfloat16/float32"
    assert key.shape == value.shape and query.shape[3] == key.shape[3] and 1 <= query.shape[3] <= 768
    bsz, sq, n, _ = query.shape
    skv, nkv = key.shape[1], key.shape[2]
    assert n <= 256 and n % nkv == 0, f"npu_fusion_attention: Nq={n} over Nkv={nkv}"
    assert b["sparse_mode"] == 0, "the stand-in models sparse_mode=0 only"
    mask = b["atten_mask"]
    masked = None
    if mask is not None:
        assert mask.dtype in (torch.bool, torch.uint8), (
            f"npu_fusion_attention atten_mask dtype {mask.dtype} (bool/uint8)"
        )
        allowed = _fusion_attention_shapes(bsz, n, sq, skv)  # the wheel's doc: BNSS, B1SS, 11SS, SS
        assert tuple(mask.shape) in allowed, (
            f"npu_fusion_attention atten_mask shape {tuple(mask.shape)} not in {sorted(allowed)}"
        )
        masked = mask.bool().reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        i, j = torch.arange(sq).reshape(-1, 1), torch.arange(skv)
        masked = masked | (i - j > b["pre_tockens"]) | (j - i > b["next_tockens"])
    out, _ = _undocumented_dead_rows(*_bsnd_attention(query, key, value, head_num, nkv, b["scale"], masked))
    z = query.new_zeros(1, dtype=torch.float32)
    return out.to(query.dtype), z, z.clone(), z.clone(), 0, 0, 0


def _fusion_attention_fake(query, *args, **kw):
    z = query.new_empty(1, dtype=torch.float32)
    return torch.empty_like(query), z, z.clone(), z.clone(), 0, 0, 0


def npu_attention_ops(wheel: str = NEWEST) -> None:
    """Defines ``npu::npu_fused_infer_attention_score`` (+ ``_v2``) and ``npu::npu_fusion_attention``
    with ``wheel``'s schemas (CPU kernels of the documented semantics, fake impls); once per process
    and set of schema strings: a wheel whose schemas differ from those defined replaces them."""
    schemas = {op: CONTRACTS["torch_npu"][wheel]["schemas"][op] for op in _ATTENTION_IMPLS}
    if _NPU_LIB.get("schemas") == schemas:
        return
    if _NPU_LIB:
        namespace = torch.ops.npu
        for op in _ATTENTION_IMPLS:  # torch 2.10's _destroy removes each name from the namespace's _dir
            if hasattr(namespace, op) and op not in namespace._dir:
                namespace._dir.append(op)
        _NPU_LIB.pop("lib")._destroy()
    lib = torch.library.Library("npu", "FRAGMENT")  # noqa: TOR901  (test-only stand-in of torch_npu's namespace)
    for op, (impl, fake) in _ATTENTION_IMPLS.items():
        lib.define(schemas[op])
        lib.impl(op, impl, "CPU")
        torch.library.register_fake(f"npu::{op}", fake, lib=lib)
    _NPU_LIB.update(lib=lib, schemas=schemas)


_ATTENTION_IMPLS = {
    "npu_fused_infer_attention_score": (_fia_v1, _fia_fake),
    "npu_fused_infer_attention_score_v2": (_fia_v2, _fia_fake),
    "npu_fusion_attention": (_fusion_attention, _fusion_attention_fake),
}
