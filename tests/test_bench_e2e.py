"""`bench e2e`: the shipped real configs, weights built on the device from a local generator, the
stock pipeline loop per variant, the files, and clear errors for bad arguments.

The smoke run is Wan 2.1 1.3B at its full width (1536) with one block, a 16x16 single frame and two
steps: seconds on CPU. The compiled variants take minutes of Inductor on a 2-core CPU; they run in
the `slow` test. Nothing here asserts on timings, only that they were measured.
"""

from __future__ import annotations

import inspect
import json
import os

import pytest
import torch

from diffusers_ascend import cli
from diffusers_ascend.benchmarks import bench_e2e
from diffusers_ascend.benchmarks.bench_e2e import (
    MODELS,
    VARIANTS,
    build_transformer,
    model_spec,
    run_e2e,
    transformer_config,
)

TINY_JOB = dict(depth=1, height=16, width=16, frames=1, steps=2, text_len=8, device="cpu")

# What the issue and the model cards give (hidden width = heads x head dim); parameter counts of
# the whole transformers, from a meta-device build of the shipped configs.
EXPECTED = {
    "flux": dict(width=3072, blocks={"num_layers": 19, "num_single_layers": 38}, params=11.90e9),
    "wan": dict(width=1536, blocks={"num_layers": 30}, params=1.42e9),
    "wan-14b": dict(width=5120, blocks={"num_layers": 40}, params=14.29e9),
    "qwen-image": dict(width=3072, blocks={"num_layers": 60}, params=20.43e9),
}


def _meta_model(model, depth=None):
    spec = model_spec(model)
    cls = bench_e2e._diffusers_class(spec["transformer_class"])
    with torch.device("meta"):
        return cls.from_config(transformer_config(spec, depth))


@pytest.mark.parametrize("model", MODELS)
def test_shipped_configs_are_the_real_models(model):
    spec = model_spec(model)
    cls = bench_e2e._diffusers_class(spec["transformer_class"])
    init = set(inspect.signature(cls.__init__).parameters) - {"self"}
    assert set(spec["transformer"]) <= init, set(spec["transformer"]) - init  # every key is a real argument
    cfg = spec["transformer"]
    assert cfg["num_attention_heads"] * cfg["attention_head_dim"] == EXPECTED[model]["width"]
    assert {k: cfg[k] for k in spec["depth_keys"]} == EXPECTED[model]["blocks"]
    params = sum(p.numel() for p in _meta_model(model).parameters())
    assert params == pytest.approx(EXPECTED[model]["params"], rel=0.01)
    assert "diffusers 0.42.1" in spec["transformer_source"] and spec["scheduler_source"]
    assert all(a["source"] and a["seconds"] > 0 for a in spec["anchors"])
    # The scheduler config is one its class accepts as is.
    scheduler_cls = bench_e2e._diffusers_class(spec["scheduler_class"])
    assert set(spec["scheduler"]) <= set(inspect.signature(scheduler_cls.__init__).parameters)


def test_the_issue_s_config_values():
    flux, wan, wan14, qwen = (model_spec(m)["transformer"] for m in MODELS)
    assert (
        flux["joint_attention_dim"],
        flux["pooled_projection_dim"],
        flux["axes_dims_rope"],
        flux["guidance_embeds"],
    ) == (4096, 768, [16, 56, 56], True)
    for w, (heads, layers, ffn) in ((wan, (12, 30, 8960)), (wan14, (40, 40, 13824))):
        assert (w["num_attention_heads"], w["num_layers"], w["ffn_dim"]) == (heads, layers, ffn)
        assert (w["text_dim"], w["in_channels"], w["out_channels"], w["patch_size"]) == (4096, 16, 16, [1, 2, 2])
    assert (qwen["num_layers"], qwen["joint_attention_dim"], qwen["in_channels"], qwen["axes_dims_rope"]) == (
        60,
        3584,
        64,
        [16, 56, 56],
    )
    assert model_spec("flux")["scheduler_class"] == "FlowMatchEulerDiscreteScheduler"
    assert model_spec("wan")["scheduler_class"] == "UniPCMultistepScheduler"


