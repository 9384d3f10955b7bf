"""Launch helpers shared by the kernels: row decomposition, tiles and grid per device type.

Every kernel here works on rows: the output viewed as ``(n0, n1, n2, D)`` (leading dims padded to
three), one row per ``(i0, i1, i2)``, each operand addressed through its own strides (broadcast
dims have stride 0), so no operand is ever copied or expanded in memory. A program walks row
blocks ``pid, pid + num_programs, ...`` (a persistent loop), so the grid can be capped:

- CUDA: at most 65535 programs (far above the SM count; the cap only bounds the launch).
- Ascend (triton-ascend): the grid is at most 65535 and should be the number of vector cores
  (each program is bound to a physical core; programs beyond it run in later waves and only add
  scheduling cost), so the grid is ``min(blocks, vector cores)``. The unified buffer (192 KB per
  vector core on 910B) holds every live tile plus double buffering: tiles stay <= 4096 fp32
  elements (16 KB each). DMA moves 32-byte aligned blocks: rows whose byte length is a multiple
  of 32 (D a multiple of 16 in bf16/fp16, of 8 in fp32: every Flux/Wan width) are read without
  partial bursts.

An operand whose rows are evenly spaced (contiguous tensors, last-dim slices, a row broadcast to
every row: `row_strides` says which) is addressed as ``row * stride``, a constexpr specialization
of the general ``i0 * s0 + i1 * s1 + i2 * s2``. Both give the same offsets; the flat form skips the
int64 ``//`` and ``%`` per row, and triton-ascend reads its affine addresses as one 2-D block where
the general form's computed row starts make it issue one DMA per row (`DiscreteMemAccess` in its
lowering, ``tests/triton/test_ascend_lowering.py``). The output, allocated by the plan, is
contiguous: row ``r`` starts at ``r * d``. An operand whose row is a quotient of the row number
(``row // H``: one rope table row per token, one adaLN modulation or mul_add gate row per batch),
or x whose rows are not evenly spaced (q of fused QKV projections), is not flat; on
`AFFINE_TILE_DEVICES` those kernels walk tiles that stay within one group instead (rope and
rms_norm: one batch's tokens x heads, `token_tile`; adaLN and mul_add: rows of one batch,
`batch_split`), where every address is affine in the tile's indices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Iterator, Sequence

import torch
import triton
import triton.language as tl

__all__ = [
    "AFFINE_TILE_DEVICES", "Launch", "ROW_TILE_LIMIT", "TILE_ELEMENTS", "ascend_tiling", "batch_split", "block",
    "cdiv", "grid", "lead3", "num_warps", "operand_strides", "options", "row_chunk", "row_coords", "row_offsets",
    "row_start", "row_strides", "rows_per_tile", "strides_as", "token_tile",
]

# Device types whose kernels plan tiles with addresses affine in each tile index where an operand's
# rows depend on a quotient of the row number (rope's per-token tables broadcast over the heads,
# adaLN's per-batch modulation, mul_add's per-batch gate, rms_norm's x with unevenly spaced rows
# such as q of fused QKV projections): triton-ascend moves such a tile as one block, where row
# tiles make it issue one DMA per row (module docstring). CUDA keeps the row tiles its H100 numbers
# were measured with. The interpreter and lowering tests widen it, as they widen `DEVICE_TYPES`.
AFFINE_TILE_DEVICES: tuple[str, ...] = ("npu",)


@contextlib.contextmanager
def ascend_tiling(*device_types: str) -> Iterator[None]:
    """Plan as Ascend plans on ``device_types`` too while the block runs: `AFFINE_TILE_DEVICES`
    widened to them and Ascend's `ROW_TILE_LIMIT` applied to them, both restored on exit (also on
    error). For the checks that run Ascend's plans elsewhere: the interpreter tests on CPU, the
    ``cuda`` tests and ``bench kernels`` on a GPU, ``bench host_path``. Not
    thread-safe: it sets module state for the process.

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


