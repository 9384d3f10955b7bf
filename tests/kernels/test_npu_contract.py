"""Contract tests of the ``npu`` providers: how ``ascend_kernels`` calls torch_npu and MindIE SD.

This is a CONTRACT test, not a hardware test. No Ascend device, torch_npu or mindiesd exists
here, so the stand-ins of ``npu_standins.py`` are installed (only inside these tests, by fixtures):
they carry the op schemas of real op-plugin releases, mirror op-plugin's dispatch (SoC,
``jit_compile``, aclnn symbols), enforce each op's documented argument contract and record every
call; the npu providers' device check is widened to "cpu" so that they are selected for CPU
tensors. The tests check argument mapping, modes, dtypes (gamma, rope tables, adaLN modulation),
output indexing, the number of device calls per fused call (`KernelCounter`), the fallback to the
native provider wherever the installed stack would fail, what ``fusions="auto"`` picks on NPU and
what ``diffusers-ascend env`` reports. The same calls against real torch_npu on a device are in
``test_npu_hardware.py`` (``-m npu``).
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F

import ascend_kernels
from ascend_kernels.npu import kernels as npu_kernels
from ascend_kernels.npu import probe
from ascend_kernels.ops.adaln import adaln_modulate_native
from ascend_kernels.ops.mul_add import mul_add_native
from ascend_kernels.ops.rms_norm import rms_norm_native
from ascend_kernels.ops.rope import rope_native
from ascend_kernels.ops.swiglu import swiglu_native
from ascend_kernels.registry import auto_provider, available_providers, explain, select_provider, use_providers
from ascend_kernels.testing import assert_close

from .conftest import flux_rope
from .npu_standins import NEWEST, ALL_ACLNN, KernelCounter, StandInTorchNpu, install_torch_npu, mindiesd_standin

ops = torch.ops.ascend_kernels

# Flux rope tables computed before any stand-in is installed (diffusers probes torch_npu itself).
FLUX_ROPE_13 = flux_rope(13)  # (S, 16) fp32
FLUX_ROPE_13_D6 = flux_rope(13, axes_dim=(2, 2, 2))  # (S, 6)
FLUX_ROPE_13_D128 = flux_rope(13, axes_dim=(16, 56, 56))  # (S, 128): Flux's real head dim
_FP32_GAMMA_PROBE = probe.rms_norm_fp32_gamma  # the real probe (install_torch_npu answers for the stand-in)
OLD_SOC = 102  # c10_npu::SocVersion::Ascend910A (Atlas training series, before A2)


@pytest.fixture
def npu_factory(monkeypatch):
    """``npu_factory(version=..., soc=..., jit_compile=..., aclnn=...)`` installs a stand-in."""
    yield lambda **kw: install_torch_npu(monkeypatch, **kw)
    probe.cache_clear()


@pytest.fixture
def torch_npu(npu_factory):
    """The newest torch_npu wheel we bind against (its schemas and docs) on an Ascend910B2, jit_compile=False."""
    return npu_factory()


@pytest.fixture
def mindiesd(torch_npu):
    with mindiesd_standin() as calls:
        yield calls


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _run(torch_npu, op, *args):
    """Runs ``op`` through the provider selection would pick, counting device calls."""
    provider = select_provider(op, *args)
    with KernelCounter(torch_npu) as counter:
        out = provider.impl(*args)
    return provider.name, out, counter


def test_standin_is_only_installed_inside_these_tests():
    assert "torch_npu" not in sys.modules or not isinstance(sys.modules["torch_npu"], StandInTorchNpu)
    assert "mindiesd" not in sys.modules
    assert available_providers("rms_norm", "cpu") == ["native"]


def test_npu_provider_selected_for_its_ops(torch_npu):
    for op in ("rms_norm", "rope", "gelu_tanh", "fast_gelu", "mul_add", "swiglu"):
        assert available_providers(op, "cpu") == ["npu", "native"], op
    assert available_providers("adaln_modulate", "cpu") == ["native"]  # no mindiesd
    with mindiesd_standin():
        assert available_providers("adaln_modulate", "cpu") == ["npu", "native"]


# ----------------------------------------------------------------------------- rms_norm
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_gamma_in_x_dtype_as_the_wheel_documents(torch_npu, x_dtype, w_dtype):
    """torch_npu 2.10.0.post6 / 2.14.0 document gamma in x's dtype (the stand-in enforces the wheel's
    doc): gamma is cast to x's dtype, as MindIE SD does; one npu_rms_norm call on x itself."""
    x, w = _randn(2, 13, 77, dtype=x_dtype), _randn(77, dtype=w_dtype, seed=1)
    name, out, counter = _run(torch_npu, "rms_norm", x, w, 1e-5, None)
    assert name == "npu" and counter.npu_calls() == ["npu_rms_norm"]
    call = torch_npu.calls[0][1]
    assert call["input"] is x and call["epsilon"] == 1e-5 and call["gamma"].dtype == x_dtype
    assert torch.equal(call["gamma"], w.to(x_dtype))
    assert out.dtype == x_dtype and out.shape == x.shape  # y, not rstd
    # The numerics of the native op given the gamma the kernel gets (fp32 math inside).
    assert torch.equal(out, rms_norm_native(x, w.to(x_dtype), 1e-5))


