"""The benchmarks at size="tiny": rows, exact per-block match counts, consistent ratios, files.

Every benchmark runs once (module fixture); nothing here asserts on timings, only that they were
measured.
"""

from __future__ import annotations

import json
import math

import pytest

from diffusers_ascend import cli
from diffusers_ascend.benchmarks import BENCHMARKS, LATENCY_VARIANTS, SIZES, latency, recompiles, run_benchmarks

from .compilation.conftest import EXPECTED_BLOCK_COUNTS

# tests/compilation's replacements per block (fp32 and bf16) with the fusions of ops_per_block:
# fusions="all" less swiglu (these blocks hold no SwiGLU site).
EXPECTED_MATCHES = {
    block: {f: n for f, n in counts.items() if f != "swiglu"} for block, counts in EXPECTED_BLOCK_COUNTS.items()
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    res = run_benchmarks(size="tiny", out_dir=out, verbose=False)
    return res, out


def _rows(results, name):
    return results[0]["benchmarks"][name]["rows"]


def test_all_benchmarks_ran(results):
    res, _ = results
    assert list(res["benchmarks"]) == list(BENCHMARKS)
    assert res["size"] == "tiny"
    for result in res["benchmarks"].values():
        assert result["rows"] and result["seconds"] > 0
        assert {"cpu", "cpu_usable", "torch", "diffusers", "device"} <= set(result["machine"])
        keys = {key.split(".")[0] for key, _ in result["columns"]}
        assert all(keys <= set(row) for row in result["rows"])


def test_ops_per_block(results):
    rows = _rows(results, "ops_per_block")
    assert [(r["block"], r["dtype"]) for r in rows] == [(b, d) for b in EXPECTED_MATCHES for d in ("fp32", "bf16")]
    for r in rows:
        assert r["matches"] == EXPECTED_MATCHES[r["block"]], r
        assert 0 < r["ops_after"] < r["ops_before"]
        assert math.isclose(r["ratio"], r["ops_after"] / r["ops_before"])
        assert r["ratio"] <= 0.5  # at least half the dispatched ops are gone in every block
        assert r["graphs_compiled"] == 1 and r["fallbacks"] == 0
    bf16 = {r["block"]: r for r in rows if r["dtype"] == "bf16"}
    fp32 = {r["block"]: r for r in rows if r["dtype"] == "fp32"}
    assert all(bf16[b]["ops_before"] > fp32[b]["ops_before"] for b in EXPECTED_MATCHES)  # the casts


def test_compile_time(results):
    rows = _rows(results, "compile_time")
    assert [(r["executor"], r["compile"]) for r in rows] == [("eager", "blocks"), ("eager", "model")]
    blocks, model = rows
    # 1 double + 2 single blocks share one backend: one graph for the double block, two for the
    # single ones (contiguous first input, a strided slice after); the whole model is one graph.
    assert blocks["graphs_compiled"] == 3 and model["graphs_compiled"] == 1
    for r in rows:
        assert r["first_call_s"] > 0 and r["steady_call_s"] > 0
        assert 0 <= r["compile_s"] <= r["first_call_s"]
        assert r["fallbacks"] == 0
    assert model["vs_model"] == 1
    assert math.isclose(blocks["vs_model"], blocks["compile_s"] / model["compile_s"])


def test_recompiles(results):
    rows = _rows(results, "recompiles")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and {r["model"] for r in rows} == {"wan"}
    assert len({r["tokens"] for r in rows}) == 4  # a new sequence length each time
    assert rows[0]["graphs_compiled"] == 1 and rows[0]["recompiles"] == 0  # 2 Wan blocks, one graph
    assert rows[0]["dynamic"] is False
    total = 0
    for r in rows:
        total += r["new_graphs"]
        assert r["graphs_compiled"] == total
        assert r["recompiles"] == total - rows[0]["graphs_compiled"]
    assert rows[1]["new_graphs"] > 0 and rows[1]["dynamic"]  # the second shape recompiles dynamic...
    assert rows[-1]["new_graphs"] == 0  # ...and by the fourth it has settled


def test_latency(results):
    rows = _rows(results, "latency")
    assert [r["variant"] for r in rows] == ["eager", "ascend_all_eager"]
    eager, fused = rows
    assert eager["vs_eager"] == 1 and eager["max_abs_diff"] == 0
    for r in rows:
        assert 0 < r["min_ms"] <= r["median_ms"]
        assert math.isclose(r["vs_eager"], r["median_ms"] / r["eager_median_ms"])
        assert math.isclose(r["vs_eager"] * r["speedup"], 1.0)
    assert fused["executor"] == "eager" and fused["graphs_compiled"] >= 2
    assert fused["max_abs_diff"] < 1e-4


def test_files_written(results):
    res, out = results
    with open(out / "results.json") as f:
        data = json.load(f)
    assert data["size"] == "tiny" and list(data["benchmarks"]) == list(BENCHMARKS)
    assert data["benchmarks"]["ops_per_block"]["rows"][0]["matches"] == EXPECTED_MATCHES["flux_double"]
    md = (out / "results.md").read_text()
    assert md.startswith("# diffusers-ascend benchmarks")
    for name in BENCHMARKS:
        assert f"## {name}" in md
    assert "| block | dtype |" in md and "|---|" in md
    assert res["machine"]["cpu"] in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_names_and_sizes_raise():
    with pytest.raises(ValueError, match="ops_per_block"):
        run_benchmarks(["ops_per_blok"], size="tiny")
    with pytest.raises(ValueError, match="'tiny', 'small'"):
        run_benchmarks(size="huge")
    with pytest.raises(ValueError, match="valid"):
        run_benchmarks(["latency"], size="tiny", options={"latncy": {}})
    with pytest.raises(ValueError, match="ascend_auto"):
        latency(size="tiny", variants=["fast"])
    with pytest.raises(ValueError, match="wan"):
        recompiles(size="tiny", models=["sd3"])
    assert SIZES == ("tiny", "small") and "ascend_auto" in LATENCY_VARIANTS


@pytest.mark.parametrize(
    "argv, flags",
    [
        (["bench"], ("--only", "--size", "--out")),
        (["bench", "warm_start"], ("--size", "--out", "--repeat")),
        (["bench", "blocks"], ("--tiny", "--variant", "--out")),
        (["bench", "kernels"], ("--case", "--out")),
        (["bench", "graph_capture"], ("--iters", "--configs", "--out")),
        (["bench", "host_path"], ("--calls", "--out")),
    ],
)
def test_commands_parse_arguments(argv, flags, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in flags)


def test_device_commands_are_the_modules():
    """Every ``bench_<name>.py`` has its registry entry; each ``bench <name>`` is `bench_<name>.cli`
    and each suite entry its module's function and plot; and the choices spelled out in the registry
    (so that --help does not import torch) are the modules' own."""
    import importlib
    import pathlib

    from diffusers_ascend.benchmarks.registry import REGISTRY

    files = {p.stem for p in pathlib.Path(cli.__file__).parent.joinpath("benchmarks").glob("bench_*.py")}
    assert {b.module for b in REGISTRY.values()} == files
    assert all(b.module == f"bench_{n}" for n, b in REGISTRY.items() if b.function is None)
    commands = cli.build_parser()._subparsers._group_actions[0].choices["bench"]._subparsers._group_actions[0].choices
    assert list(commands) == [n for n, b in REGISTRY.items() if b.function is None]
    for name, entry in REGISTRY.items():
        module = importlib.import_module(f"diffusers_ascend.benchmarks.{entry.module}")
        if entry.function is None:
            assert callable(module.cli) and commands[name].description == (entry.description or entry.help)
        else:
            assert BENCHMARKS[name] is getattr(module, entry.function) and callable(module.plot)
    from diffusers_ascend.benchmarks import bench_graph_capture, bench_warm_start

    args = cli.build_parser().parse_args(["bench", "graph_capture"])
    assert tuple(args.configs) == tuple(bench_graph_capture.CONFIGS) and tuple(args.sizes) == tuple(
        bench_graph_capture.SIZES
    )
    warm = {
        a.dest: a
        for a in cli.build_parser()
        ._subparsers._group_actions[0]
        .choices["bench"]
        ._subparsers._group_actions[0]
        .choices["warm_start"]
        ._actions
    }
    assert set(warm["size"].choices) == set(bench_warm_start.SIZES)
    assert set(warm["models"].choices) == set(bench_warm_start.SIZES["small"])


def test_eager_warm_start_ratios_are_of_medians():
    from diffusers_ascend.benchmarks import bench_warm_start as b

    def run(total, enable=0.0, call=0.0, cpu=None):
        return {"to_first_output_s": total, "enable_s": enable, "first_call_s": call, "cpu_s": cpu or total}

    repetitions = [
        {"floor": run(4.0), "cold_first": run(10.0), "cold": run(8.0, 0.5, 3.5), "warm": run(4.5, 0.3, 0.1)},
        {"floor": run(5.0), "cold_first": run(12.0), "cold": run(9.0, 0.5, 4.5), "warm": run(5.0, 0.4, 0.1)},
        {"floor": run(6.0), "cold_first": run(11.0), "cold": run(7.0, 0.5, 2.5), "warm": run(9.0, 0.5, 0.1)},
    ]
    medians = {m: b._median_run([r[m] for r in repetitions]) for m in b.EAGER_MODES}
    assert medians["warm"] == run(5.0, 0.4, 0.1) and medians["cold_first"]["to_first_output_s"] == 11.0
    ratios = b._eager_ratios(medians)
    assert ratios["ratio"] == 5.0 / 8.0 and ratios["ratio_first"] == 5.0 / 11.0
    assert ratios["ratio_enable_call"] == 0.5 / 4.0 and ratios["ratio_cpu"] == 5.0 / 8.0
    assert ratios["ratio_above_floor"] == (5.0 - 5.0) / (8.0 - 5.0)
    assert ratios["ratio_first_above_floor"] == 0.0
    # A non-numeric field (the package counters) is the first run's.
    assert b._median_run([{"packages": {"calls": 1}, "x": 1.0}, {"packages": {"calls": 2}, "x": 3.0}]) == {
        "packages": {"calls": 1},
        "x": 2.0,
    }


def test_eager_warm_start_floor_runs_diffusers_alone():
    # The floor is the same child without enabling: none of the engine is imported (the package is,
    # as `tiny` lives in it, and patches diffusers' classes: the light `integration` modules).
    import subprocess
    import sys

    code = (
        "import sys, runpy\n"
        "sys.argv = ['x', 'eager', 'flux', 'tiny', 'floor', '-', '0']\n"
        "runpy.run_module('diffusers_ascend.benchmarks.bench_warm_start', run_name='__main__')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('diffusers_ascend.compilation', "
        "'diffusers_ascend.warm_start', 'diffusers_ascend.adapters', 'ascend_kernels'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result, modules = out.stdout.strip().splitlines()[-2:]
    assert result.startswith("RESULT ") and json.loads(result[7:])["first_call_s"] > 0
    assert modules == "[]"
