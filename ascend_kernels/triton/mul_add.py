"""Triton kernel of ``ascend_kernels::mul_add``: ``x * y + z`` with broadcasting, fp32 math.

Semantics of `ascend_kernels.ops.mul_add.mul_add_native`: the output has the broadcast shape of
the three operands and eager's promoted dtype of ``x * y + z`` (Wan's bf16 ``y`` times an fp32
gate plus an fp32 residual is fp32); each operand is loaded in its own dtype through its
broadcast strides (the ``(B, 1, D)`` gate is never expanded) and the math is fp32. Limits:
`ascend_kernels.triton.limits.mul_add_supports`.

Tuning: purely elementwise, so tiles are rows x column blocks (up to 1024 columns, 4096 elements)
and long rows are split across programs. Ascend: the grid is the number of vector cores; three
input tiles and the output in fp32 (4 x 16 KB) fit the 192 KB unified buffer with double
buffering; column blocks are multiples of 32 bytes, so row segments start 32-byte aligned when
the row length is a multiple of 16 elements (3072, 5120).

Batch tiles (Ascend): a per-batch gate ``(B, 1, D)`` with ``B > 1`` (Flux with two images a
prompt, SD3 under a batched CFG) is not flat: a row tile finds its rows' gate row as ``row // S``,
which triton-ascend's adapter moves one DMA per row (``DiscreteMemAccess``). On
`_common.AFFINE_TILE_DEVICES`, where the rows split into batches within which, and from which to the
next, every operand is evenly spaced (`_common.batch_split`), `_mul_add_batches_kernel` walks tiles
within one batch: every operand's address is affine in the tile's rows (the gate's row stride is 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.mul_add import result_dtype
from . import _common
from ._common import row_coords, row_offsets
from .limits import broadcast_shape

__all__ = ["mul_add", "plan_mul_add"]

_MAX_BLOCK_C = 1024


@triton.jit
def _mul_add_kernel(
    x_ptr,
    y_ptr,
    z_ptr,
    out_ptr,
    n_rows,
    n1,
    n2,
    d,
    xs0,
    xs1,
    xs2,
    xsd,
    ys0,
    ys1,
    ys2,
    ysd,
    zs0,
    zs1,
    zs2,
    zsd,
    X_FLAT: tl.constexpr,
    Y_FLAT: tl.constexpr,
    Z_FLAT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    n_cblocks = tl.cdiv(d, BLOCK_C)
    n_tiles = tl.cdiv(n_rows, BLOCK_R) * n_cblocks
    for tile in range(pid, n_tiles, tl.num_programs(0)):
        rblk = tile // n_cblocks
        cols = (tile % n_cblocks) * BLOCK_C + tl.arange(0, BLOCK_C)
        rmask, rows, i0, i1, i2 = row_coords(rblk, n_rows, n1, n2, BLOCK_R)
        mask = rmask[:, None] & (cols < d)[None, :]
        x = tl.load(
            x_ptr + row_offsets(rows, i0, i1, i2, xs0, xs1, xs2, X_FLAT) + cols[None, :] * xsd, mask=mask, other=0.0
        )
        y = tl.load(
            y_ptr + row_offsets(rows, i0, i1, i2, ys0, ys1, ys2, Y_FLAT) + cols[None, :] * ysd, mask=mask, other=0.0
        )
        z = tl.load(
            z_ptr + row_offsets(rows, i0, i1, i2, zs0, zs1, zs2, Z_FLAT) + cols[None, :] * zsd, mask=mask, other=0.0
        )
        out = x.to(tl.float32) * y.to(tl.float32) + z.to(tl.float32)
        o_off = (rows * d)[:, None] + cols[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mul_add_batches_kernel(
    x_ptr,
    y_ptr,
    z_ptr,
    out_ptr,
    n_batches,
    batch_rows,
    d,
    xs_batch,
    xs_row,
    xsd,
    ys_batch,
    ys_row,
    ysd,
    zs_batch,
    zs_row,
    zsd,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # Row j of batch b: an operand's starts at b * s_batch + j * s_row, the output's at
    # (b * batch_rows + j) * d. A tile is BLOCK_R rows of one batch by BLOCK_C columns.
    pid = tl.program_id(0)
    n_cblocks = tl.cdiv(d, BLOCK_C)
    tiles_per_batch = tl.cdiv(batch_rows, BLOCK_R)
    for tile in range(pid, n_batches * tiles_per_batch * n_cblocks, tl.num_programs(0)):
        rblk = tile // n_cblocks
        cols = (tile % n_cblocks) * BLOCK_C + tl.arange(0, BLOCK_C)
        batch = (rblk // tiles_per_batch).to(tl.int64)
        j = (rblk % tiles_per_batch) * BLOCK_R + tl.arange(0, BLOCK_R)
        mask = (j < batch_rows)[:, None] & (cols < d)[None, :]
        x = tl.load(x_ptr + batch * xs_batch + (j * xs_row)[:, None] + cols[None, :] * xsd, mask=mask, other=0.0)
        y = tl.load(y_ptr + batch * ys_batch + (j * ys_row)[:, None] + cols[None, :] * ysd, mask=mask, other=0.0)
        z = tl.load(z_ptr + batch * zs_batch + (j * zs_row)[:, None] + cols[None, :] * zsd, mask=mask, other=0.0)
        out = x.to(tl.float32) * y.to(tl.float32) + z.to(tl.float32)
        o_off = ((batch * batch_rows + j) * d)[:, None] + cols[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=mask)


def mul_add(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``ascend_kernels::mul_add`` (same signature and semantics) as one Triton kernel."""
    out, launch = plan_mul_add(x, y, z)
    launch()
    return out