def test_rms_norm_fp32_gamma_only_where_the_device_probe_says_so(npu_factory):
    """A device that takes an fp32 gamma (what probe.rms_norm_fp32_gamma found there) gets it uncast:
    native's numerics exactly; without the probe's yes it is never assumed."""
    torch_npu = npu_factory(fp32_gamma=True)
    x, w = _randn(2, 13, 77), _randn(77, dtype=torch.float32, seed=1)
    out = ops.rms_norm(x, w, 1e-5, None)
    assert torch_npu.calls[0][1]["gamma"] is w and torch.equal(out, rms_norm_native(x, w, 1e-5))


def test_rms_norm_fp32_gamma_probe_is_off_without_a_device(torch_npu):
    # The stand-in is no device (no torch.npu): the probe answers False without calling anything.
    assert _FP32_GAMMA_PROBE(torch.bfloat16) is False
    assert torch_npu.calls == [] and probe._FP32_GAMMA == {}


@pytest.mark.parametrize("capturing", [True, False])
def test_rms_norm_fp32_gamma_probe_asks_once_and_never_in_a_capture(monkeypatch, capturing):
    """The probe synchronizes: during a capture it answers False uncached; else it asks the device
    once per dtype and keeps the answer."""
    import types

    asked = []
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(is_current_stream_capturing=lambda: capturing), raising=False)
    monkeypatch.setattr(probe, "_ask_device_fp32_gamma", lambda dtype: asked.append(dtype) or True)
    probe.cache_clear()
    try:
        answers = [_FP32_GAMMA_PROBE(torch.bfloat16) for _ in range(2)] + [_FP32_GAMMA_PROBE(torch.float32)]
        assert answers == ([False, False, False] if capturing else [True, True, False])
        assert asked == ([] if capturing else [torch.bfloat16])
    finally:
        probe.cache_clear()


@pytest.mark.parametrize("variant", ["old_soc", "jit_compile", "no_aclnn"])
def test_rms_norm_gamma_cast_where_only_x_dtype_is_accepted(npu_factory, variant):
    kw = {"old_soc": dict(soc=OLD_SOC), "jit_compile": dict(jit_compile=True), "no_aclnn": dict(aclnn=())}[variant]
    torch_npu = npu_factory(**kw)
    x, w = _randn(2, 13, 64, dtype=torch.float16), _randn(64, dtype=torch.float32, seed=1)
    name, out, counter = _run(torch_npu, "rms_norm", x, w, 1e-6, None)
    assert name == "npu" and counter.npu_calls() == ["npu_rms_norm"]
    assert torch_npu.calls[0][1]["gamma"].dtype == torch.float16  # the stand-in rejects fp32 here
    assert_close(out, rms_norm_native(x, w, 1e-6), msg="npu rms_norm (gamma cast) vs native")


def test_rms_norm_bf16_needs_a2(npu_factory):
    npu_factory(soc=OLD_SOC)
    x = _randn(2, 13, 64)
    assert select_provider("rms_norm", x, None, 1e-6, None).name == "native"
    assert select_provider("rms_norm", x.half(), None, 1e-6, None).name == "npu"


def test_rms_norm_without_weight_passes_ones(torch_npu):
    x = _randn(4, 64, dtype=torch.float16)
    ops.rms_norm(x, None, 1e-6)
    gamma = torch_npu.calls[0][1]["gamma"]
    assert gamma.dtype == torch.float16 and torch.equal(gamma, torch.ones(64, dtype=torch.float16))


def test_rms_norm_out_dtype(torch_npu):
    x = _randn(4, 64, dtype=torch.float32)
    out = ops.rms_norm(x, None, 1e-6, torch.bfloat16)  # narrower: the kernel, then a cast
    assert torch_npu.names() == ["npu_rms_norm"] and out.dtype == torch.bfloat16
    out = ops.rms_norm(x.bfloat16(), None, 1e-6, torch.float32)  # wider: native keeps fp32 precision
    assert torch_npu.names() == ["npu_rms_norm"] and out.dtype == torch.float32


