"""Triton kernels vs eager and torch.compile of the same composite, at Flux and Wan 14B sizes (bf16, CUDA).

    diffusers-ascend bench kernels --out benchmarks/results/     # needs a CUDA GPU

Per case: the composite as diffusers writes it, run eager and compiled by Inductor (default mode),
the Triton kernel called directly, through ``torch.ops.ascend_kernels`` (with the dispatcher), and
as its ``triton_op`` compiled by Inductor (Inductor's own code launches the kernel: what the
inductor executor runs, see `diffusers_ascend.compilation.backend.bind_compiler_ops`), each timed
twice (`time_ms`: median, L2 flushed before each run):

- ``*_ms``: CUDA events around a plain call. At Flux sizes a kernel
  moves ~50-75 MB in ~20 us, less than the host needs to launch it (Triton's launcher, and for the
  op the dispatcher and provider selection), so this column is host-inclusive: what an uncaptured
  call costs.
- ``*_dev_ms``: the same call captured once in a CUDA graph and replayed between the events: the
  device time alone, what a call costs under graph capture (and the kernel's own speed). Achieved
  bandwidth and the comparisons with Inductor's code are taken from these.

Where Ascend plans the call differently (`ascend_kernels.triton._common.ascend_tiling`: rope's and
rms_norm's token tiles, adaLN's and mul_add's batch tiles, row chunks of Wan's 5120-wide
reductions), that tiling is timed too, on this GPU (``ascend_tiles``; ``ascend_tiles_vs_kernel`` above 1: faster than the row tiles CUDA plans):
the measurement that would move CUDA to it. The batch-2 cases (two Flux images a prompt, SD3's
batched CFG) and Flux's q after ``fuse_qkv_projections`` are the forms where it differs.

Achieved bandwidth counts the bytes a fused kernel must move (each input read once at its real
size, the output written once) and is compared with this device's measured device-to-device copy
bandwidth (a 1 GiB copy), and the device time with that of a copy moving the same bytes
(``*_pct_same_size_copy``: at Flux sizes even a copy loses to ramp-up and tail, which this
separates from the kernel's own efficiency). ``ceiling_vs_compiled`` is Inductor's device time
over that copy's: about the most any kernel that moves these bytes can gain over Inductor's code
(a copy's reads and writes are balanced where a kernel's are not, hence "about").

It prints a table, writes ``kernels.json`` (with the machine) and prints the
`ascend_kernels.triton.measurements.Measurement` rows to record (only after the block check of
`bench_blocks`; see that module's docstring). A path that fails (say Inductor's launch of the
``triton_op``) is reported in its row's ``errors`` and on stderr, the others are still measured,
and the command exits 1.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ._common import error_line, machine_info, text_table, time_ms, write_json

# Flux: 4096 image + 512 text tokens at 1024x1024, 24 heads of 128, width 3072. Wan 2.1 14B at
# 1280x720, 81 frames: 21 x 45 x 80 = 75600 tokens, 40 heads of 128, width 5120.
FLUX_TOKENS, FLUX_IMG, FLUX_DIM, FLUX_HEADS = 4608, 4096, 3072, 24
WAN_TOKENS, WAN_DIM, WAN_HEADS = 75600, 5120, 40
SD3_DIM = 1536  # SD3 medium's width, at 1024x1024 (4096 image tokens) under a batched CFG
HEAD_DIM = 128


@dataclasses.dataclass
class Case:
    name: str
    op: str
    shape: str
    make: Callable[[], tuple]  # () -> op args (on CUDA)
    composite: Callable[..., Any]  # the diffusers code, same args


def _cases() -> list[Case]:
    import torch
    import torch.nn.functional as F

    bf, f32 = torch.bfloat16, torch.float32

    def rand(*shape, dtype=bf):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    def rms(x, w, eps, out_dtype):  # torch.nn.RMSNorm (Flux/Wan norm_q, norm_k)
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    def rope_flux(x, cos, sin, layout):  # diffusers apply_rotary_emb(use_real=True, unbind_dim=-1)
        x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
        return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)

    def adaln_flux(x, scale, shift, eps, w, b, out_dtype):  # AdaLayerNormZero
        return F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale[:, None]) + shift[:, None]

    def adaln_wan(x, scale, shift, eps, w, b, out_dtype):  # WanTransformerBlock, fp32 modulation
        return (F.layer_norm(x.float(), (x.shape[-1],), eps=eps) * (1 + scale) + shift).type_as(x)

    def gate(x, y, z):  # residual + gate * y (Flux); Wan: h.float() + y * gate_f32
        return z + x * y

    def flux_tables():
        return rand(1, FLUX_TOKENS, 1, HEAD_DIM, dtype=f32), rand(1, FLUX_TOKENS, 1, HEAD_DIM, dtype=f32)

    def fused_qkv_q(batch):  # q of FluxAttention after fuse_projections(): a chunk of to_qkv's output
        return rand(batch, FLUX_IMG, 3 * FLUX_DIM)[..., :FLUX_DIM].unflatten(-1, (FLUX_HEADS, HEAD_DIM))

    def sd3_modulation():  # scale, shift and gate: chunks of SD3's AdaLayerNormZero output (B, 6 x D)
        mod = rand(2, 6 * SD3_DIM)
        return mod[:, :SD3_DIM], mod[:, SD3_DIM : 2 * SD3_DIM], mod[:, 2 * SD3_DIM : 3 * SD3_DIM]

    def wan_tables():
        return rand(1, WAN_TOKENS, 1, HEAD_DIM, dtype=f32), rand(1, WAN_TOKENS, 1, HEAD_DIM, dtype=f32)

    return [
        Case(
            "flux_qk_norm",
            "rms_norm",
            f"1x{FLUX_TOKENS}x{FLUX_HEADS}x{HEAD_DIM}",
            lambda: (rand(1, FLUX_TOKENS, FLUX_HEADS, HEAD_DIM), rand(HEAD_DIM), 1e-6, None),
            rms,
        ),
        Case(
            "wan_qk_norm",
            "rms_norm",
            f"1x{WAN_TOKENS}x{WAN_DIM}",
            lambda: (rand(1, WAN_TOKENS, WAN_DIM), rand(WAN_DIM), 1e-6, None),
            rms,
        ),
        Case(
            "flux_rope",
            "rope",
            f"1x{FLUX_TOKENS}x{FLUX_HEADS}x{HEAD_DIM}",
            lambda: (rand(1, FLUX_TOKENS, FLUX_HEADS, HEAD_DIM), *flux_tables(), "interleaved"),
            rope_flux,
        ),
        Case(
            "wan_rope",
            "rope",
            f"1x{WAN_TOKENS}x{WAN_HEADS}x{HEAD_DIM}",
            lambda: (rand(1, WAN_TOKENS, WAN_HEADS, HEAD_DIM), *wan_tables(), "interleaved"),
            rope_flux,
        ),
        Case(
            "flux_adaln",
            "adaln_modulate",
            f"1x{FLUX_IMG}x{FLUX_DIM}",
            lambda: (rand(1, FLUX_IMG, FLUX_DIM), rand(1, FLUX_DIM), rand(1, FLUX_DIM), 1e-6, None, None, None),
            adaln_flux,
        ),
        Case(
            "wan_adaln",
            "adaln_modulate",
            f"1x{WAN_TOKENS}x{WAN_DIM}",
            lambda: (
                rand(1, WAN_TOKENS, WAN_DIM),
                rand(1, 1, WAN_DIM, dtype=f32),
                rand(1, 1, WAN_DIM, dtype=f32),
                1e-6,
                None,
                None,
                bf,
            ),
            adaln_wan,
        ),
        Case(
            "flux_gate",
            "mul_add",
            f"1x{FLUX_IMG}x{FLUX_DIM}",
            lambda: (rand(1, 1, FLUX_DIM), rand(1, FLUX_IMG, FLUX_DIM), rand(1, FLUX_IMG, FLUX_DIM)),
            gate,
        ),
        Case(
            "wan_gate",
            "mul_add",
            f"1x{WAN_TOKENS}x{WAN_DIM}",
            lambda: (
                rand(1, WAN_TOKENS, WAN_DIM),
                rand(1, 1, WAN_DIM, dtype=f32),
                rand(1, WAN_TOKENS, WAN_DIM, dtype=f32),
            ),
            gate,
        ),
        # Forms whose Ascend tiling differs from CUDA's row tiles (see the module docstring).
        Case(
            "flux_qkv_q_norm",
            "rms_norm",
            f"1x{FLUX_IMG}x{FLUX_HEADS}x{HEAD_DIM} of QKV",
            lambda: (fused_qkv_q(1), rand(HEAD_DIM), 1e-6, None),
            rms,
        ),
        Case(
            "flux_rope_batch2",
            "rope",
            f"2x{FLUX_TOKENS}x{FLUX_HEADS}x{HEAD_DIM}",
            lambda: (rand(2, FLUX_TOKENS, FLUX_HEADS, HEAD_DIM), *flux_tables(), "interleaved"),
            rope_flux,
        ),
        Case(
            "sd3_adaln_batch2",
            "adaln_modulate",
            f"2x{FLUX_IMG}x{SD3_DIM}",
            lambda: (rand(2, FLUX_IMG, SD3_DIM), *sd3_modulation()[:2], 1e-6, None, None, None),
            adaln_flux,
        ),
        Case(
            "sd3_gate_batch2",
            "mul_add",
            f"2x{FLUX_IMG}x{SD3_DIM}",
            lambda: (sd3_modulation()[2][:, None], rand(2, FLUX_IMG, SD3_DIM), rand(2, FLUX_IMG, SD3_DIM)),
            gate,
        ),
    ]


def _bytes(args: Sequence[Any], out) -> int:
    import torch

    return (
        sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
        + out.numel() * out.element_size()
    )


def _l2_flush() -> Callable[[], Any]:
    """Writes 256 MB, more than any L2: each timed call starts from a cold cache."""
    import torch

    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_


def host_ms(fn: Callable[[], Any], runs: int = 200) -> float:
    """Median time of a plain call of ``fn`` between CUDA events, the host's launch cost included."""
    return statistics.median(time_ms(fn, runs=runs, warmup=25, device="cuda", before=_l2_flush()))


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB: bytes read + written per second, in GB/s."""
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = host_ms(lambda: dst.copy_(src), runs=50)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def same_size_copy_ms(moved: int) -> float:
    """Device time (`device_ms`) of a device-to-device copy that moves ``moved`` bytes in all (half
    read, half written): the floor for a case of that size, ramp-up and tail included. A 50 MB
    Flux-size call cannot reach the 1 GiB copy's bandwidth even as a plain copy; against this the
    kernel's own efficiency shows."""
    import torch

    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return device_ms(lambda: dst.copy_(src))