def test_depth_cuts_every_repeated_block_kind():
    assert {k: v for k, v in transformer_config(model_spec("flux"), 2).items() if "layers" in k} == {
        "num_layers": 2,
        "num_single_layers": 2,
    }
    assert transformer_config(model_spec("wan"), 99)["num_layers"] == 30  # at most the real count


def test_weights_are_built_on_the_device_from_a_local_generator():
    spec = model_spec("wan")
    state = torch.random.get_rng_state()
    model = build_transformer(spec, "cpu", torch.bfloat16, depth=1, seed=3)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG was not drawn from
    again = build_transformer(spec, "cpu", torch.bfloat16, depth=1, seed=3)
    other = build_transformer(spec, "cpu", torch.bfloat16, depth=1, seed=4)
    pairs = list(zip(model.parameters(), again.parameters(), other.parameters()))
    assert all(torch.equal(a, b) for a, b, _ in pairs)
    assert not all(torch.equal(a, c) for a, _, c in pairs)
    # bf16 except `_keep_in_fp32_modules`, as from_pretrained(torch_dtype=torch.bfloat16) leaves them.
    fp32 = {n for n, p in model.named_parameters() if p.dtype == torch.float32}
    assert fp32 and all(bench_e2e._keep_fp32(model, n) for n in fp32)
    assert all(p.dtype == torch.bfloat16 for n, p in model.named_parameters() if n not in fp32)
    # The model's own initialisation ran: nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    w = model.blocks[0].ffn.net[0].proj.weight.float()
    assert w.abs().max() <= 1536**-0.5 and w.std() == pytest.approx(1536**-0.5 / 3**0.5, rel=0.02)
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_construction_refuses_global_rng_draws():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match="global RNG"):
        with bench_e2e._SeededInit(gen, torch.bfloat16):
            torch.randn_like(torch.zeros(2))
    with bench_e2e._SeededInit(gen, torch.bfloat16):
        assert torch.empty(2).dtype == torch.bfloat16 and torch.empty(2, dtype=torch.float32).dtype == torch.float32


