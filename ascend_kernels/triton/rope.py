"""Triton kernel of ``ascend_kernels::rope``: ``x * cos + rot(x) * sin`` in one pass, fp32 math.

Both layouts of the op (`ascend_kernels.ops.rope`): ``"interleaved"`` (Flux, Wan: pairs
``(x[2i], x[2i+1])``) and ``"half"`` (rotate-half). cos/sin (fp32 tables in diffusers, any
float dtype accepted) are read through their broadcast strides, e.g. ``(1, S, 1, D)`` against x
``(B, S, H, D)``: no table is expanded in memory. Limits:
`ascend_kernels.triton.limits.rope_supports`.

Interleaved pairs are split into even/odd lanes in registers (``tl.split``/``tl.join``), so every
global access is a contiguous row segment: strided loads are slow on Ascend's DMA.

Token tiles (`_common.AFFINE_TILE_DEVICES`): where the tables vary by (batch, token) only, a row
tile would find the table row as ``row // H``, one DMA per row on Ascend; `_rope_tokens_kernel`
walks tiles of one batch x tokens x heads x D instead, every address affine in its indices. CUDA
keeps row tiles (its L2 serves the repeated table rows); docs/triton.md has the details.
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
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    n_rows,
    n1,
    n2,
    d,
    width,
    xs0,
    xs1,
    xs2,
    xsd,
    cs0,
    cs1,
    cs2,
    csd,
    ss0,
    ss1,
    ss2,
    ssd,
    INTERLEAVED: tl.constexpr,
    X_FLAT: tl.constexpr,
    C_FLAT: tl.constexpr,
    S_FLAT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
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


@triton.jit
def _rope_tokens_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    n_batches,
    n_tokens,
    n_heads,
    width,
    xs_b,
    xs_t,
    xs_h,
    xsd,
    os_b,
    os_t,
    os_h,
    cs_b,
    cs_t,
    csd,
    ss_b,
    ss_t,
    ssd,
    INTERLEAVED: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # x's row (batch b, token t, head h) starts at b * xs_b + t * xs_t + h * xs_h, the output's at
    # b * os_b + t * os_t + h * os_h, a table's row for (b, t) at b * cs_b + t * cs_t (cs_b = 0: one
    # table for the batch). Tiles: one batch x BLOCK_T tokens x BLOCK_H heads x D, so every address
    # is affine in the tile's token and head indices, whichever of them x lays out first.
    pid = tl.program_id(0)
    n_hblocks = tl.cdiv(n_heads, BLOCK_H)
    per_batch = tl.cdiv(n_tokens, BLOCK_T) * n_hblocks
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < width
    for tile in range(pid, n_batches * per_batch, tl.num_programs(0)):
        b = (tile // per_batch).to(tl.int64)
        toks = (((tile % per_batch) // n_hblocks) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        heads = (tile % n_hblocks) * BLOCK_H + tl.arange(0, BLOCK_H)
        tmask = toks < n_tokens
        mask = (tmask[:, None] & (heads < n_heads)[None, :])[:, :, None] & cmask[None, None, :]
        x_off = (b * xs_b + toks[:, None] * xs_t + heads[None, :] * xs_h)[:, :, None] + cols[None, None, :] * xsd
        o_off = (b * os_b + toks[:, None] * os_t + heads[None, :] * os_h)[:, :, None] + cols[None, None, :]
        tab_mask = tmask[:, None] & cmask[None, :]
        c_off = (b * cs_b + toks * cs_t)[:, None] + cols[None, :] * csd
        s_off = (b * ss_b + toks * ss_t)[:, None] + cols[None, :] * ssd
        if INTERLEAVED:
            x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
            c = tl.load(cos_ptr + c_off, mask=tab_mask, other=0.0).to(tl.float32)
            s = tl.load(sin_ptr + s_off, mask=tab_mask, other=0.0).to(tl.float32)
            x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_H, BLOCK_D // 2, 2)))
            rot = tl.reshape(tl.join(-x_odd, x_even), (BLOCK_T, BLOCK_H, BLOCK_D))
            y = x * c[:, None, :] + rot * s[:, None, :]
            tl.store(out_ptr + o_off, y.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            x1 = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
            x2 = tl.load(x_ptr + x_off + width * xsd, mask=mask, other=0.0).to(tl.float32)
            c1 = tl.load(cos_ptr + c_off, mask=tab_mask, other=0.0).to(tl.float32)[:, None, :]
            c2 = tl.load(cos_ptr + c_off + width * csd, mask=tab_mask, other=0.0).to(tl.float32)[:, None, :]
            s1 = tl.load(sin_ptr + s_off, mask=tab_mask, other=0.0).to(tl.float32)[:, None, :]
            s2 = tl.load(sin_ptr + s_off + width * ssd, mask=tab_mask, other=0.0).to(tl.float32)[:, None, :]
            tl.store(out_ptr + o_off, (x1 * c1 - x2 * s1).to(out_ptr.dtype.element_ty), mask=mask)
            tl.store(out_ptr + o_off + width, (x2 * c2 + x1 * s2).to(out_ptr.dtype.element_ty), mask=mask)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """``ascend_kernels::rope`` (same signature and semantics) as one Triton kernel."""
    out, launch = plan_rope(x, cos, sin, layout)
    launch()
    return out


def plan_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str
) -> tuple[torch.Tensor, _common.Launch]:
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
    width = d if interleaved else d // 2
    block_d = _common.block(width)
    row_width = block_d if interleaved else 2 * block_d  # the half layout holds both halves
    if x.device.type in _common.AFFINE_TILE_DEVICES and not (x_flat and c_flat and s_flat):
        # the heads: the leading dim (of 1 and 2) that the tables are broadcast over
        heads = next((k for k in (2, 1) if sizes[k] > 1 and cs[k] == 0 == ss[k]), None)
        if heads is not None:
            return out, _plan_tokens(
                (x, cos, sin, out), interleaved, width, sizes, heads, xs, (cs, csd), (ss, ssd), block_d, row_width
            )
    block_r = _common.rows_per_tile(row_width, x.device.type)
    return out, _common.Launch(
        _rope_kernel,
        _common.grid(_common.cdiv(n_rows, block_r), x.device),
        (x, cos, sin, out, n_rows, n1, n2, d, width, *xs, x.stride(-1), *cs, csd, *ss, ssd),
        dict(INTERLEAVED=interleaved, X_FLAT=x_flat, C_FLAT=c_flat, S_FLAT=s_flat, BLOCK_R=block_r, BLOCK_D=block_d),
        _common.num_warps(block_r * row_width),
        _common.options(x.device),
    )


def _plan_tokens(
    tensors,
    interleaved: bool,
    width: int,
    sizes,
    heads: int,
    xs,
    cos_strides,
    sin_strides,
    block_d: int,
    row_width: int,
) -> _common.Launch:
    """The `_rope_tokens_kernel` launch: ``tensors`` = (x, cos, sin, out); ``sizes`` the three leading
    sizes, of which dim 0 is the batch, dim ``heads`` the heads (1: x heads-major, 2: token-major)
    and the other the tokens; ``xs`` x's leading strides; each table's (three leading strides,
    last-dim stride), its head stride 0."""
    x, d = tensors[0], tensors[0].shape[-1]
    toks = 3 - heads
    n_batches, n_tokens, n_heads = sizes[0], sizes[toks], sizes[heads]
    (cs, csd), (ss, ssd) = cos_strides, sin_strides
    os = (sizes[1] * sizes[2] * d, sizes[2] * d, d)  # the output is contiguous
    per_tile = max(1, _common.TILE_ELEMENTS.get(x.device.type, 4096) // row_width)  # rows of a tile
    block_t, block_h = _common.token_tile(per_tile, n_tokens, n_heads)
    n_tiles = n_batches * _common.cdiv(n_tokens, block_t) * _common.cdiv(n_heads, block_h)
    return _common.Launch(
        _rope_tokens_kernel,
        _common.grid(n_tiles, x.device),
        (
            *tensors,
            n_batches,
            n_tokens,
            n_heads,
            width,
            xs[0],
            xs[toks],
            xs[heads],
            x.stride(-1),
            os[0],
            os[toks],
            os[heads],
            cs[0],
            cs[toks],
            csd,
            ss[0],
            ss[toks],
            ssd,
        ),
        dict(INTERLEAVED=interleaved, BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d),
        _common.num_warps(block_t * block_h * row_width),
        _common.options(x.device),
    )
