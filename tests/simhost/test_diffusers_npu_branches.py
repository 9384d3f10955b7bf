"""diffusers' own NPU branches on the simulated Ascend host: CONTRACT tests, not hardware.

In this process the stand-in torch_npu distribution (tests/simhost/site) was found by diffusers at
its import, so diffusers runs the code it runs on a host with the torch_npu wheel installed:
``RMSNorm.forward`` calls ``torch_npu.npu_rms_norm`` itself, ``GEGLU`` calls ``npu_geglu(...,
approximate=1)``, ``_native_npu`` attention is usable, pipelines import torch_npu. What is checked:
our swaps, passes, ``ascend_report()`` and graph capture handle those calls (counted as fused by
diffusers, never fused twice, captured only where torch_npu runs their aclnn kernel). Nothing here
ran on an Ascend device: numerics are the stand-ins' fp32 math, not the NPU kernels'.

Of the four families the issue names, only Qwen-Image uses diffusers' ``RMSNorm`` in diffusers
0.42.1: Flux, Wan and Chroma build ``torch.nn.RMSNorm`` (their counts of diffusers' own calls are
zero, asserted as such).
"""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from ascend_kernels.testing import assert_close
from diffusers_ascend.fusions import default_fusions
from tests.models.test_zoo import _build, _tensors
from tests.models.zoo_table import COVERAGE

pytestmark = pytest.mark.usefixtures("simhost")

FAMILIES = [
    "FluxTransformer2DModel",
    "WanTransformer3DModel",
    "QwenImageTransformer2DModel",
    "ChromaTransformer2DModel",
]
# diffusers RMSNorm modules with a weight in the zoo's tiny configs (each runs once per forward).
DIFFUSERS_RMS_NORMS = {
    "FluxTransformer2DModel": 0,
    "WanTransformer3DModel": 0,
    "QwenImageTransformer2DModel": 9,
    "ChromaTransformer2DModel": 0,
}
NO_RMS_NORM = [f for f in default_fusions() if f != "rms_norm"]  # fusions="all" less rms_norm


def _model(name, dtype):
    model, inputs = _build(name)
    cast = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    return model.to(dtype), cast


def _assert_close(out, ref, dtype):
    a, e = _tensors(out), _tensors(ref)
    assert len(a) == len(e) and a
    for x, y in zip(a, e):
        assert_close(x, y, dtype=dtype)


def _logged_calls(log_dir, op: str) -> int:
    """Calls of ``torch.ops.npu.<op>`` in the last logged stage of every compiled graph."""
    import glob
    import os
    import re

    last = {}
    for path in sorted(glob.glob(os.path.join(str(log_dir), "*.py"))):
        last[re.sub(r"\.\d\d\.[a-z0-9_]+\.py$", "", os.path.basename(path))] = path
    return sum(open(p).read().count(f"torch.ops.npu.{op}.default(") for p in last.values())


def test_diffusers_found_the_standin_distribution(simhost):
    from diffusers.models import activations, attention_dispatch
    from diffusers.pipelines import pipeline_utils
    from diffusers.utils import import_utils

    assert importlib.metadata.version("torch_npu") == "2.10.0.post6"
    assert import_utils.is_torch_npu_available()
    module = sys.modules["torch_npu"]
    assert activations.torch_npu is module and module._standin is simhost.torch_npu
    assert pipeline_utils.torch_npu is module  # pipelines import torch_npu at diffusers' import
    # a plain module, as the wheel's: dynamo on torch 2.10 traces `import torch_npu` in a forward only then
    assert type(module) is types.ModuleType
    # diffusers set these at its own import, from the distribution: nothing patched them here.
    assert attention_dispatch._CAN_USE_NPU_ATTN is True
    assert attention_dispatch.npu_fusion_attention is torch.ops.npu.npu_fusion_attention


def test_standin_ops_keep_the_wheel_contract(simhost):
    npu = sys.modules["torch_npu"]
    assert [a.name for a in npu.npu_rms_norm.default._schema.arguments] == ["input", "gamma", "epsilon"]
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="gamma dtype torch.float32 must equal the input's torch.bfloat16"):
        npu.npu_rms_norm(x, torch.ones(8), epsilon=1e-6)  # the wheel's doc: gamma in the input's dtype
    w = torch.randn(8)
    y, rstd = npu.npu_rms_norm(x.float(), w, epsilon=1e-5)
    assert rstd.shape == (2, 3, 1) and rstd.dtype == torch.float32
    assert_close(y, torch.nn.functional.rms_norm(x.float(), (8,), w, 1e-5), dtype=torch.float32)

    h = torch.randn(2, 5, 16)
    out, gelu = npu.npu_geglu(h, dim=-1, approximate=1)
    left, right = h.chunk(2, -1)
    assert_close(gelu, F.gelu(right, approximate="tanh"), dtype=torch.float32)
    assert_close(out, left * F.gelu(right, approximate="tanh"), dtype=torch.float32)
    with pytest.raises(RuntimeError, match="not divisible by 2"):
        npu.npu_geglu(torch.randn(2, 7))


