"""Warm start: time to the first output of a fresh process, without and with saved compile artifacts.

    python benchmarks/warm_start.py --size small --repeat 3 --out benchmarks/results/

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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# size -> model -> (transformer config overrides, input shape)
SIZES = {
    "tiny": {"flux": (dict(num_layers=1, num_single_layers=1), (8, 8)), "wan": (dict(num_layers=2), (2, 8, 8))},
    "small": {"flux": (dict(num_layers=4, num_single_layers=4), (16, 16)), "wan": (dict(num_layers=4), (2, 16, 16))},
}


def _child(model: str, size: str, mode: str, art: str) -> None:
    import torch

    import diffusers_ascend
    from diffusers_ascend.benchmarks._common import flux_model_inputs, wan_model_inputs
    from diffusers_ascend.mixin import package_counters
    from diffusers_ascend.compilation._compat import compile_cache_counters
    from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, WAN_TRANSFORMER_CONFIG, tiny_flux_transformer, tiny_wan_transformer

    overrides, shape = SIZES[size][model]
    if model == "flux":
        net, inputs = tiny_flux_transformer(**overrides), flux_model_inputs({**FLUX_TRANSFORMER_CONFIG, **overrides}, *shape)
    else:
        net, inputs = tiny_wan_transformer(**overrides), wan_model_inputs({**WAN_TRANSFORMER_CONFIG, **overrides}, *shape)
    t = time.perf_counter()
    diffusers_ascend.enable_ascend_compile(net, fusions="all", executor="inductor", compile="blocks",
                                           cache=None if mode == "cold" else art)
    if mode == "warm-caches-only":  # a hook on each block: the packages step aside for dynamo + torch's caches
        for block in net._ascend_state.compiled:
            block.register_forward_pre_hook(lambda module, args: None)
    enable_s = time.perf_counter() - t
    t = time.perf_counter()
    with torch.no_grad():
        net(**inputs)
    first_call_s = time.perf_counter() - t
    done = time.time()
    info = dict(enable_s=enable_s, first_call_s=first_call_s, first_output_at=done, **compile_cache_counters(),
                graphs=diffusers_ascend.ascend_report(net).graphs_compiled, packages=package_counters(net))
    if mode == "cold":
        t = time.perf_counter()
        manifest = diffusers_ascend.save_ascend_cache(net, art)
        info["save_s"] = time.perf_counter() - t
        info["artifact_bytes"] = {k: v["size"] for k, v in manifest["files"].items()}
    print("RESULT " + json.dumps(info), flush=True)


def _run(model: str, size: str, mode: str, art: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix=f"inductor-{mode}-")}
    start = time.time()
    out = subprocess.run([sys.executable, __file__, "--child", model, size, mode, art], capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{model} {mode} process failed:\n{out.stderr[-3000:]}")
    info = json.loads(next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))[7:])
    info["to_first_output_s"] = info.pop("first_output_at") - start
    return info


def warm_start(size: str = "small", models=("flux", "wan"), repeat: int = 1) -> dict:
    """Cold vs warm fresh-process time to the first output per model; see the module docstring.

    With `repeat` > 1 each model is measured that many times (each time a new cold process and new
    artifacts); a row holds every run and the median of its ratios (the 2-core container is shared,
    and a warm process of ~4 s moves by half a second from run to run)."""
    import statistics

    from diffusers_ascend.benchmarks._common import machine_info

    rows = []
    for model in models:
        runs = []
        for _ in range(repeat):
            art = tempfile.mkdtemp(prefix=f"ascend-cache-{model}-")
            cold = _run(model, size, "cold", art)
            warm = _run(model, size, "warm", art)
            caches = _run(model, size, "warm-caches-only", art)
            runs.append(dict(cold=cold, warm=warm, warm_caches_only=caches,
                             ratio=warm["to_first_output_s"] / cold["to_first_output_s"],
                             ratio_caches_only=caches["to_first_output_s"] / cold["to_first_output_s"]))
        rows.append(dict(model=model, blocks=SIZES[size][model][0], runs=runs,
                         ratio=statistics.median(r["ratio"] for r in runs),
                         ratio_caches_only=statistics.median(r["ratio_caches_only"] for r in runs)))
    import torch

    return dict(benchmark="warm_start", size=size, executor="inductor", compile="blocks", torch=torch.__version__,
                repeat=repeat, rows=rows, machine=machine_info())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--models", nargs="+", default=["flux", "wan"], choices=["flux", "wan"])
    parser.add_argument("--out", default=None, help="directory for warm_start.json (default: print only)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per model (a new cold process each); the median is reported")
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "SIZE", "MODE", "ART"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    result = warm_start(args.size, args.models, args.repeat)
    print(f"torch {result['torch']}, {result['machine'].get('cpu', '')}; seconds from process start to first output, "
          f"median of {args.repeat} run(s) (ratios: median [min-max])")
    print("| model | cold | warm (packages) | ratio | warm (torch's caches only) | ratio | packages: calls run | save (cold) |")
    print("|---|---|---|---|---|---|---|---|")

    def med(row, mode, key):
        import statistics

        return statistics.median(r[mode][key] for r in row["runs"])

    for r in result["rows"]:
        ratios = [x["ratio"] for x in r["runs"]]
        caches = [x["ratio_caches_only"] for x in r["runs"]]
        packages = r["runs"][0]["warm"]["packages"]
        print(f"| {r['model']} | {med(r, 'cold', 'to_first_output_s'):.1f} | {med(r, 'warm', 'to_first_output_s'):.1f} | "
              f"{r['ratio']:.2f} [{min(ratios):.2f}-{max(ratios):.2f}] | {med(r, 'warm_caches_only', 'to_first_output_s'):.1f} | "
              f"{r['ratio_caches_only']:.2f} [{min(caches):.2f}-{max(caches):.2f}] | "
              f"{packages['packages']}: {packages['calls']} | {med(r, 'cold', 'save_s'):.1f} |")
    if args.out:
        from diffusers_ascend.benchmarks._common import write_json

        write_json(result, args.out, "warm_start.json")
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
