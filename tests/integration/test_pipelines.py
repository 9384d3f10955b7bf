"""enable/disable/report on tiny Flux and Wan (2.2, two transformers) pipelines; persistence round trip; bad inputs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import diffusers_ascend
from diffusers_ascend.tiny import (
    flux_block_inputs,
    flux_pipeline_inputs,
    tiny_flux_pipeline,
    tiny_wan_pipeline,
    wan_pipeline_inputs,
)

from ..compilation.conftest import EXPECTED_BLOCK_COUNTS

# FINDINGS section 1: matches per block with fusions="all", every fusion of the table's "all".
FLUX_DOUBLE, FLUX_SINGLE, WAN = (EXPECTED_BLOCK_COUNTS[b] for b in ("flux_double", "flux_single", "wan"))
# With fusions="all" the integration first swaps fused layers in (diffusers_ascend.layers): RMSNorm
# and GELU-tanh modules and one rope processor per attention. Those sites reach the compiled graph
# already fused, so the passes match only what has no module-level swap: adaLN and mul_add.
SWAPPED = ("rms_norm", "rope", "gelu_tanh")
FLUX_SWAPS = {"rms_norm": 4 + 2, "gelu_tanh": 2 + 1, "rope": 1 + 1}  # double + single block
# Tiny Wan has 2 blocks (4 norms, 2 attentions, 1 FFN each) and a GELU-tanh in its text embedder.
WAN_SWAPS = {"rms_norm": 2 * 4, "gelu_tanh": 2 * 1 + 1, "rope": 2 * 2}


def _pass_matches(*blocks):
    return {f: 0 if f in SWAPPED else sum(b[f] for b in blocks) for f in FLUX_DOUBLE}


def _snapshot(pipe):
    return {n: (m, m._compiled_call_impl) for n, m in pipe.transformer.named_modules()}


@pytest.fixture(scope="module")
def flux():
    torch._dynamo.reset()
    pipe = tiny_flux_pipeline()
    ref = pipe(**flux_pipeline_inputs()).images
    pipe.enable_ascend_compile(fusions="all", executor="eager")
    out = pipe(**flux_pipeline_inputs()).images
    return pipe, ref, out


def test_flux_numerics_and_compiled_blocks(flux):
    pipe, ref, out = flux
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    compiled = [n for n, m in pipe.transformer.named_modules() if m._compiled_call_impl is not None]
    assert compiled == ["transformer_blocks.0", "single_transformer_blocks.0"]
    assert not any("_orig_mod" in k for k in pipe.transformer.state_dict())


def test_flux_report_totals(flux):
    report = flux[0].ascend_report()
    assert not report.fallbacks
    assert {f: report.matches.get(f, 0) for f in FLUX_DOUBLE} == _pass_matches(FLUX_DOUBLE, FLUX_SINGLE)
    assert report.swaps == FLUX_SWAPS


def test_wan22_two_transformers():
    torch._dynamo.reset()
    pipe = tiny_wan_pipeline(two_stage=True)
    ref = pipe(**wan_pipeline_inputs()).frames
    diffusers_ascend.enable_ascend_compile(pipe, fusions="all", executor="eager")
    assert pipe.transformer._ascend_state.backend is not pipe.transformer_2._ascend_state.backend
    out = pipe(**wan_pipeline_inputs()).frames
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    report = pipe.ascend_report()
    # One graph per transformer on every torch (< 2.8: because enable shares the blocks' processors).
    assert {f: report.matches.get(f, 0) for f in WAN} == _pass_matches(*[WAN] * 2)
    assert report.swaps == {f: 2 * n for f, n in WAN_SWAPS.items()}


def test_disable_restores_and_enable_twice_does_not_stack():
    pipe = tiny_flux_pipeline()
    before = _snapshot(pipe)
    pipe.enable_ascend_compile(executor="eager", fusions="none")
    first = pipe.transformer._ascend_state
    pipe.enable_ascend_compile(executor="eager", fusions=["rms_norm"])
    assert pipe.transformer._ascend_state is not first
    assert pipe.transformer._ascend_state.config.fusions == ("rms_norm",)
    assert len(pipe.transformer._ascend_state.compiled) == 2
    pipe.disable_ascend_compile()
    assert _snapshot(pipe) == before
    assert "_ascend_config" not in pipe.transformer.config and "_ascend_config" not in pipe.config
    assert not hasattr(pipe.transformer, "_ascend_state")


def test_on_error_fallback_and_raise():
    pipe = tiny_flux_pipeline()
    ref = pipe(**flux_pipeline_inputs(steps=1)).images

    def broken(*a, **k):
        torch._dynamo.graph_break()
        return orig(*a, **k)

    blk = pipe.transformer.single_transformer_blocks[0]
    orig = blk.forward
    blk.forward = broken  # a graph break under fullgraph=True cannot compile
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="failed to compile"):
        pipe.enable_ascend_compile(executor="eager", fullgraph=True)
        out = pipe(**flux_pipeline_inputs(steps=1)).images
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert [f["module"] for f in pipe.ascend_report().fallbacks] == ["transformer.single_transformer_blocks.0"]
    torch._dynamo.reset()
    pipe.enable_ascend_compile(executor="eager", fullgraph=True, on_error="raise")
    with pytest.raises(Exception):  # noqa: B017  (dynamo's graph-break error; its class varies by release)
        pipe(**flux_pipeline_inputs(steps=1))
    del blk.forward


def test_round_trip(tmp_path):
    pipe = tiny_flux_pipeline()
    pipe.enable_ascend_compile(fusions=["rms_norm", "rope"], compile="none")
    sd = pipe.transformer.state_dict()
    pipe.save_pretrained(tmp_path)
    none = dict(text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)
    loaded = type(pipe).from_pretrained(tmp_path, **none)
    assert loaded.transformer._ascend_state.config == pipe.transformer._ascend_state.config
    sd2 = loaded.transformer.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert "_ascend_config" in type(pipe).load_config(tmp_path)
    plain = type(pipe).from_pretrained(tmp_path, ascend_config=False, **none)
    assert not hasattr(plain.transformer, "_ascend_state")
    over = type(pipe).from_pretrained(tmp_path, ascend_config={"compile": "none", "fusions": "none"}, **none)
    assert over.transformer._ascend_state.config.fusions == "none"
    model = type(pipe.transformer).from_pretrained(tmp_path / "transformer")
    assert model._ascend_state.config == pipe.transformer._ascend_state.config
    code = (
        "import warnings,sys; warnings.simplefilter('error');"
        "from diffusers import FluxTransformer2DModel as M; m=M.from_pretrained(sys.argv[1]);"
        "assert not hasattr(m,'enable_ascend_compile'); print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "transformer")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize(
    "config,overrides,exc",
    [
        (None, {"fusions": ["nope"]}, ValueError),
        (None, {"compile": 3}, (TypeError, ValueError)),
        (42, {}, TypeError),
        ({"version": 0}, {}, ValueError),
        ({"fusions": "bogus"}, {}, ValueError),
        ("/nonexistent/dir", {}, Exception),
        (None, {"bogus": 1}, TypeError),
    ],
)
def test_bad_inputs_change_nothing(config, overrides, exc):
    pipe = tiny_flux_pipeline()
    before = _snapshot(pipe)
    with pytest.raises(exc):
        pipe.enable_ascend_compile(config, **overrides)
    assert _snapshot(pipe) == before and not hasattr(pipe.transformer, "_ascend_state")


def test_newer_version_warns_and_loads():
    pipe = tiny_flux_pipeline()
    with pytest.warns(UserWarning, match="newer"):
        pipe.enable_ascend_compile({"version": 999, "compile": "none", "fusions": "none"})
    assert pipe.transformer._ascend_state.config.compile == "none"


def test_attention_auto_on_npu_sets_native_npu(monkeypatch):
    from diffusers.models import attention_dispatch
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from diffusers_ascend.attention import processors
    from diffusers_ascend.platform import override_platform

    monkeypatch.setattr(attention_dispatch, "_CAN_USE_NPU_ATTN", True)  # diffusers' torch_npu check
    model = tiny_flux_pipeline(dtype=torch.bfloat16).transformer  # _native_npu is bf16/fp16 only (float32: "native")
    procs = processors(model)
    active = _AttentionBackendRegistry._active_backend
    with override_platform("npu"):
        diffusers_ascend.enable_ascend_compile(model, compile="none", fusions="none")
    assert {p._attention_backend.value for p in procs} == {"_native_npu"}
    assert _AttentionBackendRegistry._active_backend is active  # diffusers' process-wide default is untouched
    diffusers_ascend.enable_ascend_compile(model, compile="none", fusions="none")  # cpu: left alone
    assert {p._attention_backend for p in procs} == {None}


IMPORT_ORDERS = {
    "ascend_first": "import diffusers_ascend; light = 'diffusers.pipelines.pipeline_utils' not in sys.modules; from diffusers import FluxPipeline, WanTransformer3DModel",
    "diffusers_first": "from diffusers import FluxPipeline, WanTransformer3DModel; light = True; import diffusers_ascend",
}


@pytest.mark.own_process
@pytest.mark.parametrize("order", sorted(IMPORT_ORDERS))
def test_import_patches_in_either_order_and_stays_light(order):
    code = (
        f"import sys; {IMPORT_ORDERS[order]}\n"
        "heavy = [m for m in sys.modules if m.startswith(('ascend_kernels', 'diffusers_ascend.compilation'))]\n"
        "print(light, heavy, all(hasattr(c, m) for c in (FluxPipeline, WanTransformer3DModel)"
        " for m in ('enable_ascend_compile', 'disable_ascend_compile', 'ascend_report')),"
        " getattr(FluxPipeline.from_pretrained, '_ascend_wrapped', False))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "True [] True True", r.stderr[-2000:]


@pytest.mark.parametrize("kind", ["flux", "wan"])
def test_compile_none_swaps_layers_only(kind):
    pipe = tiny_flux_pipeline() if kind == "flux" else tiny_wan_pipeline()
    inputs = flux_pipeline_inputs if kind == "flux" else wan_pipeline_inputs
    out_attr = "images" if kind == "flux" else "frames"
    ref = getattr(pipe(**inputs()), out_attr)
    pipe.enable_ascend_compile(fusions="all", compile="none")
    out = getattr(pipe(**inputs()), out_attr)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    report = pipe.ascend_report()
    assert report.swaps == (FLUX_SWAPS if kind == "flux" else WAN_SWAPS)
    assert report.graphs_compiled == 0 and not any(m._compiled_call_impl for m in pipe.transformer.modules())
    pipe.disable_ascend_compile()
    assert not any(type(m).__name__.startswith("Fused") for m in pipe.transformer.modules())


def test_no_adapter_is_refused_before_any_change():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8))
    with pytest.raises(ValueError, match="no Ascend adapter.*compile='model' or compile='none'"):
        diffusers_ascend.enable_ascend_compile(model, fusions="all")
    assert type(model[1]) is torch.nn.RMSNorm and not hasattr(model, "_ascend_state")


def test_failure_half_way_restores_the_previous_setup(monkeypatch):
    from diffusers_ascend.integration import api

    pipe = tiny_wan_pipeline(two_stage=True)
    pipe.enable_ascend_compile(fusions=["rms_norm"], compile="none")
    before = {n: type(m) for n, m in pipe.transformer_2.named_modules()}
    calls = []

    def fail_on_second(model, cfg, state):
        calls.append(model)
        if len(calls) == 2:
            raise RuntimeError("attention backend refused")

    monkeypatch.setattr(api, "set_attention", fail_on_second)
    with pytest.raises(RuntimeError, match="refused"):
        pipe.enable_ascend_compile(fusions="all", compile="none")
    monkeypatch.undo()
    # Both transformers are back on the first configuration, layers included.
    for t in (pipe.transformer, pipe.transformer_2):
        assert t._ascend_state.config.fusions == ("rms_norm",)
    assert {n: type(m) for n, m in pipe.transformer_2.named_modules()} == before
    assert pipe.ascend_report().swaps == {"rms_norm": 16}


@pytest.mark.parametrize(
    "content,exc",
    [
        ("{not json", ValueError),
        ('{"fusions": ["rms_norm", "nope"]}', ValueError),
        ('["a", "list"]', (TypeError, ValueError)),
    ],
)
def test_bad_config_file_in_a_folder_changes_nothing(tmp_path, content, exc):
    (tmp_path / "ascend_config.json").write_text(content)
    pipe = tiny_flux_pipeline()
    before = _snapshot(pipe)
    with pytest.raises(exc):
        pipe.enable_ascend_compile(str(tmp_path))
    assert _snapshot(pipe) == before and not hasattr(pipe.transformer, "_ascend_state")


def test_a_model_error_is_not_mistaken_for_a_compile_failure():
    pipe = tiny_flux_pipeline()
    pipe.enable_ascend_compile(executor="eager")
    block = pipe.transformer.transformer_blocks[0]
    bad = flux_block_inputs(dim=32)
    bad["hidden_states"] = bad["hidden_states"][..., :5]  # wrong width: the block itself cannot run
    with pytest.raises(RuntimeError):
        block(**bad)
    assert not pipe.ascend_report().fallbacks and block._compiled_call_impl is not None
    pipe(**flux_pipeline_inputs(steps=1))  # and it still compiles and runs on good inputs
    assert not pipe.ascend_report().fallbacks and pipe.ascend_report().graphs_compiled == 2
