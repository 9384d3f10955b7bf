"""Every torch_npu / torch.npu / mindiesd call of the package, bound against the wheels' real signatures.

A CONTRACT test (no Ascend device here): the package's calls are recorded through the stand-ins
while the npu providers and FIA run their real code paths, then each recorded call is bound
(``inspect.Signature.bind``) against the signature built from the schema string the torch_npu
2.10.0.post6 / 2.14.0 wheel ships in ``libtorch_npu.so`` (MindIE SD 3.1.0: its
``libPTAExtensionOPS.so``); the ``torch_npu.npu`` Python API against the ``def`` in the wheel's
source. The signatures come from ``npu_contracts.json`` (``tools/npu_wheels.py``; ``--check`` verifies
it against the wheels), so this runs offline. A static scan makes sure no call site escapes the test.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import pytest
import torch

from ascend_kernels.npu import attention as npu_attention
from ascend_kernels.npu import probe

from .npu_standins import CONTRACTS, MINDIESD, WHEELS, api_signature, install_torch_npu, mindiesd_standin

ROOT = Path(__file__).resolve().parents[2]
ops = torch.ops.ascend_kernels
_ARG = re.compile(r"^(?P<type>[\w\[\]?().]+(?:\([a-z!]+\))?)\s+(?P<name>\w+)(?:=(?P<default>.+))?$")


def schema_signature(schema: str) -> inspect.Signature:
    """An ``inspect.Signature`` of a torch schema string: names, defaults present or not, keyword-only
    after ``*`` (values are not typed: binding checks names, arity and keyword-only-ness)."""
    args = schema[schema.index("(") + 1 : schema.rindex(") ->")]
    params, kind, depth, part = [], inspect.Parameter.POSITIONAL_OR_KEYWORD, 0, ""
    pieces = []
    for ch in args + ",":  # split at top-level commas (defaults such as [128,128] contain commas)
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            pieces.append(part.strip())
            part = ""
        else:
            part += ch
    for piece in filter(None, pieces):
        if piece == "*":
            kind = inspect.Parameter.KEYWORD_ONLY
            continue
        m = _ARG.match(piece)
        assert m, f"unparsed schema argument {piece!r} in {schema}"
        default = inspect.Parameter.empty if m["default"] is None else m["default"]
        params.append(inspect.Parameter(m["name"], kind, default=default))
    return inspect.Signature(params)


def bind_all(calls, signature_of) -> list[str]:
    """The calls that do not bind to their wheel signature, with the reason."""
    bad = []
    for name, args, kwargs in calls:
        try:
            signature_of(name).bind(*args, **kwargs)
        except (TypeError, KeyError) as e:
            bad.append(f"{name}(*{len(args)} args, {sorted(kwargs)}): {e}")
    return bad


def _randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


class _Recorder:
    """Wraps ``torch_npu.<op>`` / ``torch.ops.npu.<op>`` / ``torch.ops.mindiesd.<op>`` to record the
    positional and keyword arguments exactly as the package passes them."""

    def __init__(self):
        self.calls: list[tuple[str, tuple, dict]] = []

    def wrap(self, name, fn):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return fn(*args, **kwargs)

        call.default = getattr(fn, "default", None)  # the stand-ins read the packet's schema
        return call


def _drive_package(monkeypatch, wheel):
    """Runs each npu provider and FIA as the package calls them; returns the recorded calls and the
    stand-in (whose ``api_calls`` hold the torch_npu.npu calls)."""
    fake = install_torch_npu(monkeypatch, version=wheel)
    rec = _Recorder()
    for op in ("npu_rms_norm", "npu_rotary_mul", "npu_gelu", "npu_fast_gelu", "npu_swiglu"):
        monkeypatch.setattr(fake, op, rec.wrap(op, getattr(fake, op)))
    npu_ns = torch.ops.npu
    for op in ("npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2"):
        monkeypatch.setattr(npu_ns, op, rec.wrap(op, getattr(npu_ns, op)), raising=False)
    x = _randn(2, 13, 64)
    ops.rms_norm(x, _randn(64, dtype=torch.float32), 1e-6, None)
    ops.rms_norm(x, None, 1e-6, None)
    cos, sin = torch.randn(13, 16), torch.randn(13, 16)
    for layout in ("interleaved", "half"):
        ops.rope(_randn(1, 13, 2, 16), cos[None, :, None], sin[None, :, None], layout)
    ops.gelu_tanh(x)
    ops.fast_gelu(x)
    ops.swiglu(_randn(2, 13, 64), None, -1)
    ops.swiglu(_randn(2, 13, 32), _randn(2, 13, 32), -1)
    q = _randn(1, 32, 2, 16)
    for name in ("npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2"):
        monkeypatch.setattr(npu_attention, "fia_op", lambda name=name: name)
        npu_attention.fia(q, q, q, return_lse=True)
        npu_attention.fia(q, q, q, attn_mask=torch.ones(1, 1, 32, 32, dtype=torch.bool))
    with mindiesd_standin():
        monkeypatch.setattr(torch.ops.mindiesd, "adaln", rec.wrap("adaln", torch.ops.mindiesd.adaln), raising=False)
        ops.adaln_modulate(_randn(2, 13, 64), _randn(2, 64), _randn(2, 64), 1e-6, None, None, None)
    # probe's torch_npu.npu calls (soc, name, compile mode) went through the stand-in's wheel signatures
    probe.soc_version(), probe.soc_name(), probe.jit_compile()
    return rec.calls, fake


@pytest.mark.parametrize("wheel", WHEELS)
def test_every_op_call_binds_to_the_wheel_schema(monkeypatch, wheel):
    calls, fake = _drive_package(monkeypatch, wheel)
    schemas = CONTRACTS["torch_npu"][wheel]["schemas"]
    names = {name for name, _, _ in calls}
    assert names == {
        "npu_rms_norm",
        "npu_rotary_mul",
        "npu_gelu",
        "npu_fast_gelu",
        "npu_swiglu",
        "npu_fused_infer_attention_score",
        "npu_fused_infer_attention_score_v2",
        "adaln",
    }
    signature = lambda n: schema_signature(MINDIESD["schemas"][n] if n == "adaln" else schemas[n])  # noqa: E731
    assert bind_all(calls, signature) == []
    # the torch_npu.npu calls bound in the stand-in against the wheel's def (a mismatch raises there)
    assert {name for name, _ in fake.api_calls} >= {"get_soc_version", "get_device_name", "is_jit_compile_false"}


@pytest.mark.parametrize("wheel", WHEELS)
def test_binding_catches_a_wrong_keyword(wheel):
    """The check itself: what an op-plugin page documents but the wheel names otherwise fails."""
    sig = schema_signature(CONTRACTS["torch_npu"][wheel]["schemas"]["npu_rms_norm"])
    assert list(sig.parameters) == ["input", "gamma", "epsilon"]  # not "self", as the op-plugin yaml says
    assert bind_all([("npu_rms_norm", (), {"self": 1, "gamma": 2})], lambda n: sig)
    gelu = schema_signature(CONTRACTS["torch_npu"][wheel]["schemas"]["npu_gelu"])
    assert bind_all([("npu_gelu", (1, "tanh"), {})], lambda n: gelu)  # approximate is keyword-only


def _meta(op: str, wheel: str):
    """The wheel's meta function of ``op`` (``_meta_registrations.py``, stored as source text)."""
    import math

    namespace: dict = {"torch": torch, "math": math}
    exec(CONTRACTS["torch_npu"][wheel]["meta"][op], namespace)  # noqa: S102  (the wheel's own meta source)
    return next(v for k, v in namespace.items() if k.endswith("_meta"))


