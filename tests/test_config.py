"""AscendConfig: validation, resolution per platform, JSON round trips, identity, coerce."""

import copy
import json
import os
import subprocess
import sys

import pytest

from diffusers_ascend.config import CONFIG_NAME, CONFIG_VERSION, FUSION_TO_OP, FUSIONS, AscendConfig
from diffusers_ascend.fusions import default_fusions
from diffusers_ascend.platform import override_platform

# What fusions="all" means: the table's rows that keep numerics (read from it: a new row needs no edit here).
NON_NUMERIC = default_fusions()


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(fusions=5), TypeError, r"fusions.*int 5.*'rms_norm'"),
        (dict(fusions="everything"), ValueError, r"'everything'.*'auto', 'all', 'none'"),
        (dict(fusions=["rms_nrom"]), ValueError, r"\['rms_nrom'\].*valid.*'mul_add'.*Did you mean 'rms_norm'"),
        (dict(fusions=["rope", 3]), ValueError, r"\[3\].*valid"),
        (dict(fusions=["gelu_tanh", "fast_gelu"]), ValueError, r"'gelu_tanh' and 'fast_gelu'"),
        (dict(fullgraph="yes"), TypeError, r"fullgraph.*True or False.*'yes'"),
        (dict(safe_output=1), TypeError, r"safe_output"),
        (dict(max_captured_graphs=0), ValueError, r"max_captured_graphs=0.*>= 1"),
        (dict(max_captured_graphs=True), TypeError, r"max_captured_graphs.*int.*True"),
        (dict(max_captured_graphs=2.0), TypeError, r"max_captured_graphs.*2.0"),
        (dict(recompile_limit=-1), ValueError, r"recompile_limit=-1.*>= 1 or None"),
        (dict(compile="blocs"), ValueError, r"compile='blocs'.*'blocks', 'model', 'none'.*Did you mean 'blocks'"),
        (dict(executor="inductr"), ValueError, r"executor='inductr'.*'auto', 'eager', 'inductor'"),
        (dict(mode="fast"), ValueError, r"mode='fast'.*'max-autotune'"),
        (dict(dynamic="yes"), ValueError, r"dynamic='yes'.*None, True, False"),
        (dict(dynamic=1), ValueError, r"dynamic=1"),
        (dict(graph_capture="npugraph"), ValueError, r"graph_capture='npugraph'.*'graph_only'"),
        (dict(on_error="ignore"), ValueError, r"on_error='ignore'.*'fallback', 'raise'"),
        (dict(attention="flsh"), ValueError, r"attention='flsh'.*'_native_npu'.*Did you mean 'flash'"),
        (dict(attention=3), TypeError, r"attention"),
        (dict(graph_log_dir=3), TypeError, r"graph_log_dir"),
        (dict(compile="none", graph_capture="graph_only"), ValueError, r"compile='none'.*graph_capture"),
        (dict(compile="none", freezing=True), ValueError, r"compile='none'.*freezing"),
        (dict(compile="none", executor="inductor"), ValueError, r"compile='none'.*executor='inductor'"),
        (dict(compile="none", fullgraph=True, mode="max-autotune"), ValueError, r"mode='max-autotune'.*fullgraph"),
        (dict(executor="eager", mode="max-autotune"), ValueError, r"Inductor setting.*executor='eager'"),
    ],
)
def test_invalid_values_name_value_and_choices(kwargs, exc, pattern):
    before = copy.deepcopy(kwargs)
    with pytest.raises(exc, match=pattern):
        AscendConfig(**kwargs)
    assert kwargs == before


