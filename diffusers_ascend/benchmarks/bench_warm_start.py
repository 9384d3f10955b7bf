"""Benchmark `warm_start`: time to the first output of a fresh process, without and with saved artifacts.

    diffusers-ascend bench warm_start --size small --repeat 3 --out benchmarks/results/

For each model (tiny-config Flux and Wan transformers, random weights, compile="blocks",
executor="inductor", every fusion): a cold process (empty Inductor cache directory) compiles,
reaches its first output, then saves its artifacts with `save_ascend_cache` (torch's compile
caches and one AOTInductor package per compiled block class); a second fresh process (another
empty Inductor cache directory) enables with ``cache=`` that folder and runs the packages; a
third does the same with a forward pre-hook on every block, which makes the packages step aside,
so it measures torch's compile caches alone. The time is taken by this parent from just before
starting the child to the moment the child has its first output (interpreter start, imports,
model construction, enable and the first call included). Ratio = warm / cold of one run; with
``--repeat N`` the median of N runs (each with a new cold process), all runs in the JSON.

``--executor eager`` (issue 36; ``--size depth``: FLUX.1-dev's 19 + 38 and Wan 2.1 14B's 40 blocks
at the tiny width), per model without and with graph capture (on a CPU, the test suite's stand-in
graph API: host work only): a fresh process on a machine where none ran before (no self-check
verdict, `compilation/passes/verdict.py`) compiles and saves eager packages; a second cold one
finds the verdict; a third starts from the packages. Each child also reports the seconds spent in
the self-check and pattern registration, in its enable and over its first call.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ._common import machine_info, write_json

# size -> model -> (transformer config overrides, input shape)
SIZES = {
    "tiny": {"flux": (dict(num_layers=1, num_single_layers=1), (8, 8)), "wan": (dict(num_layers=2), (2, 8, 8))},
    "small": {"flux": (dict(num_layers=4, num_single_layers=4), (16, 16)), "wan": (dict(num_layers=4), (2, 16, 16))},
    # The real models' depths at the tiny width: FLUX.1-dev (19 double + 38 single blocks), Wan 2.1 14B (40).
    "depth": {"flux": (dict(num_layers=19, num_single_layers=38), (8, 8)), "wan": (dict(num_layers=40), (2, 8, 8))},
}


def _model(model: str, size: str):
    """The tiny `model` ("flux" or "wan") at `size` and its call's inputs."""
    from diffusers_ascend import tiny

    overrides, shape = SIZES[size][model]
    if model == "flux":
        return tiny.tiny_flux_transformer(**overrides), tiny.flux_model_inputs(*shape)
    return tiny.tiny_wan_transformer(**overrides), tiny.wan_model_inputs(*shape)


def _child(model: str, size: str, mode: str, art: str) -> None:
    import torch

    import diffusers_ascend
    from diffusers_ascend.compilation._compat import compile_cache_counters
    from diffusers_ascend.integration import enabled_models, package_counters

    net, inputs = _model(model, size)
    t = time.perf_counter()
    diffusers_ascend.enable_ascend_compile(
        net, fusions="all", executor="inductor", compile="blocks", cache=None if mode == "cold" else art
    )
    if mode == "warm-caches-only":  # a hook on each block: the packages step aside for dynamo + torch's caches
        for block in enabled_models(net)[0].compiled:
            block.register_forward_pre_hook(lambda module, args: None)
    enable_s = time.perf_counter() - t
    t = time.perf_counter()
    with torch.no_grad():
        net(**inputs)
    first_call_s = time.perf_counter() - t
    done = time.time()
    info = dict(
        enable_s=enable_s,
        first_call_s=first_call_s,
        first_output_at=done,
        **compile_cache_counters(),
        graphs=diffusers_ascend.ascend_report(net).graphs_compiled,
        packages=package_counters(net),
    )
    if mode == "cold":
        info.update(_timed_save(net, art))
    print("RESULT " + json.dumps(info), flush=True)


def _timed_save(net, art: str) -> dict:
    """`save_ascend_cache` of the cold process: its time and the size of each file it wrote."""
    import diffusers_ascend

    t = time.perf_counter()
    manifest = diffusers_ascend.save_ascend_cache(net, art)
    return {"save_s": time.perf_counter() - t, "artifact_bytes": {k: v["size"] for k, v in manifest["files"].items()}}