# ----------------------------------------------------------------------------- rope
@pytest.mark.parametrize("layout, mode", [("interleaved", "interleave"), ("half", "half")])
def test_rope_fp32_tables_keep_fp32_precision(torch_npu, layout, mode):
    """Flux/Wan feed fp32 cos/sin with bf16 x and compute in fp32. op_api npu_rotary_mul would
    round mixed tables to x's dtype, so the kernel runs in fp32 on an upcast x: eager's numerics
    (bitwise, in this emulation), three calls (x up, the kernel, the result down)."""
    cos, sin = FLUX_ROPE_13
    x = _randn(2, 13, 3, 16)  # BSND
    c, s = cos[None, :, None], sin[None, :, None]
    name, out, counter = _run(torch_npu, "rope", x, c, s, layout)
    assert name == "npu" and counter.npu_calls() == ["npu_rotary_mul"]
    call = torch_npu.calls[0][1]
    assert call["rotary_mode"] == mode and call["input"].dtype == torch.float32
    assert call["r1"].data_ptr() == c.data_ptr() and call["r2"].data_ptr() == s.data_ptr()  # fp32, not copied
    assert counter.ops == ["aten._to_copy", "aten._to_copy"] and counter.count() == 3
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(out, rope_native(x, c, s, layout))


def test_rope_tables_in_x_dtype_are_one_call(torch_npu):
    cos, sin = FLUX_ROPE_13
    x = _randn(2, 3, 13, 16)  # BNSD with cos (S, D) -> 11SD
    name, out, counter = _run(torch_npu, "rope", x, cos.bfloat16(), sin.bfloat16(), "interleaved")
    assert name == "npu" and counter.count() == 1 and torch_npu.calls[0][1]["r1"].shape == (1, 1, 13, 16)
    assert_close(out, rope_native(x, cos.bfloat16(), sin.bfloat16(), "interleaved"), msg="npu rope vs native")


def test_rope_old_schema_has_half_only(npu_factory):
    """op-plugin <= 6.0.0: npu_rotary_mul(self, r1, r2), no rotary_mode keyword (the stand-in's
    packet raises TypeError on it, as the real one does)."""
    torch_npu = npu_factory(version="6.0.0")
    cos, sin = FLUX_ROPE_13
    x = _randn(2, 13, 3, 16)
    c, s = cos[None, :, None], sin[None, :, None]
    assert select_provider("rope", x, c, s, "interleaved").name == "native"
    out = ops.rope(x, c, s, "interleaved")
    assert torch_npu.calls == [] and torch.equal(out, rope_native(x, c, s, "interleaved"))
    ops.rope(x, c, s, "half")
    assert torch_npu.names() == ["npu_rotary_mul"] and "rotary_mode" not in torch_npu.calls[0][1]
    assert torch_npu.calls[0][1].keys() == {"self", "r1", "r2"}


@pytest.mark.parametrize("version", ["7.0.0", NEWEST])
@pytest.mark.parametrize("variant", ["old_soc", "jit_compile", "no_aclnn"])
def test_rope_acl_op_path_is_half_only_with_d128(npu_factory, version, variant):
    """SoC before 910B1, jit_compile=True or a CANN without aclnnRotaryPositionEmbedding: torch_npu
    runs acl_op::npu_rotary_mul, which raises for "interleave" (documented: half, D == 128)."""
    kw = {"old_soc": dict(soc=OLD_SOC), "jit_compile": dict(jit_compile=True),
          "no_aclnn": dict(aclnn={"aclnnRmsNorm", "aclnnAddcmul"})}[variant]
    torch_npu = npu_factory(version=version, **kw)
    cos, sin = FLUX_ROPE_13_D128
    x = _randn(1, 13, 4, 128, dtype=torch.float16)
    c, s = cos[None, :, None], sin[None, :, None]
    assert select_provider("rope", x, c, s, "interleaved").name == "native"
    ops.rope(x, c, s, "interleaved")
    assert torch_npu.calls == []
    out = ops.rope(x, c, s, "half")
    assert torch_npu.names() == ["npu_rotary_mul"] and torch_npu.calls[0][1]["rotary_mode"] == "half"
    assert torch.equal(out, rope_native(x, c, s, "half"))
    x64 = _randn(1, 13, 4, 64, dtype=torch.float16)
    assert select_provider("rope", x64, c[..., :64], s[..., :64], "half").name == "native"  # D != 128


def test_rope_outside_limits_falls_back_to_native(torch_npu):
    cos, sin = FLUX_ROPE_13_D6
    x = _randn(2, 13, 3, 6)
    ops.rope(x, cos[None, :, None], sin[None, :, None], "interleaved")  # supported
    x3 = _randn(13, 3, 6)  # 3-D: not handled by this provider
    out = ops.rope(x3, cos[:, None], sin[:, None], "interleaved")
    big = _randn(40, 13, 25, 6)  # B*N = 1000: interleave limit
    ops.rope(big, cos[None, :, None], sin[None, :, None], "interleaved")
    assert torch_npu.names() == ["npu_rotary_mul"]
    assert out.shape == x3.shape
    assert select_provider("rope", big, cos[None, :, None], sin[None, :, None], "interleaved").name == "native"
    assert select_provider("rope", big, cos[None, :, None], sin[None, :, None], "half").name == "npu"


