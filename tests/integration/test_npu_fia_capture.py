"""Graph capture on a simulated Ascend host with ``npu_fia`` attention: CONTRACT tests, not hardware.

`simulated_npu` (tests/simulated_npu.py) stands in for torch_npu (FIA, npu_fusion_attention and
the fused ops, with their documented schemas and semantics) and for ``torch.npu.NPUGraph`` /
``torch.npu.graph`` (capture records the ops and poisons their results, replay re-runs them), on
the CPU. Under it, tiny Flux, Wan and Qwen-Image pipelines run ``enable_ascend_compile()`` with
``graph_capture="graph_with_compile"`` and ``attention="auto"`` (which resolves to ``npu_fia``):
every block is captured and replayed, and the images equal the eager pipeline's. On a 910B:
tests/compilation/test_graph_capture_npu.py.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import diffusers_ascend
from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline, tiny_wan_pipeline, wan_pipeline_inputs

BF16 = torch.bfloat16
TOL = dict(atol=5e-2, rtol=5e-2)  # 2 bf16 denoising steps through a VAE, as test_composition.py
FIA = "npu_fused_infer_attention_score_v2"


def tiny_qwenimage_pipeline(dtype=BF16):
    """A `QwenImagePipeline` with a tiny transformer and VAE (diffusers' own test sizes, head dim
    16) and no text encoder (pass ``prompt_embeds``)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    ).eval()
    vae = AutoencoderKLQwenImage(
        base_dim=24,
        z_dim=4,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).eval()
    pipe = QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None, tokenizer=None, transformer=transformer
    )
    return pipe.to(dtype)


def qwenimage_pipeline_inputs(dtype=BF16):
    g = torch.Generator().manual_seed(0)
    return dict(
        prompt_embeds=torch.randn(1, 8, 16, generator=g).to(dtype),
        prompt_embeds_mask=torch.ones(1, 8, dtype=torch.long),
        height=32,
        width=32,
        num_inference_steps=2,
        true_cfg_scale=1.0,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
    )


PIPELINES = {
    "flux": (lambda: tiny_flux_pipeline(dtype=BF16), lambda: flux_pipeline_inputs(dtype=BF16), "images"),
    # head dim 16: FIA's D must be a multiple of 16 (the default tiny Wan has 12)
    "wan": (
        lambda: tiny_wan_pipeline(dtype=BF16, attention_head_dim=16),
        lambda: wan_pipeline_inputs(dtype=BF16),
        "frames",
    ),
    "qwenimage": (tiny_qwenimage_pipeline, qwenimage_pipeline_inputs, "images"),
}


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_fia_capture_replays_equal_eager(simulated_npu, fresh_dynamo, kind):
    build, inputs, attr = PIPELINES[kind]
    eager = diffusers_ascend.enable_ascend_compile(build(), compile="none", fusions="none", attention="npu_fia")
    ref = getattr(eager(**inputs()), attr)
    pipe = build()
    pipe.enable_ascend_compile(graph_capture="graph_with_compile")  # attention="auto", executor="auto" (eager on NPU)
    out = getattr(pipe(**inputs()), attr)
    torch.testing.assert_close(out.float(), ref.float(), **TOL)
    transformer = pipe.transformer
    procs = diffusers_ascend.attention.processors(transformer)
    assert {p._attention_backend.value for p in procs} == {"npu_fia"}
    stats = transformer._ascend_state.backend.graph_capture.stats
    n_blocks = len(transformer._ascend_state.compiled)
    assert stats["captures"] >= n_blocks and stats["replays"] > stats["captures"]
    assert not pipe.ascend_report().fallbacks
    names = simulated_npu.torch_npu.names()
    assert FIA in names and "npu_fusion_attention" not in names
    captures = stats["captures"]
    again = getattr(pipe(**inputs()), attr)  # same shapes: replays only
    torch.testing.assert_close(again.float(), out.float(), atol=0, rtol=0)
    assert stats["captures"] == captures


def test_fia_capture_refuses_native_npu(simulated_npu):
    with pytest.raises(ValueError, match="npu_fusion_attention.*attention='auto' or 'npu_fia'"):
        diffusers_ascend.enable_ascend_compile(
            tiny_flux_pipeline(dtype=BF16), attention="_native_npu", graph_capture="graph_with_compile"
        )


