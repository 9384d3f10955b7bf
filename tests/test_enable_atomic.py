"""`enable_ascend_compile` is all-or-nothing: a failure at any step leaves the pipeline computing
exactly as before, with no fused class, compiled block, attention backend or config key left
behind, and torch's process-wide dynamo/Inductor config identical to what it was.

Failures are injected where real ones happen (a fused class that cannot be built, a block whose
compile setup raises, an attention backend that fails half-way, the pipeline's config update):
real tiny Flux pipelines, real swaps and compiles up to the injected point.
"""

from __future__ import annotations

import pytest
import torch

import diffusers_ascend
from diffusers_ascend import layers
from diffusers_ascend.adapters import registry
from diffusers_ascend.compilation import _compat
from diffusers_ascend.integration import api
from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline

FAST = dict(fusions="all", executor="eager")
# What enabling tiny Flux holds dynamo's recompile limit at: 8 per block class, +1 per block where
# dynamo compiles each block instance (torch < 2.8).
FLUX_LIMIT = 16 + (0 if _compat.compiled_blocks_share_graphs() else 2)


def _torch_config():
    import torch._inductor.config as inductor_config

    return torch._dynamo.config.get_config_copy(), inductor_config.get_config_copy()


def _run(pipe):
    with torch.no_grad():
        return pipe(**flux_pipeline_inputs()).images


def _classes(model) -> list[str]:
    out = []
    for m in model.modules():
        out.append(type(m).__module__)
        proc = getattr(m, "processor", None)
        if proc is not None:
            out.append(type(proc).__module__)
    return out


def _assert_untouched(pipe, ref, config_before):
    model = pipe.transformer
    assert not any(name.startswith("diffusers_ascend") for name in _classes(model))  # no fused class left
    assert all(m._compiled_call_impl is None for m in model.modules())
    assert getattr(model, "_ascend_state", None) is None and "_ascend_config" not in model.config
    assert "_ascend_config" not in pipe.config and pipe.ascend_report() is None
    assert _torch_config() == config_before
    assert torch.equal(_run(pipe), ref)  # computes exactly as eager


@pytest.fixture
def pipe():
    torch._dynamo.reset()
    p = tiny_flux_pipeline()
    p.set_progress_bar_config(disable=True)
    yield p
    torch._dynamo.reset()


@pytest.fixture
def low_limit():
    # A limit below what a Flux enable asks for (16), so a failed enable would visibly leave it raised.
    import gc

    gc.collect()  # models enabled by earlier tests and dropped in reference cycles hold the limit until collected
    with torch._dynamo.config.patch(**{_compat._recompile_limit_name(): 4}):  # 2.6: cache_size_limit
        yield


def test_failure_inside_the_layer_swaps(pipe, monkeypatch, low_limit):
    ref, before = _run(pipe), _torch_config()

    seen = []

    def second_processor_fails(proc):
        seen.append(proc)
        if len(seen) == 2:
            raise TypeError("__class__ assignment: object layout differs")
        return True

    # The single block's processor fails after the double block's RMSNorm, GELU and processor
    # swaps were made.
    flux_swaps = registry.adapter_swaps()
    monkeypatch.setattr(
        registry,
        "adapter_swaps",
        lambda: tuple(
            layers.Swap(s.fusion, s.source, s.target, applies=second_processor_fails)
            if s.source == "FluxAttnProcessor"
            else s
            for s in flux_swaps
        ),
    )
    with pytest.raises(TypeError, match="layout differs"):
        pipe.enable_ascend_compile(**FAST)
    assert len(seen) == 2
    _assert_untouched(pipe, ref, before)
    pipe.disable_ascend_compile()  # still a no-op
    _assert_untouched(pipe, ref, before)