# Elements per tile (rows x block columns), per device type.
TILE_ELEMENTS = {"cuda": 4096, "npu": 4096}
# Longest row (elements, a power of two) that a reduction over the row keeps in one tile, per device
# type; a longer row is reduced in column chunks (`row_chunk`). Ascend: every live tile of a program,
# times two where triton-ascend double-buffers a load (its default), must fit the 192 KB unified
# buffer, or bishengir-compile fails with "ub overflow"; an adaLN tile of Wan 14B's 5120-wide rows
# (8192 lanes: x in bf16 and fp32, the centred row, scale, shift, y) needs more than that by a count
# of its live tiles (an estimate: bishengir-compile, which decides, cannot run here). CUDA: no limit
# below `limits.max_row` (registers; the H100 numbers are of whole-row tiles).
ROW_TILE_LIMIT: dict[str, int] = {"npu": 4096}
_MAX_GRID = 65535
# CUDA: programs per SM of a persistent launch (None: one program per row block, up to 65535).
# Swept on an H100 (tiles of 2048-16384 elements x {None, 2, 4, 8, 16} programs per SM, the eight
# cases of bench kernels, 2026-11-23): 16 per SM with 4096-element tiles is within 3% of
# the best of each case, and lifts Wan 14B adaLN from 55% to 75% of copy bandwidth (the
# modulation row is read once per program, not once per row); 2 per SM starves Flux sizes.
CUDA_PROGRAMS_PER_SM: int | None = 16


@dataclasses.dataclass
class Launch:
    """One kernel launch, planned from tensor metadata only (``plan_*`` of each kernel module accept
    meta tensors too, so tests can compile the exact launch for a GPU target without a GPU)."""

    kernel: Any
    grid: tuple[int]
    args: tuple
    constexprs: dict[str, Any]
    num_warps: int
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps, **self.options)

    def traced(self) -> None:
        """The launch through `torch.library.wrap_triton`, for the body of a ``triton_op``: traced by
        a compiler it records the ``triton_kernel_wrapper_*`` higher-order op (the kernel, this grid
        and these arguments), which Inductor compiles and launches from its own wrapper code; run
        eagerly it is the plain launch. `options` are left out: Inductor compiles a user kernel with
        its own options and rejects others as kernel arguments."""
        from torch.library import wrap_triton

        wrap_triton(self.kernel)[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps)


def options(device: torch.device) -> dict[str, Any]:
    """Compiler options of a launch on ``device``. CUDA: FMA contraction on, stated explicitly
    (Triton 3.9 warns that its default turns off in 3.10; torch's own CUDA kernels contract too).
    Nothing elsewhere: triton-ascend rejects options its backend does not define."""
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
    """Strides of ``t`` broadcast to ``shape`` (``t.expand(shape).stride()`` without building the
    view, on the per-call host path): (three leading strides, last-dim stride)."""
    st = _broadcast_strides(t, shape)
    return lead3(shape, st)[1], st[-1]


def row_strides(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[int], bool]:
    """An operand's three leading strides for `row_offsets`, and whether its rows are flat.

    Flat: row ``r = (i0 * n1 + i1) * n2 + i2`` starts at ``r * s2`` (contiguous rows, last-dim
    slices, one row broadcast to all: stride 0). The stride of a size-1 dim is never multiplied by
    a non-zero index, so it is rewritten to keep the general formula equal to the flat one; the
    kernel may then use either.

    Args:
        sizes: ``(n0, n1, n2)``, the leading sizes of the output (`lead3`).
        strides: the operand's leading strides against those sizes.

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
    """What a kernel takes for an operand ``t`` broadcast to the output ``shape``: its three leading
    strides (`row_strides`), its last-dim stride, and whether its rows are flat."""
    st = _broadcast_strides(t, shape)
    lead, flat = row_strides(*lead3(shape, st))
    return lead, st[-1], flat


def batch_split(
    sizes: Sequence[int], strides: Sequence[Sequence[int]]
) -> tuple[int, int, tuple[tuple[int, int], ...]] | None:
    """Rows split into batches of consecutive rows, where every operand is flat within a batch and
    from batch to batch: ``(batches, rows per batch, [(batch stride, row stride) per operand])``,
    with the most rows per batch that allows it; ``None`` where no split does (or only one batch).

    An operand's row ``j`` of batch ``b`` then starts at ``b * batch_stride + j * row_stride``: a
    per-batch modulation or gate ``(B, 1, D)`` is row stride 0, a table shared by the batch is batch
    stride 0. A tile within one batch is affine in ``j`` for every operand, where row tiles of the
    whole tensor would compute ``row // rows_per_batch`` per row.

    Args:
        sizes: ``(n0, n1, n2)``, the leading sizes of the output (`lead3`).
        strides: each operand's three leading strides against those sizes.

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
    """(tokens, heads) of a 2-D tile of about ``per_tile`` rows over a tokens x heads grid of rows: the
    head block that pads the fewest heads (ties: the larger block), then tokens to fill the tile.

    >>> token_tile(32, 4608, 24), token_tile(32, 75600, 40)  # Flux's and Wan's heads: 8 pad none
    ((4, 8), (4, 8))
    """
    return _token_tile(per_tile, n_tokens, n_heads)


