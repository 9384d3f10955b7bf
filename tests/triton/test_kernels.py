"""Every Triton kernel against the op's native reference, in Triton's interpreter (CPU tensors),
fp32/bf16/fp16, at odd shapes (see `cases`). Each call goes through ``torch.ops.ascend_kernels``
and must have been served by the ``triton`` provider (not the native fallback); the result must
match the native provider's in values (`ascend_kernels.testing` tolerances of the output dtype),
dtype, shape and strides (Inductor asserts the strides of a custom op's output)."""

from __future__ import annotations

import pytest
import torch

import ascend_kernels
from ascend_kernels.registry import select_provider, use_providers
from ascend_kernels.testing import assert_close

from .cases import CASES, affine_tile_devices
from .conftest import randn
from ..kernels.conftest import flux_rope, wan_rope

ops = torch.ops.ascend_kernels
LAYOUTS = ("interleaved", "half")

pytestmark = pytest.mark.usefixtures("interpreter")


def _check(op: str, args: tuple, msg: str) -> torch.Tensor:
    assert select_provider(op, *args).name == "triton", f"{msg}: the triton provider did not take the call"
    out = getattr(ops, op)(*args)
    with use_providers(**{op: "native"}):
        expected = getattr(ops, op)(*args)
    assert out.stride() == expected.stride(), f"{msg}: strides {out.stride()} vs native {expected.stride()}"
    assert_close(out, expected, msg=msg)
    return out


@pytest.mark.parametrize("case", list(CASES["rms_norm"]))
def test_rms_norm(dtype, case):
    _check("rms_norm", CASES["rms_norm"][case](dtype, "cpu"), f"rms_norm {case}")


@pytest.fixture(params=["row_tiles", "affine_tiles"])
def tiles(request):
    """A rope or adaLN test twice: with the row tiles CUDA plans, and with Ascend's tiles (rope's
    token tiles, adaLN's batch tiles) where the operands allow them (`_common.AFFINE_TILE_DEVICES`
    widened to ``"cpu"``)."""
    if request.param == "row_tiles":
        yield request.param
        return
    with affine_tile_devices("cpu"):
        yield request.param


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(CASES["rope"]))
def test_rope(dtype, case, layout, tiles):
    _check("rope", (*CASES["rope"][case](dtype, "cpu"), layout), f"rope {layout} {case} ({tiles})")


# Cases whose tables are one row per token, broadcast over the heads: token tiles on Ascend.
TOKEN_TILE_CASES = {"flux_bshd_1s1d", "per_batch_tables", "three_dims_sd_tables"}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(CASES["rope"]))
def test_rope_token_tiles_only_where_the_tables_are_per_token(case, layout):
    from ascend_kernels.triton.rope import plan_rope

    args = (*CASES["rope"][case](torch.bfloat16, "cpu"), layout)
    assert plan_rope(*args)[1].kernel.__name__ == "_rope_kernel"  # a device outside AFFINE_TILE_DEVICES
    with affine_tile_devices("cpu"):
        launch = plan_rope(*args)[1]
    # Not token tiles: heads-major x (the tables vary along the last leading dim), one table row for
    # every row (already flat), a table shared by a batch of 2 (token rows wrap), gapped x rows.
    expected = "_rope_tokens_kernel" if case in TOKEN_TILE_CASES else "_rope_kernel"
    assert launch.kernel.__name__ == expected, case


@pytest.mark.parametrize("case", list(CASES["adaln_modulate"]))
def test_adaln_modulate(dtype, case, tiles):
    _check("adaln_modulate", CASES["adaln_modulate"][case](dtype, "cpu"), f"adaln_modulate {case} ({tiles})")


# Cases with one modulation row per batch of several rows, batches evenly spaced: batch tiles on Ascend.
BATCH_TILE_CASES = {"flux_bd_chunks_batch3", "wan_b1d_fp32_out", "batches_span_tiles", "four_dims_b11d"}


@pytest.mark.parametrize("case", list(CASES["adaln_modulate"]))
def test_adaln_batch_tiles_only_where_the_modulation_is_per_batch(case):
    from ascend_kernels.triton.adaln import plan_adaln_modulate

    args = CASES["adaln_modulate"][case](torch.bfloat16, "cpu")
    assert plan_adaln_modulate(*args)[1].kernel.__name__ == "_adaln_kernel"  # outside AFFINE_TILE_DEVICES
    with affine_tile_devices("cpu"):
        launch = plan_adaln_modulate(*args)[1]
    # Not batch tiles: one token per batch (a modulation row per row: flat already), a per-token
    # scale, one modulation row for all rows (read once per program), gapped x rows, a modulation
    # shared by a batch of 2 whose rows vary within it (its rows wrap).
    expected = "_adaln_batches_kernel" if case in BATCH_TILE_CASES else "_adaln_kernel"
    assert launch.kernel.__name__ == expected, case


@pytest.mark.parametrize("case", list(CASES["mul_add"]))
def test_mul_add(dtype, case):
    args = CASES["mul_add"][case](dtype, "cpu")
    out = _check("mul_add", args, f"mul_add {case}")
    assert out.dtype == (args[0] * args[1] + args[2]).dtype  # eager's promotion


def test_rope_with_diffusers_tables(dtype, tiles):
    """The tables the models feed: Flux's FluxPosEmbed (S, D) as the fused processor broadcasts
    them, and Wan's WanRotaryPosEmbed (1, S, 1, D)."""
    cos, sin = flux_rope(13)
    x = randn(1, 13, 3, 16, dtype=dtype)
    _check("rope", (x, cos[None, :, None, :], sin[None, :, None, :], "interleaved"), "rope flux tables")
    cos, sin = wan_rope(16, frames=2, height=2, width=3)
    x = randn(1, cos.shape[1], 2, 16, dtype=dtype)
    _check("rope", (x, cos, sin, "interleaved"), "rope wan tables")


def test_fp32_results_are_fp32_exact_enough():
    """fp32 in, fp32 math: the kernels agree with the fp64 reference to fp32 precision."""
    x = randn(2, 5, 77, scale=3.0)
    w = randn(77, seed=1)
    assert_close(ops.rms_norm(x, w, 1e-6), ascend_kernels.ops.rms_norm.rms_norm_native(x.double(), w.double(), 1e-6).float())
    scale, shift = randn(2, 77, seed=2), randn(2, 77, seed=3)
    ref = ascend_kernels.ops.adaln.adaln_modulate_native(x.double(), scale.double(), shift.double(), 1e-6)
    assert_close(ops.adaln_modulate(x, scale, shift, 1e-6), ref.float())


def test_backward_is_the_native_one():
    """Forward by the kernel, backward by the native composite's VJP: gradients equal the
    all-native ones."""
    x = randn(2, 5, 40, scale=2.0).requires_grad_()
    scale, shift = randn(2, 40, seed=1).requires_grad_(), randn(2, 1, 40, seed=2).requires_grad_()
    grad = randn(2, 5, 40, seed=3)
    assert select_provider("adaln_modulate", x, scale, shift, 1e-6, None, None, None).name == "triton"
    got = torch.autograd.grad(ops.adaln_modulate(x, scale, shift, 1e-6), (x, scale, shift), grad)
    with use_providers(adaln_modulate="native"):
        want = torch.autograd.grad(ops.adaln_modulate(x, scale, shift, 1e-6), (x, scale, shift), grad)
    for g, w in zip(got, want):
        assert_close(g, w)
