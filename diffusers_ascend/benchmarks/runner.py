"""`run_benchmarks`: run a selection of benchmarks, print their tables, write JSON, markdown and a plot.

The benchmarks it runs are the suite entries of `registry.REGISTRY` (those with a ``function``).
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._common import SIZES, check_out_dir, check_size, machine_info, markdown_table, text_table
from .registry import REGISTRY

_SUITE = {name: importlib.import_module(f"{__package__}.{b.module}") for name, b in REGISTRY.items() if b.function}

# name -> the function that measures it, in `REGISTRY` order (what ``diffusers-ascend bench`` runs).
BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    name: getattr(module, REGISTRY[name].function) for name, module in _SUITE.items()
}


def _check_names(names: Sequence[str] | str | None) -> list[str]:
    if names is None:
        return list(BENCHMARKS)
    if isinstance(names, str):
        names = [names]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; valid: {list(BENCHMARKS)}")
    return list(dict.fromkeys(names))


def format_result(result: dict[str, Any], markdown: bool = False) -> str:
    """One benchmark's result as a titled text (or markdown) table."""
    table = (markdown_table if markdown else text_table)(result["rows"], result["columns"])
    entry = REGISTRY.get(result["benchmark"])
    title = f"{entry.help if entry else result['benchmark']} [size={result['size']}]"
    if markdown:
        return f"## {result['benchmark']}\n\n{title}.\n\n{table}\n"
    return f"{title}\n{table}\n"


def run_benchmarks(
    names: Sequence[str] | str | None = None,
    size: str = "small",
    out_dir: str | os.PathLike | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    verbose: bool = True,
) -> dict[str, Any]:
    """Runs benchmarks, prints a table per benchmark and, with `out_dir`, writes ``results.json``,
    ``results.md`` and ``results.png`` there.

    Args:
        names: benchmark names (keys of `BENCHMARKS`: ``"ops_per_block"``, ``"compile_time"``,
            ``"recompiles"``, ``"latency"``), one name, or None for all.
        size: ``"tiny"`` (seconds; for tests) or ``"small"`` (the real benchmark, minutes on CPU).
        out_dir: directory to write the results to (created if needed); None writes nothing.
        options: per-benchmark keyword arguments, e.g. ``{"latency": {"runs": 50}}``.
        verbose: print each table as it completes.

    Returns:
        ``{"size", "machine", "benchmarks": {name: result}, "seconds"}``; each result is what the
        benchmark function returns (``rows``, ``columns``, ``machine``...) plus its ``seconds``.

    Raises:
        ValueError: for an unknown benchmark name, size or `options` key, or an `out_dir` that cannot be
            written (checked before anything runs).

    >>> results = run_benchmarks(["ops_per_block"], size="tiny", verbose=False)
    >>> results["benchmarks"]["ops_per_block"]["rows"][0]["block"]
    'flux_double'
    """
    selected = _check_names(names)
    check_size(size)
    options = dict(options or {})
    unknown = [k for k in options if k not in BENCHMARKS]
    if unknown:
        raise ValueError(f"options given for unknown benchmark(s) {unknown}; valid: {list(BENCHMARKS)}")
    if out_dir is not None:
        check_out_dir(out_dir)  # before minutes of benchmarking, not after
    results: dict[str, Any] = dict(size=size, machine=machine_info(), benchmarks={})
    start = time.perf_counter()
    for name in selected:
        t0 = time.perf_counter()
        result = BENCHMARKS[name](size=size, **options.get(name, {}))
        result["seconds"] = time.perf_counter() - t0
        results["benchmarks"][name] = result
        if verbose:
            print(format_result(result), flush=True)
    results["seconds"] = time.perf_counter() - start
    if out_dir is not None:
        write_results(results, out_dir)
    return results


# -- files --------------------------------------------------------------------------------------


def _machine_md(machine: dict[str, Any]) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in machine.items())


def to_markdown(results: dict[str, Any]) -> str:
    """The results as markdown: machine description, then one table per benchmark."""
    parts = [
        f"# diffusers-ascend benchmarks (size={results['size']})\n",
        "Machine:\n",
        _machine_md(results["machine"]),
        "",
    ]
    parts += [format_result(r, markdown=True) for r in results["benchmarks"].values()]
    return "\n".join(parts)


def _jsonable(results: dict[str, Any]) -> dict[str, Any]:
    # `columns` are display metadata (tuples); keep them as [key, title] pairs.
    return json.loads(json.dumps(results, default=str))


def write_results(results: dict[str, Any], out_dir: str | os.PathLike, stem: str = "results") -> dict[str, str]:
    """Writes ``{stem}.json``, ``{stem}.md`` and ``{stem}.png`` to `out_dir`; returns their paths.

    Args:
        results: what `run_benchmarks` returned.
        out_dir: directory, created if needed.
        stem: file name without extension (the per-benchmark scripts use the benchmark's name).

    >>> results = run_benchmarks("ops_per_block", size="tiny", verbose=False)
    >>> sorted(write_results(results, "/tmp/bench"))
    ['json', 'md', 'png']
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: os.path.join(str(out_dir), f"{stem}.{ext}") for ext in ("json", "md", "png")}
    with open(paths["json"], "w") as f:
        json.dump(_jsonable(results), f, indent=2)
        f.write("\n")
    with open(paths["md"], "w") as f:
        f.write(to_markdown(results))
    plot_results(results, paths["png"])
    return paths


def plot_results(results: dict[str, Any], path: str | os.PathLike) -> None:
    """One bar-chart panel per benchmark that ran, saved to `path` (matplotlib, Agg backend).

    Raises:
        ImportError: when matplotlib is missing (``pip install diffusers-ascend[bench]``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plotting benchmark results needs matplotlib: pip install 'diffusers-ascend[bench]'") from e

    panels = [(n, r) for n, r in results["benchmarks"].items() if n in _SUITE]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.5 * max(len(panels), 1), 4.2), squeeze=False)
    for ax, (name, result) in zip(axes[0], panels):
        _SUITE[name].plot(ax, result["rows"])
        ax.set_title(name, fontsize=11)
        ax.grid(axis="y", alpha=0.3)
    machine = results["machine"]
    fig.suptitle(
        f"diffusers-ascend benchmarks, size={results['size']} - {machine['cpu']} "
        f"({machine['cpu_usable']} cores), torch {machine['torch']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["BENCHMARKS", "SIZES", "run_benchmarks", "write_results", "to_markdown", "format_result", "plot_results"]