def device_ms(fn: Callable[[], Any], reps: int = 100) -> float:
    """Median device time of ``fn`` (CUDA kernels only; no host launch cost): ``fn`` captured in a CUDA
    graph, each replay bracketed by events after an L2 flush (256 MB written, more than any L2)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = time_ms(graph.replay, runs=reps, warmup=0, device="cuda", before=_l2_flush())
    del graph
    return statistics.median(times)


# Paths also timed on the device; the op's device time is the kernel's (only its host path differs).
DEVICE_TIMED = ("eager", "compiled", "kernel", "traced", "ascend_tiles")


def measure(
    paths: dict[str, Callable[..., Any]],
    args: Sequence[Any],
    host_ms: Callable[[Callable[[], Any]], float],
    dev_ms: Callable[[Callable[[], Any]], float],
) -> tuple[dict[str, float], dict[str, Any], dict[str, str]]:
    """Runs each path once (compiling outside the timing), then times it: ``<path>_ms`` host-inclusive
    and, for `DEVICE_TIMED`, ``<path>_dev_ms``. A path that raises is recorded in the errors (its
    first line) and the other paths are still measured, so one broken path does not cost the rest
    of a GPU session's numbers; the command then exits non-zero.

    Returns:
        ``(times, outputs, errors)``, each keyed by path name.
    """
    times: dict[str, float] = {}
    outs: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for key, fn in paths.items():
        try:
            outs[key] = fn(*args)
            times[f"{key}_ms"] = host_ms(lambda fn=fn: fn(*args))
            if key in DEVICE_TIMED:
                times[f"{key}_dev_ms"] = dev_ms(lambda fn=fn: fn(*args))
        except Exception as e:  # noqa: BLE001  (reported per path; see the docstring)
            errors[key] = error_line(e)
    return times, outs, errors


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def summarize(
    case: str,
    op: str,
    shape: str,
    moved: int,
    peak_gbs: float,
    times: dict[str, float],
    outs: dict[str, Any],
    errors: dict[str, str],
    copy_ms: float | None = None,
) -> dict[str, Any]:
    """One table row from `measure`'s results: bandwidth and % of copy from device times (of the
    1 GiB copy's bandwidth ``peak_gbs``, and of ``copy_ms``, a copy moving the same bytes), the
    kernel against eager and Inductor, and each fused path's largest difference from eager."""
    row: dict[str, Any] = dict(case=case, op=op, shape=shape, mb_moved=moved / 1e6, copy_dev_ms=copy_ms, **times)
    for key in DEVICE_TIMED:
        ms = times.get(f"{key}_dev_ms")
        gbs = moved / (ms * 1e-3) / 1e9 if ms else None
        row[f"{key}_gbs"], row[f"{key}_pct_copy"] = gbs, _ratio(100 * gbs, peak_gbs) if gbs else None
        row[f"{key}_pct_same_size_copy"] = _ratio(100 * copy_ms, ms) if copy_ms else None
    # About the most any kernel moving these bytes can gain over Inductor's code: Inductor's device
    # time against a copy of the same bytes (below 1.5: no kernel of this composite is 1.5x faster).
    row["ceiling_vs_compiled"] = _ratio(times.get("compiled_dev_ms"), copy_ms)
    row["kernel_vs_eager"] = _ratio(times.get("eager_dev_ms"), times.get("kernel_dev_ms"))
    row["kernel_vs_compiled"] = _ratio(times.get("compiled_dev_ms"), times.get("kernel_dev_ms"))
    row["traced_vs_compiled"] = _ratio(times.get("compiled_dev_ms"), times.get("traced_dev_ms"))
    row["host_kernel_vs_compiled"] = _ratio(times.get("compiled_ms"), times.get("kernel_ms"))
    row["host_traced_vs_compiled"] = _ratio(times.get("compiled_ms"), times.get("traced_ms"))
    row["ascend_tiles_vs_kernel"] = _ratio(times.get("kernel_dev_ms"), times.get("ascend_tiles_dev_ms"))
    ref = outs.get("eager")
    for key in ("kernel", "op", "traced", "ascend_tiles"):
        out = outs.get(key)
        row[f"{key}_max_abs_diff"] = (
            float((out.float() - ref.float()).abs().max()) if out is not None and ref is not None else None
        )
    row["errors"] = dict(errors)
    return row


