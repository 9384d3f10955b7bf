"""The SwiGLU fusion (`passes/swiglu.py`): packed halves and two tensors in both operand orders,
diffusers' feed-forwards (Flux 2, SwiGLU, HiDream, Qwen-Image 2.1), look-alikes left alone, and
its place before mul_add."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F

from .harness import DTYPES, aten, run


class HalvesSwiGLU(torch.nn.Module):
    """The packed forms, gate first, written by slicing or chunking, in both operand orders."""

    def __init__(self, split, order):
        super().__init__()
        self.split, self.order = split, order

    def forward(self, h):
        if self.split == "slice":
            half = h.shape[-1] // 2
            gate, up = h[..., :half], h[..., half:]
        else:
            gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up if self.order == "silu_first" else up * F.silu(gate)


class TwoTensorSwiGLU(torch.nn.Module):
    def __init__(self, order):
        super().__init__()
        self.order = order

    def forward(self, gate, up):
        return F.silu(gate) * up if self.order == "silu_first" else up * F.silu(gate)


def _swiglu_calls(backend):
    """(x, up) of each ``ascend_kernels.swiglu`` node in the rewritten graph: up None = packed."""
    return [
        (n.args[0], n.args[1] if len(n.args) > 1 else n.kwargs.get("up"))
        for n in backend.after_graphs[-1].nodes
        if n.target == torch.ops.ascend_kernels.swiglu.default
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("order", ["silu_first", "silu_last"])
@pytest.mark.parametrize("split", ["slice", "chunk"])
def test_swiglu_packed_halves(split, order, dtype):
    h = torch.randn(2, 5, 16, dtype=dtype)
    backend = run(
        HalvesSwiGLU(split, order),
        h,
        fusions=["swiglu"],
        dtype=dtype,
        expected=1,
        gone=[aten.silu.default, aten.mul.Tensor],
    )
    ((x, up),) = _swiglu_calls(backend)
    assert up is None and x.op == "placeholder"  # one packed call on h itself: npu_swiglu's layout


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("order", ["silu_first", "silu_last"])
def test_swiglu_two_tensors(order, dtype):
    gate, up = torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 5, 16, dtype=dtype)
    backend = run(
        TwoTensorSwiGLU(order),
        gate,
        up,
        fusions=["swiglu"],
        dtype=dtype,
        expected=1,
        gone=[aten.silu.default, aten.mul.Tensor],
    )
    ((x, y),) = _swiglu_calls(backend)
    inputs = [n for n in backend.after_graphs[-1].nodes if n.op == "placeholder"]
    assert [x, y] == inputs  # silu's operand is the gate, whichever side of the product it was written on


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_flux2_feed_forward(dtype):
    # Flux 2's FFN: linear_in to 2x inner, Flux2SwiGLU (silu of the first half by slices), linear_out
    from diffusers.models.transformers.transformer_flux2 import Flux2FeedForward

    torch.manual_seed(0)
    backend = run(
        Flux2FeedForward(16, mult=2.0),
        torch.randn(2, 5, 16, dtype=dtype),
        fusions=["swiglu"],
        dtype=dtype,
        expected=1,
        gone=[aten.silu.default],
    )
    ((_, up),) = _swiglu_calls(backend)
    assert up is None


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_diffusers_gate_second_half(dtype):
    # diffusers' SwiGLU: `h, gate = proj(x).chunk(2, -1); h * silu(gate)`: the gate is the SECOND
    # half, so it is the two-tensor call on the two halves (views), gate first.
    from diffusers.models.activations import SwiGLU

    torch.manual_seed(0)
    backend = run(
        SwiGLU(16, 16),
        torch.randn(2, 5, 16, dtype=dtype),
        fusions=["swiglu"],
        dtype=dtype,
        expected=1,
        gone=[aten.silu.default, aten.mul.Tensor],
    )
    ((gate, up),) = _swiglu_calls(backend)
    assert gate.target == operator.getitem and gate.args[1] == 1  # the second chunk gates
    assert up.target == operator.getitem and up.args[1] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("model", ["hidream", "qwenimage21"])
def test_swiglu_separate_projections(model, dtype):
    # silu(w1(x)) * w3(x): HiDream's and Qwen-Image 2.1's feed-forwards, with their real modules
    from diffusers.models.transformers.transformer_hidream_image import HiDreamImageFeedForwardSwiGLU
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21SwiGLUFeedForward

    torch.manual_seed(0)
    ff = (
        HiDreamImageFeedForwardSwiGLU(16, 32, multiple_of=8)
        if model == "hidream"
        else QwenImage21SwiGLUFeedForward(16, 32)
    )
    backend = run(
        ff, torch.randn(2, 5, 16, dtype=dtype), fusions=["swiglu"], dtype=dtype, expected=1, gone=[aten.silu.default]
    )
    ((gate, up),) = _swiglu_calls(backend)
    assert up is not None and gate is not up


def test_swiglu_look_alikes_are_left_alone():
    class SiluTimesItself(torch.nn.Module):  # x * silu(x): a one-input activation
        def forward(self, x):
            return F.silu(x) * x

    class PerChannelGate(torch.nn.Module):  # silu(a) * b with b only broadcasting against a
        def forward(self, a, b):
            return F.silu(a) * b

    class ScalarGate(torch.nn.Module):
        def forward(self, a):
            return F.silu(a) * 2.0

    class OddHalves(torch.nn.Module):  # slices that do not split the last dim in two halves
        def forward(self, h):
            return F.silu(h[..., :6]) * h[..., 10:]

    x = torch.randn(2, 5, 16)
    run(SiluTimesItself(), x, fusions=["swiglu"], dtype=torch.float32, expected=0)
    run(PerChannelGate(), x, torch.randn(16), fusions=["swiglu"], dtype=torch.float32, expected=0)
    run(PerChannelGate(), torch.randn(2, 1, 16), x, fusions=["swiglu"], dtype=torch.float32, expected=0)
    run(ScalarGate(), x, fusions=["swiglu"], dtype=torch.float32, expected=0)
    backend = run(OddHalves(), x, fusions=["swiglu"], dtype=torch.float32, expected=1)
    ((_, up),) = _swiglu_calls(backend)
    assert up is not None  # not the packed call (whose halves would be [:8] and [8:]): the two slices


def test_swiglu_runs_before_mul_add():
    # silu(a) * b + c: the SwiGLU is fused, the add stays (mul_add finds no product left)
    class M(torch.nn.Module):
        def forward(self, a, b, c):
            return F.silu(a) * b + c

    a, b, c = torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    backend = run(M(), a, b, c, fusions=["swiglu", "mul_add"], dtype=torch.float32, expected=1)
    assert backend.report.matches == {"swiglu": 1, "mul_add": 0}
