"""The ``diffusers-ascend`` command: env (with torch_npu missing or broken), demo (flux, wan),
config show/validate/push/pull, exit codes. Hub calls are offline: a fake cache and a mocked HfApi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import pytest

import ascend_kernels
from diffusers_ascend.cli import main
from diffusers_ascend.config import CONFIG_NAME, AscendConfig


def _json(capsys, argv, code=0):
    assert main(argv) == code
    return json.loads(capsys.readouterr().out)


def test_env_json(capsys):
    from diffusers_ascend.platform import override_platform

    with override_platform("cpu"):  # what this asserts is the CPU answer
        info = _json(capsys, ["env", "--json"])
    assert info["platform"] == "cpu" and info["torch_npu"] is None
    assert info["providers"] == {op: "native" for op in ascend_kernels.OPS}
    assert info["auto_fusions"] == [] and info["graph_capture_supported"] is False


def test_env_with_broken_torch_npu_says_so(tmp_path):
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('libhccl.so: cannot open shared object file')")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "diffusers_ascend.cli", "env"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch_npu failed to import (ImportError: libhccl.so" in r.stdout
    assert "platform                cpu" in r.stdout


@pytest.mark.parametrize(
    "model,blocks", [("flux", ["FluxTransformerBlock", "FluxSingleTransformerBlock"]), ("wan", ["WanTransformerBlock"])]
)
def test_demo(capsys, tmp_path, model, blocks):
    r = _json(capsys, ["demo", "--json", "--model", model, "--repeats", "1", "--save-dir", str(tmp_path / "saved")])
    assert r["round_trip_ok"] is True and r["reloaded_config"] == r["config"]
    # --save-dir keeps the folder, and the reload call the demo prints is code that reloads it.
    assert r["saved_to"] == str(tmp_path / "saved") and r["kept"] is True
    assert "text_encoder=None" in r["reload"]
    import diffusers

    reloaded = eval(r["reload"], {"diffusers": diffusers})
    assert reloaded.transformer._ascend_state.config.to_dict() == r["config"]
    assert r["max_abs_diff"] < 1e-5
    assert [row["block"] for row in r["per_block"]] == blocks
    assert all(row["ops_after"] < row["ops_before"] for row in r["per_block"])
    assert r["swaps"]["rms_norm"] > 0 and not r["report"]["fallbacks"]
    assert r["compile_s"] > 0 and r["eager_s"] > 0 and r["accelerated_s"] > 0


def test_config_show_defaults_and_file(capsys, tmp_path):
    info = _json(capsys, ["config", "show", "--json"])
    assert info["config"] == AscendConfig().to_dict() and info["resolved_fusions"] == []
    AscendConfig(fusions=["rope"], compile="model").save_pretrained(tmp_path)
    info = _json(capsys, ["config", "show", str(tmp_path), "--json"])
    assert info["config"]["fusions"] == ["rope"] and info["resolved_fusions"] == ["rope"]


def test_config_show_reads_a_saved_pipeline(capsys, tmp_path):
    from diffusers_ascend.tiny import tiny_flux_pipeline

    pipe = tiny_flux_pipeline()
    pipe.enable_ascend_compile(fusions=["adaln"], compile="none")
    pipe.save_pretrained(tmp_path)
    info = _json(capsys, ["config", "show", str(tmp_path), "--json"])
    assert info["config"]["fusions"] == ["adaln"] and info["config"]["compile"] == "none"


@pytest.mark.parametrize(
    "content,code,needle",
    [
        (AscendConfig(fusions="all").to_json_string(), 0, "valid"),
        ('{"fusions": ["rms_norm", "nope"]}', 1, "nope"),
        ("{not json", 1, "invalid"),
        ('{"version": 999, "fusions": "all", "from_the_future": 1}', 0, "valid"),
    ],
)
def test_config_validate(capsys, tmp_path, content, code, needle):
    path = tmp_path / CONFIG_NAME
    path.write_text(content)
    assert main(["config", "validate", str(path)]) == code
    captured = capsys.readouterr()
    reported = captured.err if code else captured.out  # failures on stderr (docs/hub.md), nothing on stdout
    assert needle in reported and str(path) in reported
    assert (captured.out if code else captured.err) == ""


def test_config_validate_json(capsys, tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"compile": "everything"}')
    r = _json(capsys, ["config", "validate", str(path), "--json"], code=1)
    assert r["valid"] is False and "compile" in r["error"] and "blocks" in r["error"]


def test_config_push_and_pull(capsys, tmp_path, monkeypatch):
    cfg = AscendConfig(fusions=["rms_norm", "rope"], on_error="raise")
    cfg.save_pretrained(tmp_path / "src")
    with mock.patch("huggingface_hub.HfApi.create_repo"), mock.patch("huggingface_hub.HfApi.upload_file") as upload:
        upload.return_value = "https://huggingface.co/me/cfg/commit/1"
        assert main(["config", "push", str(tmp_path / "src"), "me/cfg"]) == 0
    assert AscendConfig.from_dict(json.loads(upload.call_args.kwargs["path_or_fileobj"].decode())) == cfg
    assert "pushed to me/cfg" in capsys.readouterr().out
    # pull: from a fake Hub cache, offline.
    import huggingface_hub.constants

    from tests.test_hub import fake_hub_cache

    fake_hub_cache(tmp_path / "hub", "me/cfg", cfg)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["config", "pull", "me/cfg", str(tmp_path / "dst")]) == 0
    assert AscendConfig.from_pretrained(tmp_path / "dst") == cfg


def test_config_pull_unresolvable_is_exit_1(capsys, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert main(["config", "pull", "nobody/nothing", str(tmp_path / "dst")]) == 1
    err = capsys.readouterr().err
    assert "nobody/nothing" in err and "Traceback" not in err and not (tmp_path / "dst").exists()


@pytest.mark.parametrize("argv", [[], ["nope"], ["demo", "--model", "sd3"], ["config"], ["demo", "--height", "x"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "usage: diffusers-ascend" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--height", "-5"], "'-5' must be a positive integer"),
        (["--height", "0"], "'0' must be a positive integer"),
        (["--height", "20"], "'20' must be a multiple of 16"),
        (["--steps", "-1"], "'-1' must be a positive integer"),
        (["--repeats", "0"], "'0' must be a positive integer"),
        (["--repeats", "1.5"], "'1.5' is not an integer"),
        (["--fusions", "bogus"], "fusions='bogus' is invalid; valid: 'auto', 'all', 'none'"),
        (["--fusions", "rms_norm,ropee"], "unknown fusion(s) ['ropee']"),
        (["--fusions", "gelu_tanh,fast_gelu"], "pick one"),
    ],
)
def test_demo_bad_arguments_fail_before_any_work(argv, needle, capsys, monkeypatch):
    from diffusers_ascend import cli

    monkeypatch.setattr(cli, "_run_demo", lambda *a, **k: pytest.fail("the demo started"))
    with pytest.raises(SystemExit) as e:
        main(["demo", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and "Traceback" not in err


def test_run_demo_checks_its_arguments_first(monkeypatch, tmp_path):
    from diffusers_ascend import cli

    monkeypatch.setattr(cli, "_run_demo", lambda *a, **k: pytest.fail("the demo started"))
    (tmp_path / "file").write_text("")
    for kwargs, needle in (
        (dict(repeats=0), "repeats must be a positive integer"),
        (dict(steps=-1), "steps must be a positive integer"),
        (dict(fusions=["bogus"]), "bogus"),
        (dict(model="sd3"), "'flux', 'wan'"),
        (dict(save_dir=tmp_path / "file"), "is a file; pass a folder"),
        (dict(save_dir=""), "empty path"),
    ):
        with pytest.raises(ValueError, match=needle):
            cli.run_demo(**kwargs)


def test_demo_prints_only_its_own_output(tmp_path):
    # A subprocess: library loggers write to the stderr they found at import, which capsys cannot see.
    r = subprocess.run(
        [sys.executable, "-m", "diffusers_ascend.cli", "demo", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "config round-tripped OK" in r.stdout
    # The library noise the demo used to show: save_pretrained's four "None ... cannot be saved",
    # transformers' torchvision notice, diffusers' loading progress bar.
    noise = ("cannot be saved", "torchvision", "Loading pipeline components", "Traceback")
    assert not [n for n in noise if n in r.stdout + r.stderr], r.stderr[-3000:]
    assert os.listdir(tmp_path) == []  # the demo saves into a temporary directory it removes
    # ... and says where it was, that it is gone, how to keep it and how to reload such a folder.
    saved = next(line for line in r.stdout.splitlines() if line.startswith("saved to "))
    folder = saved.split()[2]
    assert "now removed; --save-dir DIR keeps it" in saved and not os.path.exists(folder)
    assert f"diffusers.FluxPipeline.from_pretrained({folder!r}, text_encoder=None, tokenizer=None" in r.stdout


@pytest.mark.parametrize(
    "content,needle",
    [(b"[" * 100_000, "nested too deeply"), (b'{"fusions": "\xff"}', "not UTF-8"), (b"[]", "holds a JSON array")],
    ids=["deep", "encoding", "array"],
)
def test_config_show_and_validate_bad_files_exit_1_without_traceback(capsys, tmp_path, content, needle):
    path = tmp_path / CONFIG_NAME
    path.write_bytes(content.replace(b"\\xff", b"\xff"))
    for argv in (["config", "show", str(path)], ["config", "validate", str(path)], ["config", "show", str(tmp_path)]):
        assert main(argv) == 1, argv
        captured = capsys.readouterr()
        assert needle in captured.err and str(path) in captured.err and captured.out == "", argv


@pytest.mark.parametrize("saved", [["rms_norm"], "all", {"compile": "everything"}])
def test_config_show_saved_folder_with_a_bad_ascend_config(capsys, tmp_path, saved):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(
        json.dumps({"_class_name": "FluxTransformer2DModel", "_ascend_config": saved})
    )
    assert main(["config", "show", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert (
        "invalid ascend config in `_ascend_config` in" in err and str(tmp_path / "transformer" / "config.json") in err
    )
    (tmp_path / "transformer" / "config.json").write_text("[]")
    assert main(["config", "show", str(tmp_path)]) == 1
    assert "holds a JSON array, expected an ascend_config.json" in capsys.readouterr().err


def test_bench_writes_json_table_and_plot(capsys, tmp_path):
    assert main(["bench", "--only", "ops_per_block", "--size", "tiny", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert "ops_per_block" in json.dumps(results)
    assert "| block |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv,needle", [(["--only", "bogus"], "bogus"), (["--size", "huge"], "huge")])
def test_bench_bad_choices_exit_1(capsys, tmp_path, argv, needle):
    assert main(["bench", *argv, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert needle in err and "valid" in err.lower() and not (tmp_path / "out").exists()


def test_bench_without_matplotlib_says_how_to_install(capsys, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["bench", "--size", "tiny", "--out", str(tmp_path / "out")]) == 1
    assert "diffusers-ascend[bench]" in capsys.readouterr().err and not (tmp_path / "out").exists()


def _model_config(path, saved=None, **extra):
    """A model's config.json as diffusers writes it, with `saved` under `_ascend_config` if given."""
    data = {"_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.42.1", "num_layers": 1, **extra}
    if saved is not None:
        data["_ascend_config"] = saved
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name", ["config.json", "model_index.json"])
def test_config_validate_checks_the_saved_settings_of_a_diffusers_config(capsys, tmp_path, name):
    # It said "valid" for a config.json whose saved settings held fusions="al": it read the file as
    # an ascend config, dropped every key with a warning and validated the defaults.
    path = _model_config(tmp_path / name, {**AscendConfig().to_dict(), "fusions": "al"})
    assert main(["config", "validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "invalid" in err and "`_ascend_config` in" in err and "fusions='al'" in err and "Did you mean 'all'" in err
    _model_config(path, AscendConfig(fusions=["rope"]).to_dict())
    r = _json(capsys, ["config", "validate", str(path), "--json"])
    assert r["valid"] is True and r["config"]["fusions"] == ["rope"] and r["warnings"] == []


@pytest.mark.parametrize(
    "content,needle",
    [
        ({"foo": 1}, "holds neither an ascend config nor saved ascend settings (its keys: foo)"),
        ({}, "holds neither an ascend config nor saved ascend settings"),
        (
            {"_class_name": "FluxTransformer2DModel", "num_layers": 1},
            "a diffusers config without saved ascend settings",
        ),
        ({"_class_name": "FluxPipeline", "_ascend_config": None}, "holds no saved ascend settings"),
    ],
)
def test_config_validate_and_show_refuse_a_file_without_an_ascend_config(capsys, tmp_path, content, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(content))
    for action in ("validate", "show"):
        assert main(["config", action, str(path)]) == 1
        captured = capsys.readouterr()
        assert needle in captured.err and str(path) in captured.err and captured.out == "", action
        assert "expected an ascend_config.json" in captured.err or "no saved" in needle
    r = _json(capsys, ["config", "validate", str(path), "--json"], code=1)
    assert r["valid"] is False and needle in r["error"]


def test_config_validate_reports_ignored_keys_as_warnings(capsys, tmp_path):
    path = tmp_path / CONFIG_NAME
    path.write_text('{"fusions": "all", "exector": "eager"}')
    assert main(["config", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"valid: {path}") and "warning: ignoring unknown ascend config keys ['exector']" in out


def test_config_show_of_a_model_config_prints_its_saved_settings(capsys, tmp_path):
    # It printed the defaults.
    saved = AscendConfig(fusions=["adaln", "rope"], compile="model", on_error="raise")
    path = _model_config(tmp_path / "config.json", saved.to_dict())
    info = _json(capsys, ["config", "show", str(path), "--json"])
    assert AscendConfig.from_dict(info["config"]) == saved
    assert main(["config", "show", str(path)]) == 0
    assert '"compile": "model"' in capsys.readouterr().out


def test_config_validate_takes_a_folder_as_show_does(capsys, tmp_path):
    # It failed with "Is a directory".
    from diffusers_ascend.tiny import tiny_flux_pipeline

    pipe = tiny_flux_pipeline()
    pipe.enable_ascend_compile(fusions=["adaln"], compile="none")
    pipe.save_pretrained(tmp_path / "pipe")
    r = _json(capsys, ["config", "validate", str(tmp_path / "pipe"), "--json"])
    assert r["valid"] is True and r["config"]["fusions"] == ["adaln"]
    AscendConfig(fusions="none").save_pretrained(tmp_path / "cfg")
    assert main(["config", "validate", str(tmp_path / "cfg")]) == 0
    assert capsys.readouterr().out.startswith(f"valid: {tmp_path / 'cfg'}")
    (tmp_path / "empty").mkdir()
    assert main(["config", "validate", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "holds no ascend settings" in err and "Traceback" not in err and "Is a directory" not in err


def test_cache_info_prints_a_readable_summary_and_json_the_manifest(capsys, tmp_path):
    # It printed one line per manifest key, the block entries' Python reprs: 6,400 characters.
    from diffusers_ascend import warm_start
    from tests.test_warm_start import _write_cache

    keys = warm_start.expected_keys(AscendConfig(fusions=["rms_norm"], executor="inductor"))
    manifest = _write_cache(tmp_path, keys, payload=b"x" * 2_500_000, packages={"ascend_aoti_0.pt2": b"p" * 1500})
    assert main(["cache", "info", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) <= 12 and max(map(len, lines)) <= 160, text
    assert f"compile artifacts at {tmp_path}" in lines[0] and f"torch {keys['torch']}" in text
    assert "ascend_inductor_cache.bin" in text and "2.5 MB" in text and "1.5 KB" in text
    assert "FluxTransformerBlock  ascend_aoti_0.pt2  ops 5 -> 2, fusions: rms_norm 1" in text
    assert "fits this machine: yes" in text and "{'" not in text  # no Python reprs
    info = _json(capsys, ["cache", "info", str(tmp_path), "--json"])
    assert {k: info[k] for k in manifest} == manifest and info["matches_here"] is True


def test_cache_info_says_why_a_cache_does_not_fit(capsys, tmp_path):
    from diffusers_ascend import warm_start
    from tests.test_warm_start import _write_cache

    keys = warm_start.expected_keys(AscendConfig(executor="inductor"))
    _write_cache(tmp_path, {**keys, "torch": "2.6.0", "platform": "npu"})
    assert main(["cache", "info", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert (
        "fits this machine: no" in text and "torch version: saved '2.6.0'" in text and "platform: saved 'npu'" in text
    )
    (tmp_path / warm_start.MANIFEST_NAME).write_text(
        json.dumps({"format": 1, "diffusers_ascend": "0.1.0", "mechanism": "inductor-mega-cache", "files": {}})
    )
    assert main(["cache", "info", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "manifest format 1" in text and "fits this machine: no" in text


def test_config_show_of_a_folder_skips_files_without_settings(capsys, tmp_path):
    # A saved pipeline: config.json of another tool at the top, the settings in model_index.json.
    (tmp_path / "config.json").write_text('{"architectures": ["Other"]}')
    _model_config(tmp_path / "model_index.json", AscendConfig(compile="model").to_dict(), _class_name="FluxPipeline")
    assert _json(capsys, ["config", "show", str(tmp_path), "--json"])["config"]["compile"] == "model"
