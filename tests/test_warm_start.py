"""Warm start (`save_ascend_cache`, `enable_ascend_compile(cache=...)`): issue 15.

The round trip runs in two fresh subprocesses, each with its own empty Inductor cache directory:
the second must get every graph from the saved artifacts, asserted with torch's own cache
counters (AOTAutograd and FX graph cache hits, no miss) and with the C++ kernel libraries found
on disk rather than rebuilt. No wall-clock assertion. Hub sources are read from a fake offline
Hub cache (the layout huggingface_hub expects), uploads go to a mocked ``HfApi``.
"""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from unittest import mock

import pytest
import torch

import diffusers_ascend
from diffusers_ascend import cache
from diffusers_ascend.cli import main
from diffusers_ascend.config import AscendConfig
from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, tiny_flux_transformer

LAYERS = dict(num_layers=1, num_single_layers=1)
SHA = "0123456789abcdef0123456789abcdef01234567"

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import diffusers_ascend
    from diffusers_ascend.benchmarks._common import flux_model_inputs
    from diffusers_ascend.compilation._compat import compile_cache_counters, inductor_cache_dir
    from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, tiny_flux_transformer

    mode, art, out = sys.argv[1:4]
    layers = dict(num_layers=1, num_single_layers=1)
    model = tiny_flux_transformer(**layers)
    inputs = flux_model_inputs({**FLUX_TRANSFORMER_CONFIG, **layers}, 8, 8)
    diffusers_ascend.enable_ascend_compile(model, fusions="all", executor="inductor", compile="blocks",
                                           cache=art if mode == "load" else None)
    def libs():
        root = inductor_cache_dir()
        return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs if f.endswith(".so"))
    before = libs()
    with torch.no_grad():
        result = model(**inputs)[0]
    info = dict(compile_cache_counters(), libs_before=before, libs_after=libs(),
                graphs=diffusers_ascend.ascend_report(model).graphs_compiled)
    if mode == "save":
        info["manifest"] = diffusers_ascend.save_ascend_cache(model, art)
    torch.save(result, out)
    print("RESULT", json.dumps(info))
    """
)


def _run(tmp_path, mode, name):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{name}"),
           "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode, str(tmp_path / "art"), str(tmp_path / f"{name}.pt")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), torch.load(tmp_path / f"{name}.pt")


@pytest.mark.skipif(torch.compiler.__dict__.get("save_cache_artifacts") is None, reason="torch 2.6: no portable compile cache")
def test_saved_artifacts_make_a_fresh_process_skip_compilation(tmp_path):
    cold, cold_out = _run(tmp_path, "save", "cold")
    assert cold["autograd_cache_miss"] >= 2 and cold["autograd_cache_hit"] == 0  # one per block class at least
    manifest = cold["manifest"]
    assert manifest["executor"] == "inductor" and set(manifest["files"]) == {cache.ARTIFACTS_NAME, cache.KERNELS_NAME}
    on_disk = json.loads((tmp_path / "art" / cache.MANIFEST_NAME).read_text())
    assert on_disk == manifest

    warm, warm_out = _run(tmp_path, "load", "warm")
    # Every graph the cold process compiled comes from the artifacts: no AOTAutograd or Inductor
    # compile, and no C++ kernel library built (all were on disk before the first call).
    assert warm["graphs"] == cold["graphs"]
    assert warm["autograd_cache_hit"] == cold["autograd_cache_miss"] and warm["autograd_cache_miss"] == 0
    assert warm["fxgraph_cache_miss"] == 0
    assert warm["libs_before"] and warm["libs_after"] == warm["libs_before"]
    torch.testing.assert_close(warm_out, cold_out, rtol=0, atol=0)


# -- validation without compiling ---------------------------------------------------------------------
def _write_cache(directory, keys, payload=b"mega-cache bytes", kernels=None, **manifest_overrides):
    """A cache directory in `save_ascend_cache`'s layout with `keys` as the manifest's keys."""
    os.makedirs(directory, exist_ok=True)
    blobs = {cache.ARTIFACTS_NAME: payload, **({cache.KERNELS_NAME: kernels} if kernels is not None else {})}
    for name, data in blobs.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    manifest = {"format": cache.FORMAT, "mechanism": cache.MECHANISM, **keys,
                "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in blobs.items()},
                **manifest_overrides}
    with open(os.path.join(directory, cache.MANIFEST_NAME), "w") as f:
        json.dump(manifest, f)
    return manifest


@pytest.fixture
def loads(monkeypatch):
    """Records what would reach torch's caches (nothing is loaded into this test process)."""
    from diffusers_ascend.compilation import _compat

    calls = []
    monkeypatch.setattr(_compat, "cache_artifacts_api", lambda: (None, calls.append))
    monkeypatch.setattr(_compat, "inductor_cache_dir", lambda: "/nonexistent-inductor-cache")
    return calls


