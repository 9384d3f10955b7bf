"""Benchmarks measured on the current machine, each an entry of `registry.REGISTRY`:
``diffusers-ascend bench`` runs the suite (`BENCHMARKS`) through `run_benchmarks`,
``diffusers-ascend bench <name>`` runs ``bench_<name>.py`` (docs/benchmarks.md).

The names below are imported from their modules on first access, so that the CLI reads the
registry (``diffusers-ascend --help``) without importing torch.

>>> from diffusers_ascend.benchmarks import run_benchmarks
>>> results = run_benchmarks(["ops_per_block"], size="tiny", out_dir="bench-results")
"""

import importlib as _importlib

from .registry import REGISTRY, Benchmark

# Public name -> (module of this package, its name there).
_EXPORTS = {
    "BENCHMARKS": ("runner", "BENCHMARKS"),
    "SIZES": ("_common", "SIZES"),
    "LATENCY_VARIANTS": ("bench_latency", "VARIANTS"),
    "machine_info": ("_common", "machine_info"),
    "ops_per_block": ("bench_ops", "ops_per_block"),
    "compile_time": ("bench_compile", "compile_time"),
    "recompiles": ("bench_recompiles", "recompiles"),
    "latency": ("bench_latency", "latency"),
    "run_e2e": ("bench_e2e", "run_e2e"),
    "run_benchmarks": ("runner", "run_benchmarks"),
    "write_results": ("runner", "write_results"),
    "to_markdown": ("runner", "to_markdown"),
    "format_result": ("runner", "format_result"),
    "plot_results": ("runner", "plot_results"),
}

__all__ = ["REGISTRY", "Benchmark", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(_importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
