"""Stand-ins for torch_npu and MindIE SD, for CONTRACT tests (no Ascend device exists here).

These are not hardware and prove nothing about kernels' speed or exact numerics. They encode what
the primary sources document, so that a provider that calls an op outside its contract fails here:

- `StandInTorchNpu`: each op is an ``OpOverloadPacket``-like callable carrying the schema of the
  op-plugin release it stands for (verbatim from ``op_plugin/config/op_plugin_functions.yaml`` of
  that branch), rejecting keywords the schema lacks, as the real packet does. It mirrors the
  dispatch of op-plugin's C++ (``op_api`` aclnn path only with jit compile off and the aclnn
  symbol present; SoC gates), enforces each path's documented dtype/shape contract (e.g. the
  ``npu_rms_norm`` A2/A3 gamma table, ``acl_op`` ``npu_rotary_mul`` accepting only "half") and
  reproduces documented behaviour that changes numerics (op_api ``npu_rotary_mul`` casts mixed
  r1/r2 to self's dtype). Results are computed in fp32 from the inputs and returned in the
  documented dtype. Every call is recorded.
- `mindiesd_standin`: registers ``mindiesd::adaln`` with MindIE SD's exact schema
  (``csrc/plugin/register_ops.cpp``) and a CPU kernel that enforces aclnnAdaLayerNorm's contract
  (hicann ops-nn ``norm/ada_layer_norm``: one dtype, scale/shift [B.., H] or [B.., 1, H]).
- `KernelCounter`: a ``TorchDispatchMode`` counting device-op calls: stand-in kernel calls plus
  aten ops dispatched outside them (views excluded: they launch nothing).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import types
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["A2_SOC", "KernelCounter", "SCHEMAS", "StandInTorchNpu", "install_torch_npu", "mindiesd_standin"]

A2_SOC = 221  # c10_npu::SocVersion::Ascend910B2 (torch_npu/csrc/core/npu/NpuVariables.h)
SOC_NAMES = {102: "Ascend910A", 221: "Ascend910B2", 250: "Ascend910_9391", 260: "Ascend950"}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# op-plugin op_plugin/config/op_plugin_functions.yaml, per release branch.
_ROTARY = {
    "6.0.0": "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2) -> Tensor",
    "7.0.0": "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor",
    "26.0.0": "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor",
}
SCHEMAS = {
    version: {
        "npu_rms_norm": "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
        "npu_rotary_mul": rotary,
        "npu_gelu": "npu_gelu(Tensor self, *, str approximate='none') -> Tensor",
        "npu_fast_gelu": "npu_fast_gelu(Tensor self) -> Tensor",
        "npu_swiglu": "npu_swiglu(Tensor self, int dim=-1) -> Tensor",
    }
    for version, rotary in _ROTARY.items()
}
ALL_ACLNN = frozenset({"aclnnRmsNorm", "aclnnRotaryPositionEmbedding", "aclnnAddcmul", "aclnnSwiGlu"})


class _Packet:
    """``torch.ops.npu.<op>``-like: ``.default._schema`` and keyword checking against it."""

    def __init__(self, owner: "StandInTorchNpu", schema: str, fn):
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
        version: op-plugin release of the schemas (``"6.0.0"``, ``"7.0.0"``, ``"26.0.0"``).
        soc: ``c10_npu::SocVersion`` value (221 = Ascend910B2, 102 = Ascend910A).
        jit_compile: ``torch_npu.npu.set_compile_mode(jit_compile=...)``.
        aclnn: aclnn kernels present in CANN's op-api libraries.
    """

    def __init__(self, version: str = "26.0.0", soc: int = A2_SOC, jit_compile: bool = False,
                 aclnn: Iterable[str] = ALL_ACLNN):
        super().__init__("torch_npu")
        self.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
        self.version, self.soc, self.jit, self.aclnn = version, soc, jit_compile, frozenset(aclnn)
        self.calls: list[tuple[str, dict]] = []
        self.depth = 0
        self.npu = types.SimpleNamespace(
            get_soc_version=lambda: self.soc,
            get_device_name=lambda *a: SOC_NAMES.get(self.soc, f"soc{self.soc}"),
            is_jit_compile_false=lambda: not self.jit,
        )
        impls = {"npu_rms_norm": self._rms_norm, "npu_rotary_mul": self._rotary_mul,
                 "npu_gelu": self._gelu, "npu_fast_gelu": self._fast_gelu, "npu_swiglu": self._swiglu}
        for name, schema in SCHEMAS[version].items():
            setattr(self, name, _Packet(self, schema, impls[name]))

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
        assert t.dtype != torch.bfloat16 or self.soc >= 220, "bf16 needs SocVersion >= Ascend910B1"

    # -- ops ----------------------------------------------------------------------------------
    def _rms_norm(self, x, gamma, epsilon):
        self._check_dtype(x)
        assert 2 <= x.dim() <= 8 and tuple(gamma.shape) == tuple(x.shape[x.dim() - gamma.dim():])
        a2_a3 = 220 <= self.soc < 240 or 250 <= self.soc < 260
        if a2_a3 and self._op_api("aclnnRmsNorm"):  # torch_npu-npu_rms_norm.md, A2/A3 table
            allowed = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
                       (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)}
        else:  # older parts' table; acl_op RmsNorm: gamma in self's dtype
            allowed = {(d, d) for d in _DTYPES}
        assert (x.dtype, gamma.dtype) in allowed, f"npu_rms_norm: (self {x.dtype}, gamma {gamma.dtype}) not allowed here"
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
        return (xf * rstd * gamma.float()).to(x.dtype), rstd

    def _rotary_mul(self, x, r1, r2, rotary_mode="half", rotate=None):
        for t in (x, r1, r2):
            self._check_dtype(t)
        assert x.dim() == 4 and r1.dim() == 4 and r2.dim() == 4 and r1.shape == r2.shape
        assert rotary_mode in ("half", "interleave"), "rotary_mode should be half or interleave"
        if self.soc < 220 or not self._op_api("aclnnRotaryPositionEmbedding"):
            # acl_op::npu_rotary_mul (RotaryMulKernelNpu.cpp) and the jit_compile=True doc.
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
        # does not matter, but the aclnn kernel must exist; A2/A3 (torch_npu-npu_swiglu.md).
        assert "aclnnSwiGlu" in self.aclnn, "aclnnSwiGlu missing from CANN"
        assert 220 <= self.soc < 240 or 250 <= self.soc < 260, "npu_swiglu: Atlas A2/A3 only"
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
    probe.cache_clear()
    return fake