@functools.lru_cache(maxsize=256)  # on the eager executor's per-call path; a model has few shapes
def _token_tile(per_tile: int, n_tokens: int, n_heads: int) -> tuple[int, int]:
    block_h = min((b for b in (1 << i for i in range(per_tile.bit_length())) if b <= block(n_heads)),
                  key=lambda b: (cdiv(n_heads, b) * b, -b))
    return min(max(1, per_tile // block_h), block(n_tokens)), block_h


def row_chunk(d: int, device_type: str) -> int | None:
    """Column chunk of a row of ``d`` elements reduced in chunks on ``device_type``: ``None`` where the
    row fits one tile (`ROW_TILE_LIMIT`), else the power of two up to that limit, and at least an
    eighth of it, that pads the last chunk least (ties: the larger).

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
    five row tensors live; more spills registers). Ignored by triton-ascend."""
    return 4 if tile_elements <= 2048 else 8 if tile_elements <= 4096 else 16


@functools.lru_cache(maxsize=None)
def _npu_vector_cores(index: int) -> int:
    # triton-ascend's driver reports the cores of the device (3.2.0, backends/ascend/driver.py:
    # NPUUtils.get_device_properties -> {"num_aicore": n, "num_vectorcore": 2 * n}).
    try:
        from triton.runtime import driver

        return int(driver.active.utils.get_device_properties(index)["num_vectorcore"])
    except Exception:  # pragma: no cover  (no NPU here) 910B: 24 AI cores x 2 vector cores
        return 48


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def grid(n_blocks: int, device: torch.device) -> tuple[int]:
    """The 1-D grid of a persistent kernel over ``n_blocks`` row blocks on ``device``."""
    if device.type == "npu":  # pragma: no cover  (no NPU here)
        cap = _npu_vector_cores(device.index if device.index is not None else torch.npu.current_device())
    elif device.type == "cuda" and CUDA_PROGRAMS_PER_SM:
        cap = CUDA_PROGRAMS_PER_SM * _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    else:
        cap = _MAX_GRID
    return (max(1, min(n_blocks, cap)),)


def block(n: int) -> int:
    """The power-of-two tile width covering ``n`` elements."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` on the host. (``triton.cdiv`` and ``triton.next_power_of_2`` are
    ``constexpr_function``s in Triton 3.x, about 4 us per host call through their wrapper.)"""
    return -(-a // b)


# -- device helpers (inlined into the kernels) ---------------------------------------------------


@triton.jit
def row_coords(blk, n_rows, n1, n2, BLOCK_R: tl.constexpr):
    """Rows of row block ``blk``: (in-range mask, rows, i0, i1, i2), int64 so offsets never
    overflow. (Indices no operand uses are dropped by the compiler.)"""
    rows = (blk * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    return rows < n_rows, rows, rows // (n2 * n1), (rows // n2) % n1, rows % n2


@triton.jit
def row_start(row, n1, n2, s0, s1, s2):
    """Element offset of one row's start (a scalar ``row``, int64) for leading strides (s0, s1, s2):
    ``i0 * s0 + i1 * s1 + i2 * s2``. A scalar, so a tile of that row is one contiguous block on
    Ascend whatever the strides (the row-at-a-time chunk kernels)."""
    return (row // (n2 * n1)) * s0 + ((row // n2) % n1) * s1 + (row % n2) * s2


@triton.jit
def row_offsets(rows, i0, i1, i2, s0, s1, s2, FLAT: tl.constexpr):
    """Element offsets of the rows' starts for leading strides (s0, s1, s2) from `row_strides`, as
    a column (BLOCK_R, 1): ``rows * s2`` where the operand is flat (the same offsets)."""
    if FLAT:
        off = rows * s2
    else:
        off = i0 * s0 + i1 * s1 + i2 * s2
    return off[:, None]
