"""Benchmarks of diffusers-ascend: real measurements on the current machine, nothing hard-coded.

- `ops_per_block`: operators each Flux/Wan block dispatches, eager vs fused, fp32 and bf16.
- `compile_time`: cold compile time, per-block (``compile="blocks"``) vs whole model.
- `recompiles`: graphs compiled as the resolution changes under per-block compilation.
- `latency`: steady-state latency of eager, whole-model Inductor and `enable_ascend_compile`.
- `run_e2e` (``diffusers-ascend bench e2e``): a real-size model (Flux, Wan 1.3B/14B, Qwen-Image;
  shipped configs, random weights on the device) through the stock pipeline's denoising loop,
  per variant (eager, ours, ours + graph capture, regional compile, MindIE SD), beside the
  published numbers for the same job.

Each function takes ``size="tiny"`` (seconds, for tests) or ``"small"`` (the real benchmark) and
returns ``{"benchmark", "size", "rows", "columns", "machine", ...}``. `run_benchmarks` runs a
selection, prints the tables and writes ``results.json``/``.md``/``.png``; the scripts in the
repository's ``benchmarks/`` directory and ``diffusers-ascend bench`` call it.

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
