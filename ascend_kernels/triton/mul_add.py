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
    x_ptr, y_ptr, z_ptr, out_ptr,
    n_rows, n1, n2, d,
    xs0, xs1, xs2, xsd,
    ys0, ys1, ys2, ysd,
    zs0, zs1, zs2, zsd,
    X_FLAT: tl.constexpr, Y_FLAT: tl.constexpr, Z_FLAT: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    n_cblocks = tl.cdiv(d, BLOCK_C)
    n_tiles = tl.cdiv(n_rows, BLOCK_R) * n_cblocks
    for tile in range(pid, n_tiles, tl.num_programs(0)):
        rblk = tile // n_cblocks
        cols = (tile % n_cblocks) * BLOCK_C + tl.arange(0, BLOCK_C)
        rmask, rows, i0, i1, i2 = row_coords(rblk, n_rows, n1, n2, BLOCK_R)
        mask = rmask[:, None] & (cols < d)[None, :]
        x = tl.load(x_ptr + row_offsets(rows, i0, i1, i2, xs0, xs1, xs2, X_FLAT) + cols[None, :] * xsd, mask=mask, other=0.0)
        y = tl.load(y_ptr + row_offsets(rows, i0, i1, i2, ys0, ys1, ys2, Y_FLAT) + cols[None, :] * ysd, mask=mask, other=0.0)
        z = tl.load(z_ptr + row_offsets(rows, i0, i1, i2, zs0, zs1, zs2, Z_FLAT) + cols[None, :] * zsd, mask=mask, other=0.0)
        out = x.to(tl.float32) * y.to(tl.float32) + z.to(tl.float32)
        o_off = (rows * d)[:, None] + cols[None, :]
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
    (_, n1, n2), _ = _common.lead3(shape, out.stride())
    strides, flat = [], []
    for t in (x, y, z):
        lead, last, t_flat = _common.operand_strides(t, shape)
        strides += [*lead, last]
        flat.append(t_flat)
    n_rows = out.numel() // d
    block_c = min(_common.block(d), _MAX_BLOCK_C)
    block_r = _common.rows_per_tile(block_c, x.device.type)
    n_tiles = _common.cdiv(n_rows, block_r) * _common.cdiv(d, block_c)
    return out, _common.Launch(
        _mul_add_kernel, _common.grid(n_tiles, x.device),
        (x, y, z, out, n_rows, n1, n2, d, *strides),
        dict(X_FLAT=flat[0], Y_FLAT=flat[1], Z_FLAT=flat[2], BLOCK_R=block_r, BLOCK_C=block_c),
        _common.num_warps(block_r * block_c), _common.options(x.device),
    )