def test_diffusers_modules_call_torch_npu_themselves(simhost):
    from diffusers.models.activations import GEGLU
    from diffusers.models.normalization import RMSNorm

    x = torch.randn(2, 4, 8)
    norm = RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8))
        y = norm(x)
    (call,) = simhost.calls("npu_rms_norm")
    assert call["epsilon"] == 1e-5 and call["gamma"] is norm.weight
    assert_close(y, F.rms_norm(x, (8,), norm.weight.detach(), 1e-5), dtype=torch.float32)
    RMSNorm(8, eps=1e-5, elementwise_affine=False)(x)  # no weight: diffusers' stock math
    assert len(simhost.calls("npu_rms_norm")) == 1

    geglu = GEGLU(8, 6)
    with torch.no_grad():
        out = geglu(x)
        h, gate = geglu.proj(x).chunk(2, -1)
    (call,) = simhost.calls("npu_geglu")
    assert (call["dim"], call["approximate"], call["activate_left"]) == (-1, 1, False)
    assert_close(out, h * F.gelu(gate, approximate="tanh"), dtype=torch.float32)  # tanh on NPU, erf on CPU


def test_swapped_norms_are_ours_and_fused_once(simhost):
    """Qwen-Image's 9 diffusers RMSNorms: reported as fused by diffusers until our rms_norm swap
    replaces their forward; then they count as our swaps only, and a forward still makes one
    npu_rms_norm call per site (9), not two."""
    import diffusers_ascend
    from diffusers_ascend.layers import upstream_fused

    name = "QwenImageTransformer2DModel"
    model, inputs = _build(name)
    assert upstream_fused(model) == {"npu_rms_norm": 9}
    with torch.no_grad():
        ref = model(**inputs)
    assert len(simhost.calls("npu_rms_norm")) == 9
    diffusers_ascend.enable_ascend_compile(model, fusions=["rms_norm"], compile="none")
    report = model.ascend_report()
    assert report.swaps == {"rms_norm": 9} and report.upstream_fused == {}
    simhost.torch_npu.calls.clear()
    with torch.no_grad():
        out = model(**inputs)
    assert len(simhost.calls("npu_rms_norm")) == 9
    _assert_close(out, ref, torch.float32)
    diffusers_ascend.disable_ascend_compile(model)
    assert upstream_fused(model) == {"npu_rms_norm": 9}


@pytest.mark.parametrize("name", FAMILIES)
def test_family_enables_and_matches_eager(name, simhost):
    """``fusions="all"``, blocks compiled, bf16 (fp32: the zoo, tests/simhost/test_zoo_npu.py):
    equal to eager (diffusers' NPU branches) within bf16 tolerances, no fallback, every diffusers
    RMSNorm swapped for ours (none left to diffusers)."""
    dtype = torch.bfloat16
    model, inputs = _model(name, dtype)
    with torch.no_grad():
        ref = model(**inputs)
    torch._dynamo.reset()
    model.enable_ascend_compile(fusions="all", compile="blocks", executor="eager", attention=None)
    with torch.no_grad():
        out = model(**inputs)
    report = model.ascend_report()
    assert not report.fallbacks, report.fallbacks
    assert report.upstream_fused == {}
    assert report.swaps["rms_norm"] == COVERAGE[name]["swaps"]["rms_norm"]  # as on CPU: every RMSNorm is ours
    _assert_close(out, ref, dtype)


@pytest.mark.parametrize("name", FAMILIES)
def test_norms_left_to_diffusers_are_reported_and_captured(name, simhost, tmp_path):
    """rms_norm fusion off, graph capture on (bf16): diffusers' own npu_rms_norm calls are counted
    as fused by diffusers, sit in the compiled graphs as ``npu.npu_rms_norm`` nodes that no pass
    rewrites, and are captured, since torch_npu runs them as aclnnRmsNorm here."""
    dtype = torch.bfloat16
    model, inputs = _model(name, dtype)
    with torch.no_grad():
        ref = model(**inputs)
    torch._dynamo.reset()
    model.enable_ascend_compile(
        fusions=NO_RMS_NORM,
        compile="blocks",
        executor="eager",
        attention=None,
        graph_capture="graph_with_compile",
        graph_log_dir=str(tmp_path),
    )
    with torch.no_grad():
        for _ in range(5):  # warm-up calls, the capture, then replays
            out = model(**inputs)
    report = model.ascend_report()
    expected = {"npu_rms_norm": DIFFUSERS_RMS_NORMS[name]} if DIFFUSERS_RMS_NORMS[name] else {}
    assert report.upstream_fused == expected
    assert report.matches.get("rms_norm", 0) == 0 and "rms_norm" not in report.swaps
    assert (_logged_calls(tmp_path, "npu_rms_norm") > 0) == bool(DIFFUSERS_RMS_NORMS[name])
    assert not report.fallbacks, report.fallbacks
    stats = model._ascend_state.backend.graph_capture.stats
    assert stats["captures"] >= 1 and stats["replays"] >= 1
    _assert_close(out, ref, dtype)


