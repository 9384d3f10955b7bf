"""Hub I/O of AscendConfig without any network.

Downloads: a fake Hub cache in the layout huggingface_hub expects
(``models--org--name/refs/main`` + ``snapshots/<sha>/ascend_config.json``) read offline, both
in a subprocess started with ``HF_HUB_OFFLINE=1``/``HF_HUB_CACHE`` and in-process with
``cache_dir``. Uploads: ``HfApi`` methods patched with ``unittest.mock``; that the right calls
happen with valid JSON is the honest level reachable offline (no real Hub round trip is tested).
"""

import json
import os
import subprocess
import sys
import textwrap
from unittest import mock

import pytest

from diffusers_ascend.config import CONFIG_NAME, AscendConfig
from diffusers_ascend.hub import AscendConfigNotFoundError

SHA = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(root, repo_id, cfg, revision="main", subfolder=None):
    repo_dir = root / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / revision).write_text(SHA)
    snap = repo_dir / "snapshots" / SHA / (subfolder or "")
    snap.mkdir(parents=True, exist_ok=True)
    (snap / CONFIG_NAME).write_text(cfg.to_json_string())
    return root


@pytest.fixture
def offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_from_pretrained_reads_hub_cache_offline_subprocess(tmp_path):
    cfg = AscendConfig(fusions=["rope", "adaln"], compile="model")
    fake_hub_cache(tmp_path / "hub", "org/name", cfg)
    code = textwrap.dedent(
        """
        from diffusers_ascend.config import AscendConfig
        from diffusers_ascend.hub import AscendConfigNotFoundError
        print(AscendConfig.from_pretrained("org/name").to_json_string().replace("\\n", " "))
        try:
            AscendConfig.from_pretrained("org/missing")
        except AscendConfigNotFoundError as e:
            print("ERR", e)
        """
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HOME": str(tmp_path / "home"),
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    first, err = out.stdout.strip().split("\n", 1)
    assert AscendConfig.from_dict(json.loads(first)) == cfg
    assert err.startswith("ERR could not find ascend_config.json") and "org/missing/ascend_config.json" in err
    assert "offline" in err


def test_from_pretrained_cache_dir_revision_subfolder(tmp_path, offline, monkeypatch):
    cfg = AscendConfig(fusions="all")
    fake_hub_cache(tmp_path, "org/name", cfg)
    assert AscendConfig.from_pretrained("org/name", cache_dir=tmp_path) == cfg
    fake_hub_cache(tmp_path, "org/pipe", cfg, revision="v1", subfolder="transformer")
    assert AscendConfig.from_pretrained("org/pipe", cache_dir=tmp_path, revision="v1", subfolder="transformer") == cfg
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))  # coerce uses the default cache
    assert AscendConfig.coerce("org/name", on_error="raise") == cfg.replace(on_error="raise")
    with pytest.raises(AscendConfigNotFoundError, match=r"org/pipe/transformer/ascend_config.json@v2.*offline"):
        AscendConfig.from_pretrained("org/pipe", cache_dir=tmp_path, revision="v2", subfolder="transformer")


def test_unresolvable_ids_give_one_clear_error(tmp_path, offline):
    for bad, needle in (
        ("org/none", "is not a local directory or file"),
        ("not a valid//repo id", "nor a valid Hub repo id"),
        (str(tmp_path / "no-such-dir"), "nor a valid Hub repo id"),
    ):
        with pytest.raises(AscendConfigNotFoundError, match=needle) as info:
            AscendConfig.from_pretrained(bad, cache_dir=tmp_path)
        assert isinstance(info.value, OSError) and repr(bad)[1:-1] in str(info.value)
    with pytest.raises(AscendConfigNotFoundError, match="neither a directory nor a file"):
        AscendConfig.from_pretrained(tmp_path / "missing")  # PathLike: never treated as a repo id