@pytest.mark.parametrize("wheel", WHEELS)
def test_standin_outputs_have_the_wheel_meta_shapes(monkeypatch, wheel):
    """Each stand-in op returns what the wheel's meta function says (shapes and dtypes: e.g.
    npu_rms_norm's rstd fp32 ``[..., 1]``, npu_swiglu halving ``dim``), for the calls we make."""
    fake = install_torch_npu(monkeypatch, version=wheel)
    x = _randn(2, 13, 64)
    cases = {
        "npu_rms_norm": ((x, _randn(64)), {"epsilon": 1e-6}),
        "npu_rotary_mul": (
            (_randn(1, 13, 2, 16), _randn(1, 13, 1, 16), _randn(1, 13, 1, 16)),
            {"rotary_mode": "interleave"},
        ),
        "npu_gelu": ((x,), {"approximate": "tanh"}),
        "npu_fast_gelu": ((x,), {}),
        "npu_swiglu": ((x,), {"dim": -1}),
    }
    for op, (args, kwargs) in cases.items():
        out = getattr(fake, op)(*args, **kwargs)
        meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        rename = {"rotary_mode": "mode"}  # the meta function's own parameter names
        want = _meta(op, wheel)(*meta_args, **{rename.get(k, k): v for k, v in kwargs.items()})
        outs, wants = (out, want) if isinstance(out, tuple) else ((out,), (want,))
        assert [(tuple(o.shape), o.dtype) for o in outs] == [(tuple(w.shape), w.dtype) for w in wants], op


