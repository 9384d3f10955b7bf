"""Triton kernel of ``ascend_kernels::adaln_modulate``: LayerNorm + ``* (1 + scale) + shift`` in one pass.

Semantics of `ascend_kernels.ops.adaln.adaln_modulate_native`: fp32 statistics (mean, then the
variance of the centred row, as LayerNorm), optional LayerNorm weight and bias, modulation with
``scale``/``shift`` read through their broadcast strides (Flux's ``(B, D)`` chunks read as
``(B, 1, D)``, Wan's ``(B, 1, D)`` sums; any broadcastable shape), the result in
``out_dtype or x.dtype`` (Wan computes in fp32 and returns fp32 from bf16 input). One read of x,
scale, shift and one write: the composite takes a LayerNorm kernel plus the pointwise tail.
Limits: `ascend_kernels.triton.limits.adaln_modulate_supports`.

Tuning: Flux/Wan rows are wide (3072; 5120 for Wan 14B) and there are few per batch, so a tile is
one row (BLOCK_D = 4096 or 8192 lanes, 8-16 warps on CUDA); the scale/shift row of the program's
batch is re-read per row, from L2. Ascend: the grid is the number of vector cores; the widest
accepted row is 8192 elements (`limits.max_row`). A one-row tile keeps x (in its dtype and in fp32),
the centred row, scale, shift and y live, and triton-ascend double-buffers the loads by default: by
that count (an estimate; bishengir-compile, which decides, is not run here) about 105-140 KB of the
192 KB unified buffer at 4096 lanes (Flux's 3072; the range: a modulation row read once per program
or per row, double-buffered), and 210-280 KB at 8192 (Wan 14B's 5120): more than the buffer holds.
So a row wider than `_common.ROW_TILE_LIMIT` (4096 on Ascend) is reduced in column chunks
(`_adaln_chunks_kernel`, 1024 wide for 5120: no padded lane), in three passes over the row (mean,
centred variance, output: the native composite's arithmetic). 3072-wide bf16 rows are 6 KB, 32-byte
aligned.

Batch tiles (Ascend): with a per-batch modulation (``B > 1``: SD3 or PixArt under a batched CFG,
any model at batch 2+), a row tile finds its rows' modulation row as ``row // S``, which
triton-ascend's adapter cannot read as an affine address: it moves scale and shift one DMA per
row (``DiscreteMemAccess`` in its lowering). On `_common.AFFINE_TILE_DEVICES`, where x's rows are
evenly spaced within a batch and from batch to batch, as are the modulation rows of the batches
(`_common.batch_split`), `_adaln_batches_kernel` walks tiles that never cross a batch: the tile's
one scale/shift row is read once, at an affine address. The same tiles serve x whose rows are not
evenly spaced (a token slice at batch 2) under a modulation shared by every row. The Flux/Wan
widths are one row per tile either way; what changes there is the address, not the tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.adaln import _as_modulation  # (B, D) against x (B, S, D) is read as (B, 1, D)
from . import _common
from ._common import row_coords, row_offsets, row_start

__all__ = ["adaln_modulate", "plan_adaln_modulate"]


@triton.jit
def _norm_params(w_ptr, b_ptr, cols, cmask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The LayerNorm weight and bias rows in fp32, loaded once per program (0.0 for an absent one,
    which `_layer_norm` never reads)."""
    w, b = 0.0, 0.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    return w, b