def _small_inputs():
    from diffusers_ascend.benchmarks._common import flux_model_inputs

    return flux_model_inputs({**FLUX_TRANSFORMER_CONFIG, **LAYERS}, 4, 4)


def test_stale_artifacts_warn_and_compile_normally(tmp_path, loads):
    cfg = AscendConfig(fusions="all", executor="eager", compile="blocks")
    keys = cache.expected_keys(cfg)
    _write_cache(tmp_path / "old-torch", {**keys, "torch": "2.0.0"})
    _write_cache(tmp_path / "other-config", cache.expected_keys(cfg.replace(fusions=["rms_norm"])))
    for name, needle in [("old-torch", "torch version: saved '2.0.0'"), ("other-config", "AscendConfig.cache_key()")]:
        model = tiny_flux_transformer(**LAYERS)
        with pytest.warns(UserWarning, match="made for another setup") as rec:
            diffusers_ascend.enable_ascend_compile(model, cfg, cache=str(tmp_path / name))
        (msg,) = [str(w.message) for w in rec if "made for another setup" in str(w.message)]
        assert needle in msg and "compiling normally" in msg
        with torch.no_grad():
            model(**_small_inputs())
        report = diffusers_ascend.ascend_report(model)
        assert report.graphs_compiled >= 2 and report.matches["adaln"] > 0  # compiled and fused as without cache
    assert loads == []  # nothing reached torch's caches


def test_matching_artifacts_reach_torch_caches(tmp_path, loads):
    cfg = AscendConfig(fusions=["rms_norm"], executor="inductor", compile="blocks")
    _write_cache(tmp_path, cache.expected_keys(cfg))
    model = tiny_flux_transformer(**LAYERS)
    diffusers_ascend.enable_ascend_compile(model, cfg, cache=str(tmp_path))
    assert loads == [b"mega-cache bytes"]


@pytest.mark.parametrize("tamper, needle", [
    (lambda d, m: (d / cache.MANIFEST_NAME).write_text("{not json"), "not valid JSON|JSON"),
    (lambda d, m: (d / cache.MANIFEST_NAME).write_text(json.dumps({**m, "extra": 1})), "unknown keys \\['extra'\\]"),
    (lambda d, m: (d / cache.MANIFEST_NAME).write_text(json.dumps({**m, "torch": 2})), "'torch' must be a string"),
    (lambda d, m: (d / cache.MANIFEST_NAME).write_text(json.dumps(
        {**m, "files": {cache.ARTIFACTS_NAME: {"sha256": "x", "size": 1}}})), "64 hex digits"),
    (lambda d, m: (d / cache.MANIFEST_NAME).write_text(json.dumps({**m, "format": 99})), "format 99"),
    (lambda d, m: (d / cache.ARTIFACTS_NAME).write_bytes(b"mega-cache bytez"), "does not match the sha256"),
])
def test_tampered_cache_is_a_clear_error_and_nothing_is_loaded(tmp_path, loads, tamper, needle):
    cfg = AscendConfig(fusions=["rms_norm"], executor="inductor", compile="blocks")
    manifest = _write_cache(tmp_path, cache.expected_keys(cfg))
    tamper(tmp_path, manifest)
    model = tiny_flux_transformer(**LAYERS)
    with pytest.raises(ValueError, match=needle):
        diffusers_ascend.enable_ascend_compile(model, cfg, cache=str(tmp_path))
    assert loads == [] and not hasattr(model, "_ascend_state")  # nothing loaded, the model untouched


@pytest.mark.parametrize("member", ["../evil.so", "/abs/evil.so", "ab/notes.txt"])
def test_kernel_archive_with_unsafe_paths_is_refused(tmp_path, loads, member):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(member)
        info.size = 3
        tar.addfile(info, io.BytesIO(b"elf"))
    cfg = AscendConfig(fusions=["rms_norm"], executor="inductor", compile="blocks")
    _write_cache(tmp_path, cache.expected_keys(cfg), kernels=buf.getvalue())
    with pytest.raises(ValueError, match="only regular .so files"):
        diffusers_ascend.enable_ascend_compile(tiny_flux_transformer(**LAYERS), cfg, cache=str(tmp_path))
    assert loads == []