def test_acl_op_norm_of_diffusers_is_not_captured(simhost, monkeypatch):
    """Without aclnnRmsNorm in CANN torch_npu runs npu_rms_norm as its acl_op kernel, which NPU
    graphs cannot capture: every Qwen-Image block graph holding diffusers' own call runs compiled,
    uncaptured, with the reason in the report; the output still equals eager."""
    dtype = torch.bfloat16
    monkeypatch.setattr(simhost.torch_npu, "aclnn", simhost.torch_npu.aclnn - {"aclnnRmsNorm"})
    model, inputs = _model("QwenImageTransformer2DModel", dtype)
    with torch.no_grad():
        ref = model(**inputs)
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="runs without graph capture"):
        model.enable_ascend_compile(
            fusions=NO_RMS_NORM, compile="blocks", executor="eager", attention=None, graph_capture="graph_with_compile"
        )
        with torch.no_grad():
            for _ in range(5):
                out = model(**inputs)
    report = model.ascend_report()
    reasons = [f["reason"] for f in report.fallbacks]
    assert reasons and all("npu_rms_norm" in r and "acl_op" in r and "aclnnRmsNorm is missing" in r for r in reasons), (
        reasons
    )
    assert model._ascend_state.backend.graph_capture.stats["captures"] == 0
    assert report.upstream_fused == {"npu_rms_norm": 9}
    _assert_close(out, ref, dtype)


@pytest.mark.parametrize("op, api", [("npu_rms_norm", "aclnnRmsNorm"), ("npu_geglu", "aclnnGeGluV3")])
def test_capture_rule_follows_torch_npu_kernel_path(op, api, simhost, monkeypatch):
    """`uncapturable_ops` refuses diffusers' own torch_npu calls exactly where torch_npu would run
    the acl_op kernel: the aclnn symbol missing, or jit_compile=True."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from diffusers_ascend.compilation.graph_capture import uncapturable_ops

    fn = getattr(torch.ops.npu, op)
    gm = make_fx(lambda x, w: fn(x, w)[0] if op == "npu_rms_norm" else fn(x)[0])(torch.randn(2, 8), torch.ones(8))
    assert uncapturable_ops(gm) == {}
    monkeypatch.setattr(simhost.torch_npu, "aclnn", simhost.torch_npu.aclnn - {api})
    (reason,) = uncapturable_ops(gm).values()
    assert f"torch_npu's {op}" in reason and f"{api} is missing" in reason
    monkeypatch.setattr(simhost.torch_npu, "aclnn", simhost.torch_npu.aclnn | {api})
    monkeypatch.setattr(simhost.torch_npu, "jit", True)
    (reason,) = uncapturable_ops(gm).values()
    assert "jit_compile=True" in reason


def test_refused_swap_leaves_the_norm_to_diffusers(simhost):
    """A diffusers RMSNorm whose swap is refused (an instance ``forward``, as offloading hooks
    install) still runs diffusers' own npu_rms_norm: reported as fused by diffusers, once."""
    from diffusers.models.normalization import RMSNorm

    import diffusers_ascend

    model, inputs = _build("QwenImageTransformer2DModel")
    hooked = next(m for m in model.modules() if isinstance(m, RMSNorm))
    hooked.forward = hooked.forward  # an instance attribute wrapping the class's forward
    with torch.no_grad():
        ref = model(**inputs)
    with pytest.warns(UserWarning):
        diffusers_ascend.enable_ascend_compile(model, fusions=["rms_norm"], compile="none")
    report = model.ascend_report()
    assert report.swaps == {"rms_norm": 8} and report.upstream_fused == {"npu_rms_norm": 1}
    simhost.torch_npu.calls.clear()
    with torch.no_grad():
        out = model(**inputs)
    assert len(simhost.calls("npu_rms_norm")) == 9  # 8 through our provider, 1 by diffusers
    _assert_close(out, ref, torch.float32)
