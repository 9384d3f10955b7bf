"""The user's path on torchao-quantized models (#44): `enable_ascend_compile` on a tiny Flux and Wan
quantized by ``quantize_`` after loading or by ``TorchAoConfig`` at ``from_pretrained``: every
quantized linear of the compiled blocks rewritten into our ops, outputs equal to torchao's eager
path, weights and settings round-tripping through ``save_pretrained``; schemes we do not fuse keep
torchao's path with a report entry; damaged scales refused before anything changes."""

from __future__ import annotations

import pytest
import torch

import diffusers_ascend  # noqa: F401  (adds enable_ascend_compile to ModelMixin)
from diffusers_ascend.tiny import flux_model_inputs, tiny_flux_transformer, tiny_wan_transformer, wan_model_inputs

torchao = pytest.importorskip("torchao")
from torchao.quantization import (  # noqa: E402
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    MappingType,
    PerGroup,
    quantize_,
)

DTYPE = torch.bfloat16
SCHEMES = {
    "int8_dynamic_linear": lambda: Int8DynamicActivationInt8WeightConfig(set_inductor_config=False),
    "int8_weight_only_linear": lambda: Int8WeightOnlyConfig(set_inductor_config=False),
}
# Linears in the compiled blocks (the rest, embedders and the output projection, run outside them):
# Flux's tiny config has one double block (14) and one single block (6); Wan's two blocks of 10
# share one compiled graph.
SITES = {"flux": 20, "wan": 10}


def _model(kind: str):
    return tiny_flux_transformer(dtype=DTYPE) if kind == "flux" else tiny_wan_transformer(dtype=DTYPE)


def _inputs(kind: str):
    if kind == "flux":
        return flux_model_inputs(dtype=DTYPE)
    return {
        k: v.to(DTYPE) if isinstance(v, torch.Tensor) and v.is_floating_point() and k != "timestep" else v
        for k, v in wan_model_inputs().items()
    }


def _run(model, kind):
    with torch.no_grad():
        return model(**_inputs(kind))[0]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", ["flux", "wan"])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_quantize_then_enable_fuses_every_block_linear_bit_exact(kind, scheme):
    model = _model(kind)
    quantize_(model, SCHEMES[scheme]())
    ref = _run(model, kind)
    model.enable_ascend_compile(fusions=[scheme], executor="eager")
    out = _run(model, kind)
    report = model.ascend_report()
    assert report.matches[scheme] == SITES[kind] and not report.fallbacks
    assert report.unfused_quantization == {}
    assert torch.equal(out, ref), (out.float() - ref.float()).abs().max()


@pytest.mark.parametrize("kind", ["flux", "wan"])
def test_all_fusions_on_a_quantized_model(kind):
    """fusions="all" holds the int8 fusions on every device: the quantized linears go to our op and the
    rest fuses as on a float model; the int8 rewrite changes no number (bit-equal to the same fusions
    without it: the other fusions' single fp32 roundings are theirs, tested in their own suites)."""
    from diffusers_ascend.fusions import default_fusions

    others = [f for f in default_fusions() if not f.startswith("int8_")]
    outs, reports = [], []
    for fusions in ("all", others):
        model = _model(kind)
        quantize_(model, SCHEMES["int8_dynamic_linear"]())
        torch._dynamo.reset()
        model.enable_ascend_compile(fusions=fusions, executor="eager")
        outs.append(_run(model, kind))
        reports.append(model.ascend_report())
    assert (
        reports[0].matches["int8_dynamic_linear"] == SITES[kind] and reports[0].matches["int8_weight_only_linear"] == 0
    )
    assert reports[0].matches["adaln"] == reports[1].matches["adaln"] > 0 and not reports[0].fallbacks
    assert torch.equal(outs[0], outs[1])


def test_torchao_config_at_load_then_enable_and_round_trip(tmp_path):
    from diffusers import FluxTransformer2DModel, TorchAoConfig

    _model("flux").save_pretrained(tmp_path / "float")
    quant = TorchAoConfig(Int8DynamicActivationInt8WeightConfig(set_inductor_config=False))
    model = FluxTransformer2DModel.from_pretrained(tmp_path / "float", quantization_config=quant, torch_dtype=DTYPE)
    assert type(model.transformer_blocks[0].attn.to_q.weight).__name__ == "Int8Tensor"
    ref = _run(model, "flux")
    model.enable_ascend_compile(fusions=["int8_dynamic_linear", "rms_norm"], executor="eager")
    out = _run(model, "flux")
    assert model.ascend_report().matches["int8_dynamic_linear"] == SITES["flux"] and torch.equal(out, ref)

    model.save_pretrained(tmp_path / "saved", safe_serialization=False)
    torch._dynamo.reset()
    loaded = FluxTransformer2DModel.from_pretrained(tmp_path / "saved", torch_dtype=DTYPE)
    assert type(loaded.transformer_blocks[0].attn.to_q.weight).__name__ == "Int8Tensor"  # weights kept int8
    assert loaded._ascend_state.config == model._ascend_state.config  # our settings travelled with them
    assert torch.equal(_run(loaded, "flux"), ref)
    assert loaded.ascend_report().matches["int8_dynamic_linear"] == SITES["flux"]


@pytest.mark.parametrize(
    ("config", "scheme"),
    [
        (lambda: Int8WeightOnlyConfig(granularity=PerGroup(8)), "torchao Int8Tensor (per-group, block_size [1, 8])"),
        (
            lambda: Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC),
            "torchao Int8Tensor (asymmetric activations)",
        ),
    ],
    ids=["per_group", "asymmetric"],
)
def test_a_scheme_we_do_not_fuse_keeps_torchaos_path_and_is_named(config, scheme):
    model = _model("wan")
    cfg = config()
    cfg.set_inductor_config = False
    quantize_(model, cfg)
    ref = _run(model, "wan")
    model.enable_ascend_compile(fusions=sorted(SCHEMES), executor="eager")  # both int8 fusions, nothing else
    out = _run(model, "wan")
    report = model.ascend_report()
    assert report.matches["int8_dynamic_linear"] == report.matches["int8_weight_only_linear"] == 0
    assert report.unfused_quantization == {scheme: 26}  # every linear of the model, in and outside blocks
    assert report.to_dict()["unfused_quantization"] == {scheme: 26}
    assert torch.equal(out, ref)  # torchao's own path, compiled


def test_a_quantized_scheme_whose_fusion_is_off_is_named():
    model = _model("wan")
    quantize_(model, SCHEMES["int8_weight_only_linear"]())
    model.enable_ascend_compile(fusions=["rms_norm"], compile="none")
    assert model.ascend_report().unfused_quantization == {"int8_weight_only_linear (fusion not enabled)": 26}


def test_a_scale_of_the_wrong_shape_is_refused_before_anything_changes():
    model = _model("wan")
    quantize_(model, SCHEMES["int8_dynamic_linear"]())
    w = model.blocks[1].ffn.net[2].weight
    w.scale = w.scale[:-1]  # a damaged checkpoint: one output channel's scale missing
    with pytest.raises(ValueError, match=r"blocks\.1\.ffn\.net\.2\.weight: torchao Int8Tensor scale .* does not fit"):
        model.enable_ascend_compile(fusions="all", executor="eager")
    assert not hasattr(model, "_ascend_state")
    w.scale = None
    with pytest.raises(ValueError, match="without scale"):
        model.enable_ascend_compile(fusions="all", executor="eager")