@pytest.mark.parametrize(
    "dtype, overrides, path",
    [
        (torch.float32, {}, "sdpa"),
        (torch.bfloat16, dict(attention_head_dim=24, axes_dims_rope=[8, 8, 8]), "npu_fusion_attention"),
    ],
    ids=["fp32", "bf16_head_dim_24"],
)
def test_fia_out_of_contract_falls_back_exactly_under_capture(simulated_npu, fresh_dynamo, dtype, overrides, path):
    """Calls outside FIA's limits fall back, equal to eager, and the report says why. The graph
    holding npu_fusion_attention (documented as not capturable) runs uncaptured, the rest of the
    block (the fallback's count is a graph break) is captured; an SDPA fallback is captured (on a
    910B, whether torch_npu's SDPA kernel captures is to be settled there: a capture that fails
    runs uncaptured, with a warning)."""
    pipe = tiny_flux_pipeline(dtype=dtype, **overrides)
    ref = pipe(**flux_pipeline_inputs(dtype=dtype)).images
    pipe.enable_ascend_compile(graph_capture="graph_with_compile", attention="npu_fia")  # "auto": fp32 -> native
    with contextlib.ExitStack() as stack:
        if path == "npu_fusion_attention":
            stack.enter_context(pytest.warns(UserWarning, match="runs without graph capture.*npu_fusion_attention"))
        out = pipe(**flux_pipeline_inputs(dtype=dtype)).images
    torch.testing.assert_close(
        out.float(), ref.float(), **(TOL if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4))
    )
    reasons = [f["reason"] for f in pipe.ascend_report().fallbacks]
    why = "dtype torch.float32" if dtype == torch.float32 else "multiple of 16"
    assert any("call(s) fell back: " in r and why in r and r.endswith(f"-> {path}") for r in reasons), reasons
    assert pipe.transformer._ascend_state.backend.graph_capture.stats["captures"] > 0
    assert any("not captured" in r and "npu_fusion_attention" in r for r in reasons) == (path == "npu_fusion_attention")


@pytest.mark.parametrize("aclnn_rms_norm", [True, False], ids=["aclnn", "acl_op"])
def test_fia_capture_routes_acl_op_fused_ops_to_native(monkeypatch, fresh_dynamo, aclnn_rms_norm):
    """Without aclnnRmsNorm in CANN, npu_rms_norm takes its acl_op kernel, which NPU graphs cannot
    capture: inside the captured graphs rms_norm runs its native composite instead."""
    from tests.kernels.npu_standins import ALL_ACLNN
    from tests.simulated_npu import simulated_npu_host

    aclnn = ALL_ACLNN if aclnn_rms_norm else ALL_ACLNN - {"aclnnRmsNorm"}
    with simulated_npu_host(monkeypatch, aclnn=aclnn) as host:
        build, inputs, attr = PIPELINES["flux"]
        ref = getattr(build()(**inputs()), attr)
        pipe = build()
        pipe.enable_ascend_compile(graph_capture="graph_with_compile", fusions=["rms_norm"])
        out = getattr(pipe(**inputs()), attr)
        torch.testing.assert_close(out.float(), ref.float(), **TOL)
        assert pipe.ascend_report().swaps == {"rms_norm": 6} and not pipe.ascend_report().fallbacks
        assert pipe.transformer._ascend_state.backend.graph_capture.stats["captures"] >= 2
        assert ("npu_rms_norm" in host.torch_npu.names()) == aclnn_rms_norm


def test_fia_capture_refused_with_jit_compile(monkeypatch, fresh_dynamo):
    from tests.simulated_npu import simulated_npu_host

    with simulated_npu_host(monkeypatch, jit_compile=True):
        build, inputs, attr = PIPELINES["flux"]
        pipe = build()
        pipe.enable_ascend_compile(graph_capture="graph_with_compile", fusions="none")
        with pytest.warns(UserWarning, match="jit_compile=True"):
            pipe(**inputs())
        assert pipe.transformer._ascend_state.backend.graph_capture.stats["captures"] == 0
        assert all("jit_compile=True" in f["reason"] for f in pipe.ascend_report().fallbacks)