# -- torch.npu / torch_npu.npu calls outside the providers: bound from their call sites -------------
def _call_sites():
    """``torch.npu.<fn>(...)`` / ``npu.<fn>(...)`` / ``torch_npu.npu.<fn>(...)`` calls in the package:
    (file:line, fn, positional count, keyword names); ``getattr(torch, device).<fn>`` included."""
    sites = []
    for path in sorted(list((ROOT / "ascend_kernels").rglob("*.py")) + list((ROOT / "diffusers_ascend").rglob("*.py"))):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = ast.unparse(node.func.value)
            if owner in ("torch.npu", "npu", "_torch_npu().npu", "torch_npu.npu") or owner.startswith(
                "getattr(torch, "
            ):
                if owner == "npu" and node.func.attr not in CONTRACTS["torch_npu"][WHEELS[0]]["python_api"]:
                    continue  # a local named npu that is not torch.npu (e.g. the torch_npu module itself)
                if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                    continue
                sites.append(
                    (
                        f"{path.relative_to(ROOT)}:{node.lineno}",
                        node.func.attr,
                        len(node.args),
                        [k.arg for k in node.keywords],
                    )
                )
    return sites


def test_the_scan_finds_the_known_call_sites():
    found = {(site.split(":")[0], fn) for site, fn, _, _ in _call_sites()}
    assert ("diffusers_ascend/platform.py", "graph") in found and (
        "ascend_kernels/npu/probe.py",
        "get_soc_version",
    ) in found
    assert ("diffusers_ascend/platform.py", "is_available") in found


@pytest.mark.parametrize("wheel", WHEELS)
def test_every_torch_npu_api_call_site_binds(wheel):
    api = CONTRACTS["torch_npu"][wheel]["python_api"]
    bad, unknown = [], []
    for site, fn, n_pos, keywords in _call_sites():
        if fn not in api:
            unknown.append(f"{site}: {fn}")  # getattr(torch, device).<fn> for CUDA too, or not in the contract
            continue
        assert api[fn] is not None, f"torch_npu {wheel} has no torch_npu.npu.{fn} ({site})"
        try:
            api_signature(fn, wheel).bind(*range(n_pos), **{k: None for k in keywords})
        except TypeError as e:
            bad.append(f"{site}: {fn}: {e}")
    assert bad == []
    # every torch.npu-style name the package calls is in the contract (tools/npu_wheels.py TORCH_NPU_API)
    assert unknown == []


