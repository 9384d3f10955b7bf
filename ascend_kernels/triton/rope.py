"""Triton kernel of ``ascend_kernels::rope``: ``x * cos + rot(x) * sin`` in one pass, fp32 math.

Both layouts of the op (`ascend_kernels.ops.rope`): ``"interleaved"`` (Flux, Wan: pairs
``(x[2i], x[2i+1])``) and ``"half"`` (rotate-half). cos/sin (fp32 tables in diffusers, any
float dtype accepted) are read through their broadcast strides, e.g. ``(1, S, 1, D)`` against x
``(B, S, H, D)``: no table is expanded in memory. Limits:
`ascend_kernels.triton.limits.rope_supports`.

Interleaved pairs are formed in registers (a contiguous row is loaded, split into even/odd lanes
with ``tl.split`` and joined back), so every global access is a contiguous row segment; the half
layout reads the two halves as two contiguous segments.

Tuning: rows of D = 128 (Flux/Wan heads) are packed 32 to a tile. Ascend: the grid is the number
of vector cores; a tile keeps x, cos, sin, the rotated x and y live (5 x 16 KB in fp32), within
the 192 KB unified buffer; a 128-wide bf16 row is 256 bytes (32-byte aligned), and the fp32
tables 512 bytes. Strided (every-other-element) loads, the alternative for the pairs, are slow on
Ascend's DMA, hence the in-register split.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common
from ._common import row_coords, row_offsets

__all__ = ["plan_rope", "rope"]


@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr,
    n_rows, n1, n2, d, width,
    xs0, xs1, xs2, xsd,
    cs0, cs1, cs2, csd,
    ss0, ss1, ss2, ssd,
    INTERLEAVED: tl.constexpr,
    X_FLAT: tl.constexpr, C_FLAT: tl.constexpr, S_FLAT: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(n_rows, BLOCK_R)
    # width: the whole row (interleaved) or each half (BLOCK_D covers D // 2), computed on the host:
    # an argument carries its divisibility by 16 into the compiler (Triton 3.2, the base of
    # triton-ascend 3.2, cannot see it through an in-kernel `d // 2` and issues 16-bit loads)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < width
    for blk in range(pid, n_blocks, tl.num_programs(0)):
        rmask, rows, i0, i1, i2 = row_coords(blk, n_rows, n1, n2, BLOCK_R)
        mask = rmask[:, None] & cmask[None, :]
        x_row = row_offsets(rows, i0, i1, i2, xs0, xs1, xs2, X_FLAT)
        c_row = row_offsets(rows, i0, i1, i2, cs0, cs1, cs2, C_FLAT)
        s_row = row_offsets(rows, i0, i1, i2, ss0, ss1, ss2, S_FLAT)
        o_row = (rows * d)[:, None]
        if INTERLEAVED:
            x = tl.load(x_ptr + x_row + cols[None, :] * xsd, mask=mask, other=0.0).to(tl.float32)
            c = tl.load(cos_ptr + c_row + cols[None, :] * csd, mask=mask, other=0.0).to(tl.float32)
            s = tl.load(sin_ptr + s_row + cols[None, :] * ssd, mask=mask, other=0.0).to(tl.float32)
            x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_R, BLOCK_D // 2, 2)))
            rot = tl.reshape(tl.join(-x_odd, x_even), (BLOCK_R, BLOCK_D))
            y = x * c + rot * s
            tl.store(out_ptr + o_row + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            hi = cols + width
            x1 = tl.load(x_ptr + x_row + cols[None, :] * xsd, mask=mask, other=0.0).to(tl.float32)
            x2 = tl.load(x_ptr + x_row + hi[None, :] * xsd, mask=mask, other=0.0).to(tl.float32)
            c1 = tl.load(cos_ptr + c_row + cols[None, :] * csd, mask=mask, other=0.0).to(tl.float32)
            c2 = tl.load(cos_ptr + c_row + hi[None, :] * csd, mask=mask, other=0.0).to(tl.float32)
            s1 = tl.load(sin_ptr + s_row + cols[None, :] * ssd, mask=mask, other=0.0).to(tl.float32)
            s2 = tl.load(sin_ptr + s_row + hi[None, :] * ssd, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + o_row + cols[None, :], (x1 * c1 - x2 * s1).to(out_ptr.dtype.element_ty), mask=mask)
            tl.store(out_ptr + o_row + hi[None, :], (x2 * c2 + x1 * s2).to(out_ptr.dtype.element_ty), mask=mask)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """``ascend_kernels::rope`` (same signature and semantics) as one Triton kernel."""
    out, launch = plan_rope(x, cos, sin, layout)
    launch()
    return out


def plan_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> tuple[torch.Tensor, _common.Launch]:
    """The output (allocated, not written) and the launch that fills it."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    d = x.shape[-1]
    interleaved = layout == "interleaved"
    sizes, xs = _common.lead3(x.shape, x.stride())
    xs, x_flat = _common.row_strides(sizes, xs)  # x's own strides: no broadcast to work out
    _, n1, n2 = sizes
    cs, csd, c_flat = _common.operand_strides(cos, x.shape)
    ss, ssd, s_flat = _common.operand_strides(sin, x.shape)
    n_rows = x.numel() // d
    block_d = _common.block(d if interleaved else d // 2)
    row_width = block_d if interleaved else 2 * block_d  # the half layout holds both halves
    block_r = _common.rows_per_tile(row_width, x.device.type)
    return out, _common.Launch(
        _rope_kernel, _common.grid(_common.cdiv(n_rows, block_r), x.device),
        (x, cos, sin, out, n_rows, n1, n2, d, d if interleaved else d // 2, *xs, x.stride(-1), *cs, csd, *ss, ssd),
        dict(INTERLEAVED=interleaved, X_FLAT=x_flat, C_FLAT=c_flat, S_FLAT=s_flat, BLOCK_R=block_r,
             BLOCK_D=block_d),
        _common.num_warps(block_r * row_width), _common.options(x.device),
    )
