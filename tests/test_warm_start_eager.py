"""Warm start for ``executor="eager"`` (issue 36): eager block packages (`warm_start/eager.py`).

A cache is saved from a real tiny FLUX transformer once per module; each test enables a new model
from it. "No trace, no pass" is asserted by making the backend, the fusion passes, the pattern
self-check, dynamo's ``torch.compile`` and the probe trace fail if called. Graph capture runs on
the CPU stand-in graph API (tests/compilation/graph_standins.py: a CONTRACT stand-in, not hardware).
The fault tests mirror those of the Inductor packages (tests/test_warm_start*.py).
"""

import dataclasses
import hashlib
import json
import re
import shutil

import pytest
import torch

import diffusers_ascend
from diffusers_ascend import platform as P
from diffusers_ascend import warm_start
from diffusers_ascend.compilation import _compat
from diffusers_ascend.compilation import backend as backend_module
from diffusers_ascend.compilation.passes import manager as manager_module
from diffusers_ascend.config import AscendConfig
from diffusers_ascend.integration import package_counters
from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, flux_model_inputs, tiny_flux_transformer
from diffusers_ascend.warm_start import eager

from .compilation.graph_standins import standin_graph_api

LAYERS = dict(num_layers=1, num_single_layers=1)
CONFIG = {**FLUX_TRANSFORMER_CONFIG, **LAYERS}
CFG = AscendConfig(fusions="all", executor="eager", compile="blocks")


@pytest.fixture(autouse=True)
def _on_cpu():
    """The packages are saved and loaded on one platform, the CPU: a cache made on another platform is
    ignored by design (`test_an_eager_cache_for_another_setup_warns_and_compiles`), so the CUDA-host
    rerun (DIFFUSERS_ASCEND_TEST_PLATFORM=cuda) must not load the CPU-made module cache as a CUDA host."""
    with P.override_platform("cpu"):
        yield


def _model():
    torch.manual_seed(0)
    return tiny_flux_transformer(**LAYERS)


def _inputs(size=8, seed=0):
    torch.manual_seed(seed)
    return flux_model_inputs(size, size, config=CONFIG)


def _forbid_compiling(monkeypatch):
    """Every entry point of a cold first call fails if reached."""

    def fail(what):
        def raiser(*args, **kwargs):
            raise AssertionError(f"a warm start reached {what}")

        return raiser

    monkeypatch.setattr(backend_module.AscendBackend, "__call__", fail("the backend (dynamo compiled a graph)"))
    monkeypatch.setattr(manager_module.FusionPassManager, "__call__", fail("a fusion pass"))
    monkeypatch.setattr(manager_module.FusionPassManager, "verify", fail("the pattern self-check"))
    monkeypatch.setattr(torch, "compile", fail("torch.compile (dynamo)"))
    monkeypatch.setattr(_compat, "aot_autograd", fail("aot_autograd"))
    monkeypatch.setattr(_compat, "probe_trace", fail("a trace"))
    monkeypatch.setattr(_compat, "export_program", fail("torch.export"))


def _save(directory, capture=False):
    model = _model()
    cfg = CFG.replace(graph_capture="graph_with_compile") if capture else CFG
    diffusers_ascend.enable_ascend_compile(model, cfg)
    with torch.no_grad():
        cold = model(**_inputs())[0]
    manifest = diffusers_ascend.save_ascend_cache(model, directory)
    return cold, manifest


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch._dynamo.reset()
    directory = tmp_path_factory.mktemp("eager-cache")
    with P.override_platform("cpu"):
        cold, manifest = _save(directory)
    torch._dynamo.reset()
    return directory, cold, manifest


def test_a_warm_eager_start_runs_the_packages_without_trace_or_pass(saved, monkeypatch):
    directory, cold, manifest = saved
    assert manifest["mechanism"] == warm_start.EAGER_MECHANISM and manifest["executor"] == "eager"
    assert sorted(manifest["files"]) == [b["file"] for b in manifest["blocks"]]  # packages only, no torch cache
    assert {b["class"] for b in manifest["blocks"]} == {"FluxTransformerBlock", "FluxSingleTransformerBlock"}
    model = _model()
    with monkeypatch.context() as m:
        _forbid_compiling(m)
        diffusers_ascend.enable_ascend_compile(model, CFG, cache=str(directory))
        with torch.no_grad():
            warm = model(**_inputs())[0]
    assert torch.equal(warm, cold)  # the same graph, the same kernels: the same numbers
    assert package_counters(model) == {"packages": len(manifest["blocks"]), "calls": 2, "passed_on": 0}
    report = diffusers_ascend.ascend_report(model)
    packaged = [g for g in report.graphs if g["name"].endswith(":export")]
    assert len(packaged) == len(manifest["blocks"]) and all(g["executor"] == "eager" for g in packaged)
    assert report.matches == {f: sum(b["matches"][f] for b in manifest["blocks"]) for f in report.matches}
    assert all(g["bound_providers"] for g in packaged)  # our ops call their providers directly, as when compiled
    assert report.fallbacks == []  # packages answering the calls are our compiled calls (no outer-compile alarm)

    # A signature without a package compiles as today (the deferred self-check runs then).
    other = _inputs(4, seed=1)
    with torch.no_grad():
        compiled = model(**other)[0]
    assert package_counters(model)["passed_on"] == 2
    assert len(diffusers_ascend.ascend_report(model).graphs) > len(packaged)
    diffusers_ascend.disable_ascend_compile(model)
    with torch.no_grad():
        plain = model(**other)[0]
    torch.testing.assert_close(compiled, plain, rtol=1e-4, atol=1e-4)