def _run(model: str, size: str, mode: str, art: str, child: str = "inductor", extra=(), env=None) -> dict:
    import diffusers_ascend

    # The child imports this copy of the package, installed or not.
    root = os.path.dirname(os.path.dirname(os.path.abspath(diffusers_ascend.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": path,
        "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix=f"inductor-{mode}-"),
    }
    start = time.time()
    out = subprocess.run(
        [sys.executable, "-m", __name__, child, model, size, mode, art, *extra], capture_output=True, text=True, env=env
    )
    if out.returncode:
        raise RuntimeError(f"{model} {mode} process failed:\n{out.stderr[-3000:]}")
    info = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    info["to_first_output_s"] = info.pop("first_output_at") - start
    return info


def warm_start(size: str = "small", models=("flux", "wan"), repeat: int = 1) -> dict:
    """Cold vs warm fresh-process time to the first output per model; see the module docstring.

    With `repeat` > 1 each model is measured that many times (each time a new cold process and new
    artifacts); a row holds every run and the median of its ratios (a warm process of a few seconds
    moves by a tenth of its time from run to run on a shared machine)."""
    rows = []
    for model in models:
        runs = []
        for _ in range(repeat):
            art = tempfile.mkdtemp(prefix=f"ascend-cache-{model}-")
            cold = _run(model, size, "cold", art)
            warm = _run(model, size, "warm", art)
            caches = _run(model, size, "warm-caches-only", art)
            runs.append(
                dict(
                    cold=cold,
                    warm=warm,
                    warm_caches_only=caches,
                    ratio=warm["to_first_output_s"] / cold["to_first_output_s"],
                    ratio_caches_only=caches["to_first_output_s"] / cold["to_first_output_s"],
                )
            )
        rows.append(
            dict(
                model=model,
                blocks=SIZES[size][model][0],
                runs=runs,
                ratio=statistics.median(r["ratio"] for r in runs),
                ratio_caches_only=statistics.median(r["ratio_caches_only"] for r in runs),
            )
        )
    return _result("inductor", size, rows, repeat=repeat)


def _median_run(runs: list[dict]) -> dict:
    """One mode's runs as one: the median of each number, the first run's other values."""
    return {k: statistics.median(r[k] for r in runs) if isinstance(v, (int, float)) else v for k, v in runs[0].items()}


def _eager_ratios(runs: dict) -> dict:
    floor, cold_first, cold, warm = (runs[m]["to_first_output_s"] for m in EAGER_MODES)

    def enable_call(run):
        return run["enable_s"] + run["first_call_s"]

    return dict(
        ratio=warm / cold,
        ratio_first=warm / cold_first,
        ratio_enable_call=enable_call(runs["warm"]) / enable_call(runs["cold"]),
        ratio_cpu=runs["warm"]["cpu_s"] / runs["cold"]["cpu_s"],
        # What diffusers-ascend adds to a process's first output, warm over cold: each less the
        # floor (the same process without us).
        ratio_above_floor=(warm - floor) / (cold - floor),
        ratio_first_above_floor=(warm - floor) / (cold_first - floor),
    )


# executor="eager": a fresh process on a machine where no process ran before (no self-check
# verdict), one after it, and one from saved eager packages; "floor" is the same process without
# enabling (diffusers' eager forward; the package is imported, which only patches diffusers'
# classes): what any process pays before and besides us.
EAGER_MODES = ("floor", "cold_first", "cold", "warm")


def _eager_child(model: str, size: str, mode: str, art: str, capture: str) -> None:
    import contextlib

    import torch

    net, inputs = _model(model, size)
    if mode == "floor":
        t = time.perf_counter()
        with torch.no_grad():
            net(**inputs)
        first_call_s = time.perf_counter() - t
        info = dict(enable_s=0.0, first_call_s=first_call_s, first_output_at=time.time(), cpu_s=time.process_time())
        print("RESULT " + json.dumps(info), flush=True)
        return

    import diffusers_ascend
    from diffusers_ascend._import_hooks import when_imported
    from diffusers_ascend.integration import package_counters

    spent = {
        "self_check_s": 0.0,
        "registration_s": 0.0,
        "matcher_import_s": 0.0,
        "self_check_cpu_s": 0.0,
        "registration_cpu_s": 0.0,
        "matcher_import_cpu_s": 0.0,
    }

    def timed(fn, key):
        # Wall and CPU seconds: the CPU time does not grow with other jobs' load on the machine.
        def wrapper(*args, **kwargs):
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - t
                spent[key.replace("_s", "_cpu_s")] += time.process_time() - c

        return wrapper

    # Instrumented in this child only: where the cold path's fixed cost goes. Installed as each
    # module finishes importing, so the enable timed below imports (and pays for) them itself.
    def instrument_manager(module):
        module.FusionPassManager.ensure_verified = timed(module.FusionPassManager.ensure_verified, "self_check_s")

    def instrument_base(module):
        module._registered = timed(module._registered, "registration_s")

    when_imported("diffusers_ascend.compilation.passes.manager", instrument_manager)
    when_imported("diffusers_ascend.compilation.passes.base", instrument_base)
    # Importing Inductor's pattern matcher (lowering, templates: seconds) happens inside the first
    # registration or self-check; timed apart, as any process that runs a pattern pass pays it.
    from diffusers_ascend.compilation import _compat

    if "torch._inductor.pattern_matcher" not in sys.modules:
        _compat._pm = timed(_compat._pm, "matcher_import_s")
    from diffusers_ascend import platform as P

    scope = contextlib.nullcontext()
    cfg = dict(fusions="all", executor="eager", compile="blocks")
    device = P.current_platform()  # an NPU or CUDA host runs on its device, captured by its own graphs
    if capture == "1":
        cfg["graph_capture"] = "graph_with_compile"
        if not P.graph_capture_supported():
            # The CPU stand-in graph API of the test suite (a CONTRACT stand-in: it times the host
            # work of capture, not a device graph), on a platform that has device graphs.
            from tests.compilation.graph_standins import standin_graph_api

            P.graph_api = lambda platform=None: standin_graph_api()
            scope = P.override_platform("cuda")
    net.to(device)
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    with scope:
        t = time.perf_counter()
        diffusers_ascend.enable_ascend_compile(net, cache=art if mode == "warm" else None, **cfg)
        enable_s = time.perf_counter() - t
        enable_spent = dict(spent)
        t = time.perf_counter()
        with torch.no_grad():
            net(**inputs)
        first_call_s = time.perf_counter() - t
        done, cpu_s = time.time(), time.process_time()
        report = diffusers_ascend.ascend_report(net)
        info = dict(
            enable_s=enable_s,
            first_call_s=first_call_s,
            first_output_at=done,
            cpu_s=cpu_s,
            enable_self_check_s=enable_spent["self_check_s"],
            enable_registration_s=enable_spent["registration_s"],
            self_check_s=spent["self_check_s"],
            registration_s=spent["registration_s"],
            matcher_import_s=spent["matcher_import_s"],
            self_check_cpu_s=spent["self_check_cpu_s"],
            registration_cpu_s=spent["registration_cpu_s"],
            matcher_import_cpu_s=spent["matcher_import_cpu_s"],
            graphs=report.graphs_compiled,
            packages=package_counters(net),
        )
        if mode == "cold_first":
            info.update(_timed_save(net, art))
    print("RESULT " + json.dumps(info), flush=True)


def eager_warm_start(size: str = "depth", models=("flux", "wan"), captures=(False, True), repeat: int = 1) -> dict:
    """``executor="eager"``: fresh-process time to the first output, per model and with or without
    graph capture (the CPU stand-in), for the `EAGER_MODES` (each in a new process; each repetition
    with a new self-check verdict directory and package folder). Each mode's numbers are medians
    over the repetitions, and the ratios (warm / cold after the first process: from process start,
    over enable + first call, and over what each adds to the floor) are of those medians."""
    from .. import platform as _platform  # noqa: F401  (fails here, not in a child, if the package is broken)

    rows = []
    for model in models:
        for capture in captures:
            repetitions = []
            for _ in range(repeat):
                art = tempfile.mkdtemp(prefix=f"ascend-eager-cache-{model}-")
                # One intra-op thread: what is timed is host work (trace, passes, loading), the same on
                # an NPU host; tiny-width CPU kernels with two OpenMP threads on a shared 2-core machine
                # cost more than all of it and depend on the machine's load alone.
                env = {
                    "DIFFUSERS_ASCEND_VERDICT_DIR": tempfile.mkdtemp(prefix="ascend-verdicts-"),
                    "OMP_NUM_THREADS": "1",
                }
                repetitions.append(
                    {
                        mode: _run(model, size, mode, art, child="eager", extra=["1" if capture else "0"], env=env)
                        for mode in EAGER_MODES
                    }
                )
            runs = {mode: _median_run([r[mode] for r in repetitions]) for mode in EAGER_MODES}
            rows.append(
                dict(
                    model=model,
                    graph_capture="graph_with_compile (CPU stand-in)" if capture else None,
                    blocks=SIZES[size][model][0],
                    repeat=repeat,
                    **runs,
                    **_eager_ratios(runs),
                    ratios_per_run=[_eager_ratios(r) for r in repetitions],
                )
            )
    return _result("eager", size, rows)


def _result(executor: str, size: str, rows: list, **extra) -> dict:
    """The JSON both executors' benchmarks write."""
    import torch

    return dict(
        benchmark="warm_start",
        size=size,
        executor=executor,
        compile="blocks",
        torch=torch.__version__,
        **extra,
        rows=rows,
        machine=machine_info(),
    )


def _eager_cli(args) -> int:
    result = eager_warm_start(args.size, args.models, repeat=args.repeat)
    print(
        f"torch {result['torch']}, {result['machine'].get('cpu', '')}, executor=eager; seconds from process start to "
        "first output (in brackets: enable + first call); floor: the same process without enabling; "
        "ratio warm/cold (of medians over --repeat runs): from process start [enable + first call; per-run range] "
        "{above the floor; per-run range}; self-check + registration: "
        "in the enable of a cold process [over the whole first output]"
    )
    print(
        "| model | graph capture | floor | cold, first process | cold | warm (packages) | ratio warm/cold | "
        "ratio of CPU s | self-check + registration, cold | matcher import |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")

    def cell(run):
        return f"{run['to_first_output_s']:.1f} [{run['enable_s'] + run['first_call_s']:.1f}]"

    for r in result["rows"]:
        cold = r["cold"]

        def spread(key, r=r):
            values = [x[key] for x in r["ratios_per_run"]]
            return f"{min(values):.2f}-{max(values):.2f}"

        print(
            f"| {r['model']} | {r['graph_capture'] or '-'} | {r['floor']['to_first_output_s']:.1f} | "
            f"{cell(r['cold_first'])} | {cell(cold)} | {cell(r['warm'])} | "
            f"{r['ratio']:.2f} [{r['ratio_enable_call']:.2f}; {spread('ratio_enable_call')}] "
            f"{{{r['ratio_above_floor']:.2f}; {spread('ratio_above_floor')}}} | {r['ratio_cpu']:.2f} | "
            f"{cold['enable_self_check_s'] + cold['enable_registration_s']:.2f} "
            f"[{cold['self_check_s'] + cold['registration_s'] - cold['matcher_import_s']:.2f}; CPU "
            f"{cold['self_check_cpu_s'] + cold['registration_cpu_s'] - cold['matcher_import_cpu_s']:.2f}] | "
            f"{cold['matcher_import_s']:.1f} |"
        )
    write_json(result, args.out, f"warm_start-eager-{args.size}.json")
    return 0


def cli(args) -> int:
    """``diffusers-ascend bench warm_start``: prints a markdown table, writes warm_start.json
    (``--executor eager``: warm_start-eager-<size>.json)."""
    if getattr(args, "executor", "inductor") == "eager":
        return _eager_cli(args)
    result = warm_start(args.size, args.models, args.repeat)
    print(
        f"torch {result['torch']}, {result['machine'].get('cpu', '')}; seconds from process start to first output, "
        f"median of {args.repeat} run(s) (ratios: median [min-max])"
    )
    print(
        "| model | cold | warm (packages) | ratio | warm (torch's caches only) | ratio | packages: calls run | save (cold) |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def med(row, mode, key):
        return statistics.median(r[mode][key] for r in row["runs"])

    for r in result["rows"]:
        ratios = [x["ratio"] for x in r["runs"]]
        caches = [x["ratio_caches_only"] for x in r["runs"]]
        packages = r["runs"][0]["warm"]["packages"]
        print(
            f"| {r['model']} | {med(r, 'cold', 'to_first_output_s'):.1f} | {med(r, 'warm', 'to_first_output_s'):.1f} | "
            f"{r['ratio']:.2f} [{min(ratios):.2f}-{max(ratios):.2f}] | {med(r, 'warm_caches_only', 'to_first_output_s'):.1f} | "
            f"{r['ratio_caches_only']:.2f} [{min(caches):.2f}-{max(caches):.2f}] | "
            f"{packages['packages']}: {packages['calls']} | {med(r, 'cold', 'save_s'):.1f} |"
        )
    if args.out:
        write_json(result, args.out, "warm_start.json")
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":  # a child process: inductor MODEL SIZE MODE ARTIFACTS, or eager ... CAPTURE
    {"inductor": _child, "eager": _eager_child}[sys.argv[1]](*sys.argv[2:])