# Each field's rule lives once, in config.py: code that takes one field alone (GraphCaptureManager)
# asks `check_field`, which says what the config says.
ONE_FIELD = [
    (k, e)
    for k, e in [
        (dict(fusions=5), TypeError),
        (dict(fusions=["rms_nrom"]), ValueError),
        (dict(attention=3), TypeError),
        (dict(compile="blocs"), ValueError),
        (dict(mode="fast"), ValueError),
        (dict(dynamic=1), ValueError),
        (dict(fullgraph="yes"), TypeError),
        (dict(recompile_limit=-1), ValueError),
        (dict(graph_capture="npugraph"), ValueError),
        (dict(safe_output=1), TypeError),
        (dict(freezing=None), TypeError),
        (dict(max_captured_graphs=2.0), TypeError),
        (dict(graph_log_dir=3), TypeError),
        (dict(on_error="ignore"), ValueError),
        (dict(executor="inductr"), ValueError),
    ]
]


def test_check_field_is_the_config_rule_of_every_field():
    from dataclasses import fields

    from diffusers_ascend.config import check_field

    assert {next(iter(k)) for k, _ in ONE_FIELD} == {f.name for f in fields(AscendConfig)}
    for kwargs, exc in ONE_FIELD:
        ((name, value),) = kwargs.items()
        with pytest.raises(exc) as by_field:
            check_field(name, value)
        with pytest.raises(exc) as by_config:
            AscendConfig(**kwargs)
        assert str(by_field.value) == str(by_config.value)
    assert check_field("fusions", "rope,rms_norm") == ("rms_norm", "rope")  # normalized as the config stores it
    with pytest.raises(TypeError, match=r"unknown AscendConfig field\(s\) \['turbo'\] in check_field\(\); valid:"):
        check_field("turbo", True)


def test_checks_beyond_the_fields_are_config_methods():
    # A backend's and enable's rules: the config stays valid data (saved, used elsewhere), these raise.
    only = AscendConfig(graph_capture="graph_only", fusions=["rms_norm"])
    with pytest.raises(ValueError, match=r"'cpu' has none"):
        only.check_backend("cpu")
    with pytest.raises(ValueError, match=r"graph_only.*without fusion passes.*\['rms_norm'\]"):
        only.check_backend("cuda")
    with pytest.raises(ValueError, match=r"reduce-overhead.*both capture device graphs"):
        AscendConfig(graph_capture="graph_with_compile", mode="reduce-overhead").check_backend("cuda")
    AscendConfig(freezing=True).check_backend("cpu")  # a bare backend takes it
    with pytest.raises(ValueError, match="freezing=True needs compile='model'"):
        AscendConfig(freezing=True).check_enable("cpu")
    AscendConfig(freezing=True, compile="model").check_enable("cpu")
    with pytest.raises(ValueError, match="unknown platform 'tpu'"):
        AscendConfig(graph_capture="graph_only").check_backend("tpu")


def test_valid_values_and_normalization():
    cfg = AscendConfig(
        fusions=["mul_add", "rope", "rms_norm", "rope"], graph_log_dir=__import__("pathlib").Path("/tmp/g")
    )
    assert cfg.fusions == ("rms_norm", "rope", "mul_add")  # canonical order, duplicates dropped
    assert cfg.graph_log_dir == "/tmp/g" and isinstance(cfg.graph_log_dir, str)
    assert AscendConfig(fusions="rope").fusions == ("rope",)
    assert AscendConfig(fusions=()).fusions == ()
    assert AscendConfig(attention="_native_npu").attention == "_native_npu"
    assert AscendConfig(attention=None).attention is None
    assert AscendConfig(compile="none", fusions="all").compile == "none"  # swaps only
    with pytest.raises(dataclasses_frozen_error()):
        cfg.fusions = "none"


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_replace_validates_and_keeps_original():
    cfg = AscendConfig(fusions=["rope"])
    new = cfg.replace(on_error="raise", fusions="all")
    assert (new.on_error, new.fusions) == ("raise", "all")
    assert (cfg.on_error, cfg.fusions) == ("fallback", ("rope",))
    with pytest.raises(TypeError, match=r"\['fusion'\].*valid:.*'fusions'.*Did you mean 'fusions'"):
        cfg.replace(fusion="all")
    with pytest.raises(ValueError, match="max_captured_graphs"):
        cfg.replace(max_captured_graphs=0)


