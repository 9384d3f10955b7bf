"""`diffusers_ascend.integration.enabled_models`: the public, read-only view of what enabling set
up, which the CLI and the benchmarks read instead of the private record on each model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import diffusers_ascend
from diffusers_ascend import AscendConfig, AscendWarning
from diffusers_ascend.integration import EnabledModelInfo, enabled_models
from diffusers_ascend.tiny import flux_model_inputs, tiny_flux_transformer, tiny_wan_pipeline


def test_a_pipeline_lists_each_enabled_transformer_by_component_name():
    pipe = tiny_wan_pipeline(two_stage=True)
    assert enabled_models(pipe) == []
    cfg = AscendConfig(fusions=["rms_norm"], executor="eager")
    diffusers_ascend.enable_ascend_compile(pipe, cfg)
    infos = enabled_models(pipe)
    assert [i.name for i in infos] == ["transformer", "transformer_2"]
    assert [i.model for i in infos] == [pipe.transformer, pipe.transformer_2]
    for info in infos:
        assert isinstance(info, EnabledModelInfo) and info.config == cfg and info.executor == "eager"
        assert info.block_classes == ("WanTransformerBlock",) and len(info.compiled) == 2
        assert all(type(m).__name__ == "WanTransformerBlock" for m in info.compiled)
        assert dict(info.signatures) == {} and dict(info.packages) == {}  # not called yet
        assert info.captured_graphs is None and info.capture_stats is None
    diffusers_ascend.disable_ascend_compile(pipe)
    assert enabled_models(pipe) == []


def test_views_are_read_only_snapshots():
    torch._dynamo.reset()
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    diffusers_ascend.enable_ascend_compile(model, fusions=["adaln"], executor="eager")
    with torch.no_grad():
        model(**flux_model_inputs(config=dict(model.config)))
    (info,) = enabled_models(model)
    assert info.name == "" and info.model is model
    # Each compiled block class recorded the signature of the call that compiled its graph.
    assert dict(info.signatures) == {"FluxTransformerBlock": 1, "FluxSingleTransformerBlock": 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.config = AscendConfig()
    with pytest.raises(TypeError):
        info.signatures["FluxTransformerBlock"] = 0
    diffusers_ascend.enable_ascend_compile(model, fusions="none", compile="none")
    (again,) = enabled_models(model)
    assert (again.executor, again.compiled, again.block_classes) == (None, (), ())
    assert info.config.fusions == ("adaln",) and len(info.compiled) == 2  # the earlier snapshot is unchanged


def test_a_model_inside_a_torch_compile_wrapper_is_seen_unwrapped():
    model = tiny_flux_transformer()
    wrapped = torch.compile(model)
    outer = r"^diffusers-ascend: FluxTransformer2DModel: it runs inside a torch.compile\(model\) wrapper"
    with pytest.warns(AscendWarning, match=outer):
        diffusers_ascend.enable_ascend_compile(wrapped, fusions="none", executor="eager")
    (info,) = enabled_models(wrapped)
    assert info.model is model and info.name == ""
