"""The npu provider checks of ``test_npu_contract.py`` against real torch_npu on an Ascend NPU.

Run on a 910B host with ``pytest -m npu tests/kernels/test_npu_hardware.py``; skipped elsewhere
(``tests/conftest.py`` skips ``@pytest.mark.npu`` tests without torch_npu and a device).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ascend_kernels  # noqa: F401
from ascend_kernels.ops.gelu import fast_gelu_native
from ascend_kernels.ops.rms_norm import rms_norm_native
from ascend_kernels.ops.rope import rope_native
from ascend_kernels.registry import available_providers, select_provider
from ascend_kernels.testing import assert_close

pytestmark = pytest.mark.npu
ops = torch.ops.ascend_kernels
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _randn(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_npu_providers_available():
    for op in ("rms_norm", "rope", "gelu_tanh", "fast_gelu"):
        assert available_providers(op, "npu")[0] == "npu"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(dtype, with_weight):
    x, w = _randn(2, 13, 77, dtype=dtype), _randn(77, dtype=torch.float32, seed=1) if with_weight else None
    xn, wn = x.npu(), (w.npu() if w is not None else None)
    assert select_provider("rms_norm", xn, wn, 1e-6, None).name == "npu"
    out = ops.rms_norm(xn, wn, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    # The kernel takes gamma in x's dtype: compare with the reference on that weight.
    ref = rms_norm_native(x, w.to(dtype) if w is not None else None, 1e-6)
    assert_close(out.cpu(), ref, msg="npu_rms_norm vs native")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("x_layout", ["BSND", "BNSD"])
def test_rope(dtype, layout, x_layout):
    theta = _randn(13, 64, dtype=torch.float32, seed=2)
    cos, sin = theta.cos(), theta.sin()
    if layout == "interleaved":  # Flux/Wan tables: each angle twice
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    else:
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    if x_layout == "BSND":
        x, c, s = _randn(2, 13, 3, 128, dtype=dtype), cos[None, :, None], sin[None, :, None]
    else:
        x, c, s = _randn(2, 3, 13, 128, dtype=dtype), cos[None, None], sin[None, None]
    assert select_provider("rope", x.npu(), c.npu(), s.npu(), layout).name == "npu"
    out = ops.rope(x.npu(), c.npu(), s.npu(), layout)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out.cpu(), rope_native(x, c.to(dtype), s.to(dtype), layout), msg="npu_rotary_mul vs native")


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_and_fast_gelu(dtype):
    x = _randn(2, 13, 77, dtype=dtype) * 3
    out = ops.gelu_tanh(x.npu())
    assert_close(out.cpu(), F.gelu(x.float(), approximate="tanh").to(dtype), msg="npu_gelu(tanh)")
    fast = ops.fast_gelu(x.npu())
    assert_close(fast.cpu(), fast_gelu_native(x), msg="npu_fast_gelu")


def test_adaln_and_mul_add_run_on_npu():
    x = _randn(2, 13, 16, dtype=torch.bfloat16).npu()
    scale, shift = _randn(2, 16, dtype=torch.bfloat16).npu(), _randn(2, 16, dtype=torch.bfloat16, seed=1).npu()
    out = ops.adaln_modulate(x, scale, shift, 1e-6)
    ref = ascend_kernels.ops.adaln.adaln_modulate_native(x.cpu(), scale.cpu(), shift.cpu(), 1e-6)
    assert_close(out.cpu(), ref, msg="adaln on npu")
    assert_close(ops.mul_add(x, x, x).cpu(), (x * x + x).cpu(), msg="mul_add on npu")