# -- Hub: offline cache, mocked uploads -----------------------------------------------------------------
def _fake_hub(root, repo_id, keys):
    snap = root / ("models--" + repo_id.replace("/", "--"))
    (snap / "refs").mkdir(parents=True)
    (snap / "refs" / "main").write_text(SHA)
    return _write_cache(snap / "snapshots" / SHA, keys)


def test_remote_artifacts_need_the_explicit_opt_in(tmp_path, loads, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    cfg = AscendConfig(fusions=["rms_norm"], executor="inductor", compile="blocks")
    _fake_hub(tmp_path, "org/warm", cache.expected_keys(cfg))
    model = tiny_flux_transformer(**LAYERS)
    with pytest.raises(ValueError, match="trust_remote_artifacts=True"):
        diffusers_ascend.enable_ascend_compile(model, cfg, cache="org/warm")
    assert loads == [] and not hasattr(model, "_ascend_state")
    assert main(["cache", "pull", "org/warm", str(tmp_path / "dst")]) == 1 and not (tmp_path / "dst").exists()

    diffusers_ascend.enable_ascend_compile(model, cfg, cache="org/warm", trust_remote_artifacts=True)
    assert loads == [b"mega-cache bytes"]
    assert main(["cache", "pull", "org/warm", str(tmp_path / "dst"), "--trust-remote-artifacts"]) == 0
    assert cache.read_manifest(str(tmp_path / "dst" / cache.MANIFEST_NAME))["config_hash"] == cfg.cache_key()


def test_cli_info_and_push(tmp_path, capsys):
    cfg = AscendConfig(executor="inductor")
    _write_cache(tmp_path, {**cache.expected_keys(cfg), "torch": "2.0.0"})
    assert main(["cache", "info", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["matches_here"] is False and info["mismatches"][0].startswith("torch version: saved '2.0.0'")
    with mock.patch("huggingface_hub.HfApi.create_repo") as create, \
            mock.patch("huggingface_hub.HfApi.create_commit") as commit:
        commit.return_value = "commit-info"
        assert main(["cache", "push", str(tmp_path), "me/warm"]) == 0
    create.assert_called_once_with("me/warm", repo_type="model", private=False, exist_ok=True)
    kw = commit.call_args.kwargs  # the manifest and its artifact in one commit
    assert kw["repo_id"] == "me/warm" and kw["commit_message"] == "Upload diffusers-ascend compile artifacts"
    assert sorted(op.path_in_repo for op in kw["operations"]) == sorted([cache.MANIFEST_NAME, cache.ARTIFACTS_NAME])


def test_torch_without_portable_cache_warns_and_compiles(tmp_path, monkeypatch):
    # torch 2.6 has no torch.compiler.save/load_cache_artifacts: the shim says None there.
    from diffusers_ascend.compilation import _compat

    cfg = AscendConfig(fusions=["rms_norm"], executor="inductor", compile="blocks")
    _write_cache(tmp_path, cache.expected_keys(cfg))
    monkeypatch.setattr(_compat, "cache_artifacts_api", lambda: None)
    model = tiny_flux_transformer(**LAYERS)
    with pytest.warns(UserWarning, match="cannot load portable compile caches"):
        diffusers_ascend.enable_ascend_compile(model, cfg, cache=str(tmp_path))
    assert hasattr(model, "_ascend_state")


def test_save_refuses_what_has_no_artifacts(tmp_path):
    model = tiny_flux_transformer(**LAYERS)
    with pytest.raises(ValueError, match="is not enabled"):
        diffusers_ascend.save_ascend_cache(model, tmp_path)
    diffusers_ascend.enable_ascend_compile(model, fusions=["rms_norm"], executor="eager")
    with pytest.raises(ValueError, match="executor='eager' produces no compiled artifact"):
        model.save_ascend_cache(tmp_path)
    diffusers_ascend.enable_ascend_compile(model, fusions=["rms_norm"], executor="inductor")
    with pytest.raises(ValueError, match="compiled no graph yet: call it once"):
        model.save_ascend_cache(tmp_path)
    assert os.listdir(tmp_path) == []
