"""Triton kernel of ``ascend_kernels::rms_norm``: one pass, a row per tile row, fp32 math.

``y = x * rsqrt(mean(x**2) + eps) [* weight]`` with x, weight loaded in their own dtypes (fp32 or
low-precision weight) and converted to fp32, the result stored in ``out_dtype or x.dtype``: the
native composite's semantics (`ascend_kernels.ops.rms_norm.rms_norm_native`) in one read of x and
one write. Limits: `ascend_kernels.triton.limits.rms_norm_supports`.

Tuning: Flux/Wan q/k norms have short rows (D = 128) and many of them (24 x 4608 per tensor at
1024 px), so a tile holds several rows (32 x 128 = 4096 elements) and the weight is loaded once
per program. Ascend: the grid is the number of vector cores (see `_common`), a tile of 4096 fp32
values (x, x*x, y: 48 KB) fits the 192 KB unified buffer with double buffering, and D = 128 rows
are 256 bytes in bf16: 32-byte aligned.

Token tiles (Ascend): x whose rows are not evenly spaced (q or k of a fused QKV projection, as
diffusers' ``fuse_qkv_projections`` makes them: ``(B, S, H, D)`` with a token stride of 3 x H x D;
a slice along the tokens of heads-major x) has its rows found through ``row // H`` and ``row % H``
in a row tile, which triton-ascend's adapter moves one DMA per row (``DiscreteMemAccess``). On
`_common.AFFINE_TILE_DEVICES`, `_rms_norm_tokens_kernel` walks tiles of one index of x's first
leading dim x a block of the second x a block of the third (tokens x heads for fused QKV), whose
addresses are affine in each index for any strides; the tile shape is rope's
(`_common.token_tile`: 4 tokens x 8 heads of D = 128 for Flux's 24 heads).

Row chunks (Ascend): a row wider than `_common.ROW_TILE_LIMIT` (4096 there: Wan's q/k norm over all
5120 channels) is reduced in column chunks by `_rms_norm_chunks_kernel`, two passes over the row
(mean square, output), so no tile outgrows the unified buffer (see `ascend_kernels.triton.adaln`).
`npu_rms_norm` takes such calls first on an NPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common
from ._common import row_coords, row_offsets, row_start

__all__ = ["plan_rms_norm", "rms_norm"]


@triton.jit
def _weight(w_ptr, cols, cmask, HAS_WEIGHT: tl.constexpr):
    """The weight row in fp32, loaded once per program (0.0 when absent, which `_rms` never reads)."""
    w = 0.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    return w


@triton.jit
def _rms(x, d, eps, w, HAS_WEIGHT: tl.constexpr):
    """RMSNorm over the last axis of an fp32 tile (masked lanes 0), times the weight row if any."""
    ms = tl.sum(x * x, axis=len(x.shape) - 1) / d
    y = x * tl.expand_dims(1.0 / tl.sqrt(ms + eps), len(x.shape) - 1)
    if HAS_WEIGHT:
        y = y * w
    return y


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    n_rows,
    n1,
    n2,
    d,
    xs0,
    xs1,
    xs2,
    xsd,
    eps,
    HAS_WEIGHT: tl.constexpr,
    X_FLAT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < d
    w = _weight(w_ptr, cols, cmask, HAS_WEIGHT)
    n_blocks = tl.cdiv(n_rows, BLOCK_R)
    for blk in range(pid, n_blocks, tl.num_programs(0)):
        rmask, rows, i0, i1, i2 = row_coords(blk, n_rows, n1, n2, BLOCK_R)
        mask = rmask[:, None] & cmask[None, :]
        x_off = row_offsets(rows, i0, i1, i2, xs0, xs1, xs2, X_FLAT) + cols[None, :] * xsd
        x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        y = _rms(x, d, eps, w, HAS_WEIGHT)
        o_off = (rows * d)[:, None] + cols[None, :]
        tl.store(out_ptr + o_off, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_tokens_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    n0,
    n1,
    n2,
    d,
    xs0,
    xs1,
    xs2,
    xsd,
    eps,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_1: tl.constexpr,
    BLOCK_2: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # x's row (i0, i1, i2) starts at i0 * xs0 + i1 * xs1 + i2 * xs2, the output's at
    # ((i0 * n1 + i1) * n2 + i2) * d. A tile: one i0 x BLOCK_1 of dim 1 x BLOCK_2 of dim 2 x D.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < d
    w = _weight(w_ptr, cols, cmask, HAS_WEIGHT)
    n_blocks2 = tl.cdiv(n2, BLOCK_2)
    per_i0 = tl.cdiv(n1, BLOCK_1) * n_blocks2
    for tile in range(pid, n0 * per_i0, tl.num_programs(0)):
        i0 = (tile // per_i0).to(tl.int64)
        i1 = (((tile % per_i0) // n_blocks2) * BLOCK_1 + tl.arange(0, BLOCK_1)).to(tl.int64)
        i2 = (tile % n_blocks2) * BLOCK_2 + tl.arange(0, BLOCK_2)
        mask = ((i1 < n1)[:, None] & (i2 < n2)[None, :])[:, :, None] & cmask[None, None, :]
        x_off = (i0 * xs0 + i1[:, None] * xs1 + i2[None, :] * xs2)[:, :, None] + cols[None, None, :] * xsd
        x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        y = _rms(x, d, eps, w, HAS_WEIGHT)
        o_off = (((i0 * n1 + i1[:, None]) * n2 + i2[None, :]) * d)[:, :, None] + cols[None, None, :]
        tl.store(out_ptr + o_off, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_chunks_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    n_rows,
    n1,
    n2,
    d,
    xs0,
    xs1,
    xs2,
    xsd,
    eps,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # One row per step, in BLOCK_C-column chunks: the mean square, then the output, each a pass over
    # the row's chunks. The row start is a scalar, so each chunk is one contiguous block.
    pid = tl.program_id(0)
    chunk = tl.arange(0, BLOCK_C)
    for r in range(pid, n_rows, tl.num_programs(0)):
        row = tl.cast(r, tl.int64)
        x_row = x_ptr + row_start(row, n1, n2, xs0, xs1, xs2)
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for c in range(0, d, BLOCK_C):
            cols = c + chunk
            x = tl.load(x_row + cols * xsd, mask=cols < d, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / d + eps)
        for c in range(0, d, BLOCK_C):
            cols = c + chunk
            cmask = cols < d
            y = tl.load(x_row + cols * xsd, mask=cmask, other=0.0).to(tl.float32) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
            tl.store(out_ptr + row * d + cols, y.to(out_ptr.dtype.element_ty), mask=cmask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``ascend_kernels::rms_norm`` (same signature and semantics) as one Triton kernel."""
    out, launch = plan_rms_norm(x, weight, eps, out_dtype)
    launch()
    return out