def plan_mul_add(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, _common.Launch]:
    """The output (allocated, not written) and the launch that fills it."""
    shape = broadcast_shape(x.shape, y.shape, z.shape)
    if shape is None:
        raise ValueError(f"mul_add: shapes {tuple(x.shape)}, {tuple(y.shape)}, {tuple(z.shape)} do not broadcast")
    out = torch.empty(shape, dtype=result_dtype(x, y, z), device=x.device)
    d = shape[-1]
    sizes = _common.lead3(shape, out.stride())[0]
    leads, lasts, flat = zip(*(_common.operand_strides(t, shape) for t in (x, y, z)))
    n_rows = out.numel() // d
    block_c = min(_common.block(d), _MAX_BLOCK_C)
    block_r = _common.rows_per_tile(block_c, x.device.type)
    if x.device.type in _common.AFFINE_TILE_DEVICES and not all(flat):
        split = _common.batch_split(sizes, leads)
        if split is not None:
            n_batches, batch_rows, batch_strides = split
            n_tiles = n_batches * _common.cdiv(batch_rows, block_r) * _common.cdiv(d, block_c)
            return out, _common.Launch(
                _mul_add_batches_kernel,
                _common.grid(n_tiles, x.device),
                (
                    x,
                    y,
                    z,
                    out,
                    n_batches,
                    batch_rows,
                    d,
                    *(s for (bs, rs), last in zip(batch_strides, lasts) for s in (bs, rs, last)),
                ),
                dict(BLOCK_R=block_r, BLOCK_C=block_c),
                _common.num_warps(block_r * block_c),
                _common.options(x.device),
            )
    strides = [s for lead, last in zip(leads, lasts) for s in (*lead, last)]
    n_tiles = _common.cdiv(n_rows, block_r) * _common.cdiv(d, block_c)
    return out, _common.Launch(
        _mul_add_kernel,
        _common.grid(n_tiles, x.device),
        (x, y, z, out, n_rows, *sizes[1:], d, *strides),
        dict(X_FLAT=flat[0], Y_FLAT=flat[1], Z_FLAT=flat[2], BLOCK_R=block_r, BLOCK_C=block_c),
        _common.num_warps(block_r * block_c),
        _common.options(x.device),
    )