@triton.jit
def _layer_norm(x, mask, d, eps, w, b, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """LayerNorm of each row of an fp32 tile (masked lanes 0): ``(x - mean) / sqrt(var + eps)``,
    times the weight row and plus the bias row where present."""
    mean = tl.sum(x, axis=1) / d
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / d
    y = xc * (1.0 / tl.sqrt(var + eps))[:, None]
    if HAS_WEIGHT:
        y = y * w[None, :]
    if HAS_BIAS:
        y = y + b[None, :]
    return y


@triton.jit
def _adaln_kernel(
    x_ptr,
    scale_ptr,
    shift_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    n_rows,
    n1,
    n2,
    d,
    xs0,
    xs1,
    xs2,
    xsd,
    cs0,
    cs1,
    cs2,
    csd,
    hs0,
    hs1,
    hs2,
    hsd,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MOD_SHARED: tl.constexpr,
    X_FLAT: tl.constexpr,
    C_FLAT: tl.constexpr,
    H_FLAT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < d
    w, b = _norm_params(w_ptr, b_ptr, cols, cmask, HAS_WEIGHT, HAS_BIAS)
    if MOD_SHARED:  # one scale/shift row for every row (batch 1): read once per program, not per row
        scale_row = tl.load(scale_ptr + cols * csd, mask=cmask, other=0.0).to(tl.float32)
        shift_row = tl.load(shift_ptr + cols * hsd, mask=cmask, other=0.0).to(tl.float32)
    n_blocks = tl.cdiv(n_rows, BLOCK_R)
    for blk in range(pid, n_blocks, tl.num_programs(0)):
        rmask, rows, i0, i1, i2 = row_coords(blk, n_rows, n1, n2, BLOCK_R)
        mask = rmask[:, None] & cmask[None, :]
        x_off = row_offsets(rows, i0, i1, i2, xs0, xs1, xs2, X_FLAT) + cols[None, :] * xsd
        x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        y = _layer_norm(x, mask, d, eps, w, b, HAS_WEIGHT, HAS_BIAS)
        if MOD_SHARED:
            y = y * (1.0 + scale_row[None, :]) + shift_row[None, :]
        else:
            c_off = row_offsets(rows, i0, i1, i2, cs0, cs1, cs2, C_FLAT) + cols[None, :] * csd
            h_off = row_offsets(rows, i0, i1, i2, hs0, hs1, hs2, H_FLAT) + cols[None, :] * hsd
            scale = tl.load(scale_ptr + c_off, mask=mask, other=0.0).to(tl.float32)
            shift = tl.load(shift_ptr + h_off, mask=mask, other=0.0).to(tl.float32)
            y = y * (1.0 + scale) + shift
        o_off = (rows * d)[:, None] + cols[None, :]
        tl.store(out_ptr + o_off, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _adaln_batches_kernel(
    x_ptr,
    scale_ptr,
    shift_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    n_batches,
    batch_rows,
    d,
    xs_batch,
    xs_row,
    xsd,
    cs_batch,
    csd,
    hs_batch,
    hsd,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Rows of batch b are b * batch_rows + j, j < batch_rows; x's row j of batch b starts at
    # b * xs_batch + j * xs_row, the output's row r at r * d; batch b's scale row at b * cs_batch, its
    # shift row at b * hs_batch. A tile is BLOCK_R rows of one batch: its modulation is one row.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < d
    w, b = _norm_params(w_ptr, b_ptr, cols, cmask, HAS_WEIGHT, HAS_BIAS)
    tiles_per_batch = tl.cdiv(batch_rows, BLOCK_R)
    for tile in range(pid, n_batches * tiles_per_batch, tl.num_programs(0)):
        batch = (tile // tiles_per_batch).to(tl.int64)
        j = (tile % tiles_per_batch) * BLOCK_R + tl.arange(0, BLOCK_R)
        rows = batch * batch_rows + j
        mask = (j < batch_rows)[:, None] & cmask[None, :]
        x_off = batch * xs_batch + (j * xs_row)[:, None] + cols[None, :] * xsd
        x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        y = _layer_norm(x, mask, d, eps, w, b, HAS_WEIGHT, HAS_BIAS)
        scale = tl.load(scale_ptr + batch * cs_batch + cols * csd, mask=cmask, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + batch * hs_batch + cols * hsd, mask=cmask, other=0.0).to(tl.float32)
        y = y * (1.0 + scale[None, :]) + shift[None, :]
        tl.store(out_ptr + (rows * d)[:, None] + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _adaln_chunks_kernel(
    x_ptr,
    scale_ptr,
    shift_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    n_rows,
    n1,
    n2,
    d,
    xs0,
    xs1,
    xs2,
    xsd,
    cs0,
    cs1,
    cs2,
    csd,
    hs0,
    hs1,
    hs2,
    hsd,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # One row per step, in BLOCK_C-column chunks: the mean, then the variance of the centred row,
    # then the output, each a pass over the row's chunks (x is read three times, the later passes
    # from cache). Every operand's row start is a scalar, so each chunk is one contiguous block.
    pid = tl.program_id(0)
    chunk = tl.arange(0, BLOCK_C)
    for r in range(pid, n_rows, tl.num_programs(0)):
        row = tl.cast(r, tl.int64)
        x_row = x_ptr + row_start(row, n1, n2, xs0, xs1, xs2)
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for c in range(0, d, BLOCK_C):
            cols = c + chunk
            acc += tl.load(x_row + cols * xsd, mask=cols < d, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=0) / d
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for c in range(0, d, BLOCK_C):
            cols = c + chunk
            cmask = cols < d
            xc = tl.where(cmask, tl.load(x_row + cols * xsd, mask=cmask, other=0.0).to(tl.float32) - mean, 0.0)
            acc += xc * xc
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / d + eps)
        scale_row = scale_ptr + row_start(row, n1, n2, cs0, cs1, cs2)
        shift_row = shift_ptr + row_start(row, n1, n2, hs0, hs1, hs2)
        for c in range(0, d, BLOCK_C):
            cols = c + chunk
            cmask = cols < d
            y = (tl.load(x_row + cols * xsd, mask=cmask, other=0.0).to(tl.float32) - mean) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                y = y + tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
            scale = tl.load(scale_row + cols * csd, mask=cmask, other=0.0).to(tl.float32)
            shift = tl.load(shift_row + cols * hsd, mask=cmask, other=0.0).to(tl.float32)
            y = y * (1.0 + scale) + shift
            tl.store(out_ptr + row * d + cols, y.to(out_ptr.dtype.element_ty), mask=cmask)


def adaln_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``ascend_kernels::adaln_modulate`` (same signature and semantics) as one Triton kernel."""
    out, launch = plan_adaln_modulate(x, scale, shift, eps, weight, bias, out_dtype)
    launch()
    return out


def plan_adaln_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, _common.Launch]:
    """The output (allocated, not written) and the launch that fills it."""
    out = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    d = x.shape[-1]
    sizes, xs = _common.lead3(x.shape, x.stride())
    xs, x_flat = _common.row_strides(sizes, xs)  # x's own strides: no broadcast to work out
    _, n1, n2 = sizes
    cs, csd, c_flat = _common.operand_strides(_as_modulation(scale, x), x.shape)
    hs, hsd, h_flat = _common.operand_strides(_as_modulation(shift, x), x.shape)
    n_rows = x.numel() // d
    block_d = _common.block(d)
    block_r = _common.rows_per_tile(block_d, x.device.type)
    w, b = (weight if weight is not None else x), (bias if bias is not None else x)
    # Every row reads the same modulation row when no leading dim of x with more than one index
    # moves the scale/shift pointers (Flux and Wan at batch 1).
    shared = all(n == 1 or (c == 0 and h == 0) for n, c, h in zip(sizes, cs, hs))
    tensors = (x, scale, shift, w, b, out)
    constexprs = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None)
    chunk = _common.row_chunk(d, x.device.type)
    if chunk is not None:  # a row too wide for one tile on this device (`_common.ROW_TILE_LIMIT`)
        return out, _common.Launch(
            _adaln_chunks_kernel,
            _common.grid(n_rows, x.device),
            (*tensors, n_rows, n1, n2, d, *xs, x.stride(-1), *cs, csd, *hs, hsd, float(eps)),
            dict(constexprs, BLOCK_C=chunk),
            _common.num_warps(chunk),
            _common.options(x.device),
        )
    if x.device.type in _common.AFFINE_TILE_DEVICES and not (x_flat and c_flat and h_flat):
        batches = _batches(sizes, xs, cs, hs)
        if batches is not None:
            n_batches, batch_rows, x_batch, x_row, cs_batch, hs_batch = batches
            return out, _common.Launch(
                _adaln_batches_kernel,
                _common.grid(n_batches * _common.cdiv(batch_rows, block_r), x.device),
                (
                    *tensors,
                    n_batches,
                    batch_rows,
                    d,
                    x_batch,
                    x_row,
                    x.stride(-1),
                    cs_batch,
                    csd,
                    hs_batch,
                    hsd,
                    float(eps),
                ),
                dict(constexprs, BLOCK_R=block_r, BLOCK_D=block_d),
                _common.num_warps(block_r * block_d),
                _common.options(x.device),
            )
    return out, _common.Launch(
        _adaln_kernel,
        _common.grid(_common.cdiv(n_rows, block_r), x.device),
        (*tensors, n_rows, n1, n2, d, *xs, x.stride(-1), *cs, csd, *hs, hsd, float(eps)),
        dict(
            constexprs, MOD_SHARED=shared, X_FLAT=x_flat, C_FLAT=c_flat, H_FLAT=h_flat, BLOCK_R=block_r, BLOCK_D=block_d
        ),
        _common.num_warps(block_r * block_d),
        _common.options(x.device),
    )


def _batches(sizes, xs, cs, hs) -> tuple[int, int, int, int, int, int] | None:
    """``(batches, rows per batch, x's batch and row strides, scale's and shift's batch strides)``
    where the rows split into batches that each read one scale and one shift row
    (`_common.batch_split` with the modulation's row stride 0); ``None`` otherwise, e.g. a
    modulation shared by a batch of 2 whose rows vary within it."""
    split = _common.batch_split(sizes, (xs, cs, hs))
    if split is None:
        return None
    n_batches, batch_rows, ((x_batch, x_row), (c_batch, c_row), (h_batch, h_row)) = split
    if c_row or h_row:  # the modulation varies within a batch
        return None
    return n_batches, batch_rows, x_batch, x_row, c_batch, h_batch