def test_a_warm_eager_start_captures_graphs_where_configured(tmp_path, monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(P, "graph_api", lambda platform=None: standin_graph_api())
    with P.override_platform("cuda"):  # the stand-in captures CPU tensors; a platform with device graphs
        cold, manifest = _save(tmp_path, capture=True)
        torch._dynamo.reset()
        model = _model()
        with monkeypatch.context() as m:
            _forbid_compiling(m)
            diffusers_ascend.enable_ascend_compile(
                model, CFG.replace(graph_capture="graph_with_compile"), cache=str(tmp_path)
            )
            with torch.no_grad():
                first = model(**_inputs())[0].clone()
                second = model(**_inputs())[0]  # replays the captured graphs
    torch.testing.assert_close(first, cold, rtol=0, atol=0)
    torch.testing.assert_close(second, cold, rtol=0, atol=0)
    capture = model._ascend_state.backend.graph_capture
    assert capture.num_graphs == len(manifest["blocks"]) and capture.stats["replays"] >= 2
    report = diffusers_ascend.ascend_report(model)
    packaged = [g for g in report.graphs if g["name"].endswith(":export")]
    assert packaged and all(g["graph_capture"] == "graph_with_compile" for g in packaged)
    assert report.fallbacks == []


def test_an_eager_cache_for_another_setup_warns_and_compiles(saved, tmp_path):
    directory, _, _ = saved
    for name, change, needle in [
        ("old-torch", {"torch": "2.0.0"}, "torch version: saved '2.0.0'"),
        ("other-fusions", {"pass_hash": "0" * 64}, "fusion pass source hash"),
    ]:
        copy = tmp_path / name
        shutil.copytree(directory, copy)
        manifest = json.loads((copy / warm_start.MANIFEST_NAME).read_text())
        (copy / warm_start.MANIFEST_NAME).write_text(json.dumps({**manifest, **change}))
        model = _model()
        with pytest.warns(UserWarning, match="made for another setup") as rec:
            diffusers_ascend.enable_ascend_compile(model, CFG, cache=str(copy))
        assert any(needle in str(w.message) for w in rec)
        with torch.no_grad():
            model(**_inputs())
        assert package_counters(model)["packages"] == 0 and diffusers_ascend.ascend_report(model).graphs_compiled >= 2
    # An eager cache for an Inductor config (another executor, another config hash): compiled normally.
    with pytest.warns(UserWarning, match="executor: saved 'eager', here 'inductor'"):
        assert warm_start.load_ascend_cache(str(directory), CFG.replace(executor="inductor")) is None


def _tamper(directory, copy, edit, resign=True):
    """A copy of the cache with ``edit(package JSON)`` applied to its first package; with `resign`
    the manifest's sha256 and size follow (an attacker who controls the whole directory)."""
    shutil.copytree(directory, copy)
    manifest = json.loads((copy / warm_start.MANIFEST_NAME).read_text())
    name = manifest["blocks"][0]["file"]
    payload = json.loads((copy / name).read_bytes())
    edit(payload)
    data = json.dumps(payload).encode()
    (copy / name).write_bytes(data)
    if resign:
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        (copy / warm_start.MANIFEST_NAME).write_text(json.dumps(manifest))
    return name


def _first_node(payload):
    return payload["program"]["graph_module"]["graph"]["nodes"][0]


@pytest.mark.parametrize(
    "edit, resign, needle",
    [
        (lambda p: _first_node(p).update(target="torch.ops.aten.cos.default"), False, "does not match the sha256"),
        (
            lambda p: _first_node(p).update(target="torch.serialization.os.system"),
            True,
            "calls 'torch.serialization.os.system'",
        ),
        (lambda p: _first_node(p).update(target="builtins.eval"), True, "calls 'builtins.eval'"),
        (lambda p: p["program"].update(guards_code=["import os"]), True, "guard code"),
        (
            lambda p: _first_node(p)["inputs"][0]["arg"].update(as_expr={"expr_str": "__import__('os')"}),
            True,
            "'as_expr'",
        ),
        (
            lambda p: p["program"]["graph_module"]["signature"]["input_specs"].__setitem__(
                0, {"parameter": {"arg": {"name": "arg0_1"}, "parameter_name": "w"}}
            ),
            True,
            "other than user_inputs",
        ),
        (
            lambda p: _first_node(p).update(metadata={"source_fn_stack": "x,torch.serialization.os.system"}),
            True,
            "node metadata",
        ),
        (lambda p: p.update(binding="0" * 64), True, "built for another call signature"),
    ],
)
def test_a_tampered_eager_package_is_refused_and_nothing_is_loaded(saved, tmp_path, monkeypatch, edit, resign, needle):
    directory, _, _ = saved
    _tamper(directory, tmp_path / "copy", edit, resign)
    model = _model()
    with pytest.raises(ValueError, match=needle):
        diffusers_ascend.enable_ascend_compile(model, CFG, cache=str(tmp_path / "copy"))
    assert getattr(model, "_ascend_state", None) is None  # nothing changed


def _forbid_reading(monkeypatch):
    """torch's program reader (and the attribute walk that resolves its call targets) fails if reached."""
    from torch._export.serde import serialize as serde

    def reached(*args, **kwargs):
        raise AssertionError("torch's reader saw a program check_program should have refused")

    monkeypatch.setattr(_compat, "export_from_json", reached)
    monkeypatch.setattr(serde.GraphModuleDeserializer, "deserialize_operator", reached)


# Names that are no operator overload: dunder attributes below torch.ops (which the grammar alone
# lets through), an overload packet, a module attribute, other modules, extra or missing parts, a
# trailing newline, look-alike letters (Cyrillic a, fullwidth digit), a namespace not allowed.
HOSTILE_TARGETS = [
    "torch.ops.aten.__class__.__init__",
    "torch.ops.aten.add.__dict__",
    "torch.ops.aten.add.Tensor.__call__",
    "torch.ops.aten._ops",
    "torch.ops.aten.add",
    "torch.ops.aten.add.overloads",
    "torch.ops.aten.__getattr__.default",
    "torch.ops.ascend_kernels.__dict__.default",
    "torch.ops.ascend_kernels.gelu_tanh.__class__",
    "builtins.eval",
    "os.system",
    "torch.ops.aten..add.Tensor",
    "torch.ops.aten.add.Tensor.",
    "torch.ops.aten.add.Tensor\n",
    "torch.ops.aten.\u0430dd.Tensor",
    "torch.ops.aten.add.Tensor\uff11",
    "torch.ops.higher_order.cond",
    "torch.ops.mylib.add.Tensor",
    "torch.ops.aten.add.Tensor.default",
    "torch.serialization.os.system",
]


@pytest.mark.parametrize("target", HOSTILE_TARGETS)
def test_check_program_refuses_every_target_that_is_not_an_operator_overload(saved, monkeypatch, target):
    directory, _, manifest = saved
    payload = json.loads((directory / manifest["blocks"][0]["file"]).read_bytes())
    _first_node(payload).update(target=target)
    _forbid_reading(monkeypatch)
    with pytest.raises(ValueError, match=f"calls {re.escape(repr(target))}: only overloads of registered"):
        eager.check_program(payload["program"])


@pytest.mark.parametrize(
    "target",
    [
        "torch.ops.aten.__and__.Tensor",  # a dunder that is a registered aten operator
        "torch.ops.aten._to_copy.default",
        "torch.ops.prims.convert_element_type.default",
        "torch.ops.ascend_kernels.gelu_tanh.default",
        "_operator.getitem",
    ],
)
def test_check_program_accepts_registered_overloads_by_the_registry_not_by_their_spelling(saved, target):
    directory, _, manifest = saved
    payload = json.loads((directory / manifest["blocks"][0]["file"]).read_bytes())
    _first_node(payload).update(target=target)
    eager.check_program(payload["program"])


def test_a_package_calling_a_dunder_below_torch_ops_is_refused_before_torch_reads_it(saved, tmp_path, monkeypatch):
    """torch's own reader would walk ``getattr`` down ``torch.ops.aten.__class__.__init__`` (and then
    warn); our check refuses it first, with the documented ValueError, and nothing is loaded."""
    directory, _, _ = saved
    _tamper(directory, tmp_path / "copy", lambda p: _first_node(p).update(target="torch.ops.aten.__class__.__init__"))
    _forbid_reading(monkeypatch)
    model = _model()
    with pytest.raises(ValueError, match=r"calls 'torch\.ops\.aten\.__class__\.__init__'"):
        diffusers_ascend.enable_ascend_compile(model, CFG, cache=str(tmp_path / "copy"))
    assert getattr(model, "_ascend_state", None) is None


def test_swapped_eager_package_entries_are_refused(saved, tmp_path):
    directory, _, manifest = saved
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    a, b = manifest["blocks"][:2]
    swapped = [{**a, "file": b["file"]}, {**b, "file": a["file"]}, *manifest["blocks"][2:]]
    (copy / warm_start.MANIFEST_NAME).write_text(json.dumps({**manifest, "blocks": swapped}))
    with pytest.raises(ValueError, match="built for another call signature"):
        warm_start.load_ascend_cache(str(copy), CFG)


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda m: m.update(executor="inductor"), "mechanism 'eager-export-blocks' with executor 'inductor'"),
        (lambda m: m["files"].update({warm_start.ARTIFACTS_NAME: {"sha256": "0" * 64, "size": 1}}), "nothing else"),
        (lambda m: m["blocks"][0].update(file="ascend_aoti_0.pt2"), "is not named"),
        (lambda m: m.update(mechanism="eager-pickles"), "mechanism 'eager-pickles'"),
    ],
)
def test_a_malformed_eager_manifest_is_a_value_error(saved, tmp_path, change, needle):
    directory, _, manifest = saved
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    edited = json.loads(json.dumps(manifest))
    change(edited)
    (copy / warm_start.MANIFEST_NAME).write_text(json.dumps(edited))
    with pytest.raises(ValueError, match=needle):
        warm_start.load_ascend_cache(str(copy), CFG)