# ----------------------------------------------------------------------------- resolution
def test_resolved_fusions_per_platform():
    auto = AscendConfig()
    # From the registry: torch_npu/aclnn kernels for rms_norm, rope, mul_add (addcmul), swiglu;
    # adaLN only with MindIE SD (not installed here); gelu_tanh is already one kernel unfused on NPU;
    # torchao's int8 linears on the quantized matmul kernels (#44).
    npu_auto = ("rms_norm", "rope", "mul_add", "swiglu", "int8_dynamic_linear", "int8_weight_only_linear")
    assert auto.resolved_fusions("npu") == npu_auto
    assert auto.resolved_fusions("cpu") == ()
    from ascend_kernels.registry import available_providers

    expected_cuda = tuple(
        f for f in NON_NUMERIC if any(p != "native" for p in available_providers(FUSION_TO_OP[f], "cuda"))
    )
    assert auto.resolved_fusions("cuda") == expected_cuda
    for plat in ("npu", "cuda", "cpu"):
        assert AscendConfig(fusions="all").resolved_fusions(plat) == NON_NUMERIC  # never fast_gelu
        assert AscendConfig(fusions="none").resolved_fusions(plat) == ()
        explicit = AscendConfig(fusions=["mul_add", "fast_gelu", "rms_norm"])
        assert explicit.resolved_fusions(plat) == ("rms_norm", "fast_gelu", "mul_add")
    with override_platform("npu"):
        assert auto.resolved_fusions() == npu_auto
    with pytest.raises(ValueError, match="'tpu'"):
        auto.resolved_fusions("tpu")
    assert "fast_gelu" in FUSIONS and "fast_gelu" not in NON_NUMERIC  # numerics-changing: named, never "all"
    assert "add_rms_norm" in FUSIONS and "add_rms_norm" not in NON_NUMERIC  # opt-in: named, never "auto"/"all"


def test_resolved_executor():
    assert AscendConfig().resolved_executor("npu") == "eager"
    assert AscendConfig().resolved_executor("cuda") == "inductor"
    assert AscendConfig().resolved_executor("cpu") == "inductor"
    assert AscendConfig(executor="inductor").resolved_executor("npu") == "inductor"
    assert AscendConfig(executor="eager").resolved_executor("cpu") == "eager"


# ----------------------------------------------------------------------------- JSON
def test_dict_and_json_round_trip():
    cfg = AscendConfig(
        fusions=["rope", "adaln"],
        attention=None,
        compile="model",
        executor="inductor",
        mode="max-autotune",
        dynamic=False,
        fullgraph=True,
        recompile_limit=16,
        graph_capture="graph_only",
        safe_output=False,
        max_captured_graphs=3,
        graph_log_dir="/tmp/x",
        on_error="raise",
    )
    d = cfg.to_dict()
    assert d["version"] == CONFIG_VERSION == 1 and "diffusers_ascend_version" in d
    assert d["fusions"] == ["rope", "adaln"]
    assert d["graph_log_dir"] is None  # local: never written (a loaded config never sets it)
    local = cfg.replace(graph_log_dir=None)
    assert AscendConfig.from_dict(d) == local
    assert AscendConfig.from_dict(json.loads(cfg.to_json_string())) == local
    assert d == cfg.to_dict()  # from_dict did not mutate


def test_save_and_from_pretrained(tmp_path):
    cfg = AscendConfig(fusions="all", compile="model")
    path = cfg.save_pretrained(tmp_path / "out")
    assert path == os.path.join(tmp_path / "out", CONFIG_NAME)
    assert AscendConfig.from_pretrained(tmp_path / "out") == cfg
    assert AscendConfig.from_pretrained(str(tmp_path / "out")) == cfg
    assert AscendConfig.from_pretrained(path) == cfg  # the json file itself
    sub = tmp_path / "pipe" / "transformer"
    cfg.save_pretrained(sub)
    assert AscendConfig.from_pretrained(tmp_path / "pipe", subfolder="transformer") == cfg