# ----------------------------------------------------------------------------- gelu
def test_gelu_tanh_calls_npu_gelu_tanh_but_is_not_auto(torch_npu):
    x = _randn(2, 13, 77)
    out = ops.gelu_tanh(x)
    assert torch_npu.names() == ["npu_gelu"] and torch_npu.calls[0][1]["approximate"] == "tanh"
    assert torch.equal(out, F.gelu(x, approximate="tanh"))
    assert auto_provider("gelu_tanh", "npu") is None and auto_provider("rms_norm", "npu").name == "npu"


def test_fast_gelu_calls_npu_fast_gelu(torch_npu):
    x = _randn(2, 13, 77, dtype=torch.float16)
    out = ops.fast_gelu(x)
    assert torch_npu.names() == ["npu_fast_gelu"] and out.dtype == x.dtype
    assert_close(out, ascend_kernels.ops.gelu.fast_gelu_native(x), msg="npu fast_gelu vs native")


# ----------------------------------------------------------------------------- mul_add
MUL_ADD_CASES = {
    "flux_bf16": ((2, 1, 96), torch.bfloat16, (2, 64, 96), torch.bfloat16, (2, 64, 96), torch.bfloat16),
    "wan_mixed": ((2, 1, 96), torch.float32, (2, 64, 96), torch.bfloat16, (2, 64, 96), torch.float32),
    "gate_second": ((2, 64, 96), torch.bfloat16, (2, 1, 96), torch.bfloat16, (2, 64, 96), torch.bfloat16),
    "fp16_fp32_residual": ((2, 1, 96), torch.float16, (2, 64, 96), torch.float16, (2, 64, 96), torch.float32),
}


@pytest.mark.parametrize("case", list(MUL_ADD_CASES))
def test_mul_add_is_one_addcmul_with_eager_promotion(torch_npu, case):
    xs, xd, ys, yd, zs, zd = MUL_ADD_CASES[case]
    x, y, z = _randn(*xs, dtype=xd), _randn(*ys, dtype=yd, seed=1), _randn(*zs, dtype=zd, seed=2)
    name, out, counter = _run(torch_npu, "mul_add", x, y, z)
    assert name == "npu" and counter.ops == ["aten.addcmul"] and counter.count() == 1
    assert out.dtype == (x * y + z).dtype and out.shape == (x * y + z).shape
    assert_close(out, mul_add_native(x, y, z), msg=f"npu mul_add ({case}) vs native")


def test_mul_add_passes_the_full_shape_factor_as_tensor2(torch_npu):
    # aclnnAddcmul takes its AxpyV2 kernel when tensor2 broadcasts to self (aclnn_addcmul.cpp).
    gate, y, z = _randn(2, 1, 8), _randn(2, 5, 8, seed=1), _randn(2, 5, 8, seed=2)
    seen = []
    orig = torch.addcmul
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "addcmul", lambda s, t1, t2: seen.append((s, t1, t2)) or orig(s, t1, t2))
        ops.mul_add(gate, y, z)
        ops.mul_add(y, gate, z)
    assert all(s is z and t1 is gate and t2 is y for s, t1, t2 in seen) and len(seen) == 2


@pytest.mark.parametrize("variant", ["jit_compile", "no_aclnn"])
def test_mul_add_mixed_dtypes_need_aclnn(npu_factory, variant):
    """acl_op addcmul returns self's dtype: mixed dtypes would not promote like eager."""
    npu_factory(**({"jit_compile": True} if variant == "jit_compile" else {"aclnn": {"aclnnRmsNorm"}}))
    gate, y, res = _randn(2, 1, 8, dtype=torch.float32), _randn(2, 5, 8, seed=1), _randn(2, 5, 8, dtype=torch.float32, seed=2)
    assert select_provider("mul_add", gate, y, res).name == "native"
    assert select_provider("mul_add", gate.bfloat16(), y, res.bfloat16()).name == "npu"  # one dtype: fine


def test_mul_add_unproven_forms_go_native(torch_npu):
    a, b = _randn(2, 5, 8), _randn(2, 5, 8, dtype=torch.float16, seed=1)
    assert select_provider("mul_add", a, b, a.float()).name == "native"  # fp16 x bf16: undocumented
    assert select_provider("mul_add", torch.tensor(2.0), a, a).name == "native"  # zero-dim operand
    assert select_provider("mul_add", a.double(), a.double(), a.double()).name == "native"  # fp64


# ----------------------------------------------------------------------------- adaln
def test_adaln_flux_form_is_one_mindiesd_call(mindiesd, torch_npu):
    x, scale, shift = _randn(2, 13, 64), _randn(2, 64, seed=1), _randn(2, 64, seed=2)
    args = (x, scale[:, None], shift[:, None], 1e-6, None, None, torch.bfloat16)  # as the pass calls it
    name, out, counter = _run(torch_npu, "adaln_modulate", *args)
    assert name == "npu" and counter.ops == ["mindiesd.adaln"] and counter.count() == 1
    call = mindiesd[0]
    assert call["x"] is x and call["epsilon"] == 1e-6 and call["weight"] is None and call["bias"] is None
    assert_close(out, adaln_modulate_native(*args), msg="npu adaln (flux) vs native")


