"""The backend by name: ``torch.compile(m, backend="ascend", options={...})`` (issue #43).

Counts are checked against the bare `AscendBackend` (the same passes) and, for the fusions
`enable_ascend_compile` also makes in graphs (it swaps RMSNorm, RoPE and GELU layers instead),
against `enable_ascend_compile` on the same model; numerics against eager.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import diffusers_ascend
from diffusers_ascend.compilation import AscendBackend, _compat
from diffusers_ascend.compilation.named_backend import (
    NOT_BY_NAME,
    OPTIONS,
    ascend_backend,
    backend_from_options,
    compiled_report,
    named_backends,
    options_config,
)
from diffusers_ascend.tiny import flux_block_inputs, flux_model_inputs, flux_single_block_inputs, tiny_flux_blocks

from .conftest import EXPECTED_BLOCK_COUNTS, as_tuple, assert_close

EAGER = {"fusions": "all", "executor": "eager"}
# Fusions enable_ascend_compile makes by graph passes as the backend does (the others are layer swaps).
GRAPH_PASS_FUSIONS = ("adaln", "mul_add", "swiglu")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _nonzero(matches: dict) -> dict:
    return {f: n for f, n in matches.items() if n}


def test_listed_and_found_by_name():
    from torch._dynamo.backends.registry import lookup_backend

    assert "ascend" in torch._dynamo.list_backends()
    assert lookup_backend("ascend") is ascend_backend
    assert diffusers_ascend.ascend_backend is ascend_backend
    assert diffusers_ascend.compiled_report is compiled_report


@pytest.mark.parametrize("name", ["flux_double", "flux_single"])
def test_flux_block_by_name_fuses_as_the_backend_object(name):
    double, single = tiny_flux_blocks()
    block, inputs = (double, flux_block_inputs()) if name == "flux_double" else (single, flux_single_block_inputs())
    compiled = torch.compile(block, backend="ascend", options=dict(EAGER), fullgraph=True)
    with torch.no_grad():
        out, ref = as_tuple(compiled(**inputs)), as_tuple(block(**inputs))
    report = compiled_report(compiled)
    assert report.matches == EXPECTED_BLOCK_COUNTS[name]
    assert report.graphs_compiled == 1 and not report.fallbacks
    torch._dynamo.reset()
    obj = AscendBackend(**EAGER)
    with torch.no_grad():
        torch.compile(block, backend=obj, fullgraph=True)(**inputs)
    assert report.matches == obj.report.matches and report.ops_after == obj.report.ops_after
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r, torch.float32)


def test_whole_tiny_flux_by_name():
    from diffusers_ascend.tiny import tiny_flux_transformer

    model = tiny_flux_transformer(num_layers=2, num_single_layers=2)
    inputs = flux_model_inputs(4, 4)
    d, s = EXPECTED_BLOCK_COUNTS["flux_double"], EXPECTED_BLOCK_COUNTS["flux_single"]
    expected = {f: 2 * d[f] + 2 * s[f] + (1 if f == "adaln" else 0) for f in d}  # + norm_out's adaLN
    compiled = torch.compile(model, backend="ascend", options=dict(EAGER), fullgraph=True)
    with torch.no_grad():
        out, ref = compiled(**inputs)[0], model(**inputs)[0]
    report = compiled_report(compiled)
    assert report.matches == expected and report.graphs_compiled == 1
    assert compiled_report(model) is None  # the OptimizedModule holds the compile, not the model
    assert_close(out, ref, torch.float32)
    # enable_ascend_compile on the same model and fusions: its graph-pass fusions count the same.
    torch._dynamo.reset()
    enabled = diffusers_ascend.enable_ascend_compile(
        tiny_flux_transformer(num_layers=2, num_single_layers=2), compile="model", fullgraph=True, **EAGER
    )
    with torch.no_grad():
        assert_close(enabled(**inputs)[0], ref, torch.float32)
    theirs = diffusers_ascend.ascend_report(enabled)
    assert {f: report.matches[f] for f in GRAPH_PASS_FUSIONS} == {f: theirs.matches[f] for f in GRAPH_PASS_FUSIONS}


def test_compile_repeated_blocks_by_name():
    """diffusers' own `compile_repeated_blocks(backend="ascend")` compiles each block in place with
    torch.compile; the report is reached from the model."""
    from diffusers_ascend.tiny import tiny_flux_transformer

    model = tiny_flux_transformer(num_layers=2, num_single_layers=2)
    inputs = flux_model_inputs(4, 4)
    with torch.no_grad():
        ref = model(**inputs)[0]
    model.compile_repeated_blocks(backend="ascend", options=dict(EAGER))
    with torch.no_grad():
        out = model(**inputs)[0]
        assert_close(model(**inputs)[0], out, torch.float32, atol=0, rtol=0)  # a second call compiles nothing
    report = compiled_report(model)
    d, s = EXPECTED_BLOCK_COUNTS["flux_double"], EXPECTED_BLOCK_COUNTS["flux_single"]
    per_graph = [_nonzero(g.matches) for g in report.graphs]
    assert _nonzero(d) in per_graph and _nonzero(s) in per_graph
    assert all(m in (_nonzero(d), _nonzero(s)) for m in per_graph)
    assert not report.fallbacks
    assert_close(out, ref, torch.float32)

    # enable_ascend_compile (compile="blocks") on the same model: the same graphs, the same graph-pass counts.
    torch._dynamo.reset()
    enabled = diffusers_ascend.enable_ascend_compile(tiny_flux_transformer(num_layers=2, num_single_layers=2), **EAGER)
    with torch.no_grad():
        assert_close(enabled(**inputs)[0], ref, torch.float32)
    theirs = diffusers_ascend.ascend_report(enabled)
    if not _compat.compiled_blocks_share_graphs():
        # 2.6/2.7 guard each block's own processor: by name one graph per block (enable shares the
        # processors), each with its block's counts (asserted above)
        assert report.graphs_compiled == len(model.transformer_blocks) + len(model.single_transformer_blocks)
        return
    assert report.graphs_compiled == theirs.graphs_compiled
    assert {f: report.matches[f] for f in GRAPH_PASS_FUSIONS} == {f: theirs.matches[f] for f in GRAPH_PASS_FUSIONS}


def test_report_of_a_pipeline_covers_its_components():
    from diffusers_ascend.tiny import tiny_flux_pipeline

    pipe = tiny_flux_pipeline()
    assert compiled_report(pipe) is None
    assert diffusers_ascend.ascend_report(pipe) is None
    pipe.transformer.compile_repeated_blocks(backend="ascend", options={"fusions": ["adaln"], "executor": "eager"})
    with torch.no_grad():
        pipe.transformer(**flux_model_inputs())
    report = compiled_report(pipe)
    d, s = EXPECTED_BLOCK_COUNTS["flux_double"]["adaln"], EXPECTED_BLOCK_COUNTS["flux_single"]["adaln"]
    assert report.matches == {"adaln": d + s} == compiled_report(pipe.transformer).matches
    # ascend_report, the enable path's reader, gives the same for what was compiled by name
    assert diffusers_ascend.ascend_report(pipe).matches == report.matches
    assert diffusers_ascend.ascend_report(pipe.transformer).matches == report.matches


def test_one_backend_per_torch_compile_call():
    """Every graph of one torch.compile call (here a recompile) goes to one backend and one report;
    another torch.compile call gets its own."""
    norm = torch.nn.RMSNorm(8)
    options = {"fusions": ["rms_norm"], "executor": "eager"}
    first = torch.compile(norm, backend="ascend", options=options, dynamic=False)
    second = torch.compile(
        norm, backend="ascend", options={"fusions": ["rms_norm"], "executor": "eager", "on_error": "raise"}
    )
    with torch.no_grad():
        first(torch.randn(2, 8))
        first(torch.randn(3, 8))  # static shapes: a second graph
        second(torch.randn(2, 8))
    (a,), (b,) = named_backends(first), named_backends(second)
    assert a is not b
    assert a.report.graphs_compiled == 2 and a.report.matches == {"rms_norm": 2}
    assert b.report.graphs_compiled == 1 and b.config.on_error == "raise"


def test_reset_reaches_the_backends_by_name():
    compiled = torch.compile(
        torch.nn.RMSNorm(8), backend="ascend", options={"fusions": ["rms_norm"], "executor": "eager"}
    )
    with torch.no_grad():
        compiled(torch.randn(2, 8))
    (backend,) = named_backends(compiled)
    assert not backend.was_reset
    torch.compiler.reset()
    assert backend.was_reset


def _dynamo_config() -> dict:
    return {k: v for k, v in torch._dynamo.config.get_config_copy().items() if not callable(v)}


BAD_OPTIONS = [
    # (options, exception type, what the message must name)
    ({"fusion": "all"}, TypeError, ["unknown option(s) ['fusion']", "Did you mean 'fusions'?", "'executor'"]),
    ({"safe_output": "yes"}, TypeError, ["safe_output must be True or False", "'yes'"]),
    ({"max_captured_graphs": 2.5}, TypeError, ["max_captured_graphs must be an int"]),
    ({"executor": "fast"}, ValueError, ["executor='fast' is invalid", "'auto', 'eager', 'inductor'"]),
    ({"fusions": ["rms_norm", "ropee"]}, ValueError, ["unknown fusion(s) ['ropee']", "Did you mean 'rope'?"]),
    ({"attention": "npu_fia"}, ValueError, ["cannot take option(s) ['attention']", "set_attention_backend"]),
    ({"recompile_limit": 64}, ValueError, ["['recompile_limit']", "process-wide"]),
    ({"executor": "eager", "mode": "max-autotune"}, ValueError, ["mode='max-autotune' is an Inductor setting"]),
    ({"fusions": "all", "graph_capture": "graph_only"}, ValueError, ["needs device graphs", "graph_capture=None"]),
    (["fusions"], TypeError, ["options must be a dict", "got list"]),
]


@pytest.mark.parametrize(("options", "exc", "names"), BAD_OPTIONS, ids=lambda v: str(v)[:40])
def test_bad_options_are_refused_before_anything_compiles(options, exc, names):
    from diffusers_ascend.platform import override_platform

    with override_platform("cpu"):  # graph capture: refused where the platform has no device graphs
        with pytest.raises(exc) as info:
            options_config(options)
        for name in names:
            assert name in str(info.value), (name, str(info.value))
        with pytest.raises(exc):
            backend_from_options(options)

        # By name torch hands the options over with the first graph: the same error, raised by
        # dynamo with our message, and nothing compiled or changed.
        norm = torch.nn.RMSNorm(8)
        before, inductor_before = _dynamo_config(), torch._inductor.config.get_config_copy()
        compiled = torch.compile(norm, backend="ascend", options=options)
        for _ in range(2):  # a second call retries and raises again: no half-made backend stays behind
            with pytest.raises(Exception) as info, torch.no_grad():
                compiled(torch.randn(2, 8))
            assert all(name in str(info.value) for name in names), str(info.value)
            cause = info.value
            while cause.__cause__ is not None or getattr(cause, "inner_exception", None) is not None:
                cause = getattr(cause, "inner_exception", None) or cause.__cause__
            assert isinstance(cause, exc), repr(cause)
        assert compiled_report(compiled) is None
        assert _dynamo_config() == before and torch._inductor.config.get_config_copy() == inductor_before


def test_the_entry_point_is_declared_as_torch_looks_it_up():
    """pyproject's entry point names this module's callable (a rename would need the venv reinstalled)."""
    import pathlib

    import tomllib

    pyproject = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["torch_dynamo_backends"]["ascend"]
    module, _, attr = target.partition(":")
    assert getattr(__import__(module, fromlist=[attr]), attr) is ascend_backend


@pytest.mark.parametrize("fn", [ascend_backend, backend_from_options, compiled_report, options_config])
def test_public_functions_are_annotated_with_examples(fn):
    import inspect

    sig = inspect.signature(fn)
    assert sig.return_annotation is not inspect.Signature.empty
    assert [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty] == []
    assert ">>>" in fn.__doc__


def test_every_config_field_is_an_option_or_refused_with_a_reason():
    from dataclasses import fields

    from diffusers_ascend.config import AscendConfig

    names = {f.name for f in fields(AscendConfig)}
    assert set(OPTIONS) | set(NOT_BY_NAME) == names and not set(OPTIONS) & set(NOT_BY_NAME)


def test_mode_and_torch_arguments():
    assert options_config(mode="max-autotune-no-cudagraphs").mode == "max-autotune-no-cudagraphs"
    with pytest.raises(ValueError, match="mode given twice"):
        options_config({"mode": "default"}, mode="max-autotune")
    with pytest.raises(TypeError, match=r"torch.compile argument\(s\) \['backend_kwarg'\]"):
        ascend_backend(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.randn(2)], backend_kwarg=1)


def test_torch_compile_mode_reaches_the_backend():
    """torch.compile's ``mode=`` (alone: torch refuses it with ``options=``) is the backend's Inductor mode."""
    compiled = torch.compile(torch.nn.ReLU(), backend="ascend", mode="max-autotune-no-cudagraphs")
    with torch.no_grad():
        compiled(torch.randn(4))
    (backend,) = named_backends(compiled)
    assert backend.config.mode == "max-autotune-no-cudagraphs"
    with pytest.raises(RuntimeError, match="Either mode or options"):
        torch.compile(torch.nn.ReLU(), backend="ascend", mode="max-autotune", options={"fusions": "all"})


def test_name_labels_the_graphs():
    """torch 2.15 passes torch.compile's ``name=`` to backends; called as it does."""

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(8)

        def forward(self, x):
            return (self.norm(x),)  # aot takes graphs with tuple outputs, as dynamo makes them

    gm = torch.fx.symbolic_trace(Norm())
    options = {"fusions": ["rms_norm"], "executor": "eager"}
    from torch._dynamo.backends.registry import lookup_backend

    wrapper = torch._TorchCompileWrapper("ascend", None, options, None)
    assert wrapper.compiler_fn is ascend_backend
    wrapper.kwargs["name"] = "my_block"  # what 2.15's wrapper adds for name=
    with torch.no_grad():
        wrapper(gm, [torch.randn(2, 8)])  # the graph is rewritten as it is compiled
    (backend,) = [wrapper._diffusers_ascend_backend]
    assert backend.report.graphs[0].name.startswith("my_block:")
    assert lookup_backend("ascend") is ascend_backend