def test_unknown_keys_warn_and_drop():
    d = AscendConfig().to_dict()
    d["turbo"] = True
    with pytest.warns(UserWarning, match=r"unknown ascend config keys \['turbo'\]"):
        cfg = AscendConfig.from_dict(d)
    assert cfg == AscendConfig() and "turbo" in d


def test_newer_version_warns_and_loads_known_keys():
    d = {"version": CONFIG_VERSION + 1, "fusions": ["rope"], "future_field": 1}
    with pytest.warns(UserWarning) as record:
        cfg = AscendConfig.from_dict(d)
    messages = [str(w.message) for w in record]
    assert any("newer" in m for m in messages) and any("['future_field']" in m for m in messages)
    assert cfg.fusions == ("rope",)
    with pytest.warns(UserWarning, match="newer"), pytest.raises(ValueError, match="on_error"):
        AscendConfig.from_dict({"version": CONFIG_VERSION + 1, "on_error": "explode"})


def test_invalid_dict_values_raise():
    with pytest.raises(ValueError, match="version"):
        AscendConfig.from_dict({"version": "one"})
    with pytest.raises(ValueError, match="compile"):
        AscendConfig.from_dict({"version": 1, "compile": "everything"})
    with pytest.raises(TypeError, match="dict"):
        AscendConfig.from_dict(["fusions"])


def test_malformed_json_names_the_file(tmp_path):
    (tmp_path / CONFIG_NAME).write_text("{not json")
    with pytest.raises(ValueError, match=rf"{CONFIG_NAME} is not valid JSON"):
        AscendConfig.from_pretrained(tmp_path)
    (tmp_path / CONFIG_NAME).write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON array"):
        AscendConfig.from_pretrained(tmp_path)


def test_missing_file_in_local_dir(tmp_path):
    with pytest.raises(OSError, match=rf"holds no {CONFIG_NAME}"):
        AscendConfig.from_pretrained(tmp_path)


# ----------------------------------------------------------------------------- identity
def test_equality_hash_cache_key():
    a = AscendConfig(fusions=["rope", "rms_norm"])
    b = AscendConfig(fusions=("rms_norm", "rope", "rms_norm"))
    assert a == b and hash(a) == hash(b) and a.cache_key() == b.cache_key()
    assert len({a, b}) == 1
    c = a.replace(on_error="raise")
    assert c != a and c.cache_key() != a.cache_key()
    assert AscendConfig(fusions="all") != AscendConfig(fusions=NON_NUMERIC)  # "all" follows future fusions
    # graph_log_dir does not change compiled code: same key, but still part of ==.
    logged = a.replace(graph_log_dir="/tmp/graphs")
    assert logged.cache_key() == a.cache_key() and logged != a and hash(logged) == hash(a)
    assert len(a.cache_key()) == 64


