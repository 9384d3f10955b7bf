"""Benchmark `recompiles`: graphs compiled as the resolution changes, per-block compilation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._common import check_size, machine_info, register_ops, timed

# Latent sizes fed in a row: (height, width) of the packed Flux latent, (frames, height, width) of
# the Wan latent (patch 1x2x2). Four distinct sequence lengths each: Wan still recompiles at the
# third, the fourth shows whether compilation has settled.
_PRESETS = {
    "tiny": dict(
        models=("wan",), flux=[(4, 4), (4, 6), (6, 6), (6, 8)], wan=[(2, 4, 4), (2, 4, 6), (2, 6, 6), (2, 6, 8)]
    ),
    "small": dict(
        models=("flux", "wan"),
        flux=[(16, 16), (16, 24), (24, 24), (24, 32)],
        wan=[(2, 8, 8), (2, 8, 12), (2, 12, 12), (2, 12, 16)],
    ),
}
MODELS = ("flux", "wan")

COLUMNS = [
    ("model", "model"),
    ("step", "step"),
    ("resolution", "latent"),
    ("tokens", "tokens"),
    ("new_graphs", "new graphs"),
    ("graphs_compiled", "graphs total"),
    ("recompiles", "recompiles"),
    ("dynamic", "dynamic graph"),
    ("call_s", "call s"),
]


def _model_and_inputs(name: str):
    from diffusers_ascend import tiny

    if name == "flux":
        layers = dict(num_layers=2, num_single_layers=2)  # >= 2 single blocks: shows the stride recompile
        config = {**tiny.FLUX_TRANSFORMER_CONFIG, **layers}
        return (
            tiny.tiny_flux_transformer(**layers),
            lambda shape: tiny.flux_model_inputs(*shape, config=config),
            lambda s: s[0] * s[1] + 8,
        )
    config = {**tiny.WAN_TRANSFORMER_CONFIG, "num_layers": 2}
    return (
        tiny.tiny_wan_transformer(num_layers=2),
        lambda shape: tiny.wan_model_inputs(*shape, config=config),
        lambda s: s[0] * (s[1] // 2) * (s[2] // 2),
    )


def recompiles(size: str = "small", models: Sequence[str] | None = None) -> dict[str, Any]:
    """Feeds four resolutions in a row through a model compiled per block (``fusions="all"``,
    eager executor, ``dynamic=None``) and records the graphs compiled after each; ``recompiles``
    counts those after the first resolution (the second recompiles dynamic, later ones reuse it).

    Args:
        size: ``"tiny"`` (Wan only, small latents: its graphs compile fastest) or ``"small"`` (Flux
            and Wan, larger latents).
        models: override the models (``"flux"``, ``"wan"``).

    Returns:
        ``{"benchmark", "size", "rows", "columns", "machine"}``; one row per (model, resolution);
        ``graphs_compiled`` and ``recompiles`` are cumulative.

    >>> rows = recompiles(size="tiny")["rows"]
    >>> rows[-1]["new_graphs"]
    0
    """
    from diffusers_ascend import ascend_report, enable_ascend_compile

    preset = _PRESETS[check_size(size)]
    models = tuple(models or preset["models"])
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"unknown models {unknown}; valid: {list(MODELS)}")
    register_ops()
    rows = []
    for name in models:
        model, make_inputs, tokens = _model_and_inputs(name)
        torch.compiler.reset()
        enable_ascend_compile(model, fusions="all", executor="eager", compile="blocks")
        first_graphs = None
        with torch.no_grad():
            for step, shape in enumerate(preset[name], 1):
                before = ascend_report(model).graphs_compiled
                _, seconds = timed(lambda: model(**make_inputs(shape)))
                report = ascend_report(model)
                new = report.graphs[before:]
                first_graphs = report.graphs_compiled if first_graphs is None else first_graphs
                rows.append(
                    dict(
                        model=name,
                        step=step,
                        resolution="x".join(map(str, shape)),
                        tokens=tokens(shape),
                        new_graphs=len(new),
                        graphs_compiled=report.graphs_compiled,
                        recompiles=report.graphs_compiled - first_graphs,
                        dynamic=any(g.dynamic for g in new) if new else None,
                        call_s=seconds,
                    )
                )
    torch.compiler.reset()
    return dict(benchmark="recompiles", size=size, rows=rows, columns=COLUMNS, machine=machine_info())


def plot(ax, rows) -> None:
    """This benchmark's panel of ``results.png`` (`runner.plot_results`)."""
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        ax.plot([r["step"] for r in mine], [r["graphs_compiled"] for r in mine], marker="o", label=model)
    ax.set_xlabel("resolution # (a new sequence length each)")
    ax.set_ylabel("graphs compiled (cumulative)")
    ax.set_xticks(sorted({r["step"] for r in rows}))
    ax.legend(fontsize=8)