def plan_rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, out_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, _common.Launch]:
    """The output (allocated, not written) and the launch that fills it."""
    out = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    d = x.shape[-1]
    sizes, xs = _common.lead3(x.shape, x.stride())
    xs, x_flat = _common.row_strides(sizes, xs)
    n0, n1, n2 = sizes
    n_rows = x.numel() // d
    block_d = _common.block(d)
    block_r = _common.rows_per_tile(block_d, x.device.type)
    chunk = _common.row_chunk(d, x.device.type)
    if chunk is not None:  # a row too wide for one tile on this device (`_common.ROW_TILE_LIMIT`)
        return out, _common.Launch(
            _rms_norm_chunks_kernel,
            _common.grid(n_rows, x.device),
            (x, weight if weight is not None else x, out, n_rows, n1, n2, d, *xs, x.stride(-1), float(eps)),
            dict(HAS_WEIGHT=weight is not None, BLOCK_C=chunk),
            _common.num_warps(chunk),
            _common.options(x.device),
        )
    if x.device.type in _common.AFFINE_TILE_DEVICES and not x_flat:
        block_1, block_2 = _common.token_tile(block_r, n1, n2)
        n_tiles = n0 * _common.cdiv(n1, block_1) * _common.cdiv(n2, block_2)
        return out, _common.Launch(
            _rms_norm_tokens_kernel,
            _common.grid(n_tiles, x.device),
            (x, weight if weight is not None else x, out, n0, n1, n2, d, *xs, x.stride(-1), float(eps)),
            dict(HAS_WEIGHT=weight is not None, BLOCK_1=block_1, BLOCK_2=block_2, BLOCK_D=block_d),
            _common.num_warps(block_1 * block_2 * block_d),
            _common.options(x.device),
        )
    return out, _common.Launch(
        _rms_norm_kernel,
        _common.grid(_common.cdiv(n_rows, block_r), x.device),
        (x, weight if weight is not None else x, out, n_rows, n1, n2, d, *xs, x.stride(-1), float(eps)),
        dict(HAS_WEIGHT=weight is not None, X_FLAT=x_flat, BLOCK_R=block_r, BLOCK_D=block_d),
        _common.num_warps(block_r * block_d),
        _common.options(x.device),
    )
