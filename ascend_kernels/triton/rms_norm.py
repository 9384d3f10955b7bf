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
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import _common
from ._common import row_coords, row_offsets

__all__ = ["plan_rms_norm", "rms_norm"]


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr,
    n_rows, n1, n2, d,
    xs0, xs1, xs2, xsd,
    eps,
    HAS_WEIGHT: tl.constexpr, X_FLAT: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < d
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    n_blocks = tl.cdiv(n_rows, BLOCK_R)
    for blk in range(pid, n_blocks, tl.num_programs(0)):
        rmask, rows, i0, i1, i2 = row_coords(blk, n_rows, n1, n2, BLOCK_R)
        mask = rmask[:, None] & cmask[None, :]
        x_off = row_offsets(rows, i0, i1, i2, xs0, xs1, xs2, X_FLAT) + cols[None, :] * xsd
        x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        ms = tl.sum(x * x, axis=1) / d
        y = x * (1.0 / tl.sqrt(ms + eps))[:, None]
        if HAS_WEIGHT:
            y = y * w[None, :]
        o_off = (rows * d)[:, None] + cols[None, :]
        tl.store(out_ptr + o_off, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, out_dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """``ascend_kernels::rms_norm`` (same signature and semantics) as one Triton kernel."""
    out, launch = plan_rms_norm(x, weight, eps, out_dtype)
    launch()
    return out


def plan_rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, out_dtype: Optional[torch.dtype] = None
) -> tuple[torch.Tensor, _common.Launch]:
    """The output (allocated, not written) and the launch that fills it."""
    out = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    d = x.shape[-1]
    sizes, xs = _common.lead3(x.shape, x.stride())
    xs, x_flat = _common.row_strides(sizes, xs)
    _, n1, n2 = sizes
    n_rows = x.numel() // d
    block_d = _common.block(d)
    block_r = _common.rows_per_tile(block_d, x.device.type)
    return out, _common.Launch(
        _rms_norm_kernel, _common.grid(_common.cdiv(n_rows, block_r), x.device),
        (x, weight if weight is not None else x, out, n_rows, n1, n2, d, *xs, x.stride(-1), float(eps)),
        dict(HAS_WEIGHT=weight is not None, X_FLAT=x_flat, BLOCK_R=block_r, BLOCK_D=block_d),
        _common.num_warps(block_r * block_d), _common.options(x.device),
    )
