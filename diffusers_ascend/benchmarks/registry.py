"""Every benchmark, in one table: `REGISTRY` (name -> `Benchmark`). ``diffusers-ascend bench``
builds its subcommands, their help and their flags from it, and `run_benchmarks` runs its suite
entries. A new benchmark is its ``bench_<name>.py`` and one entry here.

Imports no torch (``diffusers-ascend --help`` reads it): the benchmark modules are named, and
imported only when one runs.

>>> [b.name for b in REGISTRY.values() if b.function is not None]
['ops_per_block', 'compile_time', 'recompiles', 'latency']
>>> REGISTRY["kernels"].module
'bench_kernels'
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from ..platform import PLATFORMS  # stdlib only

__all__ = ["Benchmark", "REGISTRY", "multiple_of_16", "positive_int"]


@dataclass(frozen=True)
class Benchmark:
    """One benchmark.

    Args:
        name: its name: in ``bench --only NAME`` (suite) or ``diffusers-ascend bench NAME`` (its own
            subcommand).
        module: its module in `diffusers_ascend.benchmarks` (imported when it runs).
        help: one line: its subcommand's help, or the title of its table (suite).
        function: suite entries: the function of `module` that `run_benchmarks` calls with ``size=``
            (and the entry's options); its module's ``plot(ax, rows)`` draws its panel. None: a
            subcommand, run by ``<module>.cli(args)``.
        plots: it writes a PNG plot (the CLI checks for matplotlib before it runs).
        arguments: adds the subcommand's flags to its parser (the suite's are ``bench``'s own).
        description: the subcommand's ``--help`` text (default: `help`).
    """

    name: str
    module: str
    help: str
    function: str | None = None
    plots: bool = False
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    description: str | None = None


# -- argparse types (also the CLI's for its other commands) -----------------------------------------


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1.

    >>> positive_int("3")
    3
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def multiple_of_16(text: str) -> int:
    """argparse type: image sizes in pixels.

    >>> multiple_of_16("512")
    512
    """
    value = positive_int(text)
    if value % 16:  # Flux and Wan pipelines need sizes divisible by 16 (VAE scale x patch size)
        raise argparse.ArgumentTypeError(f"{text!r} must be a multiple of 16 (e.g. 32, 64, 512)")
    return value


# -- the subcommands' flags: choices spelled out (tests/test_benchmarks.py and test_bench_e2e.py check
# them against the modules) so that --help imports no torch ------------------------------------------

_E2E_MODELS = ("flux", "wan", "wan-14b", "qwen-image")
_E2E_VARIANTS = ("eager", "ascend", "ascend+graph", "regional", "ascend-by-name", "mindiesd")
_GRAPH_CONFIGS = (
    "eager",
    "eager_capture",
    "inductor_default",
    "inductor",
    "inductor_capture",
    "inductor_capture_unsafe",
    "inductor_model",
    "eager_capture_model",
    "inductor_capture_model",
)


def _e2e_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, choices=_E2E_MODELS, help="the model whose real config runs")
    p.add_argument("--depth", type=positive_int, help="blocks of each repeated kind (default: the real count)")
    p.add_argument(
        "--steps", type=positive_int, help="denoising steps (default: the model's usual job, e.g. 28 for flux)"
    )
    p.add_argument(
        "--height", type=multiple_of_16, help="image height in pixels, a multiple of 16 (default: the model's job)"
    )
    p.add_argument(
        "--width", type=multiple_of_16, help="image width in pixels, a multiple of 16 (default: the model's job)"
    )
    p.add_argument("--frames", type=positive_int, help="video frames, 4k+1 (wan, wan-14b; default 81)")
    p.add_argument("--text-len", type=positive_int, help="prompt embedding tokens (default: the model's job)")
    p.add_argument("--device", choices=PLATFORMS, help="default: this machine's accelerator")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="weights and activations (default bf16)")
    p.add_argument(
        "--variants",
        nargs="+",
        choices=_E2E_VARIANTS,
        metavar="VARIANT",
        help=f"variants to run, of {', '.join(_E2E_VARIANTS)} (default: all; eager always runs, as the reference)",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the weights, embeddings and latents (default 0)")
    p.add_argument(
        "--quant",
        choices=("int8-dynamic", "int8-weight"),
        help="after the bf16 eager reference, quantize the transformer with torchao and run eager, ascend "
        "(fusions='all') and regional on it (needs torchao)",
    )
    p.add_argument(
        "--fusions",
        default="auto",
        help="fusions of ascend, ascend+graph and ascend-by-name: auto, all, none or names, e.g. rms_norm,rope "
        "(default auto: none on a CPU)",
    )
    p.add_argument("--out", default="bench-results", help="output folder (default bench-results)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def _out_flag(name: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", help=f"folder for {name}.json (default: print only)")

    return add


def _blocks_flags(p: argparse.ArgumentParser) -> None:
    _out_flag("blocks")(p)
    p.add_argument(
        "--tiny", action="store_true", help="tiny widths on CPU, fp32: checks the plumbing, measures nothing useful"
    )
    p.add_argument("--variant", action="append", help="run only these variants (repeatable; eager always runs)")


def _kernels_flags(p: argparse.ArgumentParser) -> None:
    _out_flag("kernels")(p)
    p.add_argument("--case", action="append", help="run only these cases (repeatable)")


def _graph_capture_flags(p: argparse.ArgumentParser) -> None:
    _out_flag("graph_capture")(p)
    p.add_argument("--layers", type=positive_int, default=2, help="double-stream blocks (Flux.1 has 19)")
    p.add_argument("--single-layers", type=positive_int, default=4, help="single-stream blocks (Flux.1 has 38)")
    p.add_argument("--iters", type=positive_int, default=20, help="timed calls (median reported)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first")
    p.add_argument("--sizes", nargs="+", default=["launch_bound", "flux_1024"], choices=("launch_bound", "flux_1024"))
    p.add_argument(
        "--configs",
        nargs="+",
        metavar="CONFIG",
        default=list(_GRAPH_CONFIGS),
        choices=_GRAPH_CONFIGS,
        help=f"of {', '.join(_GRAPH_CONFIGS)} (default: all)",
    )


def _host_path_flags(p: argparse.ArgumentParser) -> None:
    _out_flag("host_path")(p)
    p.add_argument("--calls", type=positive_int, default=2000, help="calls per timed run")
    p.add_argument("--repeat", type=positive_int, default=5, help="timed runs (the median is reported)")


def _warm_start_flags(p: argparse.ArgumentParser) -> None:
    _out_flag("warm_start")(p)
    p.add_argument(
        "--size",
        default="small",
        choices=("small", "tiny", "depth"),
        help="depth: FLUX.1-dev's and Wan 2.1 14B's block counts at the tiny width",
    )
    p.add_argument(
        "--executor",
        default="inductor",
        choices=("inductor", "eager"),
        help="eager: eager block packages, with and without graph capture (the CPU stand-in on a CPU)",
    )
    p.add_argument("--models", nargs="+", default=["flux", "wan"], choices=("flux", "wan"))
    p.add_argument("--repeat", type=positive_int, default=1, help="runs per model, each from a new cold process")


def _cache_dit_flags(p: argparse.ArgumentParser) -> None:
    _out_flag("cache_dit")(p)
    p.add_argument("--steps", type=positive_int, default=8, help="denoising steps")
    p.add_argument("--taylorseer", action="store_true", help="add cache-dit's TaylorSeer calibrator (order 1)")


# name -> benchmark. The suite entries (`function` set) run, in this order, under plain
# ``diffusers-ascend bench``; the others are ``diffusers-ascend bench <name>``, in this order.
REGISTRY: dict[str, Benchmark] = {
    "ops_per_block": Benchmark(
        "ops_per_block",
        "bench_ops",
        function="ops_per_block",
        plots=True,
        help="Operators dispatched per block, eager vs fused (AscendBackend, fusions=all, executor=eager)",
    ),
    "compile_time": Benchmark(
        "compile_time",
        "bench_compile",
        function="compile_time",
        plots=True,
        help="Cold compile time: per-block vs whole-model (Flux-shaped model, fusions=all)",
    ),
    "recompiles": Benchmark(
        "recompiles",
        "bench_recompiles",
        function="recompiles",
        plots=True,
        help="Graphs compiled as the resolution changes (compile=blocks, fusions=all, executor=eager)",
    ),
    "latency": Benchmark(
        "latency",
        "bench_latency",
        function="latency",
        plots=True,
        help="Steady-state CPU latency of one transformer forward",
    ),
    "e2e": Benchmark(
        "e2e",
        "bench_e2e",
        plots=True,
        arguments=_e2e_flags,
        help="a real-size model (shipped config, random weights) through the stock pipeline's denoising loop, per variant",
        description="Runs the real transformer config of a model with random weights through the stock diffusers "
        "pipeline's denoising loop (no text encoders, no VAE decode), once per variant; writes JSON, a "
        "markdown table and a plot with the published numbers for the same job.",
    ),
    "blocks": Benchmark(
        "blocks",
        "bench_blocks",
        arguments=_blocks_flags,
        help="full-width Flux blocks on a CUDA GPU: eager, Inductor, our fusions with the Triton kernels",
    ),
    "kernels": Benchmark(
        "kernels",
        "bench_kernels",
        arguments=_kernels_flags,
        help="Triton kernels vs eager and Inductor's code at Flux and Wan 14B sizes (CUDA GPU)",
    ),
    "graph_capture": Benchmark(
        "graph_capture",
        "bench_graph_capture",
        arguments=_graph_capture_flags,
        help="CUDA graph capture over the eager and Inductor executors, full-width Flux (CUDA GPU)",
    ),
    "host_path": Benchmark(
        "host_path",
        "bench_host_path",
        arguments=_host_path_flags,
        help="host time per call of a fused op's Python path, layer by layer (CPU; needs triton)",
    ),
    "warm_start": Benchmark(
        "warm_start",
        "bench_warm_start",
        arguments=_warm_start_flags,
        help="time to the first output of a fresh process, without and with saved compile artifacts",
    ),
    "cache_dit": Benchmark(
        "cache_dit",
        "bench_cache_dit",
        arguments=_cache_dit_flags,
        help="cache-dit's DBCache on a tiny Flux, alone and with our backend in its NPU compile call (needs cache-dit)",
    ),
}
