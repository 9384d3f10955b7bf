"""freezing=True: parameters folded into the fused graph as constants (inference only), standalone
under `torch._inductor.config.patch(freezing=True)` and through `enable_ascend_compile(compile="model")`."""

from __future__ import annotations

import pytest
import torch

from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.tiny import flux_block_inputs, flux_pipeline_inputs, tiny_flux_blocks, tiny_flux_pipeline

from .conftest import EXPECTED_BLOCK_COUNTS, assert_close


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("executor", ["eager", "inductor"])
def test_frozen_block_fuses_and_matches_eager(executor, dtype):
    double, _ = tiny_flux_blocks(dtype=dtype)
    inputs = flux_block_inputs(dtype=dtype)
    backend = AscendBackend(fusions="all", executor=executor, freezing=True)
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        out = torch.compile(double, backend=backend)(**inputs)
    with torch.no_grad():
        ref = double(**inputs)
    assert backend.report.matches == EXPECTED_BLOCK_COUNTS["flux_double"]
    # Every parameter of the block became a constant of the graph.
    assert backend.report.graphs[0]["frozen_params"] == len(list(double.parameters()))
    if executor == "eager":
        assert len(backend.report.graphs[0]["bound_providers"]) == 16
    for o, r in zip(out, ref):
        assert_close(o, r, dtype)


def test_without_the_dynamo_flag_it_raises_instead_of_not_freezing():
    double, _ = tiny_flux_blocks()
    backend = AscendBackend(fusions="all", executor="eager", freezing=True)
    with pytest.raises(Exception, match=r"without torch._inductor.config.freezing.*compile='model', freezing=True"):
        with torch.no_grad():
            torch.compile(double, backend=backend)(**flux_block_inputs())


def test_freezing_is_inference_only():
    lin = torch.nn.Linear(8, 8)
    backend = AscendBackend(fusions="all", executor="eager", freezing=True)
    with pytest.raises(Exception, match="inference-only"), torch._inductor.config.patch(freezing=True):
        torch.compile(lin, backend=backend)(torch.randn(2, 8, requires_grad=True))


@pytest.mark.parametrize("executor", ["eager", "inductor"])
def test_pipeline_compile_model_frozen(executor):
    pipe = tiny_flux_pipeline()
    ref = pipe(**flux_pipeline_inputs()).images
    sd = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    pipe.enable_ascend_compile(compile="model", freezing=True, fusions="all", executor=executor)
    out = pipe(**flux_pipeline_inputs()).images
    assert_close(out, ref, torch.float32)
    report = pipe.ascend_report()
    assert not report.fallbacks and report.graphs_compiled == 1
    assert report.graphs[0]["frozen_params"] > 0
    import torch._inductor.config as inductor_config

    assert inductor_config.freezing is False  # set around the pipeline's own calls only
    pipe.disable_ascend_compile()
    assert all(torch.equal(sd[k], v) for k, v in pipe.transformer.state_dict().items())  # weights kept


def test_pipeline_freezing_with_blocks_is_refused_before_any_change():
    pipe = tiny_flux_pipeline()
    with pytest.raises(ValueError, match="freezing=True needs compile='model'"):
        pipe.enable_ascend_compile(freezing=True)
    assert not hasattr(pipe.transformer, "_ascend_state")
