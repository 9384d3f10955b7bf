"""Contract tests of the ``npu`` providers: how ``ascend_kernels`` calls torch_npu.

This is a CONTRACT test, not a hardware test. No Ascend device or torch_npu exists here, so a
stand-in ``torch_npu`` module is installed in ``sys.modules`` (only inside these tests, by a
fixture) that implements the documented semantics of each torch_npu op in plain torch, enforces
its documented argument contract (dtypes, ranks, modes, cos/sin layouts) and records every call;
the npu providers' device check is widened to "cpu" so that they are selected for CPU tensors.
The tests check argument mapping, layouts, modes, dtypes (gamma cast) and output indexing, and
that arguments outside a kernel's limits fall back to the native provider. The same checks
against real torch_npu on a device are in ``test_npu_hardware.py`` (``-m npu``).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

import ascend_kernels
from ascend_kernels import npu as npu_providers
from ascend_kernels.registry import available_providers, select_provider, use_providers
from ascend_kernels.testing import assert_close

from .conftest import flux_rope

ops = torch.ops.ascend_kernels

# Flux rope tables computed before any stand-in is installed (diffusers probes torch_npu itself).
FLUX_ROPE_13 = flux_rope(13)  # (S, 16)
FLUX_ROPE_13_D6 = flux_rope(13, axes_dim=(2, 2, 2))  # (S, 6)


class StandInTorchNpu(types.ModuleType):
    """torch_npu's documented op semantics in plain torch, asserting each op's input contract."""

    _DTYPES = (torch.float16, torch.bfloat16, torch.float32)

    def __init__(self):
        super().__init__("torch_npu")
        self.calls: list[tuple[str, dict]] = []

    def npu_rms_norm(self, x, gamma, epsilon=1e-6):
        self.calls.append(("npu_rms_norm", dict(x=x, gamma=gamma, epsilon=epsilon)))
        assert x.dtype in self._DTYPES and 2 <= x.dim() <= 8
        assert gamma.dtype == x.dtype, "npu_rms_norm: gamma must have self's dtype"
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
        return (xf * rstd * gamma.float()).to(x.dtype), rstd

    def npu_rotary_mul(self, x, r1, r2, rotary_mode="half"):
        self.calls.append(("npu_rotary_mul", dict(x=x, r1=r1, r2=r2, rotary_mode=rotary_mode)))
        assert rotary_mode in ("half", "interleave")
        assert x.dim() == 4 and r1.dim() == 4 and r2.dim() == 4
        assert x.dtype in self._DTYPES and r1.dtype == r2.dtype == x.dtype
        if rotary_mode == "half":
            x1, x2 = torch.chunk(x, 2, -1)
            x_new = torch.cat((-x2, x1), dim=-1)
        else:
            assert sum(s != 1 for s in r1.shape[:3]) <= 1, "interleave: r1/r2 must be 11SD / 1S1D / S11D"
            x1, x2 = x[..., ::2], x[..., 1::2]
            x_new = torch.stack((-x2, x1), dim=-1).flatten(-2)
        return (r1.float() * x.float() + r2.float() * x_new.float()).to(x.dtype)

    def npu_gelu(self, x, approximate="none"):
        self.calls.append(("npu_gelu", dict(x=x, approximate=approximate)))
        return F.gelu(x, approximate=approximate)

    def npu_fast_gelu(self, x):
        self.calls.append(("npu_fast_gelu", dict(x=x)))
        return (x.float() / (1 + torch.exp(-1.702 * x.float()))).to(x.dtype)  # A2/A3 formula

    def names(self):
        return [name for name, _ in self.calls]


@pytest.fixture
def torch_npu(monkeypatch):
    fake = StandInTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(npu_providers, "DEVICE_TYPES", ("npu", "cpu"))
    return fake


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_standin_is_only_installed_inside_these_tests():
    assert "torch_npu" not in sys.modules or not isinstance(sys.modules["torch_npu"], StandInTorchNpu)
    assert available_providers("rms_norm", "cpu") == ["native"]


def test_npu_provider_selected_for_its_ops(torch_npu):
    for op in ("rms_norm", "rope", "gelu_tanh", "fast_gelu"):
        assert available_providers(op, "cpu") == ["npu", "native"]
    # No torch_npu op for these: the native composite (the triton slot has no kernel).
    assert available_providers("adaln_modulate", "cpu") == ["native"]
    assert available_providers("mul_add", "cpu") == ["native"]


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_casts_gamma_and_takes_output_0(torch_npu, weight_dtype):
    x, w = _randn(2, 13, 77), _randn(77, dtype=weight_dtype, seed=1)
    out = ops.rms_norm(x, w, 1e-5)
    assert torch_npu.names() == ["npu_rms_norm"]
    call = torch_npu.calls[0][1]
    assert call["x"] is x and call["gamma"].dtype == x.dtype and call["epsilon"] == 1e-5
    assert torch.equal(call["gamma"], w.to(x.dtype))
    assert out.dtype == x.dtype and out.shape == x.shape  # y, not rstd
    assert_close(out, ascend_kernels.ops.rms_norm.rms_norm_native(x, w, 1e-5), msg="npu rms_norm vs native")


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


@pytest.mark.parametrize("layout, mode", [("interleaved", "interleave"), ("half", "half")])
def test_rope_mode_and_cos_layout(torch_npu, layout, mode):
    cos, sin = FLUX_ROPE_13  # (S, D) fp32
    x = _randn(2, 13, 3, 16)  # BSND
    c, s = cos[None, :, None], sin[None, :, None]
    out = ops.rope(x, c, s, layout)
    assert torch_npu.names() == ["npu_rotary_mul"]
    call = torch_npu.calls[0][1]
    assert call["rotary_mode"] == mode and call["x"] is x
    assert call["r1"].shape == (1, 13, 1, 16) and call["r1"].dtype == x.dtype  # 1S1D in x's dtype
    assert torch.equal(call["r1"], c.to(x.dtype)) and torch.equal(call["r2"], s.to(x.dtype))
    assert out.shape == x.shape and out.dtype == x.dtype
    # cos/sin rounded to bf16 by the kernel contract: compare at bf16 tolerance.
    assert_close(out, ascend_kernels.ops.rope.rope_native(x, c, s, layout), msg="npu rope vs native")


def test_rope_pads_cos_to_4d(torch_npu):
    x = _randn(2, 3, 13, 16)  # BNSD with cos (S, D) -> 11SD
    cos, sin = FLUX_ROPE_13
    ops.rope(x, cos, sin, "interleaved")
    assert torch_npu.calls[0][1]["r1"].shape == (1, 1, 13, 16)


def test_rope_outside_limits_falls_back_to_native(torch_npu):
    cos, sin = FLUX_ROPE_13_D6
    x = _randn(2, 13, 3, 6)
    ops.rope(x, cos[None, :, None], sin[None, :, None], "interleaved")  # supported
    x3 = _randn(13, 3, 6)  # 3-D: not supported by npu_rotary_mul
    out = ops.rope(x3, cos[:, None], sin[:, None], "interleaved")
    big = _randn(40, 13, 25, 6)  # B*N = 1000: interleave limit
    ops.rope(big, cos[None, :, None], sin[None, :, None], "interleaved")
    assert torch_npu.names() == ["npu_rotary_mul"]
    assert out.shape == x3.shape
    assert select_provider("rope", big, cos[None, :, None], sin[None, :, None], "interleaved").name == "native"
    assert select_provider("rope", big, cos[None, :, None], sin[None, :, None], "half").name == "npu"


def test_gelu_tanh_calls_npu_gelu_tanh(torch_npu):
    x = _randn(2, 13, 77)
    out = ops.gelu_tanh(x)
    assert torch_npu.names() == ["npu_gelu"] and torch_npu.calls[0][1]["approximate"] == "tanh"
    assert torch.equal(out, F.gelu(x, approximate="tanh"))


def test_fast_gelu_calls_npu_fast_gelu(torch_npu):
    x = _randn(2, 13, 77, dtype=torch.float16)
    out = ops.fast_gelu(x)
    assert torch_npu.names() == ["npu_fast_gelu"] and out.dtype == x.dtype
    assert_close(out, ascend_kernels.ops.gelu.fast_gelu_native(x), msg="npu fast_gelu vs native")


def test_adaln_and_mul_add_use_native_on_npu(torch_npu):
    x = _randn(2, 13, 16)
    ops.adaln_modulate(x, _randn(2, 16), _randn(2, 16), 1e-6)
    ops.mul_add(x, x, x)
    assert torch_npu.calls == []


def test_use_providers_native_bypasses_npu(torch_npu):
    x = _randn(2, 13, 77)
    with use_providers(rms_norm="native", gelu_tanh="native"):
        ops.rms_norm(x, None, 1e-6)
        ops.gelu_tanh(x)
    assert torch_npu.calls == []


def test_backward_uses_native_vjp(torch_npu):
    x = _randn(2, 13, 16, dtype=torch.float32).requires_grad_()
    ops.rms_norm(x, None, 1e-6).sum().backward()
    assert torch_npu.names() == ["npu_rms_norm"]  # forward only: backward is the composite's vjp
    ref = x.detach().clone().requires_grad_()
    F.rms_norm(ref, (16,), None, 1e-6).sum().backward()
    assert_close(x.grad, ref.grad, msg="grad through the npu forward")
