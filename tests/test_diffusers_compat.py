"""The diffusers compatibility layer: supported range, every private name looked up by feature, and a
diffusers that moved one refused at enable time with our error (not diffusers' ImportError, and
before any model is changed)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import warnings

import diffusers
import pytest
from diffusers.models import attention_dispatch, modeling_utils
from diffusers.models.transformers import transformer_flux

import diffusers_ascend
from diffusers_ascend import _diffusers_compat as dc
from diffusers_ascend._diffusers_compat import DiffusersCompatError
from diffusers_ascend.errors import AscendWarning
from diffusers_ascend.tiny import tiny_flux_transformer

REPO = pathlib.Path(__file__).resolve().parents[1]
RANGE = r"Supported: diffusers 0\.36 to 0\.42\.x\."


def test_error_is_public():
    assert diffusers_ascend.DiffusersCompatError is DiffusersCompatError and issubclass(
        DiffusersCompatError, RuntimeError
    )


def test_floor_is_stated_once_pyproject_agrees():
    pin = re.search(r'"diffusers>=(\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text())
    assert pin is not None and (int(pin.group(1)), int(pin.group(2))) == dc.DIFFUSERS_FLOOR


def test_every_private_name_resolves_on_this_diffusers():
    dc.check_diffusers()
    for what in dc.PRIVATE_NAMES:
        dc.require(what)  # raises DiffusersCompatError where a name is missing
    assert dc.support_status()[0] == "supported"  # the release this suite runs is inside the range


def test_import_stays_light():
    code = "import sys, diffusers_ascend; print(sorted(m for m in ('diffusers', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_enabling_a_model_does_not_import_the_pipelines():
    # No pipeline can exist before `diffusers.pipelines` is imported; the check must not import it.
    code = (
        "import sys, diffusers_ascend\n"
        "from diffusers_ascend.tiny import tiny_flux_transformer\n"
        "m = tiny_flux_transformer()\n"
        "diffusers_ascend.enable_ascend_compile(m, fusions=['rms_norm'], compile='none')\n"
        "print(sorted(n for n in sys.modules if n.startswith('diffusers.pipelines')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_moved_pipeline_base_is_refused_once_pipelines_are_imported(monkeypatch):
    from diffusers.pipelines import pipeline_utils

    monkeypatch.delattr(pipeline_utils, "DiffusionPipeline")
    with pytest.raises(DiffusersCompatError, match=r"pipeline_utils\.DiffusionPipeline` \(pipeline base class"):
        dc.check_diffusers()


def _untouched(model) -> dict:
    return {
        "state": "_ascend_state" in model.__dict__,
        "config": "_ascend_config" in model.config,
        "processors": sorted({type(m.processor).__name__ for m in model.modules() if hasattr(m, "processor")}),
        "backends": {dc.attention_backend(m.processor) for m in model.modules() if hasattr(m, "processor")},
    }


@pytest.mark.parametrize(
    "owner, name, shown",
    [
        (
            transformer_flux,
            "_get_qkv_projections",
            r"diffusers\.models\.transformers\.transformer_flux\._get_qkv_projections",
        ),
        (
            attention_dispatch,
            "_AttentionBackendRegistry",
            r"diffusers\.models\.attention_dispatch\._AttentionBackendRegistry",
        ),
        (
            modeling_utils.ModelMixin,
            "_repeated_blocks",
            r"diffusers\.models\.modeling_utils\.ModelMixin\._repeated_blocks",
        ),
    ],
    ids=["function", "class", "class-attribute"],
)
def test_a_diffusers_without_a_private_name_is_refused_at_enable(monkeypatch, owner, name, shown):
    model = tiny_flux_transformer()
    before = _untouched(model)
    monkeypatch.delattr(owner, name)
    with pytest.raises(
        DiffusersCompatError,
        match=(
            rf"^diffusers-ascend: cannot run on diffusers {re.escape(diffusers.__version__)}: `{shown}` \(.*"
            r"is missing or moved .*" + RANGE
        ),
    ):
        diffusers_ascend.enable_ascend_compile(model, fusions=["rms_norm"], compile="none")
    assert _untouched(model) == before  # refused before the model was changed


def test_a_moved_name_never_breaks_loading_without_enabling(monkeypatch):
    # from_pretrained looks for saved settings through the adapters: only enable refuses this diffusers.
    from diffusers_ascend.adapters import adapter_for

    monkeypatch.delattr(transformer_flux, "_get_qkv_projections")
    monkeypatch.delitem(sys.modules, "diffusers_ascend.adapters.flux", raising=False)  # imported anew: its lookup fails
    model = tiny_flux_transformer()
    assert adapter_for(model) is not None
    with pytest.raises(DiffusersCompatError, match="_get_qkv_projections"):
        diffusers_ascend.enable_ascend_compile(model, compile="none")


def test_the_check_names_every_missing_name_at_once(monkeypatch):
    monkeypatch.delattr(transformer_flux, "_get_qkv_projections")
    monkeypatch.delattr(attention_dispatch, "_check_shape")
    with pytest.raises(DiffusersCompatError) as e:
        dc.check_diffusers()
    assert "transformer_flux._get_qkv_projections" in str(e.value) and "attention_dispatch._check_shape" in str(e.value)


@pytest.mark.parametrize(
    "owner, name, stand_in, shown",
    [
        (
            attention_dispatch._AttentionBackendRegistry,
            "register",
            classmethod(lambda cls, backend, constraints=None: None),
            r"the `supports_context_parallel` argument of `_AttentionBackendRegistry\.register`",
        ),
        (
            attention_dispatch,
            "_templated_context_parallel_attention",
            lambda query, key, value, forward_op, backward_op, parallel_config=None: None,
            r"the `_parallel_config` argument of `_templated_context_parallel_attention`",
        ),
    ],
    ids=["register", "context-parallel"],
)
def test_a_changed_signature_is_refused(monkeypatch, owner, name, stand_in, shown):
    monkeypatch.setattr(owner, name, stand_in)
    with pytest.raises(DiffusersCompatError, match=shown + r".*" + RANGE):
        dc.check_diffusers()


def test_too_old_diffusers_is_refused_with_the_range(monkeypatch):
    monkeypatch.setattr(diffusers, "__version__", "0.35.2")
    model = tiny_flux_transformer()
    with pytest.raises(
        DiffusersCompatError,
        match=r"diffusers 0\.35\.2 is older than the supported range "
        r"\(diffusers 0\.36 to 0\.42\.x\): upgrade diffusers\.",
    ):
        diffusers_ascend.enable_ascend_compile(model, compile="none")
    assert "_ascend_state" not in model.__dict__


def test_newer_untested_diffusers_warns_once(monkeypatch):
    monkeypatch.setattr(diffusers, "__version__", "0.99.0")
    dc._warn_untested.cache_clear()
    try:
        with pytest.warns(AscendWarning, match=r"diffusers 0\.99\.0 is newer than the newest release verified"):
            dc.check_diffusers()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dc.check_diffusers()  # once, not per enable
    finally:
        dc._warn_untested.cache_clear()


def test_a_config_without_its_private_storage_raises_ours():
    class NotAConfig:
        pass

    with pytest.raises(DiffusersCompatError, match=r"`NotAConfig\._internal_dict` \(the config's storage\) is missing"):
        dc.set_config_entry(NotAConfig(), "_ascend_config", {})


def test_set_config_entry_writes_and_removes_a_key():
    model = tiny_flux_transformer()
    dc.set_config_entry(model, "_ascend_config", {"fusions": "all"})
    assert model.config["_ascend_config"] == {"fusions": "all"}
    dc.set_config_entry(model, "_ascend_config", None)
    assert "_ascend_config" not in model.config


def test_env_reports_the_diffusers_range_and_status(monkeypatch, capsys):
    from diffusers_ascend import cli

    info = cli.env_info()
    assert info["diffusers_range"] == "0.36 to 0.42.x" and info["diffusers_status"] == "supported"
    monkeypatch.setattr(cli, "_version", lambda dist: "0.35.0" if dist == "diffusers" else None)
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"diffusers_status\s+too old", out)
    assert "warning: diffusers 0.35.0 is older than the supported range (diffusers 0.36 to 0.42.x)" in out