# -- item 5: the docs' SoC lists, torch_npu's library search ---------------------------------------
@pytest.mark.parametrize("wheel", WHEELS)
def test_probe_names_soc_families_as_the_wheel_does(wheel):
    """Every SocVersion of the wheel's enum gets the family the wheel's own SoC detection gives it
    (A2 = Ascend910B1.., A3 = Ascend910_93..; "Ascend910B" = 104 is the older Atlas training part)."""
    from .npu_standins import soc_family

    for name, value in CONTRACTS["torch_npu"][wheel]["soc_versions"].items():
        if value >= 0:
            assert probe.soc_family(value) == soc_family(value, wheel), name
    assert probe.soc_family(104) == "910" and probe.is_a2(221) and not probe.is_a2(250) and probe.is_a2_a3(250)


@pytest.mark.parametrize(
    "soc, rope, swiglu", [(221, True, True), (250, True, False), (260, False, False), (240, False, False)]
)
def test_rope_and_swiglu_gated_to_the_socs_their_docs_list(monkeypatch, soc, rope, swiglu):
    """npu_rotary_mul's aclnn path: A2/A3 (its doc); npu_swiglu: A2 only. Not "SoC >= 220": an A5
    (Ascend950) or a 310B part goes native, with the reason in the provider's description."""
    from ascend_kernels.npu import kernels
    from ascend_kernels.registry import select_provider

    install_torch_npu(monkeypatch, soc=soc)
    cos, sin = torch.randn(13, 16), torch.randn(13, 16)
    x = _randn(1, 13, 2, 16)
    assert (select_provider("rope", x, cos[None, :, None], sin[None, :, None], "interleaved").name == "npu") is rope
    assert (select_provider("swiglu", _randn(2, 13, 64), None, -1).name == "npu") is swiglu
    assert kernels.swiglu_kernel() is swiglu
    ops.rope(x, cos[None, :, None], sin[None, :, None], "half")  # the stand-in raises off its doc's SoCs
    ops.swiglu(_randn(2, 13, 64), None, -1)


@pytest.mark.parametrize("wheel", WHEELS)
def test_aclnn_probe_searches_the_libraries_torch_npu_searches(monkeypatch, tmp_path, wheel):
    """libtorch_npu.so looks aclnn symbols up in libcust_opapi.so (ASCEND_CUSTOM_OPP_PATH/op_api/lib
    first), libopapi.so and the libaclnn_*.so feature libraries; the probe must find a kernel in any."""
    import types

    wanted = CONTRACTS["torch_npu"][wheel]["aclnn_libraries"]
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(tmp_path / "vendor"))
    monkeypatch.delenv("ASCEND_OPP_PATH", raising=False)
    searched = probe._op_api_libraries()
    assert {Path(n).name for n in searched} >= set(wanted)
    assert searched[0] == str(tmp_path / "vendor" / "op_api" / "lib" / "libcust_opapi.so")
    for lib in wanted:
        has = types.SimpleNamespace(aclnnFoo=1, aclnnFooGetWorkspaceSize=1)
        monkeypatch.setattr(probe, "_open", lambda name, lib=lib, has=has: has if Path(name).name == lib else None)
        probe.aclnn_available.cache_clear()
        assert probe.aclnn_available("aclnnFoo"), lib
    probe.cache_clear()