def test_a_package_torch_cannot_read_is_left_to_the_compiler(saved, tmp_path, monkeypatch):
    directory, _, manifest = saved

    def unreadable(data):
        raise RuntimeError("schema version 99 is newer than this torch's")

    monkeypatch.setattr(_compat, "export_from_json", unreadable)
    model = _model()
    with pytest.warns(UserWarning, match="did not load .*schema version 99.* it compiles normally"):
        diffusers_ascend.enable_ascend_compile(model, CFG, cache=str(directory))
    with torch.no_grad():
        model(**_inputs())
    assert package_counters(model)["packages"] == 0 and diffusers_ascend.ascend_report(model).graphs_compiled >= 2


def test_a_remote_eager_cache_needs_the_explicit_opt_in():
    model = _model()
    with pytest.raises(ValueError, match="without trust_remote_artifacts=True"):
        diffusers_ascend.enable_ascend_compile(model, CFG, cache="someone/eager-cache")


def test_eager_packages_hold_no_pickle_and_no_code(saved):
    directory, _, manifest = saved
    for entry in manifest["blocks"]:
        data = (directory / entry["file"]).read_bytes()
        payload = json.loads(data)  # JSON through and through: no zip, no pickle stream
        eager.check_program(payload["program"])
        targets = {n["target"] for n in payload["program"]["graph_module"]["graph"]["nodes"]}
        assert any(t.startswith("torch.ops.ascend_kernels.") for t in targets)  # the fused graph, not the original