def run(cases: Sequence[str] | None = None) -> dict[str, Any]:
    import torch
    import triton

    import ascend_kernels  # noqa: F401  (registers torch.ops.ascend_kernels)
    from ascend_kernels.registry import use_providers
    from ascend_kernels.triton import _common, planner, traceable_op
    from ascend_kernels.triton import kernel as triton_kernel

    torch.manual_seed(0)
    peak = copy_bandwidth_gbs()
    rows = []
    for case in _cases():
        if cases and case.name not in cases:
            continue
        args = case.make()
        torch.compiler.reset()
        paths = dict(
            eager=case.composite,
            compiled=torch.compile(case.composite),
            kernel=triton_kernel(case.op),
            op=getattr(torch.ops.ascend_kernels, case.op),
            traced=torch.compile(lambda *a, _op=traceable_op(case.op): _op(*a)),  # noqa: B008  (bound per case)
        )
        row_kernel = planner(case.op)(*args)[1].kernel.__name__
        with _common.ascend_tiling("cuda"):
            ascend_kernel = planner(case.op)(*args)[1].kernel.__name__
        if ascend_kernel != row_kernel:  # time Ascend's tiling on this GPU too
            paths["ascend_tiles"] = _with_ascend_tiles(paths["kernel"])
        with use_providers(**{case.op: "triton"}):
            times, outs, errors = measure(paths, args, host_ms, device_ms)
        out = outs["kernel"] if "kernel" in outs else case.composite(*args)  # its size: the bytes written
        moved = _bytes(args, out)
        row = summarize(
            case.name, case.op, case.shape, moved, peak, times, outs, errors, copy_ms=same_size_copy_ms(moved)
        )
        rows.append(dict(row, row_kernel=row_kernel, ascend_kernel=ascend_kernel))
        del args, outs, out
        torch.cuda.empty_cache()
    torch.compiler.reset()
    return dict(
        benchmark="kernels",
        dtype="bf16",
        copy_gbs=peak,
        machine=machine_info("cuda"),
        versions=f"torch {torch.__version__}, triton {triton.__version__}",
        device=torch.cuda.get_device_name(0),
        rows=rows,
    )


