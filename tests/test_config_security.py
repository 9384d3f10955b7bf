"""A loaded config is data: it never writes files, never sets local paths, and reaches process-wide
state only within documented bounds; every way a file can be malformed is one ValueError naming it.

Tampered inputs are real files: a saved tiny Flux pipeline whose ``transformer/config.json`` and
``model_index.json`` were edited, and a Hub repo in an offline huggingface_hub cache (the layout
``hf_hub_download`` reads; no network). Each test owns ``tmp_path`` and asserts that the tree
under it is unchanged after the tampered config was loaded and the pipeline run, with the working
directory set inside it so a relative ``../..`` would land there too.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from diffusers_ascend.config import (
    CONFIG_NAME,
    MAX_CONFIG_BYTES,
    MAX_LOADED_CAPTURED_GRAPHS,
    MAX_LOADED_RECOMPILE_LIMIT,
    AscendConfig,
    read_json_object,
)

FAST = dict(fusions=["rms_norm", "adaln"], executor="eager")


def _tree(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)


def _local_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "graph_log_dir" in str(w.message)]


@pytest.fixture
def dynamo_limit():
    """dynamo's recompile limit at 8 for the test, restored afterwards whatever happens; yields a
    reader of it (torch 2.6 names it ``cache_size_limit``)."""
    import gc

    import torch._dynamo.config as dc

    from diffusers_ascend.compilation import _compat

    gc.collect()  # models enabled by earlier tests and dropped in reference cycles hold the limit until collected
    with dc.patch(**{_compat._recompile_limit_name(): 8}):
        yield _compat.dynamo_recompile_limit


# ----------------------------------------------------------------------------- decoding
@pytest.mark.parametrize(
    "content,needle",
    [
        (b"{not json", "is not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"fusions": ' + b"[" * 20 + b'"rope"' + b"]" * 20 + b"}", "nested more than 8 levels"),
        (b'{"fusions": "\xff\xfe"}', "is not UTF-8 text (byte 0xff at offset 13)"),
        (b'{"max_captured_graphs": ' + b"9" * 5000 + b"}", "is not valid JSON (Exceeds the limit"),
        (b'{"max_captured_graphs": NaN}', "NaN is not a JSON number"),
        (b'{"recompile_limit": Infinity}', "Infinity is not a JSON number"),
        (b'"auto"', "holds a JSON string, expected"),
        (b"[1, 2]", "holds a JSON array, expected"),
        (b"null", "holds a JSON null, expected"),
        (b'{"fusions": ["rms_norm", "nope"]}', "unknown fusion(s) ['nope']"),
        (
            b'{"recompile_limit": true}',
            "recompile_limit must be an int",
        ),  # a TypeError in code, a ValueError from a file
        (b'{"compile": "' + b"x" * 100_000 + b'"}', "... (truncated)"),
    ],
    ids=[
        "syntax",
        "depth-parser",
        "depth",
        "encoding",
        "huge-int",
        "nan",
        "infinity",
        "string",
        "array",
        "null",
        "bad-fusion",
        "wrong-type",
        "huge-string",
    ],
)
def test_every_decode_problem_is_one_value_error_naming_the_file(tmp_path, content, needle):
    path = tmp_path / CONFIG_NAME
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        AscendConfig.from_pretrained(tmp_path)
    message = str(info.value)
    assert type(info.value) is ValueError and str(path) in message and needle in message
    assert len(message) < 1000  # bounded, even for a 100 kB value


def test_files_over_the_size_cap_are_refused_unread(tmp_path):
    path = tmp_path / CONFIG_NAME
    path.write_bytes(b"{" + b" " * MAX_CONFIG_BYTES + b"}")  # valid JSON, but no config is this large
    with pytest.raises(ValueError, match=rf"{CONFIG_NAME} is larger than {MAX_CONFIG_BYTES} bytes"):
        AscendConfig.from_json_file(path)
    path.write_bytes(b"{" + b" " * (MAX_CONFIG_BYTES - 2) + b"}")
    assert read_json_object(str(path)) == {}


def test_non_mapping_from_dict_with_a_source_is_a_value_error():
    for bad in (["rms_norm"], "rms_norm", 3):
        with pytest.raises(
            ValueError, match=r"invalid ascend config in the model: it holds a JSON (array|string|number)"
        ):
            AscendConfig.from_dict(bad, source="the model")
    with pytest.raises(TypeError, match="from_dict expects a dict"):  # code keeps its TypeError
        AscendConfig.from_dict(["rms_norm"])


# ----------------------------------------------------------------------------- local fields
def test_graph_log_dir_is_never_written(tmp_path):
    from unittest import mock

    cfg = AscendConfig(graph_log_dir=tmp_path / "my-logs")
    assert cfg.graph_log_dir == str(tmp_path / "my-logs")  # code sets it
    assert cfg.to_dict()["graph_log_dir"] is None and str(tmp_path) not in cfg.to_json_string()
    path = cfg.save_pretrained(tmp_path / "saved")
    assert str(tmp_path / "my-logs") not in open(path).read()
    with mock.patch("huggingface_hub.HfApi.create_repo"), mock.patch("huggingface_hub.HfApi.upload_file") as upload:
        cfg.push_to_hub("me/cfg")
    assert json.loads(upload.call_args.kwargs["path_or_fileobj"])["graph_log_dir"] is None


def test_graph_log_dir_from_data_is_dropped_with_one_warning():
    d = AscendConfig(fusions=["rope"]).to_dict()
    d["graph_log_dir"] = "../../somewhere"
    with pytest.warns(UserWarning) as record:
        cfg = AscendConfig.from_dict(d, source="x.json")
    assert cfg.graph_log_dir is None and cfg.fusions == ("rope",)
    (message,) = [str(w.message) for w in record]
    assert "ignoring graph_log_dir='../../somewhere' from x.json" in message and "enable_ascend_compile(" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AscendConfig.from_dict(AscendConfig().to_dict())  # null: nothing to warn about
    # Code keeps full control: an override next to a loaded config sets it.
    assert AscendConfig.coerce(d, graph_log_dir="/tmp/x").graph_log_dir == "/tmp/x"


def test_loaded_recompile_limit_is_capped():
    with pytest.warns(
        UserWarning, match=rf"recompile_limit=<int of 100 bits> from a.json is above the {MAX_LOADED_RECOMPILE_LIMIT}"
    ):
        cfg = AscendConfig.from_dict({"recompile_limit": 2**99}, source="a.json")
    assert cfg.recompile_limit == MAX_LOADED_RECOMPILE_LIMIT == 64
    assert AscendConfig.from_dict({"recompile_limit": 64}).recompile_limit == 64
    assert AscendConfig(recompile_limit=10**6).recompile_limit == 10**6  # code may ask for more


def test_loaded_max_captured_graphs_is_capped(tmp_path):
    # A tampered config must not make graph capture keep device graphs without bound.
    path = tmp_path / "ascend_config.json"
    path.write_text(json.dumps({"version": 1, "graph_capture": "graph_only", "max_captured_graphs": 10**9}))
    with pytest.warns(
        UserWarning,
        match=rf"max_captured_graphs=1000000000 from .*ascend_config.json is above the "
        rf"{MAX_LOADED_CAPTURED_GRAPHS} a loaded config may set \(each one holds device memory\)",
    ):
        cfg = AscendConfig.from_json_file(path)
    assert cfg.max_captured_graphs == MAX_LOADED_CAPTURED_GRAPHS == 32
    assert AscendConfig.from_dict({"max_captured_graphs": 32}).max_captured_graphs == 32
    assert AscendConfig(max_captured_graphs=100).max_captured_graphs == 100  # code may ask for more
    with pytest.warns(UserWarning, match="max_captured_graphs=100"):  # loaded: capped, then code's override
        assert AscendConfig.coerce({"max_captured_graphs": 100}, max_captured_graphs=100).max_captured_graphs == 100


# ----------------------------------------------------------------------------- tampered inputs
def _saved_pipeline(tmp_path, **overrides):
    from diffusers_ascend.tiny import tiny_flux_pipeline

    pipe = tiny_flux_pipeline()
    pipe.enable_ascend_compile(**FAST, graph_log_dir=tmp_path / "own-logs", **overrides)
    saved = tmp_path / "saved"
    pipe.save_pretrained(saved)
    # Its recompile-limit hold goes now, not whenever the cycle collector frees the pipeline: the
    # tests below check the limit the loaded pipeline holds and restores.
    pipe.disable_ascend_compile()
    return saved


def _load(saved):
    from diffusers import FluxPipeline

    return FluxPipeline.from_pretrained(saved, text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)


def _run(pipe):
    from diffusers_ascend.tiny import flux_pipeline_inputs

    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(**flux_pipeline_inputs()).images


def test_saved_pipeline_does_not_carry_the_local_path(tmp_path):
    saved = _saved_pipeline(tmp_path)
    for name in ("model_index.json", "transformer/config.json"):
        text = (saved / name).read_text()
        assert '"_ascend_config"' in text and str(tmp_path / "own-logs") not in text, name


@pytest.mark.parametrize("log_dir", ["../../evil", "ABSOLUTE"])
def test_tampered_saved_folder_writes_nothing(tmp_path, monkeypatch, dynamo_limit, log_dir):
    torch._dynamo.reset()
    saved = _saved_pipeline(tmp_path)
    log_dir = str(tmp_path / "abs-evil") if log_dir == "ABSOLUTE" else log_dir
    for name in ("model_index.json", "transformer/config.json"):
        d = json.loads((saved / name).read_text())
        d["_ascend_config"]["graph_log_dir"] = log_dir
        d["_ascend_config"]["recompile_limit"] = 10**9
        (saved / name).write_text(json.dumps(d))
    cwd = tmp_path / "cwd" / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)  # "../../evil" would be tmp_path/cwd/evil
    before = _tree(tmp_path)
    with pytest.warns(UserWarning) as record:
        pipe = _load(saved)
    (message,) = _local_warnings(record)  # one warning, naming the model it came from
    # Values are echoed cut to 80 characters (a long tmp path is cut): compare the start.
    assert f"graph_log_dir={log_dir!r}"[:60] in message and "FluxTransformer2DModel (transformer)" in message
    state = pipe.transformer._ascend_state
    assert state.config.graph_log_dir is None and state.config.recompile_limit == 64
    assert dynamo_limit() == 64  # bounded, not 10**9
    _run(pipe)
    assert pipe.ascend_report().graphs  # the blocks did compile through the backend
    assert _tree(tmp_path) == before  # no directory, no graph file, anywhere under tmp_path
    pipe.disable_ascend_compile()
    assert dynamo_limit() == 8  # restored on disable


@pytest.mark.parametrize("log_dir", ["../../evil", "ABSOLUTE"])
def test_tampered_hub_config_writes_nothing(tmp_path, monkeypatch, dynamo_limit, log_dir):
    import huggingface_hub.constants

    from diffusers_ascend.tiny import tiny_flux_pipeline
    from tests.test_hub import fake_hub_cache

    torch._dynamo.reset()
    hub = tmp_path / "hub"
    fake_hub_cache(hub, "mallory/flux-ascend", AscendConfig(**FAST))
    (snapshot,) = hub.glob("models--mallory--flux-ascend/snapshots/*")
    d = json.loads((snapshot / CONFIG_NAME).read_text())
    d.update(graph_log_dir=str(tmp_path / "abs-evil") if log_dir == "ABSOLUTE" else log_dir, recompile_limit=10**9)
    (snapshot / CONFIG_NAME).write_text(json.dumps(d))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    cwd = tmp_path / "cwd" / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    pipe = tiny_flux_pipeline()
    before = _tree(tmp_path)
    with pytest.warns(UserWarning) as record:
        pipe.enable_ascend_compile("mallory/flux-ascend")
    (message,) = _local_warnings(record)
    assert str(snapshot / CONFIG_NAME) in message
    assert dynamo_limit() == 64
    _run(pipe)
    assert pipe.ascend_report().graphs
    assert _tree(tmp_path) == before
    pipe.disable_ascend_compile()
    assert dynamo_limit() == 8


def test_graph_log_dir_from_code_still_logs(tmp_path):
    from diffusers_ascend.tiny import tiny_flux_pipeline

    torch._dynamo.reset()
    pipe = tiny_flux_pipeline().enable_ascend_compile(**FAST, graph_log_dir=tmp_path / "logs")
    _run(pipe)
    assert any(p.name.endswith(".input.py") for p in (tmp_path / "logs").iterdir())


@pytest.mark.parametrize("value", [["rms_norm"], "rms_norm", 7, {"compile": "everything"}])
def test_wrong_typed_saved_ascend_config_is_a_clear_error(tmp_path, value):
    from diffusers import FluxTransformer2DModel

    from diffusers_ascend.tiny import tiny_flux_transformer

    model = tiny_flux_transformer()
    model.register_to_config(_ascend_config=value)
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError) as info:
        FluxTransformer2DModel.from_pretrained(tmp_path / "m")
    message = str(info.value)
    assert "invalid ascend config in `_ascend_config` of the FluxTransformer2DModel loaded from" in message
    assert str(tmp_path / "m") in message and "ascend_config=False" in message
    assert "dictionary update sequence" not in message
    loaded = FluxTransformer2DModel.from_pretrained(tmp_path / "m", ascend_config=False)  # the way out it names
    assert getattr(loaded, "_ascend_state", None) is None


def test_wrong_typed_ascend_config_in_a_saved_pipeline(tmp_path):
    from diffusers_ascend.tiny import tiny_flux_pipeline

    pipe = tiny_flux_pipeline().enable_ascend_compile(fusions=["rms_norm"], compile="none")
    saved = tmp_path / "saved"
    pipe.save_pretrained(saved)
    index = json.loads((saved / "model_index.json").read_text())
    index["_ascend_config"] = "garbage"  # diffusers does not restore it: never read, never fatal
    (saved / "model_index.json").write_text(json.dumps(index))
    assert _load(saved).transformer._ascend_state.config.fusions == ("rms_norm",)
    transformer = json.loads((saved / "transformer" / "config.json").read_text())
    transformer["_ascend_config"] = {"fusions": ["rms_norm", "ropee"]}
    (saved / "transformer" / "config.json").write_text(json.dumps(transformer))
    with pytest.raises(ValueError) as info:
        _load(saved)
    message = str(info.value)
    assert message.startswith("invalid ascend config in `_ascend_config` of the FluxTransformer2DModel (transformer)")
    assert "unknown fusion(s) ['ropee']" in message and "Did you mean 'rope'? Load without it" in message
