"""Benchmarks of diffusers-ascend: real measurements on the current machine, nothing hard-coded.

``diffusers-ascend bench`` runs the CPU benchmarks below; ``diffusers-ascend bench <name>`` runs one
of the others. All time through `_common.time_ms` (synchronised per device, warm-up, repeats) and
write JSON through `_common.write_json`.

- `ops_per_block`: operators each Flux/Wan block dispatches, eager vs fused, fp32 and bf16.
- `compile_time`: cold compile time, per-block (``compile="blocks"``) vs whole model.
- `recompiles`: graphs compiled as the resolution changes under per-block compilation.
- `latency`: steady-state latency of eager, whole-model Inductor and `enable_ascend_compile`.
- `run_e2e` (``bench e2e``): a real-size model (Flux, Wan 1.3B/14B, Qwen-Image; shipped configs,
  random weights on the device) through the stock pipeline's denoising loop, per variant, beside
  the published numbers for the same job.
- ``bench blocks`` / ``kernels`` / ``graph_capture`` (CUDA GPU; ``blocks --tiny`` on CPU),
  ``host_path`` (CPU, needs triton), ``warm_start`` (fresh processes): modules ``bench_<name>``.

Each of the first four takes ``size="tiny"`` (seconds, for tests) or ``"small"`` (the real
benchmark) and returns ``{"benchmark", "size", "rows", "columns", "machine", ...}``.
`run_benchmarks` runs a selection, prints the tables and writes ``results.json``/``.md``/``.png``.

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