def test_adaln_wan_form_computes_in_fp32(mindiesd, torch_npu):
    """Wan: bf16 x, fp32 scale/shift (B, 1, D), the eager code computes in fp32 and casts back.
    The kernel needs one dtype: it runs in fp32 on an upcast x (3 calls), never on rounded
    modulation."""
    x, scale, shift = _randn(2, 13, 64), _randn(2, 1, 64, dtype=torch.float32, seed=1), _randn(2, 1, 64, dtype=torch.float32, seed=2)
    args = (x, scale, shift, 1e-6, None, None, torch.bfloat16)
    name, out, counter = _run(torch_npu, "adaln_modulate", *args)
    assert name == "npu" and counter.ops == ["aten._to_copy", "mindiesd.adaln", "aten._to_copy"]
    call = mindiesd[0]
    assert call["x"].dtype == torch.float32 and call["scale"] is scale and call["shift"] is shift
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, adaln_modulate_native(*args))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_adaln_per_token_modulation_is_one_call_on_rows(mindiesd, torch_npu, dtype):
    """Per-token scale/shift [B, S, H] (Wan 2.2 TI2V, Qwen-Image-Edit) are outside the kernel's
    [B.., H] / [B.., 1, H] contract: every token becomes a batch entry, x [B*S, 1, H] and
    scale/shift [B*S, H], one call; the result is x's shape and the native provider's numerics."""
    x, scale, shift = _randn(2, 13, 64, dtype=dtype), _randn(2, 13, 64, dtype=dtype, seed=1), _randn(2, 13, 64, dtype=dtype, seed=2)
    args = (x, scale, shift, 1e-6, None, None, None)
    name, out, counter = _run(torch_npu, "adaln_modulate", *args)
    assert name == "npu" and counter.ops == ["mindiesd.adaln"]  # the reshapes are views
    call = mindiesd[0]
    assert tuple(call["x"].shape) == (26, 1, 64) and tuple(call["scale"].shape) == tuple(call["shift"].shape) == (26, 64)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close(out, adaln_modulate_native(*args), msg="npu adaln (per token) vs native")


def test_adaln_per_token_wan_ti2v_form(mindiesd, torch_npu):
    """Wan 2.2 TI2V: bf16 x, fp32 per-token modulation, fp32 compute cast back: rows in fp32."""
    x = _randn(1, 13, 64)
    scale, shift = _randn(1, 13, 64, dtype=torch.float32, seed=1), _randn(1, 13, 64, dtype=torch.float32, seed=2)
    args = (x, scale, shift, 1e-6, None, None, torch.bfloat16)
    name, out, counter = _run(torch_npu, "adaln_modulate", *args)
    assert name == "npu" and counter.ops == ["aten._to_copy", "mindiesd.adaln", "aten._to_copy"]
    assert mindiesd[0]["x"].dtype == torch.float32 and tuple(mindiesd[0]["x"].shape) == (13, 1, 64)
    assert torch.equal(out, adaln_modulate_native(*args))


def test_adaln_per_token_with_a_per_sample_shift(mindiesd, torch_npu):
    # a per-token scale and a per-sample shift: the shift is laid out per token too (one copy)
    x, scale, shift = _randn(2, 13, 64), _randn(2, 13, 64, seed=1), _randn(2, 64, seed=2)
    args = (x, scale, shift, 1e-6, None, None, None)
    name, out, _ = _run(torch_npu, "adaln_modulate", *args)
    assert name == "npu" and len(mindiesd) == 1 and tuple(mindiesd[0]["shift"].shape) == (26, 64)
    assert_close(out, adaln_modulate_native(*args), msg="npu adaln (per-token scale, per-sample shift) vs native")


def test_adaln_standin_enforces_the_modulation_contract(torch_npu):
    # The stand-in refuses what the kernel's contract refuses: per-token modulation unreshaped.
    x = _randn(2, 13, 64)
    with mindiesd_standin():
        with pytest.raises(AssertionError, match="scale/shift"):
            torch.ops.mindiesd.adaln(x, _randn(2, 13, 64, seed=1), _randn(2, 13, 64, seed=2))
        with pytest.raises(AssertionError, match="one dtype|x's dtype"):
            torch.ops.mindiesd.adaln(x, _randn(2, 64, dtype=torch.float32), _randn(2, 64, dtype=torch.float32))
        torch.ops.mindiesd.adaln(x.reshape(26, 1, 64), _randn(26, 64, seed=1), _randn(26, 64, seed=2))  # accepted