def test_cache_key_stable_across_processes():
    cfg = AscendConfig(fusions=["rope", "mul_add"], mode="max-autotune", dynamic=True)
    code = (
        "from diffusers_ascend.config import AscendConfig;"
        "print(AscendConfig(fusions=['mul_add', 'rope'], mode='max-autotune', dynamic=True).cache_key())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == cfg.cache_key()


# ----------------------------------------------------------------------------- coerce
def test_coerce_every_accepted_type(tmp_path):
    base = AscendConfig(fusions=["rope"], compile="model")
    assert AscendConfig.coerce() == AscendConfig()
    assert AscendConfig.coerce(None, on_error="raise") == AscendConfig(on_error="raise")
    assert AscendConfig.coerce(base) is base
    assert AscendConfig.coerce(base, fusions="none") == base.replace(fusions="none")
    assert base.fusions == ("rope",)
    d = base.to_dict()
    assert AscendConfig.coerce(d) == base
    assert AscendConfig.coerce({"fusions": ["rope"]}, compile="model") == base
    base.save_pretrained(tmp_path)
    assert AscendConfig.coerce(str(tmp_path)) == base
    assert AscendConfig.coerce(tmp_path, on_error="raise") == base.replace(on_error="raise")
    assert AscendConfig.coerce(tmp_path / CONFIG_NAME) == base


def test_coerce_rejects_bad_types_and_names():
    with pytest.raises(TypeError, match=r"from int; accepted: AscendConfig, dict, .*Hub repo id, or None"):
        AscendConfig.coerce(5)
    with pytest.raises(TypeError, match=r"\['fusion'\].*valid"):
        AscendConfig.coerce(None, fusion="all")
    d = {"fusions": "all"}
    with pytest.raises(ValueError):
        AscendConfig.coerce(d, compile="nothing")
    assert d == {"fusions": "all"}


def test_light_import():
    code = (
        "import sys, diffusers_ascend.config as c; c.AscendConfig(fusions='all').to_dict();"
        "print(sorted(m for m in ('diffusers', 'torch._inductor', 'huggingface_hub') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_auto_picks_up_a_triton_kernel_where_it_runs(monkeypatch):
    import ascend_kernels.triton as tri
    from ascend_kernels.triton import measurements

    monkeypatch.setattr(tri, "triton_available", lambda: True)
    monkeypatch.setattr(tri, "triton_ascend_available", lambda: True)
    auto = AscendConfig()
    assert auto.resolved_fusions("npu") == (
        "rms_norm",
        "rope",
        "adaln",
        "mul_add",
        "swiglu",
        "int8_dynamic_linear",
        "int8_weight_only_linear",
    )
    # On CUDA only kernels measured faster than Inductor's code for their composite: none recorded.
    assert auto.resolved_fusions("cuda") == ()
    faster = measurements.Measurement(
        "adaln_modulate",
        "cuda",
        "NVIDIA H100 80GB HBM3",
        "flux_img",
        "bf16",
        kernel_ms=0.04,
        compiled_ms=0.069,
        versions="-",
        date="-",
    )
    monkeypatch.setattr(measurements, "MEASUREMENTS", (faster,))
    assert auto.resolved_fusions("cuda") == ("adaln",)
    assert auto.resolved_fusions("cpu") == ()


# ----------------------------------------------------------------------------- comma-separated fusions
def test_comma_separated_fusions_are_the_list_of_their_names(tmp_path):
    # The CLI's syntax, in Python: it said "Did you mean 'rms_norm'?".
    cfg = AscendConfig(fusions="rope, rms_norm")
    assert cfg.fusions == ("rms_norm", "rope") and cfg == AscendConfig(fusions=["rms_norm", "rope"])
    assert cfg.to_dict()["fusions"] == ["rms_norm", "rope"]  # saved as a JSON list
    assert AscendConfig.from_pretrained(cfg.save_pretrained(tmp_path)) == cfg
    assert AscendConfig.from_dict({"fusions": "rms_norm,rope"}) == cfg  # a hand-written file may use it too
    assert cfg.replace(fusions="adaln,mul_add").fusions == ("adaln", "mul_add")


@pytest.mark.parametrize(
    "value, pattern",
    [
        ("rms_norm,ropee", r"unknown fusion\(s\) \['ropee'\].*Did you mean 'rope'"),
        ("all,rope", r"'all' is a keyword, not a fusion name"),
        ("rope,", r"empty name"),
        (",", r"empty name"),
        ("gelu_tanh,fast_gelu", r"pick one"),
    ],
)
def test_comma_separated_fusions_are_validated_name_by_name(value, pattern):
    with pytest.raises(ValueError, match=pattern):
        AscendConfig(fusions=value)
