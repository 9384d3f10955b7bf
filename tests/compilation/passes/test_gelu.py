"""The GELU fusions (`passes/gelu.py`): tanh-GELU, exact GELU left alone, and fast_gelu only when
named."""

from __future__ import annotations

import pytest
import torch

from ..conftest import SnapshotBackend, compile_module
from .harness import DTYPES, aten, run


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gelu_tanh(dtype):
    from diffusers.models.attention import FeedForward

    torch.manual_seed(0)
    ff = FeedForward(16, dim_out=16, activation_fn="gelu-approximate")
    run(
        ff, torch.randn(2, 5, 16, dtype=dtype), fusions=["gelu_tanh"], dtype=dtype, expected=1, gone=[aten.gelu.default]
    )


def test_gelu_exact_is_not_tanh():
    run(torch.nn.GELU(), torch.randn(4, 16), fusions=["gelu_tanh"], dtype=torch.float32, expected=0)


def test_fast_gelu_runs_only_when_named():
    x = torch.randn(4, 16)
    gelu = torch.nn.GELU(approximate="tanh")
    backend = SnapshotBackend(fusions=["fast_gelu"], executor="eager")
    with torch.no_grad():
        out = compile_module(gelu, backend)(x)
    assert backend.report.matches == {"fast_gelu": 1}
    backend.assert_fused("fast_gelu", 1, gone=[aten.gelu.default])
    torch.testing.assert_close(out, x * torch.sigmoid(1.702 * x))  # the approximation, as documented
    tanh_only = SnapshotBackend(fusions=["gelu_tanh"], executor="eager")
    with torch.no_grad():
        compile_module(gelu, tanh_only)(x)
    assert tanh_only.fused_calls("gelu_tanh") == 1
    assert torch.ops.ascend_kernels.fast_gelu.default not in tanh_only.after[-1]
