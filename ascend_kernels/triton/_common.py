"""Launch helpers shared by the kernels: row decomposition, tiles and grid per device type.

Kernels work on rows: the output viewed as ``(n0, n1, n2, D)``, each operand addressed through its
own strides (broadcast dims: stride 0), so nothing is expanded in memory. A program walks row
blocks in a persistent loop, so the grid is capped (the number of vector cores on Ascend).
Operands with evenly spaced rows (`row_strides`) use the flat ``row * stride`` form, which
triton-ascend lowers to one block DMA instead of one per row; docs/triton.md has the details.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = [
    "AFFINE_TILE_DEVICES",
    "Launch",
    "ROW_TILE_LIMIT",
    "TILE_ELEMENTS",
    "ascend_tiling",
    "batch_split",
    "block",
    "cdiv",
    "grid",
    "lead3",
    "num_warps",
    "operand_strides",
    "options",
    "row_chunk",
    "row_coords",
    "row_offsets",
    "row_start",
    "row_strides",
    "rows_per_tile",
    "strides_as",
    "token_tile",
]

# Device types whose kernels use affine tiles (`token_tile`, `batch_split`) where an operand's row is a
# quotient of the row number: triton-ascend moves such a tile as one DMA block, not one per row.
AFFINE_TILE_DEVICES: tuple[str, ...] = ("npu",)


@contextlib.contextmanager
def ascend_tiling(*device_types: str) -> Iterator[None]:
    """Plan as on Ascend for ``device_types`` too, restored on exit (tests, `diffusers-ascend bench`). Not thread-safe.

    >>> from ascend_kernels.triton import _common
    >>> with _common.ascend_tiling("cpu"):
    ...     _common.AFFINE_TILE_DEVICES, _common.ROW_TILE_LIMIT["cpu"]
    (('npu', 'cpu'), 4096)
    >>> _common.AFFINE_TILE_DEVICES, "cpu" in _common.ROW_TILE_LIMIT
    (('npu',), False)
    """
    global AFFINE_TILE_DEVICES
    saved, saved_limits = AFFINE_TILE_DEVICES, dict(ROW_TILE_LIMIT)
    AFFINE_TILE_DEVICES = (*saved, *device_types)
    ROW_TILE_LIMIT.update(dict.fromkeys(device_types, ROW_TILE_LIMIT["npu"]))
    try:
        yield
    finally:
        AFFINE_TILE_DEVICES = saved
        ROW_TILE_LIMIT.clear()
        ROW_TILE_LIMIT.update(saved_limits)


TILE_ELEMENTS = {"cuda": 4096, "npu": 4096}
# Longest row (a power of two) a reduction keeps in one tile; longer rows go in chunks (`row_chunk`).
# Ascend: every live tile, double-buffered, must fit the 192 KB unified buffer (see docs/triton.md).
ROW_TILE_LIMIT: dict[str, int] = {"npu": 4096}
_MAX_GRID = 65535
# CUDA programs per SM of a persistent launch (None: one per row block); the sweep is in docs/triton.md.
CUDA_PROGRAMS_PER_SM: int | None = 16


@dataclasses.dataclass
class Launch:
    """One kernel launch, planned from tensor metadata only (meta tensors work too)."""

    kernel: Any
    grid: tuple[int]
    args: tuple
    constexprs: dict[str, Any]
    num_warps: int
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps, **self.options)

    def traced(self) -> None:
        """The launch through `torch.library.wrap_triton`, for a ``triton_op`` body: Inductor then
        compiles and launches it itself. `options` are left out: Inductor rejects them as arguments."""
        from torch.library import wrap_triton

        wrap_triton(self.kernel)[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps)


def options(device: torch.device) -> dict[str, Any]:
    """Compiler options for ``device``: CUDA states FMA contraction explicitly (Triton 3.10 changes
    the default); triton-ascend rejects options its backend does not define."""
    return {"enable_fp_fusion": True} if device.type == "cuda" else {}


def lead3(shape: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[int]]:
    """Sizes and strides of the leading dims (all but the last), padded in front to three."""
    sizes, st = list(shape[:-1]), list(strides[:-1])
    pad = 3 - len(sizes)
    return [1] * pad + sizes, [0] * pad + st


def _broadcast_strides(t: torch.Tensor, shape: Sequence[int]) -> list[int]:
    pad = len(shape) - t.dim()
    return [0] * pad + [0 if n == 1 and m != 1 else s for n, m, s in zip(t.shape, shape[pad:], t.stride())]


def strides_as(t: torch.Tensor, shape: Sequence[int]) -> tuple[list[int], int]:
    """``t.expand(shape).stride()`` without building the view: (three leading strides, last stride)."""
    st = _broadcast_strides(t, shape)
    return lead3(shape, st)[1], st[-1]


def row_strides(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[int], bool]:
    """An operand's leading strides for `row_offsets`, and whether its rows are flat (row ``r``
    starts at ``r * s2``). Size-1 dims get strides that make the general formula equal the flat one.

    >>> row_strides([1, 4608, 24], [0, 3072, 128])  # contiguous (1, 4608, 24, 128); n0 == 1
    ([14155776, 3072, 128], True)
    >>> row_strides([1, 4608, 24], [0, 128, 0])  # a (1, 4608, 1, 128) table: row // 24, not flat
    ([0, 128, 0], False)
    """
    (n0, n1, n2), (s0, s1, s2) = sizes, strides
    r = s2 if n2 > 1 else s1 if n1 > 1 else s0 if n0 > 1 else 0  # innermost moving dim: one row
    f1 = r * n2
    if (n1 == 1 or s1 == f1) and (n0 == 1 or s0 == f1 * n1):
        return [f1 * n1, f1, r], True
    return list(strides), False


def operand_strides(t: torch.Tensor, shape: Sequence[int]) -> tuple[list[int], int, bool]:
    """Leading strides (`row_strides`), last-dim stride and flatness of ``t`` broadcast to ``shape``."""
    st = _broadcast_strides(t, shape)
    lead, flat = row_strides(*lead3(shape, st))
    return lead, st[-1], flat


def batch_split(
    sizes: Sequence[int], strides: Sequence[Sequence[int]]
) -> tuple[int, int, tuple[tuple[int, int], ...]] | None:
    """Rows split into batches where every operand is flat within and across batches:
    ``(batches, rows per batch, ((batch stride, row stride) per operand))``, the largest batch that
    allows it; ``None`` where none does (or one batch). A tile within a batch is then affine in its
    row index for every operand, with no ``row // rows_per_batch`` per row.

    >>> batch_split([1, 2, 4096], [[0, 4096 * 1536, 1536], [0, 6 * 1536, 0]])  # x and an SD3 gate
    (2, 4096, ((6291456, 1536), (9216, 0)))
    """
    return _batch_split(tuple(sizes), tuple(map(tuple, strides)))


@functools.lru_cache(maxsize=1024)  # on the eager executor's per-call path; a model has few shapes
def _batch_split(sizes: tuple[int, ...], strides: tuple[tuple[int, ...], ...]):
    for k in (1, 2):  # dims k.. within a batch, dims ..k-1 index the batches
        outer, inner = [1] * (3 - k) + list(sizes[:k]), [1] * k + list(sizes[k:])
        split = []
        for st in strides:
            (_, _, bs), b_flat = row_strides(outer, [0] * (3 - k) + list(st[:k]))
            (_, _, rs), r_flat = row_strides(inner, [0] * k + list(st[k:]))
            if not (b_flat and r_flat):
                break
            split.append((bs, rs))
        else:
            if outer[1] * outer[2] > 1:
                return outer[1] * outer[2], inner[1] * inner[2], tuple(split)
    return None


def token_tile(per_tile: int, n_tokens: int, n_heads: int) -> tuple[int, int]:
    """(tokens, heads) of a tile of about ``per_tile`` rows: the head block padding fewest heads
    (ties: larger), then tokens to fill the tile.

    >>> token_tile(32, 4608, 24), token_tile(32, 75600, 40)  # Flux's and Wan's heads: 8 pad none
    ((4, 8), (4, 8))
    """
    return _token_tile(per_tile, n_tokens, n_heads)


@functools.lru_cache(maxsize=256)  # on the eager executor's per-call path; a model has few shapes
def _token_tile(per_tile: int, n_tokens: int, n_heads: int) -> tuple[int, int]:
    block_h = min(
        (b for b in (1 << i for i in range(per_tile.bit_length())) if b <= block(n_heads)),
        key=lambda b: (cdiv(n_heads, b) * b, -b),
    )
    return min(max(1, per_tile // block_h), block(n_tokens)), block_h


def row_chunk(d: int, device_type: str) -> int | None:
    """Column chunk for reducing a row of ``d`` elements: ``None`` where it fits one tile
    (`ROW_TILE_LIMIT`), else the power of two (limit/8 to limit) that pads the last chunk least.

    >>> row_chunk(3072, "npu"), row_chunk(5120, "npu"), row_chunk(5120, "cuda")  # Flux, Wan 14B
    (None, 1024, None)
    """
    limit = ROW_TILE_LIMIT.get(device_type)
    if limit is None or block(d) <= limit:
        return None
    return min((limit >> k for k in range(4)), key=lambda c: (cdiv(d, c) * c, -c))


def rows_per_tile(block_d: int, device_type: str) -> int:
    """Rows per tile so that a tile holds about `TILE_ELEMENTS` elements (at least one row)."""
    return max(1, TILE_ELEMENTS.get(device_type, 4096) // block_d)


def num_warps(tile_elements: int) -> int:
    """CUDA warps per program: at most 16 fp32 values per thread and tensor (the adaLN kernel keeps
    five row tensors live). Ignored by triton-ascend."""
    return 4 if tile_elements <= 2048 else 8 if tile_elements <= 4096 else 16


@functools.cache
def _npu_vector_cores(index: int) -> int:
    # num_vectorcore is 2 x num_aicore in triton-ascend's driver.
    try:
        from triton.runtime import driver

        return int(driver.active.utils.get_device_properties(index)["num_vectorcore"])
    except Exception:  # pragma: no cover  (no NPU here) 910B: 24 AI cores x 2 vector cores
        return 48


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def grid(n_blocks: int, device: torch.device) -> tuple[int]:
    """The 1-D grid of a persistent kernel over ``n_blocks`` row blocks on ``device``."""
    if device.type == "npu":  # pragma: no cover  (no NPU here)
        cap = _npu_vector_cores(device.index if device.index is not None else torch.npu.current_device())
    elif device.type == "cuda" and CUDA_PROGRAMS_PER_SM:
        cap = CUDA_PROGRAMS_PER_SM * _cuda_sms(
            device.index if device.index is not None else torch.cuda.current_device()
        )
    else:
        cap = _MAX_GRID
    return (max(1, min(n_blocks, cap)),)


def block(n: int) -> int:
    """The power-of-two tile width covering ``n`` elements."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` on the host (``triton.cdiv`` is a ``constexpr_function``: ~4 us per host call)."""
    return -(-a // b)


# -- device helpers (inlined into the kernels) ---------------------------------------------------


@triton.jit
def row_coords(blk, n_rows, n1, n2, BLOCK_R: tl.constexpr):
    """Rows of row block ``blk``: (in-range mask, rows, i0, i1, i2), int64 so offsets never overflow."""
    rows = (blk * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    return rows < n_rows, rows, rows // (n2 * n1), (rows // n2) % n1, rows % n2


@triton.jit
def row_start(row, n1, n2, s0, s1, s2):
    """Element offset of one (scalar) row's start: a tile of that row is one contiguous block on
    Ascend whatever the strides."""
    return (row // (n2 * n1)) * s0 + ((row // n2) % n1) * s1 + (row % n2) * s2


@triton.jit
def row_offsets(rows, i0, i1, i2, s0, s1, s2, FLAT: tl.constexpr):
    """Row-start offsets as a (BLOCK_R, 1) column: ``rows * s2`` where the operand is flat."""
    if FLAT:
        off = rows * s2
    else:
        off = i0 * s0 + i1 * s1 + i2 * s2
    return off[:, None]
