"""Benchmark `latency`: steady-state latency of eager, whole-model Inductor and enable_ascend_compile."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._common import bars, check_size, machine_info, register_ops, timed


def _eager(model):
    return model


def _inductor(model):
    return torch.compile(model)  # the default backend, whole model: the baseline users know


def _ascend(**kwargs) -> Callable:
    def setup(model):
        from diffusers_ascend import enable_ascend_compile

        return enable_ascend_compile(model, **kwargs)

    return setup


# name -> (what it is, setup(model) -> callable)
VARIANTS: dict[str, tuple[str, Callable]] = {
    "eager": ("diffusers eager", _eager),
    "inductor": ("torch.compile(model), default Inductor", _inductor),
    "ascend_auto": ('enable_ascend_compile(fusions="auto"): per block, auto executor', _ascend(fusions="auto")),
    "ascend_all_inductor": (
        'enable_ascend_compile(fusions="all", executor="inductor")',
        _ascend(fusions="all", executor="inductor"),
    ),
    "ascend_all_eager": (
        'enable_ascend_compile(fusions="all", executor="eager") (the NPU setup)',
        _ascend(fusions="all", executor="eager"),
    ),
}

# "small": a Flux-shaped transformer at dim 256 with 1024 tokens. "tiny" skips the Inductor
# variants: their cold compile is too slow for a test.
_SMALL_FLUX = dict(
    patch_size=1,
    in_channels=64,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=64,
    num_attention_heads=4,
    joint_attention_dim=256,
    pooled_projection_dim=256,
    axes_dims_rope=[16, 24, 24],
)
_PRESETS = {
    "tiny": dict(config=None, height=4, width=4, txt_len=8, runs=3, warmup=1, variants=("eager", "ascend_all_eager")),
    "small": dict(config=_SMALL_FLUX, height=28, width=32, txt_len=128, runs=20, warmup=3, variants=tuple(VARIANTS)),
}

COLUMNS = [
    ("variant", "variant"),
    ("executor", "executor"),
    ("fusions", "fusions"),
    ("median_ms", "median ms"),
    ("min_ms", "min ms"),
    ("eager_median_ms", "paired eager ms"),
    ("vs_eager", "time vs eager"),
    ("speedup", "speedup"),
    ("first_call_s", "first call s"),
    ("graphs_compiled", "graphs"),
    ("max_abs_diff", "max |diff|"),
]


def latency(
    size: str = "small", variants: Sequence[str] | None = None, runs: int | None = None, warmup: int | None = None
) -> dict[str, Any]:
    """Steady-state CPU latency of one transformer forward, per variant (see `VARIANTS`).

    Each variant gets a fresh model with the same seeded weights; its first call (compilation
    included) is reported separately. Then its calls alternate with calls of an eager model:
    ``warmup`` pairs are discarded, the median and min of ``runs`` calls are taken, and ``vs_eager``
    is its median over the median of the paired eager calls (robust to load from other processes).
    Outputs are compared with eager.

    Args:
        size: ``"tiny"`` (the tiny Flux config, 24 tokens, no Inductor variants: seconds) or
            ``"small"`` (dim 256, 2 double + 2 single blocks, 1024 tokens, every variant).
        variants: override the variants measured (keys of `VARIANTS`); ``"eager"`` is always added
            first, as the reference.
        runs, warmup: override the number of timed and discarded calls.

    Returns:
        ``{"benchmark", "size", "rows", "columns", "machine", "model"}``; one row per variant with
        ``median_ms``, ``min_ms``, ``eager_median_ms`` (the paired eager calls), ``vs_eager`` (median
        / paired eager median), ``speedup`` (its inverse), ``first_call_s``, ``graphs_compiled``,
        ``fusions``, ``executor`` and ``max_abs_diff``.

    >>> rows = latency(size="tiny")["rows"]
    >>> [r["variant"] for r in rows]
    ['eager', 'ascend_all_eager']
    """
    from diffusers_ascend import ascend_report
    from diffusers_ascend.integration import enabled_models
    from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, flux_model_inputs, tiny_flux_transformer

    preset = _PRESETS[check_size(size)]
    names = list(variants or preset["variants"])
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown latency variants {unknown}; valid: {list(VARIANTS)}")
    names = ["eager"] + [v for v in names if v != "eager"]
    runs, warmup = runs or preset["runs"], warmup if warmup is not None else preset["warmup"]
    config = preset["config"] or FLUX_TRANSFORMER_CONFIG
    inputs = flux_model_inputs(preset["height"], preset["width"], txt_len=preset["txt_len"], config=config)
    register_ops()

    # A fresh dynamo state per variant: variants sharing dynamo's cache change each other's graphs
    # (automatic dynamic shapes are per code object).
    def build():
        return tiny_flux_transformer(**config) if preset["config"] else tiny_flux_transformer()

    eager_model, rows, eager_all = build(), [], []
    with torch.no_grad():
        reference = eager_model(**inputs)[0]
        for name in names:
            torch.compiler.reset()
            model = eager_model if name == "eager" else VARIANTS[name][1](build())
            out, first = timed(lambda: model(**inputs)[0])
            mine, paired = [], []
            for round_ in range(warmup + runs):
                t = timed(lambda: model(**inputs))[1] * 1e3
                e = timed(lambda: eager_model(**inputs))[1] * 1e3
                if round_ >= warmup:
                    mine.append(t)
                    paired.append(e)
            eager_all += paired
            report = ascend_report(model) if name.startswith("ascend") else None
            enabled = enabled_models(model) if name.startswith("ascend") else []
            rows.append(
                dict(
                    variant=name,
                    description=VARIANTS[name][0],
                    first_call_s=first,
                    median_ms=statistics.median(mine),
                    min_ms=min(mine),
                    eager_median_ms=statistics.median(paired),
                    executor=enabled[0].executor
                    if enabled and enabled[0].executor is not None
                    else ("inductor" if name == "inductor" else "-"),
                    fusions=(",".join(report.matches) or "none") if report is not None else "-",
                    graphs_compiled=report.graphs_compiled if report is not None else None,
                    max_abs_diff=(out - reference).abs().max().item(),
                )
            )
    torch.compiler.reset()
    for row in rows:
        row["vs_eager"] = row["median_ms"] / row["eager_median_ms"]
        row["speedup"] = 1 / row["vs_eager"]
    rows[0].update(
        median_ms=statistics.median(eager_all),
        min_ms=min(eager_all),
        vs_eager=1.0,
        speedup=1.0,
        eager_median_ms=statistics.median(eager_all),
    )
    return dict(
        benchmark="latency",
        size=size,
        rows=rows,
        columns=COLUMNS,
        machine=machine_info(),
        model=dict(config, tokens=preset["height"] * preset["width"] + preset["txt_len"], runs=runs, warmup=warmup),
    )


def plot(ax, rows) -> None:
    """This benchmark's panel of ``results.png`` (`runner.plot_results`)."""
    # The ratio to the paired eager calls, not raw milliseconds: it is what survives machine load.
    bars(
        ax,
        [r["variant"] for r in rows],
        {"time vs eager (lower is faster)": [r["vs_eager"] for r in rows]},
        "median time / paired eager median",
    )
    ax.axhline(1.0, color="grey", linewidth=0.8)