def test_local_files_only_without_offline_env(tmp_path):
    cfg = AscendConfig(compile="model")
    fake_hub_cache(tmp_path, "org/name", cfg)
    assert AscendConfig.from_pretrained("org/name", cache_dir=tmp_path, local_files_only=True) == cfg
    with pytest.raises(AscendConfigNotFoundError, match="offline"):
        AscendConfig.from_pretrained("org/other", cache_dir=tmp_path, local_files_only=True)


def test_push_to_hub_calls(tmp_path):
    cfg = AscendConfig(fusions=["rms_norm"], on_error="raise")
    with (
        mock.patch("huggingface_hub.HfApi.create_repo") as create,
        mock.patch("huggingface_hub.HfApi.upload_file") as upload,
    ):
        upload.return_value = "commit-info"
        assert cfg.push_to_hub("me/cfg", private=True, revision="dev", create_pr=True) == "commit-info"
    create.assert_called_once_with("me/cfg", repo_type="model", private=True, exist_ok=True)
    kw = upload.call_args.kwargs
    assert (kw["repo_id"], kw["path_in_repo"], kw["revision"], kw["create_pr"]) == ("me/cfg", CONFIG_NAME, "dev", True)
    assert kw["commit_message"] == "Upload ascend_config.json"
    assert AscendConfig.from_dict(json.loads(kw["path_or_fileobj"].decode())) == cfg


def test_save_pretrained_push_to_hub(tmp_path):
    cfg = AscendConfig()
    with (
        mock.patch("huggingface_hub.HfApi.create_repo") as create,
        mock.patch("huggingface_hub.HfApi.upload_file") as upload,
    ):
        path = cfg.save_pretrained(tmp_path, push_to_hub=True, repo_id="me/cfg", commit_message="hi")
        with pytest.raises(ValueError, match="repo_id"):
            cfg.save_pretrained(tmp_path / "untouched", push_to_hub=True)
        assert not (tmp_path / "untouched").exists()
    assert create.call_count == 1 and upload.call_args.kwargs["commit_message"] == "hi"
    with open(path, "rb") as fh:
        assert fh.read() == upload.call_args.kwargs["path_or_fileobj"]


@pytest.mark.parametrize(
    "path",
    [
        "./my-model",
        "../models/flux",
        "/data/models/flux",
        "models/flux/transformer",
        "models\\flux",
        ".hidden",
        "org/..",
        "~/flux",
        "org/name.git",
    ],
)
def test_a_path_that_cannot_be_a_repo_id_fails_at_once(tmp_path, monkeypatch, path):
    # A mistyped path cost 25 s of Hub retries before its error: now no download is even tried.
    import time

    import huggingface_hub

    from diffusers_ascend import warm_start

    def no_download(*args, **kwargs):
        pytest.fail(f"tried the Hub for {path!r}")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_download)
    monkeypatch.chdir(tmp_path)  # none of these paths exists here
    for load in (AscendConfig.from_pretrained, warm_start.cache_info):
        start = time.perf_counter()
        with pytest.raises(AscendConfigNotFoundError) as info:
            load(path)
        assert time.perf_counter() - start < 1.0
        message = str(info.value)
        assert (
            repr(path) in message and "neither an existing local directory or file nor a valid Hub repo id" in message
        )


def test_a_valid_repo_id_still_reaches_the_hub(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def fake_download(repo_id, filename, **kwargs):
        calls.append(repo_id)
        raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.chdir(tmp_path)
    for repo_id in ("org/name", "name", "Org-1/my_model.v2"):
        with pytest.raises(AscendConfigNotFoundError, match="downloading .* from the Hub failed"):
            AscendConfig.from_pretrained(repo_id)
    assert calls == ["org/name", "name", "Org-1/my_model.v2"]
    # A repo id whose first part is a folder here is most likely a mistyped path: the error says so.
    (tmp_path / "models").mkdir()
    with pytest.raises(
        AscendConfigNotFoundError,
        match=r"'models' is a local folder: if you meant a path in it, "
        r"'models/flux' does not exist",
    ):
        AscendConfig.from_pretrained("models/flux")
    with pytest.raises(AscendConfigNotFoundError) as info:
        AscendConfig.from_pretrained("org/name")
    assert "local folder" not in str(info.value)