# The smallest e2e job on the CPU (the variants and output are each test's).
E2E_TINY = [
    "bench",
    "e2e",
    "--model",
    "wan",
    "--depth",
    "1",
    "--height",
    "16",
    "--width",
    "16",
    "--frames",
    "1",
    "--steps",
    "2",
    "--text-len",
    "8",
    "--device",
    "cpu",
]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One CLI run: eager plus the two variants that cannot exist on a CPU (listed as skipped)."""
    out = tmp_path_factory.mktemp("e2e")
    argv = [*E2E_TINY, "--variants", "ascend+graph", "mindiesd", "--out", str(out), "--json"]
    return cli.main(argv), out


def test_smoke_run_writes_json_table_and_plot(smoke):
    rc, out = smoke
    assert rc == 0
    stem = out / "e2e-wan-cpu-depth1"
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["model"] == "wan" and data["config"]["num_layers"] == 1 and data["config"]["ffn_dim"] == 8960
    assert data["depth"] == {"num_layers": 1} and data["full_depth"] == {"num_layers": 30}
    assert data["job"]["steps"] == 2 and data["transformer_calls_per_step"] == 2  # Wan's CFG
    assert data["command"] == (
        "diffusers-ascend bench e2e --model wan --depth 1 --height 16 --width 16 --frames 1 "
        "--steps 2 --text-len 8 --device cpu --variants eager ascend+graph mindiesd"
    )
    assert data["pipeline"] == "WanPipeline" and data["scheduler"]["_class_name"] == "UniPCMultistepScheduler"
    assert {"cpu", "torch", "diffusers", "device"} <= set(data["machine"])
    assert "resident set" in data["peak_mem_kind"] and data["leaves_out"]
    names = [v["name"] for v in data["variants"]]
    assert names == ["eager", "ascend+graph", "mindiesd"]  # eager first, as the reference
    eager, graph, mindie = data["variants"]
    assert eager["status"] == "ok" and eager["max_abs_diff"] == 0
    assert eager["cold_s"] > 0 and eager["step_ms"] > 0 and eager["e2e_s"] > 0 and eager["peak_mem_mb"] > 0
    assert len(eager["steps_ms"]) == 2
    assert graph["status"] == "skipped" and "device graphs" in graph["note"]
    assert mindie["status"] == "skipped" and "Ascend NPUs only" in mindie["note"]
    md = stem.with_suffix(".md").read_text()
    assert md.startswith("# Wan 2.1 T2V 1.3B end to end") and "| eager | ok |" in md and "skipped" in md
    assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_anchors_are_comparable_only_for_the_same_job_at_full_depth():
    spec = model_spec("flux")
    full = transformer_config(spec)
    assert all(a["comparable"] for a in bench_e2e._anchors(spec, spec["job"], {k: full[k] for k in spec["depth_keys"]}))
    shallow = transformer_config(spec, 1)
    assert not any(
        a["comparable"] for a in bench_e2e._anchors(spec, spec["job"], {k: shallow[k] for k in spec["depth_keys"]})
    )
    depth = {k: full[k] for k in spec["depth_keys"]}
    for other_job in (dict(spec["job"], steps=4), dict(spec["job"], text_len=64)):
        assert not any(a["comparable"] for a in bench_e2e._anchors(spec, other_job, depth))
    assert not any(a["comparable"] for a in bench_e2e._anchors(spec, spec["job"], depth, dtype="fp32"))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(model="sd3"), "unknown model 'sd3'; valid: 'flux', 'wan', 'wan-14b', 'qwen-image'"),
        (dict(model="flux", variants=["eager", "fast"]), "unknown variant 'fast'; valid: 'eager', 'ascend'"),
        (dict(model="flux", device="tpu"), "unknown device 'tpu'; valid: 'cpu', 'cuda', 'npu'"),
        (dict(model="flux", dtype="fp8"), "unknown dtype 'fp8'; valid: 'bf16', 'fp32'"),
        (dict(model="flux", frames=5), "--frames applies to video models"),
        (dict(model="wan", frames=4), "4k\\+1"),
        (dict(model="flux", height=100), "multiple of 16"),
        (dict(model="flux", depth=0), "depth must be a positive integer"),
        (dict(model="flux", fusions="rms_nrm"), "fusions='rms_nrm' is invalid.*Did you mean 'rms_norm'"),
    ],
)
def test_bad_arguments_raise_before_anything_is_built(kwargs, match, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("built a model for bad arguments")

    monkeypatch.setattr(bench_e2e, "build_transformer", no_build)
    with pytest.raises(ValueError, match=match):
        run_e2e(progress=False, **kwargs)


def test_cli_rejects_unknown_model_and_variant_with_the_choices(capsys):
    for argv, bad in ((["--model", "sd3"], "'sd3'"), (["--model", "flux", "--variants", "fast"], "'fast'")):
        with pytest.raises(SystemExit) as e:
            cli.main(["bench", "e2e", *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"invalid choice: {bad}" in err and ("'qwen-image'" in err or "'mindiesd'" in err)
    with pytest.raises(SystemExit):
        cli.main(["bench", "e2e", "--model", "flux", "--height", "100"])
    assert "multiple of 16" in capsys.readouterr().err


def test_cli_choices_are_the_module_s():
    e2e = cli.build_parser().parse_args(["bench", "e2e", "--model", "flux"])
    assert e2e.bench_command == "e2e" and e2e.variants is None and e2e.dtype == "bf16"
    actions = {
        a.dest: a
        for a in cli.build_parser()
        ._subparsers._group_actions[0]
        .choices["bench"]
        ._subparsers._group_actions[0]
        .choices["e2e"]
        ._actions
    }
    assert tuple(actions["model"].choices) == MODELS and tuple(actions["variants"].choices) == VARIANTS
    # `bench` without a subcommand still runs the small benchmarks.
    assert cli.build_parser().parse_args(["bench", "--only", "latency"]).bench_command is None


@pytest.mark.slow
def test_compiled_variants_run_and_match_eager(tmp_path):
    """ascend and regional compile a full-width Wan block with Inductor: minutes on a 2-core CPU."""
    result = run_e2e("wan", variants=["ascend", "regional"], progress=False, out_dir=tmp_path, **TINY_JOB)
    rows = {v["name"]: v for v in result["variants"]}
    assert list(rows) == ["eager", "ascend", "regional"]
    for name in ("ascend", "regional"):
        assert rows[name]["status"] == "ok", rows[name]
        assert rows[name]["cold_s"] > rows[name]["step_ms"] / 1e3  # the first step compiled
        assert 0 < rows[name]["max_abs_diff"] < 0.1  # bf16 latents after two steps
    assert rows["ascend"]["graphs_compiled"] == 1 and rows["ascend"]["fallbacks"] == 0
    assert rows["ascend"]["fusions"] == {}  # fusions="auto" picks none on CPU


def test_command_runs_as_a_module():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "diffusers_ascend.cli", "bench", "e2e", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "--model {flux,wan,wan-14b,qwen-image}" in out.stdout and "--variants" in out.stdout


def _out_of_memory(model, device):
    """An eager setup whose denoising call fails as a too-large job does on a device."""

    def fail(module, args, kwargs):
        raise torch.cuda.OutOfMemoryError("NPU out of memory. Tried to allocate 38.00 GiB")

    handle = model.register_forward_pre_hook(fail, with_kwargs=True)
    return handle.remove


def test_a_failed_eager_reference_is_a_row_and_exit_1_not_a_traceback(tmp_path, monkeypatch, capsys):
    # It raised RuntimeError("the eager reference failed...") out of the CLI: a traceback, no files.
    spec = bench_e2e.VARIANT_SPECS
    monkeypatch.setitem(spec, "eager", (spec["eager"][0], spec["eager"][1], _out_of_memory))
    monkeypatch.setitem(spec, "regional", (spec["regional"][0], spec["regional"][1], bench_e2e._eager))  # runs fast
    monkeypatch.setattr(bench_e2e, "warm_up_compiler", lambda **k: None)
    assert cli.main([*E2E_TINY, "--variants", "eager", "regional", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert "variant eager failed: OutOfMemoryError: NPU out of memory. Tried to allocate 38.00 GiB" in captured.err
    data = json.loads((tmp_path / "e2e-wan-cpu-depth1.json").read_text())
    eager, other = data["variants"]
    assert eager["status"] == "failed" and "Tried to allocate" in eager["note"]
    assert other["status"] == "ok" and other["step_ms"] > 0, other["note"]
    assert other["max_abs_diff"] is None  # timed, with nothing to compare with
    assert "not compared: the eager reference failed" in other["note"]


def test_ctrl_c_exits_130_with_one_line(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_e2e, "_run_variant", interrupted)
    assert cli.main([*E2E_TINY, "--variants", "eager", "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert "diffusers-ascend bench: interrupted" in err.splitlines() and "Traceback" not in err


def _unwritable(tmp_path):
    """A folder this process cannot write: a read-only one, or for root (which writes those) /sys."""
    import tempfile

    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o500)
        return str(folder / "out")
    if not os.path.isdir("/sys"):
        pytest.skip("no /sys here")
    try:
        with tempfile.TemporaryFile(dir="/sys"):
            pytest.skip("no folder this root process cannot write")
    except OSError:
        return "/sys/diffusers-ascend-out"


@pytest.mark.parametrize("where", ["a file", "under a file", "unwritable"])
def test_a_bad_out_is_refused_before_the_run(tmp_path, monkeypatch, capsys, where):
    # It was found only when the results were written, after the whole run.
    (tmp_path / "f").write_text("")
    out = {
        "a file": str(tmp_path / "f"),
        "under a file": str(tmp_path / "f" / "sub"),
        "unwritable": _unwritable(tmp_path),
    }[where]
    needle = {"a file": "is a file; pass a folder", "under a file": "is a file", "unwritable": "is not writable"}[where]

    def no_run(*args, **kwargs):
        raise AssertionError("the run started")

    import diffusers_ascend.benchmarks

    monkeypatch.setattr(bench_e2e, "build_transformer", no_run)
    monkeypatch.setattr(bench_e2e, "warm_up_compiler", no_run)
    monkeypatch.setattr(diffusers_ascend.benchmarks, "run_benchmarks", no_run)
    for argv in (
        [*E2E_TINY, "--out", out],
        ["bench", "--size", "tiny", "--out", out],
        ["bench", "host_path", "--out", out],
    ):
        assert cli.main(argv) == 1, argv
        err = capsys.readouterr().err
        assert needle in err and repr(out) in err and "Traceback" not in err, argv
    with pytest.raises(ValueError, match=needle):
        run_e2e("wan", out_dir=out, progress=False, **TINY_JOB)
