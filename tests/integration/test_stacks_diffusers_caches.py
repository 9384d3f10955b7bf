"""diffusers' own step caches (``model.enable_cache(...)``: FirstBlockCache, TaylorSeer, MagCache,
FasterCache, Pyramid Attention Broadcast) with ``enable_ascend_compile``, as their users run them:
the cache applied on the transformer, our compile enabled on the pipeline. Each: the fusions it lets
run are made (exact counts), no fallback, and the images equal the same cache without us.

MagCache runs each block's forward under ``torch.compiler.disable``: before, dynamo compiled no
graph there (a reported fallback); now our compile sits below its hook (its skip decisions eager,
the block's forward compiled), see ``integration.block_compile.compile_in_place``.
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernels.testing import assert_close
from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline, tiny_wan_pipeline, wan_pipeline_inputs

FAST = dict(fusions="all", executor="eager")
STEPS = 4
# Per model: the swaps made at enable and the graph matches of its blocks (the same with every cache
# here: each cache lets every block run at some step, and its graphs hold the same patterns).
FLUX = ({"rope": 2, "rms_norm": 6, "gelu_tanh": 3}, {"adaln": 5, "mul_add": 5})
WAN = ({"gelu_tanh": 3, "rope": 4, "rms_norm": 8}, {"adaln": 2, "mul_add": 2})


def _config(kind: str, pipe):
    from diffusers.hooks import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        MagCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )

    if kind == "first_block":
        return FirstBlockCacheConfig(threshold=1.0)
    if kind == "taylorseer":
        return TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=1, taylor_factors_dtype=torch.float32)
    if kind == "mag":
        return MagCacheConfig(mag_ratios=[1.0] * STEPS, num_inference_steps=STEPS)
    # diffusers' own Flux pipeline tests configure these two the same way.
    if kind == "faster":
        return FasterCacheConfig(
            spatial_attention_block_skip_range=2,
            spatial_attention_timestep_skip_range=(-1, 901),
            unconditional_batch_skip_range=2,
            attention_weight_callback=lambda _: 0.5,
            is_guidance_distilled=True,
            current_timestep_callback=lambda: pipe.current_timestep,
        )
    assert kind == "pab"
    return PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(-1, 901),
        current_timestep_callback=lambda: pipe.current_timestep,
    )


def _run(model: str, pipe):
    if model == "wan":
        return pipe(**wan_pipeline_inputs(steps=STEPS)).frames
    return pipe(**flux_pipeline_inputs(steps=STEPS)).images


def _cached(model: str, kind: str):
    pipe = tiny_wan_pipeline() if model == "wan" else tiny_flux_pipeline()
    pipe.transformer.enable_cache(_config(kind, pipe))
    return pipe


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


CASES = [
    ("flux", "first_block"),
    ("flux", "taylorseer"),
    ("flux", "mag"),
    ("flux", "faster"),
    ("flux", "pab"),
    ("wan", "mag"),
]


@pytest.mark.parametrize("model,kind", CASES, ids=[f"{m}-{k}" for m, k in CASES])
def test_cache_then_enable_is_fused_and_equals_the_cache_alone(model, kind):
    plain = tiny_wan_pipeline() if model == "wan" else tiny_flux_pipeline()
    uncached = _run(model, plain)
    ref = _run(model, _cached(model, kind))
    assert (ref - uncached).abs().max() > 1e-5  # the cache changed the result: it reused something
    pipe = _cached(model, kind)
    pipe.enable_ascend_compile(**FAST)
    out = _run(model, pipe)
    report = pipe.ascend_report()
    swaps, matches = WAN if model == "wan" else FLUX
    if kind == "first_block":
        # FBC's head hook runs the first (double) block in dynamo and breaks the graph at its
        # disabled residual check: that block's 4 + 4 are in a second graph too (3 graphs).
        matches = {"adaln": 5 + 4, "mul_add": 5 + 4}
    assert not report.fallbacks
    assert report.swaps == swaps
    assert {f: n for f, n in report.matches.items() if n} == matches
    assert report.graphs_compiled >= 1
    assert_close(out, ref, dtype=torch.float32)


@pytest.mark.parametrize("order", ["cache_first", "enable_first"])
def test_mag_cache_blocks_compile_below_its_hook_and_disable_restores_it(order):
    """MagCache's block hooks call the block's forward with dynamo disabled: our compiled forward
    takes that call (hooks applied before or after enabling); disabling points them back."""
    ref = _run("flux", _cached("flux", "mag"))
    pipe = tiny_flux_pipeline()
    if order == "cache_first":
        pipe.transformer.enable_cache(_config("mag", pipe))
    pipe.enable_ascend_compile(**FAST)
    if order == "enable_first":
        pipe.transformer.enable_cache(_config("mag", pipe))
    out = _run("flux", pipe)
    report = pipe.ascend_report()
    assert not report.fallbacks
    assert report.graphs_compiled == 2  # one per block class, below the hooks
    assert {f: n for f, n in report.matches.items() if n} == FLUX[1]
    assert_close(out, ref, dtype=torch.float32)
    blocks = [*pipe.transformer.transformer_blocks, *pipe.transformer.single_transformer_blocks]
    pipe.disable_ascend_compile()
    inner = [h.fn_ref.original_forward for b in blocks for h in b._diffusers_hook.hooks.values()]
    assert not any(hasattr(f, "_ascend_block") for f in inner)  # none of ours left in a hook
    own = [f for f in inner if getattr(f, "__func__", None) is type(getattr(f, "__self__", None)).forward]
    assert [f.__self__ for f in own] == blocks  # each block's innermost hook calls its own forward again
    assert_close(_run("flux", pipe), ref, dtype=torch.float32)
