"""Model adapters (one file per family), the generic adapter's warning, the diffusers RMSNorm swap,
and the report after a block fell back (its matches are not counted)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch

from ascend_kernels.testing import assert_close
from diffusers_ascend.adapters import adapter_for
from diffusers_ascend.adapters.registry import adapter_swaps, registered_adapters
from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.layers import SWAPS, apply_swaps, restore_swaps
from diffusers_ascend.tiny import (
    FLUX_TRANSFORMER_CONFIG,
    flux_model_inputs,
    tiny_flux_transformer,
    tiny_wan_transformer,
)

from ..compilation.conftest import EXPECTED_BLOCK_COUNTS


def test_families_declare_their_facts_and_layers_holds_none():
    adapters = registered_adapters()
    assert {"FluxTransformer2DModel", "WanTransformer3DModel"} <= set(adapters)
    flux, wan = adapters["FluxTransformer2DModel"], adapters["WanTransformer3DModel"]
    assert [s.source for s in flux.swaps] == ["FluxAttnProcessor"]
    assert [s.source for s in wan.swaps] == ["WanAttnProcessor"]
    assert wan.preconditions and "cos[..., 2i] == cos[..., 2i+1]" in wan.preconditions[0]
    krea2 = adapters["Krea2Transformer2DModel"]
    assert [s.source for s in krea2.swaps] == ["Krea2RMSNorm"]
    assert set(adapter_swaps()) == set(flux.swaps + wan.swaps + krea2.swaps)
    helios = adapters["HeliosTransformer3DModel"]
    assert helios.blocks == ("HeliosTransformerBlock",) and helios.pattern_forms == {"rope": ("wan_chunk",)}
    assert helios.preconditions and "cos[..., 2i] == cos[..., 2i+1]" in helios.preconditions[0]
    kandinsky5 = adapters["Kandinsky5Transformer3DModel"]
    assert kandinsky5.pattern_forms == {"rope": ("rotation_matrix",)} and not kandinsky5.preconditions
    # layers.py keeps model-independent modules only: no swap of a model family's class
    assert not {s.source for s in SWAPS} & {"FluxAttnProcessor", "WanAttnProcessor"}
    # found as the op files are: every module of the package registers an adapter it defines
    from diffusers_ascend import adapters as package

    families = {m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")} - {"registry"}
    assert families >= {"flux", "wan", "krea2", "helios", "kandinsky5", "kandinsky6"}
    for family in families:
        defined = vars(importlib.import_module(f"diffusers_ascend.adapters.{family}")).values()
        assert any(a is d for a in adapters.values() for d in defined), family


def test_declared_pattern_forms_exist():
    from diffusers_ascend.compilation.passes import get_pass_class

    for adapter in registered_adapters().values():
        for fusion, forms in adapter.pattern_forms.items():
            known = {p.form for p in get_pass_class(fusion).patterns()}
            assert set(forms) <= known, (adapter.name, fusion, set(forms) - known)


def test_generic_adapter_from_repeated_blocks_and_mro():
    from diffusers import FluxTransformer2DModel, WanVACETransformer3DModel

    class MyFlux(FluxTransformer2DModel):
        pass

    assert adapter_for(MyFlux(**FLUX_TRANSFORMER_CONFIG)).name == "flux"
    generic = adapter_for(WanVACETransformer3DModel.__new__(WanVACETransformer3DModel))
    assert generic.name == "generic:WanVACETransformer3DModel"
    assert generic.blocks == ("WanTransformerBlock", "WanVACETransformerBlock")
    assert adapter_for(torch.nn.Linear(2, 2)) is None


def test_repeated_block_name_matching_nothing_warns_and_is_reported(monkeypatch):
    model = tiny_wan_transformer()
    monkeypatch.setattr(type(model), "_repeated_blocks", ["WanTransformerBlock", "NoSuchBlock"])
    from diffusers_ascend.adapters import registry

    monkeypatch.delitem(registry._ADAPTERS, "WanTransformer3DModel")  # use the generic adapter
    monkeypatch.setattr(registry, "_load_families", lambda: None)
    with pytest.warns(UserWarning, match="'NoSuchBlock'.*matches no submodule"):
        model.enable_ascend_compile(executor="eager")
    report = model.ascend_report()
    assert [f["module"] for f in report.fallbacks] == ["<NoSuchBlock>"]
    assert len(model._ascend_state.compiled) == 2  # the blocks that exist are compiled
    model.disable_ascend_compile()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_diffusers_rms_norm_swap_matches_stock(dtype, affine):
    from diffusers.models.normalization import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-6, elementwise_affine=affine).to(dtype)
    if affine:
        torch.nn.init.normal_(norm.weight)
    x = torch.randn(2, 5, 16, dtype=dtype)
    ref = norm(x)
    undo, counts = apply_swaps(norm, ["rms_norm"])
    assert counts == {"rms_norm": 1} and type(norm).__name__ == "FusedDiffusersRMSNorm"
    assert isinstance(norm, RMSNorm)
    out = norm(x)
    assert out.dtype == ref.dtype
    assert_close(out, ref, dtype=dtype)
    restore_swaps(undo)
    assert type(norm) is RMSNorm


def test_diffusers_rms_norm_with_bias_runs_stock_code():
    from diffusers.models.normalization import RMSNorm

    norm = RMSNorm(8, eps=1e-6, bias=True)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(3, 8)
    ref = norm(x)
    apply_swaps(norm, ["rms_norm"])
    torch.testing.assert_close(norm(x), ref, rtol=0, atol=0)


def test_fallback_graph_matches_are_not_counted(monkeypatch):
    """A block whose compiled graph fails after rewriting (the executor raising stands in for an
    Inductor failure) runs eager: its matches leave `matches`, its fallback entry says what was lost."""
    model = tiny_flux_transformer()

    def failing_execute(self, gm, example_inputs, keep=None):
        if "FluxSingleTransformerBlock" in self.report.graphs[-1]["name"]:
            raise RuntimeError("lowering failed")
        return orig(self, gm, example_inputs, keep)

    orig = AscendBackend._execute
    monkeypatch.setattr(AscendBackend, "_execute", failing_execute)
    torch._dynamo.reset()
    model.enable_ascend_compile(executor="eager", fusions="all")
    inputs = flux_model_inputs(4, 4)
    with torch.no_grad(), pytest.warns(UserWarning, match="failed to compile"):
        model(**inputs)
    report = model.ascend_report()
    (fb,) = report.fallbacks
    assert fb["module"] == "single_transformer_blocks.0" and "lowering failed" in fb["reason"]
    # rms_norm / rope / gelu_tanh are module swaps (they still run in the eager block); the
    # passes found adaLN and mul_add, and those of the single block never ran
    single, double = EXPECTED_BLOCK_COUNTS["flux_single"], EXPECTED_BLOCK_COUNTS["flux_double"]
    assert fb["lost"] == {f: single[f] for f in ("adaln", "mul_add")}
    assert {k: v for k, v in report.matches.items() if v} == {f: double[f] for f in ("adaln", "mul_add")}
    assert report.swaps == {"rms_norm": 6, "gelu_tanh": 3, "rope": 2}
    fell = [g for g in report.graphs if g.get("fell_back")]
    assert len(fell) == 1 and "FluxSingleTransformerBlock" in fell[0]["name"]
    assert "(not run: adaln=1, mul_add=1)" in str(report)
    model.disable_ascend_compile()
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_krea2_rms_norm_swap_matches_stock(dtype):
    # the weight stays fp32 (the model's _keep_in_fp32_modules), activations in `dtype`
    from diffusers.models.transformers.transformer_krea2 import Krea2RMSNorm

    torch.manual_seed(0)
    norm = Krea2RMSNorm(16, eps=1e-5)
    torch.nn.init.normal_(norm.weight, std=0.3)
    x = torch.randn(2, 5, 16).to(dtype)
    ref = norm(x)
    undo, counts = apply_swaps(norm, ["rms_norm"], extra=adapter_swaps())
    assert counts == {"rms_norm": 1} and type(norm).__name__ == "FusedKrea2RMSNorm"
    out = norm(x)
    assert out.dtype == ref.dtype == dtype
    assert_close(out, ref, dtype=dtype)
    restore_swaps(undo)
    assert type(norm) is Krea2RMSNorm


def test_swaps_leave_a_look_alike_of_the_same_name_alone():
    # transformer_chronoedit defines its own `WanAttnProcessor`: only diffusers' transformer_wan
    # class is Wan's (the fused processor mirrors that code, not the copy's)
    from diffusers.models.transformers import transformer_chronoedit

    proc = transformer_chronoedit.WanAttnProcessor()
    undo, counts = apply_swaps(_Holder(proc), ["rope"], extra=adapter_swaps())
    assert counts == {} and type(proc) is transformer_chronoedit.WanAttnProcessor


class _Holder(torch.nn.Module):
    def __init__(self, processor):
        super().__init__()
        self.processor = processor
