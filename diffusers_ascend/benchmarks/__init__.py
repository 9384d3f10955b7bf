"""Benchmarks measured on the current machine: ``diffusers-ascend bench`` runs `BENCHMARKS` through
`run_benchmarks`, ``diffusers-ascend bench <name>`` runs ``bench_<name>.py`` (docs/benchmarks.md).

>>> from diffusers_ascend.benchmarks import run_benchmarks
>>> results = run_benchmarks(["ops_per_block"], size="tiny", out_dir="bench-results")
"""

from ._common import SIZES, machine_info
from .bench_compile import compile_time
from .bench_e2e import run_e2e
from .bench_latency import VARIANTS as LATENCY_VARIANTS
from .bench_latency import latency
from .bench_ops import ops_per_block
from .bench_recompiles import recompiles
from .runner import BENCHMARKS, format_result, plot_results, run_benchmarks, to_markdown, write_results

__all__ = [
    "BENCHMARKS", "SIZES", "LATENCY_VARIANTS", "machine_info", "ops_per_block", "compile_time", "recompiles",
    "latency", "run_e2e", "run_benchmarks", "write_results", "to_markdown", "format_result", "plot_results",
]
