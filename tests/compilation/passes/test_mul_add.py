"""The mul_add fusion (`passes/mul_add.py`): the residual gate in both orders, mixed dtypes, a
broadcast residual, and scalar operands left alone."""

from __future__ import annotations

import pytest
import torch

from .harness import DTYPES, aten, run


class Gate(torch.nn.Module):
    def __init__(self, order):
        super().__init__()
        self.order = order

    def forward(self, residual, gate, y):
        return residual + gate * y if self.order == "add_first" else gate * y + residual


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("order", ["add_first", "mul_first"])
def test_mul_add_orders(order, dtype):
    r, g, y = torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 1, 16, dtype=dtype), torch.randn(2, 5, 16, dtype=dtype)
    run(Gate(order), r, g, y, fusions=["mul_add"], dtype=dtype, expected=1, gone=[aten.mul.Tensor, aten.add.Tensor])


def test_mul_add_wan_mixed_dtypes():
    class M(torch.nn.Module):
        def forward(self, h, y, gate):
            return (h.float() + y * gate).type_as(h)

    h, y, gate = (
        torch.randn(2, 5, 16, dtype=torch.bfloat16),
        torch.randn(2, 5, 16, dtype=torch.bfloat16),
        torch.randn(2, 1, 16),
    )
    run(M(), h, y, gate, fusions=["mul_add"], dtype=torch.bfloat16, expected=1)


def test_mul_add_leaves_scalar_operands():
    class M(torch.nn.Module):
        def forward(self, x, y):
            # gelu's tanh polynomial, written out, and a scalar gate
            inner = x + x * x * x * 0.044715
            return inner * 2.0 + y

    run(M(), torch.randn(4, 16), torch.randn(4, 16), fusions=["mul_add"], dtype=torch.float32, expected=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mul_add_qwen_image_broadcast_residual(dtype):
    # FINDINGS section 5: Qwen-Image's `x + y * gate` where the residual broadcasts against the
    # product (x (B, 1, D), y (B, S, D)) false-matched MindIE SD's same-shape residual-gate
    # pattern. Here the op broadcasts like eager and every match re-checks the result's shape and
    # dtype, so the fused result is eager's.
    class M(torch.nn.Module):
        def forward(self, x, y, gate):
            return x + y * gate

    x, y, gate = (
        torch.randn(2, 1, 16, dtype=dtype),
        torch.randn(2, 5, 16, dtype=dtype),
        torch.randn(2, 1, 16, dtype=dtype),
    )
    run(M(), x, y, gate, fusions=["mul_add"], dtype=dtype, expected=1)