_ADALN_SCHEMA = ("adaln(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None, Tensor? bias=None, "
                 "float? epsilon=1e-5) -> Tensor")


@contextlib.contextmanager
def mindiesd_standin(calls: Optional[list] = None):
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
            assert tuple(t.shape) in (lead + (h,), lead + (1, h)), f"scale/shift {tuple(t.shape)} for x {tuple(x.shape)}"
        y = F.layer_norm(x.float(), (h,), None if weight is None else weight.float(),
                         None if bias is None else bias.float(), epsilon)
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
        lib._destroy()


class KernelCounter(TorchDispatchMode):
    """Counts device-op calls: ops dispatched while no stand-in kernel runs (views excluded).

    Each stand-in torch_npu op and each ``mindiesd`` op counts as one call (its own internals are
    the stand-in's emulation, not calls the provider makes).
    """

    def __init__(self, torch_npu: Optional[StandInTorchNpu] = None):
        super().__init__()
        self.torch_npu = torch_npu
        self.ops: list[str] = []
        self._start = 0

    def __enter__(self):
        self._start = len(self.torch_npu.calls) if self.torch_npu is not None else 0
        return super().__enter__()

    def npu_calls(self) -> list[str]:
        return self.torch_npu.names()[self._start:] if self.torch_npu is not None else []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if (self.torch_npu is None or self.torch_npu.depth == 0) and not func.is_view:
            self.ops.append(str(func.overloadpacket._qualified_op_name).replace("::", "."))
        return func(*args, **(kwargs or {}))

    def count(self) -> int:
        return len(self.npu_calls()) + len(self.ops)