def test_adaln_outside_the_kernel_contract_goes_native(npu_factory):
    npu_factory()
    x, s = _randn(2, 13, 64), _randn(2, 64, seed=1)
    with mindiesd_standin() as calls:
        assert select_provider("adaln_modulate", x, s, s, 1e-6, None, None, None).name == "npu"  # [B, H]
        larger = _randn(3, 13, 64, seed=3)  # would enlarge x: no modulation of x
        assert select_provider("adaln_modulate", x, larger, larger, 1e-6, None, None, None).name == "native"
        assert select_provider("adaln_modulate", x, s.double(), s.double(), 1e-6, None, None, None).name == "native"
        assert calls == []
    npu_factory(soc=OLD_SOC)  # AdaLayerNorm: Atlas A2/A3 only
    with mindiesd_standin():
        assert select_provider("adaln_modulate", x.half(), s.half(), s.half(), 1e-6, None, None, None).name == "native"


# ----------------------------------------------------------------------------- swiglu
def test_swiglu_packed_is_one_npu_swiglu_call(torch_npu):
    h = _randn(2, 13, 2 * 77)
    name, out, counter = _run(torch_npu, "swiglu", h, None, -1)
    assert name == "npu" and counter.npu_calls() == ["npu_swiglu"] and counter.count() == 1
    call = torch_npu.calls[0][1]
    assert call["input"] is h and call["dim"] == -1
    assert out.dtype == torch.bfloat16 and out.shape == (2, 13, 77)
    assert torch.equal(out, swiglu_native(h))  # silu of the FIRST half: the op's packed layout


def test_swiglu_packed_non_contiguous_is_made_contiguous(torch_npu):
    h = _randn(2, 2 * 77, 13).transpose(1, 2)  # the kernel rejects non-contiguous input (the stand-in too)
    name, out, counter = _run(torch_npu, "swiglu", h, None, -1)
    assert name == "npu" and counter.npu_calls() == ["npu_swiglu"] and counter.ops == ["aten.clone"]
    assert torch.equal(out, swiglu_native(h))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_swiglu_two_tensors_concatenated_in_low_precision(torch_npu, dtype):
    """A separate gate (HiDream) or diffusers' gate-second halves: one copy into the [gate, up]
    layout, then one kernel (2 calls, the fp32 composite would be 5)."""
    h = _randn(2, 13, 2 * 77, dtype=dtype)
    up, gate = h.chunk(2, -1)
    name, out, counter = _run(torch_npu, "swiglu", gate, up, -1)
    assert name == "npu" and counter.ops == ["aten.cat"] and counter.npu_calls() == ["npu_swiglu"]
    assert torch.equal(torch_npu.calls[0][1]["input"], torch.cat((gate, up), -1))
    assert torch.equal(out, swiglu_native(gate, up))


def test_swiglu_outside_the_kernel_contract_goes_native(npu_factory):
    npu_factory()
    g, u = _randn(2, 13, 77, dtype=torch.float32), _randn(2, 13, 77, dtype=torch.float32, seed=1)
    assert select_provider("swiglu", g, u, -1).name == "native"  # fp32 composite: no casts, no copy
    assert select_provider("swiglu", torch.cat((g, u), -1), None, -1).name == "npu"  # packed fp32: one call
    h = _randn(2, 13, 154)
    assert select_provider("swiglu", h.double(), None, -1).name == "native"  # fp64
    assert select_provider("swiglu", torch.empty(0, 154, dtype=torch.bfloat16), None, -1).name == "native"  # empty
    assert select_provider("swiglu", torch.empty(*(1,) * 8, 2, dtype=torch.bfloat16), None, -1).name == "native"  # 9 dims
    for kw in (dict(soc=OLD_SOC), dict(aclnn=ALL_ACLNN - {"aclnnSwiGlu"})):
        npu_factory(**kw)
        assert select_provider("swiglu", h, None, -1).name == "native", kw
    npu_factory(jit_compile=True)  # op_api only: jit_compile does not change the path
    assert select_provider("swiglu", h, None, -1).name == "npu"


