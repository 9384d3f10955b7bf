"""``supports_args`` of the ``triton`` providers: the calls each kernel handles (no triton import).

Common limits: x (and every operand) fp16/bf16/fp32 on one device, 1 to 4 dims, not empty,
row-major strides (the dims of size > 1 in decreasing stride order: contiguous tensors, slices and
``unflatten`` views of them; the kernels write a contiguous output, which is what the native
composite returns for such inputs). Row reductions take at most `max_row` elements (16384 on
CUDA; 8192 on Ascend, chunked past `_common.ROW_TILE_LIMIT`). Anything else falls back to native.

>>> import torch
>>> from ascend_kernels.triton.limits import rms_norm_supports
>>> rms_norm_supports(torch.empty(2, 5, 128, dtype=torch.bfloat16), torch.empty(128), 1e-6, None)
True
>>> rms_norm_supports(torch.empty(2, 5, 128, dtype=torch.float64), None, 1e-6, None)
False
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..ops.adaln import _as_modulation

__all__ = [
    "DTYPES",
    "broadcast_shape",
    "MAX_ROPE_HEAD_DIM",
    "adaln_modulate_supports",
    "max_row",
    "mul_add_supports",
    "rms_norm_supports",
    "rope_supports",
    "row_major",
]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_DIMS = 4
# Longest row reduced in one tile, per device type (elements).
_MAX_ROW = {"cuda": 16384, "npu": 8192}
MAX_ROPE_HEAD_DIM = 1024
_LAYOUTS = ("interleaved", "half")


def max_row(device_type: str) -> int:
    """Longest row (elements) ``rms_norm`` / ``adaln_modulate`` reduce in one tile on ``device_type``."""
    return _MAX_ROW.get(device_type, _MAX_ROW["cuda"])


def row_major(t: torch.Tensor, broadcast_ok: bool = False) -> bool:
    """Whether the dims of ``t`` with size > 1 have strictly decreasing strides (stride-0, i.e.
    expanded, dims allowed only with ``broadcast_ok``)."""
    strides = [st for sz, st in zip(t.shape, t.stride()) if sz > 1 and not (broadcast_ok and st == 0)]
    return all(s > 0 for s in strides) and all(a > b for a, b in zip(strides, strides[1:]))


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """The broadcast shape of ``shapes`` (torch's rules), or None where they do not broadcast.

    Plain Python over the sizes, for the per-call host path: `torch.broadcast_shapes` runs torch's
    symbolic-shape reference, about half of a ``mul_add`` call's host time through the ``triton``
    provider on the 2-core CI container.

    >>> broadcast_shape((2, 1, 8), (5, 8)), broadcast_shape((3,), (4,))
    ((2, 5, 8), None)
    """
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for shape in shapes:
        for i, n in enumerate(shape, ndim - len(shape)):
            if n != 1:
                if out[i] == 1:
                    out[i] = n
                elif out[i] != n:
                    return None
    return tuple(out)


def _broadcasts_to(shape: Sequence[int], target: torch.Size) -> bool:
    return len(shape) <= len(target) and broadcast_shape(shape, target) == tuple(target)


def _main_ok(x: torch.Tensor) -> bool:
    return x.dtype in DTYPES and 1 <= x.dim() <= MAX_DIMS and x.numel() > 0 and row_major(x)


def _same_device(x: torch.Tensor, *others: torch.Tensor | None) -> bool:
    return all(t is None or t.device == x.device for t in others)


def _vector_ok(t: torch.Tensor | None, d: int) -> bool:
    return t is None or (tuple(t.shape) == (d,) and t.dtype in DTYPES)


def _out_dtype_ok(out_dtype: torch.dtype | None) -> bool:
    return out_dtype is None or out_dtype in DTYPES


def rms_norm_supports(x: torch.Tensor, weight: torch.Tensor | None, eps: float, out_dtype=None) -> bool:
    """Common limits, D <= `max_row`, weight None or ``(D,)`` in any of `DTYPES`."""
    return (
        _main_ok(x)
        and x.shape[-1] <= max_row(x.device.type)
        and _vector_ok(weight, x.shape[-1])
        and _out_dtype_ok(out_dtype)
        and _same_device(x, weight)
    )


def rope_supports(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> bool:
    """Common limits, even D <= `MAX_ROPE_HEAD_DIM`, cos/sin broadcast to x without enlarging it."""
    return (
        layout in _LAYOUTS
        and _main_ok(x)
        and x.shape[-1] % 2 == 0
        and x.shape[-1] <= MAX_ROPE_HEAD_DIM
        and all(t.dtype in DTYPES and _broadcasts_to(t.shape, x.shape) for t in (cos, sin))
        and _same_device(x, cos, sin)
    )


def adaln_modulate_supports(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> bool:
    """Common limits, D <= `max_row`, scale/shift (as the op reads them) broadcast to x, weight/bias ``(D,)``."""
    d = x.shape[-1] if x.dim() else 0
    return (
        _main_ok(x)
        and d <= max_row(x.device.type)
        and all(t.dtype in DTYPES and _broadcasts_to(_as_modulation(t, x).shape, x.shape) for t in (scale, shift))
        and _vector_ok(weight, d)
        and _vector_ok(bias, d)
        and _out_dtype_ok(out_dtype)
        and _same_device(x, scale, shift, weight, bias)
    )


def mul_add_supports(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> bool:
    """Operands in `DTYPES` on one device, row-major (stride-0 dims allowed), a 1-4 dim non-empty result."""
    operands = (x, y, z)
    if not all(t.dtype in DTYPES and t.dim() <= MAX_DIMS and row_major(t, broadcast_ok=True) for t in operands):
        return False
    if not _same_device(x, y, z):
        return False
    shape = broadcast_shape(x.shape, y.shape, z.shape)
    if shape is None:
        return False
    n = 1
    for s in shape:
        n *= s
    return 1 <= len(shape) <= MAX_DIMS and n > 0