def test_save_of_an_eager_model_compiled_whole_is_refused(tmp_path):
    model = _model()
    diffusers_ascend.enable_ascend_compile(model, CFG.replace(compile="model"))
    with torch.no_grad():
        model(**_inputs(4))
    with pytest.raises(ValueError, match="compile='blocks'"):
        diffusers_ascend.save_ascend_cache(model, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def _plain(obj):
    """Schema objects as nested (class name, fields): 2.6's unions raise on ``==`` (it reads their
    unset fields), so they are compared by their set field (``type``, ``value``: every release)."""
    from torch._export.serde.union import _Union

    if isinstance(obj, _Union):
        return (type(obj).__name__, obj.type, _plain(obj.value))
    if dataclasses.is_dataclass(obj):
        return (type(obj).__name__, {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, list):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return (type(obj).__name__, obj)


def test_packages_are_read_as_torchs_own_deserializer_reads_them(saved):
    """`_compat.export_from_json` converts the JSON with each class's hints resolved once: the same
    schema objects as torch's ``_dict_to_dataclass`` and a program that runs alike."""
    from torch._export.serde import serialize as serde

    directory, _, manifest = saved
    assert manifest["blocks"]
    for entry in manifest["blocks"]:
        program = json.loads((directory / entry["file"]).read_bytes())["program"]
        if hasattr(serde, "_dict_to_dataclass"):
            ours = _compat._schema_objects(serde, serde.ExportedProgram, program)
            assert _plain(ours) == _plain(serde._dict_to_dataclass(serde.ExportedProgram, program))
        data = json.dumps(program).encode()
        ours = _compat.export_from_json(data)
        theirs = serde.deserialize(serde.SerializedArtifact(data, b"", b"", b""))
        assert str(ours.graph) == str(theirs.graph)
