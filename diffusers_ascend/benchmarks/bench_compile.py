"""Benchmark `compile_time`: cold compile time of per-block vs whole-model compilation."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch

from ._common import bars, check_size, cold_compile, machine_info, register_ops, time_ms, timed, warm_up_compiler

# "tiny" runs the eager executor only: a cold Inductor compile is too slow for a test.
_PRESETS = {
    "tiny": dict(num_layers=1, num_single_layers=2, height=4, width=4, executors=("eager",)),
    "small": dict(num_layers=4, num_single_layers=4, height=16, width=16, executors=("eager", "inductor")),
}
COMPILES = ("blocks", "model")

COLUMNS = [
    ("executor", "executor"),
    ("compile", "compile"),
    ("blocks", "blocks"),
    ("graphs_compiled", "graphs"),
    ("first_call_s", "first call s"),
    ("steady_call_s", "steady call s"),
    ("compile_s", "compile s"),
    ("vs_model", "compile vs model"),
]


def compile_time(size: str = "small", executors: Sequence[str] | None = None) -> dict[str, Any]:
    """Cold compile time of ``compile="blocks"`` (each repeated block compiled in place, one shared
    backend) vs ``compile="model"`` (the whole transformer as one graph) on a Flux-shaped model.

    Each starts cold (`cold_compile`); compile time is the first call minus a steady-state call.

    Args:
        size: ``"tiny"`` (1 double + 2 single blocks, eager executor only) or ``"small"`` (4 + 4
            blocks, eager and Inductor executors).
        executors: override the executors measured (``"eager"``, ``"inductor"``).

    Returns:
        ``{"benchmark", "size", "rows", "columns", "machine", "model"}``; one row per (executor,
        compile); ``vs_model`` is its compile time over ``compile="model"``'s.

    >>> result = compile_time(size="tiny")
    >>> [(r["compile"], r["graphs_compiled"]) for r in result["rows"]]
    [('blocks', 3), ('model', 1)]
    """
    from diffusers_ascend import ascend_report, enable_ascend_compile
    from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, flux_model_inputs, tiny_flux_transformer

    preset = _PRESETS[check_size(size)]
    executors = tuple(executors or preset["executors"])
    layers = dict(num_layers=preset["num_layers"], num_single_layers=preset["num_single_layers"])
    config = {**FLUX_TRANSFORMER_CONFIG, **layers}
    inputs = flux_model_inputs(preset["height"], preset["width"], config=config)
    register_ops()
    warm_up_compiler(inductor="inductor" in executors)

    rows = []
    for executor in executors:
        for compile in COMPILES:
            model = tiny_flux_transformer(**layers)
            with cold_compile(), torch.no_grad():
                enable_ascend_compile(model, fusions="all", executor=executor, compile=compile)
                _, first = timed(lambda: model(**inputs))
                steady = statistics.median(time_ms(lambda: model(**inputs), runs=5, warmup=0)) / 1e3
                report = ascend_report(model)
            rows.append(
                dict(
                    executor=executor,
                    compile=compile,
                    blocks=layers["num_layers"] + layers["num_single_layers"],
                    graphs_compiled=report.graphs_compiled,
                    first_call_s=first,
                    steady_call_s=steady,
                    compile_s=max(first - steady, 0.0),
                    fallbacks=len(report.fallbacks),
                )
            )
    for row in rows:
        model_row = next(r for r in rows if r["executor"] == row["executor"] and r["compile"] == "model")
        row["vs_model"] = row["compile_s"] / model_row["compile_s"] if model_row["compile_s"] else None
    return dict(
        benchmark="compile_time",
        size=size,
        rows=rows,
        columns=COLUMNS,
        machine=machine_info(),
        model=dict(config, tokens=preset["height"] * preset["width"] + 8),
    )


def plot(ax, rows) -> None:
    """This benchmark's panel of ``results.png`` (`runner.plot_results`)."""
    executors = list(dict.fromkeys(r["executor"] for r in rows))
    series = {
        c: [next((r["compile_s"] for r in rows if r["executor"] == e and r["compile"] == c), 0.0) for e in executors]
        for c in ("blocks", "model")
    }
    bars(ax, [f"executor={e}" for e in executors], {f"compile={c}": v for c, v in series.items()}, "cold compile (s)")
