"""Benchmark `cache_dit`: cache-dit's DBCache on a tiny Flux pipeline, alone and with our backend in
the place cache-dit's NPU path gives MindIE SD's (``torch.compile(transformer,
backend=MindieSDBackend(), dynamic=True)``, cache-dit PR #1004): steps computed, wall time, max diff.

Needs cache-dit (``pip install cache-dit``). Importing it patches diffusers' classes for the rest of
the process: run this in its own process (``diffusers-ascend bench cache_dit``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ._common import machine_info, register_ops, text_table, timed, write_json

COLUMNS = [
    ("stack", "stack"),
    ("steps", "steps"),
    ("steps_computed", "steps computed"),
    ("cached_steps", "cached steps"),
    ("first_call_s", "first call s"),
    ("warm_call_s", "warm call s"),
    ("max_diff", "max diff vs cache-dit alone"),
    ("fused", "fusions made"),
]
# The how of `cache_dit_flux`: cache-dit alone; cache-dit's NPU compile call with our backend in
# MindIE SD's place; cache-dit, then enable_ascend_compile on the pipeline.
HOWS = ("cache_dit", "npu_compile_call", "enable_ascend_compile")
OPTIONS = dict(fusions="all", executor="eager")  # "auto" fuses nothing on a CPU


def object_backend(options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``torch.compile`` keywords that put our backend object where cache-dit's NPU path puts
    ``MindieSDBackend()``.

    >>> sorted(object_backend())
    ['backend']
    """
    from diffusers_ascend import AscendBackend, AscendConfig

    return dict(backend=AscendBackend(AscendConfig(**(options or OPTIONS))))


def cache_dit_flux(
    how: str = "cache_dit",
    steps: int = 8,
    calibrator: bool = False,
    compile_kwargs: dict[str, Any] | None = None,
    calls: int = 1,
    seed: int = 0,
    **transformer_overrides,
) -> dict[str, Any]:
    """A tiny Flux pipeline under cache-dit's DBCache (first block computed, the rest cached when
    its residual changed less than 0.5 after 2 warm-up steps), run `calls` times.

    Args:
        how: one of `HOWS`.
        steps: denoising steps.
        calibrator: add cache-dit's TaylorSeer calibrator (order 1).
        compile_kwargs: for ``"npu_compile_call"``: ``torch.compile``'s backend keywords (default
            `object_backend`); the call is ``torch.compile(transformer, dynamic=True, **compile_kwargs)``.
        calls: pipeline calls (the first compiles).
        seed: weights and inputs.
        transformer_overrides: tiny Flux config overrides (e.g. ``num_layers=2``).

    Returns:
        ``{"images", "seconds" (per call), "cached_steps" (of the last call), "report" (FusionReport or
        None), "compile_kwargs"}``.
    """
    import cache_dit
    from cache_dit import DBCacheConfig, TaylorSeerCalibratorConfig

    from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline

    if how not in HOWS:
        raise ValueError(f"unknown how {how!r}; valid: {', '.join(HOWS)}")
    pipe = tiny_flux_pipeline(seed, **transformer_overrides)
    cache_dit.enable_cache(
        pipe,
        cache_config=DBCacheConfig(
            Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=0.5, max_warmup_steps=2
        ),
        calibrator_config=TaylorSeerCalibratorConfig(taylorseer_order=1) if calibrator else None,
    )
    transformer = pipe.transformer
    report = None
    if how == "npu_compile_call":
        compile_kwargs = object_backend() if compile_kwargs is None else compile_kwargs
        # cache-dit's `mindiesd_compile`: the whole transformer, dynamic=True, after its cache hooks.
        pipe.transformer = torch.compile(transformer, dynamic=True, **compile_kwargs)
        backend = compile_kwargs.get("backend")
        report = getattr(backend, "report", None)  # an object; by name the report is read after the calls
    elif how == "enable_ascend_compile":
        pipe.enable_ascend_compile(**OPTIONS)
    seconds, images = [], None
    with torch.no_grad():
        for _ in range(calls):
            out, s = timed(lambda: pipe(**flux_pipeline_inputs(steps=steps, seed=seed)).images)
            images = out
            seconds.append(s)
    if how == "enable_ascend_compile":
        report = pipe.ascend_report()
    elif how == "npu_compile_call" and isinstance(compile_kwargs.get("backend"), str):
        from diffusers_ascend import compiled_report

        report = compiled_report(pipe.transformer)
    stats = cache_dit.summary(transformer, logging=False)
    cached = sorted({s for st in stats for s in st.cached_steps})
    return dict(images=images, seconds=seconds, cached_steps=cached, report=report, compile_kwargs=compile_kwargs)


def run(steps: int = 8, calibrator: bool = False) -> dict[str, Any]:
    """cache-dit alone, then with our backend in its NPU compile call, then with
    ``enable_ascend_compile``: two calls each (the first compiles).

    Returns:
        ``{"benchmark", "rows", "columns", "machine"}``.
    """
    register_ops()
    rows, ref = [], None
    for how in HOWS:
        torch.compiler.reset()
        got = cache_dit_flux(how, steps=steps, calibrator=calibrator, calls=2)
        ref = got["images"] if ref is None else ref
        report = got["report"]
        rows.append(
            dict(
                stack={
                    "cache_dit": "cache-dit DBCache",
                    "npu_compile_call": "+ torch.compile(backend=AscendBackend, dynamic=True)",
                    "enable_ascend_compile": "+ pipe.enable_ascend_compile",
                }[how],
                steps=steps,
                steps_computed=steps - len(got["cached_steps"]),
                cached_steps=" ".join(map(str, got["cached_steps"])),
                first_call_s=got["seconds"][0],
                warm_call_s=got["seconds"][1],
                max_diff=float((got["images"] - ref).abs().max()),
                fused=sum(report.matches.values()) + sum(report.swaps.values()) if report is not None else 0,
            )
        )
    torch.compiler.reset()
    return dict(benchmark="cache_dit", calibrator=calibrator, rows=rows, columns=COLUMNS, machine=machine_info())


def cli(args) -> int:
    """``diffusers-ascend bench cache_dit``: 0, or 2 without cache-dit."""
    import importlib.util

    if importlib.util.find_spec("cache_dit") is None:
        print("bench cache_dit needs cache-dit (pip install cache-dit)", file=sys.stderr)
        return 2
    result = run(args.steps, args.taylorseer)
    print(f"{result['machine']['cpu']}, torch {result['machine']['torch']}: tiny Flux, cache-dit DBCache")
    print(text_table(result["rows"], COLUMNS))
    write_json(result, args.out, "cache_dit.json")
    return 0