# -- MindIE SD 3.1.0 under torch 2.14 ---------------------------------------------------------------
@pytest.fixture
def mindiesd_310(tmp_path, monkeypatch):
    """A stand-in ``mindiesd`` 3.1.0 distribution: its ``_torch_variants.py`` (the variants the wheel
    ships, from npu_contracts.json) and an ``__init__`` that raises as 3.1.0's does on an NPU host with
    a torch outside them (and, like it, touches ASCEND_CUSTOM_OPP_PATH first)."""
    from ascend_kernels import npu, registry

    pkg = tmp_path / "mindiesd"
    pkg.mkdir()
    (pkg / "_torch_variants.py").write_text(
        f"SUPPORTED_TORCH_PLUGIN_VARIANTS = {MINDIESD['torch_plugin_variants']!r}\n"
    )
    message = MINDIESD["unsupported_torch_error"].split(": ", 1)[1]
    (pkg / "__init__.py").write_text(
        "import os, torch\n"
        "os.environ['ASCEND_CUSTOM_OPP_PATH'] = 'mindiesd-vendors:' + os.environ.get('ASCEND_CUSTOM_OPP_PATH', '')\n"
        f"raise RuntimeError(f{message!r})\n"
    )
    dist = tmp_path / "mindiesd-3.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mindiesd\nVersion: 3.1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    caches = (npu._import_error, registry._imports, npu.mindiesd_torch_unsupported)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


@pytest.mark.parametrize("torch_version, supported", [("2.14.0", False), ("2.13.0+cpu", True)])
def test_mindiesd_310_on_torch_214_is_a_reason_and_a_fallback(
    monkeypatch, mindiesd_310, capsys, torch_version, supported
):
    """torch 2.14 (pinned): the reason names the torch releases MindIE SD 3.1.0 ships plugins for, the
    import (which raises and edits ASCEND_CUSTOM_OPP_PATH) never runs, adaln_modulate goes native."""
    import json
    import os

    from ascend_kernels.npu import mindiesd_unavailable_reason
    from diffusers_ascend.cli import main
    from diffusers_ascend.platform import override_platform

    install_torch_npu(monkeypatch)
    monkeypatch.setattr(torch, "__version__", torch_version)
    monkeypatch.delenv("ASCEND_CUSTOM_OPP_PATH", raising=False)
    why = mindiesd_unavailable_reason()
    if supported:  # a torch it ships: its import decides (here: it raises, reported as such)
        assert why.startswith("mindiesd 3.1.0 is installed but raised at import (RuntimeError: Unsupported torch")
        return
    assert why == (
        "mindiesd 3.1.0 has op plugins for torch 2.7, 2.9, 2.10, 2.11, 2.12, 2.13 only and this is torch "
        "2.14.0 (its import raises RuntimeError('Unsupported torch version')); install a torch it supports "
        "or a MindIE SD release built for this torch"
    )
    assert "mindiesd" not in sys.modules and "ASCEND_CUSTOM_OPP_PATH" not in os.environ
    with override_platform("cpu"):  # the stand-in's providers take CPU tensors; a CUDA host picks others
        assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["mindiesd"] == f"unavailable, because {why}"
    assert info["providers"]["adaln_modulate"] == "native" and why in info["provider_reasons"]["adaln_modulate"]
    # bench e2e's "mindiesd" variant (MindIE SD's compile backend) is skipped with the same reason
    from diffusers_ascend.benchmarks.bench_e2e import VARIANT_SPECS

    assert VARIANT_SPECS["mindiesd"][1]("npu") == why


@pytest.mark.npu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_fp32_gamma_settled_on_the_device(dtype):
    """On a 910B (``-m npu``): the probe's answer, and the provider's result within tolerance of native
    with an fp32 weight either way (uncast where the device took it, cast where it did not)."""
    from ascend_kernels.ops.rms_norm import rms_norm_native
    from ascend_kernels.testing import assert_close

    probe.cache_clear()
    takes = probe.rms_norm_fp32_gamma(dtype)
    print(f"npu_rms_norm takes an fp32 gamma with {dtype} input on {probe.soc_name()}: {takes}")
    x = torch.randn(4, 256, 3072, generator=torch.Generator().manual_seed(0)).to(dtype).to("npu")
    w = torch.rand(3072, generator=torch.Generator().manual_seed(1)).to("npu")
    assert_close(
        ops.rms_norm(x, w, 1e-6, None), rms_norm_native(x, w, 1e-6), msg=f"npu rms_norm, fp32 gamma taken: {takes}"
    )
