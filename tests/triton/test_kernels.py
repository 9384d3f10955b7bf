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

from ..kernels.conftest import flux_rope, wan_rope
from .cases import CASES, ROW_REDUCTION_CASES, ascend_tiling, rows_in_chunks
from .conftest import randn

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


@pytest.fixture(params=["row_tiles", "affine_tiles"])
def tiles(request):
    """A kernel test twice: with the row tiles CUDA plans, and with Ascend's tiles (rope's and
    rms_norm's token tiles, adaLN's and mul_add's batch tiles) where the operands allow them
    (`_common.AFFINE_TILE_DEVICES` widened to ``"cpu"``)."""
    if request.param == "row_tiles":
        yield request.param
        return
    with ascend_tiling("cpu"):
        yield request.param


@pytest.mark.parametrize("case", list(CASES["rms_norm"]))
def test_rms_norm(dtype, case, tiles):
    _check("rms_norm", CASES["rms_norm"][case](dtype, "cpu"), f"rms_norm {case} ({tiles})")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(CASES["rope"]))
def test_rope(dtype, case, layout, tiles):
    _check("rope", (*CASES["rope"][case](dtype, "cpu"), layout), f"rope {layout} {case} ({tiles})")


@pytest.mark.parametrize("case", list(CASES["adaln_modulate"]))
def test_adaln_modulate(dtype, case, tiles):
    _check("adaln_modulate", CASES["adaln_modulate"][case](dtype, "cpu"), f"adaln_modulate {case} ({tiles})")


@pytest.mark.parametrize(
    "op,case", [(op, c) for op, c in ROW_REDUCTION_CASES if c != "batches_span_tiles"]
)  # 140 rows: 10 s a dtype, nothing new
def test_reductions_in_row_chunks(op, case, dtype, monkeypatch):
    """Ascend's chunked reduction of rows wider than one tile (`_common.ROW_TILE_LIMIT`: 4096 there,
    here half the case's row so that it takes 2-8 chunks): every case, also the batched, sliced and
    broadcast ones."""
    from ascend_kernels.triton import planner

    args = CASES[op][case](dtype, "cpu")
    rows_in_chunks(monkeypatch, args)
    kernel = planner(op)(*args)[1].kernel.__name__
    assert kernel == {"rms_norm": "_rms_norm_chunks_kernel", "adaln_modulate": "_adaln_chunks_kernel"}[op]
    _check(op, args, f"{op} {case} (row chunks)")


@pytest.mark.parametrize("case", list(CASES["mul_add"]))
def test_mul_add(dtype, case, tiles):
    args = CASES["mul_add"][case](dtype, "cpu")
    out = _check("mul_add", args, f"mul_add {case} ({tiles})")
    assert out.dtype == (args[0] * args[1] + args[2]).dtype  # eager's promotion


# Per op: its row-tile kernel, Ascend's kernel, and the cases whose operands take Ascend's. rms_norm:
# x whose rows are not evenly spaced (any strides; a tile is affine in each leading index). Rope:
# tables that vary by batch and token only, broadcast over the heads (x token- or heads-major).
# adaLN: one modulation row per batch of rows. mul_add: an operand per batch, every operand evenly
# spaced within a batch and across batches. Not taken: every operand flat already (one table or
# modulation row for every row, per-token modulation, scalars and last-dim broadcasts), and an
# adaLN/mul_add operand shared by a batch of 2 whose rows vary within it (its rows wrap).
ASCEND_TILES = {
    "rms_norm": (
        "_rms_norm_kernel",
        "_rms_norm_tokens_kernel",
        {"gapped_rows", "fused_qkv_batch2", "fused_qkv_many_heads", "heads_major_token_slice"},
    ),
    "rope": (
        "_rope_kernel",
        "_rope_tokens_kernel",
        {
            "flux_bshd_1s1d",
            "per_batch_tables",
            "three_dims_sd_tables",
            "sliced_x",
            "gapped_x",  # batch 2 with one table: a tile is tokens of one batch
            "bnsd_11sd_batch3",
        },
    ),  # heads-major x: the heads are dim 1
    "adaln_modulate": (
        "_adaln_kernel",
        "_adaln_batches_kernel",
        {
            "flux_bd_chunks_batch3",
            "wan_b1d_fp32_out",
            "batches_span_tiles",
            "four_dims_b11d",
            # gapped x: the gaps fall between batches, rows within one are evenly spaced
            "gapped_x",
            "gapped_x_shared_mod",
        },
    ),
    "mul_add": (
        "_mul_add_kernel",
        "_mul_add_batches_kernel",
        {
            "gate_b1d_batch3",
            "residual_first_gate_bd",
            "wan_mixed_promotes_to_fp32",
            "gapped_x_and_residual",
            "batches_span_tiles",
        },
    ),
}


@pytest.mark.parametrize(
    "op,case,layout",
    [
        (op, case, layout)
        for op in ASCEND_TILES
        for case in CASES[op]
        for layout in (LAYOUTS if op == "rope" else (None,))
    ],
)
def test_ascend_tiles_only_where_the_operands_allow(op, case, layout):
    from ascend_kernels.triton import planner

    args = CASES[op][case](torch.bfloat16, "cpu") + ((layout,) if layout else ())
    row_kernel, ascend_kernel, ascend_cases = ASCEND_TILES[op]
    assert planner(op)(*args)[1].kernel.__name__ == row_kernel  # a device outside AFFINE_TILE_DEVICES
    with ascend_tiling("cpu"):
        launch = planner(op)(*args)[1]
    assert launch.kernel.__name__ == (ascend_kernel if case in ascend_cases else row_kernel), case


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
    assert_close(
        ops.rms_norm(x, w, 1e-6), ascend_kernels.ops.rms_norm.rms_norm_native(x.double(), w.double(), 1e-6).float()
    )
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