def test_apply_swaps_undoes_itself():
    from diffusers_ascend.tiny import tiny_flux_transformer

    model = tiny_flux_transformer()
    calls = []

    def flaky(obj):
        calls.append(obj)
        if len(calls) == 4:
            raise RuntimeError("boom")
        return isinstance(obj, torch.nn.RMSNorm)

    swaps = (layers.Swap("rms_norm", "RMSNorm", lambda: layers.FusedRMSNorm, applies=flaky),)
    orig = layers.SWAPS
    layers.SWAPS = swaps
    try:
        with pytest.raises(RuntimeError, match="boom"):
            layers.apply_swaps(model, ["rms_norm"])
    finally:
        layers.SWAPS = orig
    assert len(calls) == 4 and not any(isinstance(m, layers.FusedRMSNorm) for m in model.modules())


def test_failure_after_the_recompile_limit_was_raised(pipe, monkeypatch, low_limit):
    ref, before = _run(pipe), _torch_config()
    real = api.compile_in_place
    compiled = []

    def second_block_fails(module, name, state, cfg, **kwargs):
        assert _compat.dynamo_recompile_limit() == FLUX_LIMIT  # raised by now
        if compiled:
            raise RuntimeError("compile setup failed")
        real(module, name, state, cfg, **kwargs)
        compiled.append(module)

    monkeypatch.setattr(api, "compile_in_place", second_block_fails)
    with pytest.raises(RuntimeError, match="compile setup failed"):
        pipe.enable_ascend_compile(**FAST)
    assert compiled  # one block had been compiled in place
    _assert_untouched(pipe, ref, before)


def test_failure_setting_the_attention_backend(pipe, monkeypatch, low_limit):
    ref, before = _run(pipe), _torch_config()
    model = pipe.transformer
    procs = [m.processor for m in model.modules() if hasattr(m, "processor")]
    backends = [p._attention_backend for p in procs]

    def unavailable(backend):
        raise ValueError("backend not available")

    # diffusers' requirement check, which enable runs before it sets the backend on the processors
    monkeypatch.setattr("diffusers.models.attention_dispatch._check_attention_backend_requirements", unavailable)
    with pytest.raises(ValueError, match="backend not available"):
        pipe.enable_ascend_compile(attention="native", **FAST)
    assert [p._attention_backend for p in procs] == backends
    monkeypatch.undo()
    _assert_untouched(pipe, ref, before)


def test_failure_registering_the_pipeline_config(pipe, monkeypatch, low_limit):
    ref, before = _run(pipe), _torch_config()

    def refuse(**kwargs):
        raise RuntimeError("config is read-only")

    monkeypatch.setattr(pipe, "register_to_config", refuse)
    with pytest.raises(RuntimeError, match="read-only"):
        pipe.enable_ascend_compile(**FAST)
    monkeypatch.undo()
    _assert_untouched(pipe, ref, before)


def test_failed_reenable_keeps_the_previous_setup(pipe, monkeypatch, low_limit):
    ref = _run(pipe)
    pipe.enable_ascend_compile(fusions=["rms_norm"], executor="eager")
    first = pipe.transformer._ascend_state.config
    enabled_config = _torch_config()
    assert _compat.dynamo_recompile_limit() == FLUX_LIMIT

    def broken():
        raise ImportError("no rope today")

    swaps = registry.adapter_swaps()  # the rope swaps are the adapters' (Flux's processor)
    monkeypatch.setattr(
        registry,
        "adapter_swaps",
        lambda: tuple(layers.Swap(s.fusion, s.source, broken) if s.fusion == "rope" else s for s in swaps),
    )
    with pytest.raises(ImportError, match="no rope today"):
        pipe.enable_ascend_compile(fusions=["rms_norm", "rope"], executor="eager", recompile_limit=32)
    assert pipe.transformer._ascend_state.config == first and pipe.ascend_report().swaps == {"rms_norm": 6}
    assert _torch_config() == enabled_config  # 16 again, not 32
    out = _run(pipe)
    assert (out - ref).abs().max() < 1e-5
    diffusers_ascend.disable_ascend_compile(pipe)
    assert _compat.dynamo_recompile_limit() == 4
