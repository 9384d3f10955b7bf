"""Shared pieces of the benchmarks: sizes, machine description, the timing helper, cold caches, tables, JSON."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

SIZES = ("tiny", "small")


def check_size(size: str) -> str:
    """Returns `size` if it is one of `SIZES`, else raises a ValueError naming the valid ones."""
    if size not in SIZES:
        raise ValueError(f"unknown benchmark size {size!r}; valid sizes: {', '.join(map(repr, SIZES))}")
    return size


def register_ops() -> None:
    """Registers ``torch.ops.ascend_kernels``, which the passes' replacements call (else nothing fuses)."""
    import ascend_kernels  # noqa: F401


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """Where the numbers were measured: OS, CPU, cores and threads, library versions, device.

    Args:
        device: the device type the benchmark's tensors are on (the benchmarks of this package run
            on the CPU wherever they are started, a GPU or NPU host included).

    >>> info = machine_info()
    >>> {"cpu", "torch", "diffusers", "device"} <= set(info)
    True
    """
    import diffusers

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    if device == "cuda":
        device = f"cuda ({torch.cuda.get_device_name(0)})"
    elif device == "npu":
        device = f"npu ({torch.npu.get_device_name(0)})"  # type: ignore[attr-defined]
    return dict(
        platform=platform.platform(),
        python=platform.python_version(),
        cpu=_cpu_model(),
        cpu_count=os.cpu_count(),
        cpu_usable=usable,
        torch_threads=torch.get_num_threads(),
        torch=torch.__version__,
        diffusers=diffusers.__version__,
        device=device,
        # Other processes distort timings.
        load_avg_1m=round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )


@contextlib.contextmanager
def cold_compile():
    """A fresh dynamo state and an empty, temporary Inductor/AOT cache: what a first run pays.

    Else the second compile of a graph is a cache hit, measuring the cache, not the compiler.
    """
    from diffusers_ascend.compilation._compat import fresh_inductor_cache

    torch.compiler.reset()
    try:
        with fresh_inductor_cache():
            yield
    finally:
        torch.compiler.reset()


def write_json(result: dict[str, Any], out_dir: str | None, name: str) -> str | None:
    """Writes `result` to ``out_dir/name`` (creating the directory) and says so; None without `out_dir`."""
    if not out_dir:
        return None
    import json

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")
    return path


def check_out_dir(out_dir: str | os.PathLike) -> str:
    """Refuses, before a run, an output folder its files could not be written to: a path that is a
    file, a parent that is a file, or a folder this process cannot write. Creates nothing.

    Returns:
        `out_dir` as a string.

    Raises:
        ValueError: naming the path and why.

    >>> check_out_dir("bench-results")
    'bench-results'
    """
    import tempfile

    path = os.fspath(out_dir)
    if not path:
        raise ValueError("the output folder is an empty path; pass a folder (created if missing)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"the output folder {path!r} is a file; pass a folder (created if missing)")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):  # the folder and its missing parents would be created
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"cannot create the output folder {path!r}: {existing!r} is a file")
    try:  # writing is the only reliable test (os.access says yes to root on a read-only mount)
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise ValueError(
            f"cannot write the output folder {path!r}: {existing!r} is not writable ({e.strerror or e})"
        ) from None
    return path


def error_line(e: BaseException) -> str:
    """``"Type: first line of the message"`` (at most 300 characters), for a failed row of a table.

    >>> error_line(RuntimeError("no kernel image\\nsecond line"))
    'RuntimeError: no kernel image'
    """
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


def synchronize(device: str) -> Callable[[], None]:
    """The call that waits for the work queued on `device` (``"cuda"``, ``"npu"``; a no-op on CPU).

    >>> synchronize("cpu")()
    """
    if device in ("cuda", "npu"):
        return getattr(torch, device).synchronize
    return lambda: None


def timed(fn: Callable[[], Any], device: str = "cpu") -> tuple[Any, float]:
    """`(fn(), seconds)`, the device's queued work included.

    >>> timed(lambda: 3)[0]
    3
    """
    sync = synchronize(device)
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def time_ms(
    fn: Callable[[], Any], runs: int = 20, warmup: int = 3, device: str = "cpu", before: Callable[[], Any] | None = None
) -> list[float]:
    """Milliseconds of each of `runs` calls of `fn`, after `warmup` untimed calls.

    On ``"cuda"`` and ``"npu"`` device timing events bracket each call; elsewhere the host clock.

    Args:
        fn: the call to time.
        runs: timed calls.
        warmup: untimed calls first (compilation, caches, allocator).
        device: ``"cpu"``, ``"cuda"`` or ``"npu"``.
        before: run before each timed call, outside the timing (e.g. an L2 cache flush).

    >>> len(time_ms(lambda: sum(range(100)), runs=5, warmup=1))
    5
    """
    for _ in range(warmup):
        fn()
    events = getattr(torch, device).Event if device in ("cuda", "npu") else None
    synchronize(device)()
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        if events is not None:
            start, end = events(enable_timing=True), events(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return times


def stats(times: Sequence[float]) -> dict[str, float]:
    """Median, minimum and 10th/90th percentiles of `times` (milliseconds).

    >>> stats([1.0, 2.0, 3.0, 4.0, 5.0])["median_ms"]
    3.0
    """
    ordered = sorted(times)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return dict(median_ms=statistics.median(ordered), min_ms=ordered[0], p10_ms=pct(0.1), p90_ms=pct(0.9))


def warm_up_compiler(inductor: bool = True) -> None:
    """Pays the once-per-process costs (Inductor import, pattern registration, toolchain check)
    outside any measurement, so the first variant measured is not penalised."""
    from diffusers_ascend.compilation import AscendBackend
    from diffusers_ascend.tiny import flux_single_block_inputs, tiny_flux_blocks

    register_ops()
    _, single = tiny_flux_blocks()
    inputs = flux_single_block_inputs()
    with cold_compile(), torch.no_grad():
        torch.compile(single, backend=AscendBackend(fusions="all", executor="eager"))(**inputs)
        if inductor:
            torch.compiler.reset()
            torch.compile(torch.nn.Linear(4, 4))(torch.randn(2, 4))


def _get(row: dict[str, Any], key: str) -> Any:
    """`row[key]`, where a dotted key reads a nested dict (``"matches.rope"``)."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def table_cells(
    rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]
) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells of `rows` for `columns` = ``[(key, title), ...]``."""
    return [title for _, title in columns], [[_fmt(_get(r, key)) for key, _ in columns] for r in rows]


def text_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A fixed-width text table (first column left-aligned, the rest right-aligned)."""
    header, cells = table_cells(rows, columns)
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]
    lines = []
    for r in [header, *cells]:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A GitHub-flavoured markdown table."""
    header, cells = table_cells(rows, columns)
    align = "|".join("---" if i == 0 else "---:" for i in range(len(header)))
    lines = ["| " + " | ".join(header) + " |", f"|{align}|"]
    lines += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(lines)


def bars(ax, labels: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    """Grouped bars, one group per label and one bar per series, each labelled with its value."""
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
