"""The self-check verdict cache (`passes/verdict.py`, issue 36): a pass recorded on this machine
stands in for the self-check only for the same torch build and pattern code."""

import json
import os

import pytest
import torch

from diffusers_ascend.compilation import _compat
from diffusers_ascend.compilation.passes import base, get_pass_class, verdict
from diffusers_ascend.compilation.passes.manager import FusionPassManager

FUSIONS = ["rms_norm", "mul_add"]


@pytest.fixture
def verdicts(tmp_path, monkeypatch):
    monkeypatch.setenv(verdict.ENV, str(tmp_path / "verdicts"))
    return tmp_path / "verdicts"


@pytest.fixture
def counted(monkeypatch):
    """How often the self-check itself runs."""
    calls = []
    original = FusionPassManager.verify

    def verify(self):
        calls.append(self.fusions)
        original(self)

    monkeypatch.setattr(FusionPassManager, "verify", verify)
    return calls


def test_a_recorded_pass_stands_in_for_the_self_check(verdicts, counted):
    assert FusionPassManager(FUSIONS).ensure_verified() is True
    (path,) = verdicts.glob("*.json")
    assert json.loads(path.read_text())["torch"] == torch.__version__
    assert FusionPassManager(FUSIONS).ensure_verified() is False  # another process on this machine
    assert len(counted) == 1
    assert FusionPassManager(["rms_norm"]).ensure_verified() is True  # another fusion set: its own verdict
    assert len(counted) == 2


@pytest.mark.parametrize("change", ["pattern source", "torch version", "torch build", "op definitions"])
def test_any_change_of_torch_or_pattern_code_checks_again(verdicts, counted, monkeypatch, change):
    assert FusionPassManager(FUSIONS).ensure_verified() is True
    if change == "pattern source":
        cls = get_pass_class("rms_norm")
        real = cls.source_hash()
        monkeypatch.setattr(cls, "source_hash", classmethod(lambda c: real + "edited"))
    elif change == "torch version":
        monkeypatch.setattr(torch, "__version__", torch.__version__ + ".post1")
    elif change == "torch build":
        monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    else:
        import ascend_kernels.ops.rms_norm as op_module

        real_source = verdict.inspect.getsource

        def edited(obj):
            return real_source(obj) + ("# edited" if obj is op_module else "")

        monkeypatch.setattr(verdict.inspect, "getsource", edited)
    assert FusionPassManager(FUSIONS).ensure_verified() is True
    assert len(counted) == 2


@pytest.fixture
def fresh_registration():
    base._registered_impl.cache_clear()
    base._verified_impl.cache_clear()
    yield
    base._registered_impl.cache_clear()
    base._verified_impl.cache_clear()


def test_a_verdict_never_hides_a_torch_that_breaks_a_pattern(verdicts, monkeypatch, fresh_registration):
    assert FusionPassManager(["adaln"]).ensure_verified() is True
    # Another torch build whose matcher accepts the registration but never fires.
    monkeypatch.setattr(torch.version, "git_version", "f" * 40)
    monkeypatch.setattr(_compat, "register_replacement", lambda *a, **k: None)
    base._registered_impl.cache_clear()
    base._verified_impl.cache_clear()
    with pytest.raises(_compat.TorchCompatError, match=r"replaced its own form 0 times"):
        FusionPassManager(["adaln"]).ensure_verified()
    assert len(list(verdicts.glob("*.json"))) == 1  # the failure recorded no verdict (search graphs live in patterns/)


def test_a_verdict_file_is_read_as_data_and_must_name_its_key(verdicts, counted):
    manager = FusionPassManager(FUSIONS)
    key = verdict.verdict_key(manager, True)
    verdicts.mkdir()
    for content in (
        "not json",
        json.dumps({"key": "0" * 64, "torch": torch.__version__}),
        json.dumps({"key": key, "torch": "2.0.0"}),
        json.dumps([key]),
    ):
        (verdicts / f"{key}.json").write_text(content)
        assert manager.ensure_verified() is True
        os.unlink(verdicts / f"{key}.json")
    assert len(counted) == 4


def test_the_cache_can_be_off_or_unwritable(tmp_path, monkeypatch, counted):
    monkeypatch.setenv(verdict.ENV, "")
    assert verdict.verdict_dir() is None
    assert FusionPassManager(FUSIONS).ensure_verified() is True
    assert FusionPassManager(FUSIONS).ensure_verified() is True
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(verdict.ENV, str(blocker / "verdicts"))  # under a file: cannot be created
    assert FusionPassManager(FUSIONS).ensure_verified() is True
    assert FusionPassManager(FUSIONS).ensure_verified() is True
    assert len(counted) == 4
    monkeypatch.delenv(verdict.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert verdict.verdict_dir() == str(tmp_path / "xdg" / "diffusers_ascend" / "verdicts")