FRESH_PROCESS = r"""
import json, sys
import torch
from diffusers.models.transformers.transformer_flux import FluxPosEmbed, FluxTransformerBlock

torch.manual_seed(0)
block = FluxTransformerBlock(dim=32, num_attention_heads=2, attention_head_dim=16).eval()
gen = torch.Generator().manual_seed(1)
hidden, enc, temb = (torch.randn(1, n, 32, generator=gen) for n in (16, 8, 1))
temb = temb[:, 0]
ids = torch.cat([torch.zeros(8, 3), torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"), -1).reshape(16, 3)])
rope = FluxPosEmbed(theta=10000, axes_dim=[4, 4, 8])(ids)
kwargs = dict(hidden_states=hidden, encoder_hidden_states=enc, temb=temb, image_rotary_emb=rope)
assert "diffusers_ascend" not in sys.modules
compiled = torch.compile(block, backend="ascend", options={"fusions": "all", "executor": "eager"}, fullgraph=True)
with torch.no_grad():
    out = compiled(**kwargs)
    ref = block(**kwargs)
import diffusers_ascend
report = diffusers_ascend.compiled_report(compiled)
diff = max((o - r).abs().max().item() for o, r in zip(out, ref))
print(json.dumps({"matches": report.matches, "max_diff": diff}))
"""


@pytest.mark.own_process
def test_fresh_process_finds_the_backend_by_name():
    """A process that never imported diffusers_ascend: torch finds ``ascend`` by its entry point."""
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["matches"] == EXPECTED_BLOCK_COUNTS["flux_double"]
    assert result["max_diff"] < 1e-4