def _with_ascend_tiles(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` planned as Ascend plans it (`ascend_kernels.triton._common.ascend_tiling` around
    each call; under the device timing's CUDA graph the plan is made once, at capture)."""
    from ascend_kernels.triton._common import ascend_tiling

    def call(*args):
        with ascend_tiling("cuda"):
            return kernel(*args)

    return call


COLUMNS = [
    ("case", "case"),
    ("shape", "shape"),
    ("mb_moved", "MB"),
    ("eager_dev_ms", "eager dev ms"),
    ("compiled_dev_ms", "compiled dev ms"),
    ("kernel_dev_ms", "triton dev ms"),
    ("kernel_gbs", "triton GB/s"),
    ("kernel_pct_copy", "triton % copy"),
    ("compiled_pct_copy", "compiled % copy"),
    ("copy_dev_ms", "same-size copy dev ms"),
    ("kernel_pct_same_size_copy", "triton % same-size copy"),
    ("compiled_pct_same_size_copy", "compiled % same-size copy"),
    ("kernel_vs_eager", "vs eager"),
    ("kernel_vs_compiled", "vs compiled"),
    ("ceiling_vs_compiled", "ceiling vs compiled (a copy of the bytes)"),
    ("compiled_ms", "compiled host ms"),
    ("kernel_ms", "triton host ms"),
    ("op_ms", "triton op host ms"),
    ("traced_ms", "triton in Inductor host ms"),
    ("traced_dev_ms", "triton in Inductor dev ms"),
    ("traced_vs_compiled", "in Inductor vs compiled"),
    ("kernel_max_abs_diff", "max |diff|"),
    ("traced_max_abs_diff", "in Inductor max |diff|"),
    ("ascend_kernel", "Ascend tiling"),
    ("ascend_tiles_dev_ms", "Ascend tiling dev ms"),
    ("ascend_tiles_vs_kernel", "Ascend tiling vs row tiles"),
]


def measurement_rows(result: dict[str, Any]) -> list[str]:
    """`Measurement(...)` source lines for `ascend_kernels.triton.measurements.MEASUREMENTS`."""
    date = datetime.date.today().isoformat()
    return [
        f"Measurement({r['op']!r}, 'cuda', {result['device']!r}, {r['case']!r}, 'bf16', "
        f"kernel_ms={r['kernel_dev_ms']:.4f}, compiled_ms={r['compiled_dev_ms']:.4f}, versions={result['versions']!r}, "
        f"date={date!r}),"
        for r in result["rows"]
        if r.get("kernel_dev_ms") is not None and r.get("compiled_dev_ms") is not None  # both measured
    ]


def cli(args) -> int:
    """``diffusers-ascend bench kernels``: 0 when every path ran, 1 when one failed, 2 without a GPU."""
    import torch

    if not torch.cuda.is_available():
        print(
            "bench kernels measures Triton kernels on a CUDA GPU and none is available here "
            "(torch.cuda.is_available() is False). Correctness without a GPU: "
            "TRITON_INTERPRET=1 python -m pytest tests/triton",
            file=sys.stderr,
        )
        return 2
    result = run(args.case)
    print(f"{result['device']}: measured copy bandwidth {result['copy_gbs']:.0f} GB/s ({result['versions']})")
    print(text_table(result["rows"], COLUMNS))
    print("\nrows for ascend_kernels/triton/measurements.py (after the block check of bench blocks):")
    print("\n".join(measurement_rows(result)))
    write_json(result, args.out, "kernels.json")
    failed = [(r["case"], path, e) for r in result["rows"] for path, e in r["errors"].items()]
    for case, path, e in failed:
        print(f"FAILED {case} {path}: {e}", file=sys.stderr)
    return 1 if failed else 0