def test_swiglu_standin_enforces_the_documented_contract(torch_npu):
    with pytest.raises(AssertionError, match="even size"):
        torch_npu.npu_swiglu(_randn(2, 13, 77))
    with pytest.raises(AssertionError, match="non-contiguous"):
        torch_npu.npu_swiglu(_randn(2, 154, 13).transpose(1, 2))
    with pytest.raises(AssertionError, match="1-8 dims"):
        torch_npu.npu_swiglu(torch.empty(0, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="unexpected keyword"):
        torch_npu.npu_swiglu(_randn(2, 8), axis=-1)


# ----------------------------------------------------------------------------- auto + env
def test_auto_on_npu_is_derived_from_the_registry(torch_npu):
    from diffusers_ascend.config import AscendConfig

    auto = AscendConfig()
    assert auto.resolved_fusions("npu") == ("rms_norm", "rope", "mul_add", "swiglu")  # not gelu_tanh
    with mindiesd_standin():
        assert auto.resolved_fusions("npu") == ("rms_norm", "rope", "adaln", "mul_add", "swiglu")
    assert AscendConfig(fusions=["gelu_tanh"]).resolved_fusions("npu") == ("gelu_tanh",)  # by name


@pytest.mark.parametrize("kw", [dict(version="6.0.0"), dict(jit_compile=True), dict(soc=OLD_SOC)],
                         ids=["op_plugin_6", "jit_compile", "old_soc"])
def test_auto_leaves_out_what_this_stack_would_run_as_a_composite(npu_factory, kw):
    """Flux/Wan rope is interleaved: a build or mode that runs only "half" gains nothing; the
    AdaLayerNorm and SwiGlu kernels exist on A2/A3 only (SwiGlu has no acl_op kernel, so
    jit_compile does not take it away)."""
    from diffusers_ascend.config import AscendConfig

    npu_factory(**kw)
    with mindiesd_standin():
        auto = AscendConfig().resolved_fusions("npu")
    assert "rope" not in auto and "rms_norm" in auto and "mul_add" in auto
    assert ("adaln" in auto) == ("soc" not in kw)
    assert ("swiglu" in auto) == ("soc" not in kw)


def _env(capsys, platform="npu"):
    from diffusers_ascend import platform as P
    from diffusers_ascend.cli import main

    # Detection is cached per process: never let it see the stand-in (it has no torch.npu).
    with pytest.MonkeyPatch.context() as mp, P.override_platform(platform):
        mp.setattr(P, "_detect", lambda: ("cpu", None))
        assert main(["env", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert main(["env"]) == 0
        return info, capsys.readouterr().out


def test_env_shows_each_provider_and_why(torch_npu, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)
    with mindiesd_standin():
        info, text = _env(capsys)
    assert info["providers"] == {op: "npu" for op in ascend_kernels.OPS}
    why = info["provider_reasons"]
    assert why["rope"].startswith("torch_npu.npu_rotary_mul, interleaved/half mode(s) via aclnn (rotary_mode keyword")
    assert "Ascend910B2" in why["rope"] and "jit_compile=False" in why["rope"]
    assert "gamma cast to x's dtype (torch_npu's doc)" in why["rms_norm"]
    assert "not in fusions='auto'" in why["gelu_tanh"] and "aclnnGelu" in why["gelu_tanh"]
    assert why["adaln_modulate"].startswith("torch.ops.mindiesd.adaln") and why["mul_add"].startswith("torch.addcmul")
    assert why["swiglu"].startswith("torch_npu.npu_swiglu (aclnnSwiGlu")
    assert info["auto_fusions"] == ["rms_norm", "rope", "adaln", "mul_add", "swiglu"]
    assert "  rope                  npu     torch_npu.npu_rotary_mul" in text and "torch_npu failed" not in text
    assert info["mindiesd"] == "installed: torch.ops.mindiesd.adaln registered"


@pytest.fixture
def mindiesd_raising_at_import(tmp_path, monkeypatch):
    """A stand-in ``mindiesd`` 3.1.0 distribution on ``sys.path`` whose import raises as MindIE SD's
    op plugin does on a torch release it was not built for (an undefined C++ symbol of torch)."""
    from ascend_kernels import npu, registry

    pkg = tmp_path / "mindiesd"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        'raise ImportError("libPTAExtensionOPS.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev")\n')
    dist = tmp_path / "mindiesd-3.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mindiesd\nVersion: 3.1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    caches = (npu._import_error, registry._imports)  # import results are cached per process
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


def test_mindiesd_raising_at_import_is_a_reason_not_an_error(torch_npu, mindiesd_raising_at_import, capsys):
    from ascend_kernels.npu import mindiesd_available

    assert not mindiesd_available() and "mindiesd" not in sys.modules
    info, text = _env(capsys)
    assert info["providers"]["adaln_modulate"] == "native" and "adaln" not in info["auto_fusions"]
    why = ("unavailable, because mindiesd 3.1.0 is installed but raised at import (ImportError: libPTAExtensionOPS.so: "
           "undefined symbol: _ZN3c1017RegisterOperatorsD1Ev): its op plugin is built for some torch releases only and "
           f"this is torch {torch.__version__}; install the MindIE SD build for this torch")
    assert info["mindiesd"] == why and why in info["provider_reasons"]["adaln_modulate"]
    assert f"mindiesd                {why}" in text
    assert info["providers"]["rms_norm"] == "npu"  # the torch_npu kernels are unaffected


def test_env_explains_fallbacks(npu_factory, capsys):
    npu_factory(version="6.0.0", jit_compile=True)
    info, _ = _env(capsys)
    assert info["providers"]["rope"] == "npu"  # half mode still runs on torch_npu
    assert "no rotary_mode keyword (op-plugin < 7.0.0)" in info["provider_reasons"]["rope"]
    assert "interleaved (Flux/Wan) falls back to native" in info["provider_reasons"]["rope"]
    assert "not in fusions='auto'" in info["provider_reasons"]["rope"] and "rope" not in info["auto_fusions"]
    assert "gamma cast to x's dtype" in info["provider_reasons"]["rms_norm"]
    assert info["providers"]["adaln_modulate"] == "native"
    assert "unavailable, because mindiesd not installed" in info["provider_reasons"]["adaln_modulate"]
    assert info["mindiesd"] == "unavailable, because mindiesd not installed (pip install diffusers-ascend[mindiesd])"
    assert "one dtype only" in info["provider_reasons"]["mul_add"]


# ----------------------------------------------------------------------------- supports_args limits (A2, newest wheel)
def _rope_args(b, s, n, d, dtype=torch.bfloat16):
    return torch.empty(b, s, n, d, dtype=dtype), torch.empty(1, s, 1, d), torch.empty(1, s, 1, d)


def test_npu_rope_supports_args_limits(torch_npu):
    ok = _rope_args(2, 13, 24, 128)
    assert npu_kernels.rope_supports(*ok, "interleaved") and npu_kernels.rope_supports(*ok, "half")
    # cos/sin given as (S, D) pad to 1S1D; BNSD with 11SD too.
    assert npu_kernels.rope_supports(ok[0], torch.empty(13, 1, 128), torch.empty(13, 1, 128), "interleaved")
    assert npu_kernels.rope_supports(torch.empty(2, 24, 13, 128), torch.empty(13, 128), torch.empty(13, 128), "interleaved")
    assert not npu_kernels.rope_supports(*_rope_args(2, 13, 24, 77), "interleaved")  # odd D
    assert not npu_kernels.rope_supports(*_rope_args(2, 13, 24, 896), "interleaved")  # D >= 896
    assert not npu_kernels.rope_supports(*_rope_args(40, 13, 25, 64), "interleaved")  # B*N = 1000
    assert npu_kernels.rope_supports(*_rope_args(40, 13, 25, 64), "half")  # half: B, N < 1000 each
    assert not npu_kernels.rope_supports(*_rope_args(2, 13, 24, 64, torch.float64), "half")  # fp64
    x3 = torch.empty(13, 24, 64)
    assert not npu_kernels.rope_supports(x3, torch.empty(13, 1, 64), torch.empty(13, 1, 64), "half")  # 3-D x
    # Per-batch cos (BS1D) only in half mode.
    bs1d = (torch.empty(2, 13, 24, 64), torch.empty(2, 13, 1, 64), torch.empty(2, 13, 1, 64))
    assert npu_kernels.rope_supports(*bs1d, "half") and not npu_kernels.rope_supports(*bs1d, "interleaved")


def test_npu_rms_norm_and_gelu_supports_args_limits(torch_npu):
    x = torch.empty(2, 13, 77, dtype=torch.bfloat16)
    assert npu_kernels.rms_norm_supports(x, torch.empty(77), 1e-6, None)
    assert npu_kernels.rms_norm_supports(x, None, 1e-6, torch.bfloat16)
    assert not npu_kernels.rms_norm_supports(x, None, 1e-6, torch.float32)  # wider out_dtype
    assert not npu_kernels.rms_norm_supports(torch.empty(77), None, 1e-6, None)  # 1-D: kernel needs 2-8 dims
    assert not npu_kernels.rms_norm_supports(x.double(), None, 1e-6, None)
    assert not npu_kernels.rms_norm_supports(x, torch.empty(2, 77), 1e-6, None)
    assert npu_kernels.gelu_supports(x) and not npu_kernels.gelu_supports(x.double())
    assert not npu_kernels.gelu_supports(torch.empty((1,) * 9))


# ----------------------------------------------------------------------------- misc
def test_use_providers_native_bypasses_npu(torch_npu):
    x = _randn(2, 13, 77)
    with use_providers(rms_norm="native", gelu_tanh="native", mul_add="native"):
        ops.rms_norm(x, None, 1e-6)
        ops.gelu_tanh(x)
        with KernelCounter(torch_npu) as counter:
            ops.mul_add(x, x, x)
    assert torch_npu.calls == [] and "aten.addcmul" not in counter.ops


def test_backward_uses_native_vjp(torch_npu):
    x = _randn(2, 13, 16, dtype=torch.float32).requires_grad_()
    ops.rms_norm(x, None, 1e-6).sum().backward()
    assert torch_npu.names() == ["npu_rms_norm"]  # forward only: backward is the composite's vjp
    ref = x.detach().clone().requires_grad_()
    F.rms_norm(ref, (16,), None, 1e-6).sum().backward()
    assert_close(x.grad, ref.grad, msg="grad through the npu forward")


def test_explain_names_the_native_reason_on_cpu():
    assert explain("rope", "cpu") == ("native", "the PyTorch reference composite (no kernel provider runs on 'cpu')")
