"""enable_ascend_compile composed with what diffusers users combine it with: model CPU offload, group
offloading, first block cache, LoRA loaded after enabling, `.to(dtype)`; two pipelines with two
configs in one process; resolutions changing without recompiles; compile="model"; the Hub offline."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ascend_kernels.testing import assert_close
from diffusers_ascend.compilation import _compat
from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline

FAST = dict(fusions="all", executor="eager")


def _run(pipe, **kw):
    return pipe(**flux_pipeline_inputs(**kw)).images


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_two_pipelines_two_configs_one_process():
    a, b = tiny_flux_pipeline(), tiny_flux_pipeline()
    ref = _run(a)
    a.enable_ascend_compile(fusions=["rms_norm"], executor="eager")
    b.enable_ascend_compile(fusions=["adaln", "mul_add"], executor="eager")
    out_a, out_b = _run(a), _run(b)
    ra, rb = a.ascend_report(), b.ascend_report()
    assert ra.swaps == {"rms_norm": 6} and {f: n for f, n in ra.matches.items() if n} == {}
    # Without the rope fusion, each unfused rope's `x * cos + rot(x) * sin` is a mul_add too:
    # 5 gates/residuals + 2 ropes in each of the 2 blocks.
    assert rb.swaps == {} and {f: n for f, n in rb.matches.items() if n} == {"adaln": 5, "mul_add": 5 + 4}
    assert_close(out_a, ref, dtype=torch.float32)
    assert_close(out_b, ref, dtype=torch.float32)
    # Disabling one leaves the other as it was.
    a.disable_ascend_compile()
    assert b.transformer._ascend_state.config.fusions == ("adaln", "mul_add")
    assert type(b.transformer.transformer_blocks[0].attn.norm_q).__name__ == "RMSNorm"


def test_three_resolutions_do_not_recompile_once_dynamic():
    pipe = tiny_flux_pipeline()
    refs = {hw: _run(pipe, height=hw, width=hw) for hw in (16, 24, 32)}
    pipe.enable_ascend_compile(**FAST)
    compiled = []
    for hw in (16, 24, 32):
        assert_close(_run(pipe, height=hw, width=hw), refs[hw], dtype=torch.float32)
        compiled.append(pipe.ascend_report().graphs_compiled)
    # 16: one static graph per block class; 24: the sequence length changed, so dynamo marks it
    # dynamic and compiles once more per block class; 32: served by the dynamic graphs.
    assert compiled == [2, 4, 4]


def test_compile_model_whole_transformer():
    pipe = tiny_flux_pipeline()
    ref = _run(pipe)
    pipe.enable_ascend_compile(compile="model", **FAST)
    assert_close(_run(pipe), ref, dtype=torch.float32)
    report = pipe.ascend_report()
    assert pipe.transformer._compiled_call_impl is not None and report.graphs_compiled >= 1
    # The blocks' 5 + 5, plus the final `norm_out` (AdaLayerNormContinuous, adds 1 to the scale
    # before unsqueezing it): one more adaLN.
    assert {f: n for f, n in report.matches.items() if n} == {"adaln": 5 + 1, "mul_add": 5}
    pipe.disable_ascend_compile()
    assert pipe.transformer._compiled_call_impl is None


def test_unresolvable_hub_id_offline_changes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    pipe = tiny_flux_pipeline()
    with pytest.raises(OSError, match="no-such-user/no-such-config"):
        pipe.enable_ascend_compile("no-such-user/no-such-config")
    assert not hasattr(pipe.transformer, "_ascend_state")


def test_to_dtype_after_enabling():
    pipe = tiny_flux_pipeline()
    pipe.enable_ascend_compile(**FAST)
    pipe.to(torch.bfloat16)
    out = _run(pipe, dtype=torch.bfloat16)
    eager = tiny_flux_pipeline().to(torch.bfloat16)
    ref = _run(eager, dtype=torch.bfloat16)
    assert out.dtype == ref.dtype
    # Images pass through a VAE and a clamp: compare with the bf16 block tolerance, loosened for
    # 2 denoising steps of accumulated bf16 rounding.
    torch.testing.assert_close(out, ref, atol=5e-2, rtol=5e-2)
    assert not pipe.ascend_report().fallbacks


def test_model_cpu_offload_then_enable():
    pipe = tiny_flux_pipeline()
    ref = _run(pipe)
    pipe.enable_model_cpu_offload(device="cpu")
    pipe.enable_ascend_compile(**FAST)
    assert_close(_run(pipe), ref, dtype=torch.float32)
    assert not pipe.ascend_report().fallbacks
    assert hasattr(pipe.transformer, "_hf_hook")  # accelerate's offload hook untouched


def test_group_offload_then_enable():
    pipe = tiny_flux_pipeline()
    ref = _run(pipe)
    pipe.transformer.enable_group_offload(
        onload_device=torch.device("cpu"),
        offload_device=torch.device("cpu"),
        offload_type="block_level",
        num_blocks_per_group=1,
    )
    pipe.enable_ascend_compile(**FAST)
    assert_close(_run(pipe), ref, dtype=torch.float32)
    assert not pipe.ascend_report().fallbacks


def test_first_block_cache_with_enable():
    from diffusers.hooks import FirstBlockCacheConfig

    pipe, eager = tiny_flux_pipeline(), tiny_flux_pipeline()
    for p in (pipe, eager):
        p.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    ref = _run(eager, steps=3)
    pipe.enable_ascend_compile(**FAST)
    assert_close(_run(pipe, steps=3), ref, dtype=torch.float32)
    assert not pipe.ascend_report().fallbacks


def _lora_dir(tmp_path):
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    donor = tiny_flux_pipeline(seed=1)
    donor.transformer.add_adapter(
        LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v"], init_lora_weights=False)
    )
    layers = get_peft_model_state_dict(donor.transformer)
    type(donor).save_lora_weights(tmp_path, transformer_lora_layers=layers)
    return tmp_path


def test_load_lora_after_enable(tmp_path):
    lora = _lora_dir(tmp_path)
    eager = tiny_flux_pipeline()
    base = _run(eager)
    eager.load_lora_weights(lora)
    ref = _run(eager)
    assert (ref - base).abs().max() > 1e-3  # the LoRA changes the output
    pipe = tiny_flux_pipeline()
    pipe.enable_ascend_compile(**FAST)
    _run(pipe)
    pipe.load_lora_weights(lora)
    assert_close(_run(pipe), ref, dtype=torch.float32)
    assert not pipe.ascend_report().fallbacks


def test_recompile_limit_raised_per_block_class():
    import gc

    import torch._dynamo.config as dc

    limit = _compat.dynamo_recompile_limit  # 2.6 names it cache_size_limit
    # Flux: double + single block classes, 8 each (+1 per block where dynamo compiles each instance)
    flux = 16 + (0 if _compat.compiled_blocks_share_graphs() else 2)
    gc.collect()  # models enabled by earlier tests and dropped in reference cycles hold the limit until collected
    with dc.patch(**{_compat._recompile_limit_name(): 8}):  # restores dynamo's value afterwards (monkeypatch cannot)
        a = tiny_flux_pipeline().enable_ascend_compile(**FAST)
        assert limit() == flux
        b = tiny_flux_pipeline().enable_ascend_compile(recompile_limit=40, **FAST)
        assert limit() == 40
        c = tiny_flux_pipeline().enable_ascend_compile(recompile_limit=10, **FAST)
        assert limit() == 40  # never lowered below what an enabled model holds
        b.disable_ascend_compile()
        assert limit() == flux  # the largest remaining hold (a)
        a.disable_ascend_compile()
        c.disable_ascend_compile()
        assert limit() == 8  # the value before the first enable


def test_recompile_limit_set_by_the_user_meanwhile_is_kept():
    import gc

    import torch._dynamo.config as dc

    limit = _compat.dynamo_recompile_limit  # 2.6 names it cache_size_limit
    gc.collect()
    with dc.patch(**{_compat._recompile_limit_name(): 8}):
        pipe = tiny_flux_pipeline().enable_ascend_compile(**FAST)
        assert limit() > 8
        _compat.set_dynamo_recompile_limit(100)  # the user's own setting: never overwritten on disable
        pipe.disable_ascend_compile()
        assert limit() == 100
        pipe.enable_ascend_compile(**FAST)
        assert limit() == 100  # already high enough: left alone
        pipe.disable_ascend_compile()
        assert limit() == 100


def test_config_only_hub_repo_accelerates_a_pipeline_offline(monkeypatch, tmp_path):
    import huggingface_hub.constants as c

    from diffusers_ascend import AscendConfig
    from tests.test_hub import fake_hub_cache

    shared = AscendConfig(fusions=["rms_norm", "adaln"], compile="none")
    fake_hub_cache(tmp_path, "someone/flux-ascend", shared)
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    pipe = tiny_flux_pipeline()
    pipe.enable_ascend_compile("someone/flux-ascend")
    assert pipe.transformer._ascend_state.config == shared
    assert pipe.ascend_report().swaps == {"rms_norm": 6}


# -- compositions that lose fusion: a warning and a report entry, never silence ------------------
class _CountAscendOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ``ascend_kernels`` ops an eager (uncompiled) call dispatches."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("ascend_kernels::"):
            op = name.split("::")[1].split(".")[0]
            self.counts[op] = self.counts.get(op, 0) + 1
        return func(*args, **(kwargs or {}))


LEAF_SWAPS = {"flux": {"rope": 2, "rms_norm": 6, "gelu_tanh": 3}, "wan": {"gelu_tanh": 3, "rope": 4, "rms_norm": 8}}


@pytest.mark.parametrize("model", ["flux", "wan"])
def test_leaf_level_group_offload_before_enable_swaps_under_its_hooks(model):
    """Leaf-level offloading puts diffusers' hook dispatcher in each leaf's ``forward``, which calls
    the class's forward bound at hooking time: a class swap alone never ran (6 RMSNorm swaps on Flux
    lost and reported before). The swap now re-points the hook's call at the fused class's forward:
    the hooks still move the parameters, our fused layers run inside them."""
    from diffusers_ascend.tiny import tiny_wan_pipeline, wan_pipeline_inputs

    make, inputs, images = (
        (tiny_wan_pipeline, wan_pipeline_inputs, lambda o: o.frames)
        if model == "wan"
        else (tiny_flux_pipeline, flux_pipeline_inputs, lambda o: o.images)
    )
    pipe = make()
    ref = images(pipe(**inputs()))
    pipe.transformer.enable_group_offload(
        onload_device=torch.device("cpu"), offload_device=torch.device("cpu"), offload_type="leaf_level"
    )
    pipe.enable_ascend_compile(fusions="all", compile="none")
    report = pipe.ascend_report()
    assert not report.fallbacks
    assert report.swaps == LEAF_SWAPS[model]
    with _CountAscendOps() as ops:
        out = images(pipe(**inputs()))
    steps = 2
    assert ops.counts["rms_norm"] == LEAF_SWAPS[model]["rms_norm"] * steps  # each swapped norm ran, each step
    assert_close(out, ref, dtype=torch.float32)
    norm = next(m for m in pipe.transformer.modules() if type(m).__name__ == "FusedRMSNorm")
    pipe.disable_ascend_compile()
    assert type(norm).__name__ == "RMSNorm"
    # the hook calls the stock forward again
    refs = [h.fn_ref.forward for h in norm._diffusers_hook.hooks.values()]
    assert any(getattr(f, "__func__", None) is type(norm).forward for f in refs)
    assert_close(images(pipe(**inputs())), ref, dtype=torch.float32)


def test_leaf_level_group_offload_then_enable_compiles_blocks():
    pipe = tiny_flux_pipeline()
    ref = _run(pipe)
    pipe.transformer.enable_group_offload(
        onload_device=torch.device("cpu"), offload_device=torch.device("cpu"), offload_type="leaf_level"
    )
    pipe.enable_ascend_compile(**FAST)
    out = _run(pipe)
    report = pipe.ascend_report()
    assert not report.fallbacks
    assert report.swaps == LEAF_SWAPS["flux"]
    # The offload hooks' onload/offload are dynamo-disabled: graphs break at each leaf, the block
    # patterns still match within them.
    assert {f: n for f, n in report.matches.items() if n} == {"adaln": 5, "mul_add": 5}
    assert_close(out, ref, dtype=torch.float32)


def test_an_instance_forward_that_is_not_a_diffusers_hook_keeps_the_module_and_says_so():
    """A ``forward`` set on the instance by other code (not diffusers' hook dispatcher, which a swap
    can re-point): the class swap would never run, so it is left out and reported."""
    import functools

    pipe = tiny_flux_pipeline()
    ref = _run(pipe)
    for m in pipe.transformer.modules():
        if type(m).__name__ == "RMSNorm":
            m.forward = functools.partial(type(m).forward, m)
    with pytest.warns(UserWarning, match=r"6 RMSNorm module\(s\) not fused by 'rms_norm'.*instance attribute"):
        pipe.enable_ascend_compile(fusions=["rms_norm"], compile="none")
    report = pipe.ascend_report()
    assert report.swaps.get("rms_norm", 0) == 0
    assert [(fb["module"], fb["lost"]) for fb in report.to_dict()["fallbacks"]] == [
        ("transformer.<rms_norm swaps>", {"rms_norm": 6})
    ]
    assert not any(type(m).__name__ == "FusedRMSNorm" for m in pipe.transformer.modules())
    assert_close(_run(pipe), ref, dtype=torch.float32)


@pytest.mark.parametrize("how", ["compile_repeated_blocks", "model.compile"])
def test_a_compile_after_enabling_that_replaces_ours_is_reported(how):
    pipe = tiny_flux_pipeline()
    pipe.enable_ascend_compile(**FAST)
    model = pipe.transformer
    if how == "compile_repeated_blocks":
        model.compile_repeated_blocks(backend="eager")
        needle, module = r"2 compiled block\(s\) were compiled again", "transformer.<FluxTransformerBlock>"
    else:
        model.compile(backend="eager")
        needle, module = "the whole model was compiled by another", "transformer"
    with pytest.warns(UserWarning, match=needle):
        report = pipe.ascend_report()
    assert [fb["module"] for fb in report.to_dict()["fallbacks"]] == [module]
    assert len(pipe.ascend_report().fallbacks) == 1  # recorded once
    pipe.disable_ascend_compile()  # the user's compile stays theirs
    assert any(m._compiled_call_impl is not None for m in model.modules())


@pytest.mark.parametrize("order", ["before", "after"])
def test_an_outer_torch_compile_of_the_model_is_reported(order):
    """``pipe.transformer = torch.compile(pipe.transformer)``: that dynamo traces through our
    compiled blocks with its own backend, so ours compiles no graph; the report used to say
    nothing (after) or miss the model (before)."""
    pipe = tiny_flux_pipeline()
    ref = _run(pipe)
    needle = r"runs inside a torch.compile\(model\) wrapper"
    if order == "before":
        pipe.transformer = torch.compile(pipe.transformer, backend="eager")
        with pytest.warns(UserWarning, match=needle):
            pipe.enable_ascend_compile(**FAST)
    else:
        pipe.enable_ascend_compile(**FAST)
        pipe.transformer = torch.compile(pipe.transformer, backend="eager")
    with pytest.warns(UserWarning, match=needle) if order == "after" else contextlib.nullcontext():
        out = _run(pipe)
        report = pipe.ascend_report()
    assert_close(out, ref, dtype=torch.float32)
    assert report.graphs_compiled == 0  # our backend never ran
    assert [fb["module"] for fb in report.to_dict()["fallbacks"]] == ["transformer"]
    assert report.swaps == {"rope": 2, "rms_norm": 6, "gelu_tanh": 3}  # they run inside the outer graph
    pipe.transformer = pipe.transformer._orig_mod  # unwrapped: our backend compiles the blocks
    assert_close(_run(pipe), ref, dtype=torch.float32)
    assert pipe.ascend_report().graphs_compiled == 2
    pipe.disable_ascend_compile()
    assert not hasattr(pipe.transformer, "_ascend_state")


# -- attention processors that are not the class a processor swap was written for ---------------
class _CountingFluxProcessor:
    """A user's own attention processor for Flux (delegates to diffusers' class, counts calls)."""

    def __init__(self):
        from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

        self._inner = FluxAttnProcessor()
        self._attention_backend = None
        self._parallel_config = None
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._inner(*args, **kwargs)


SWAPS_ONLY = dict(fusions="all", compile="none")


def test_a_foreign_attention_processor_is_kept_and_reported():
    pipe = tiny_flux_pipeline()
    ref = _run(pipe)
    proc = _CountingFluxProcessor()
    pipe.transformer.set_attn_processor(proc)
    with pytest.warns(
        UserWarning,
        match=r"2 _CountingFluxProcessor object\(s\) kept, not fused by the 'rope' swap.*"
        r"is not diffusers' FluxAttnProcessor",
    ):
        pipe.enable_ascend_compile(**SWAPS_ONLY)
    report = pipe.ascend_report()
    assert "rope" not in report.swaps
    assert [(fb["module"], fb["lost"]) for fb in report.to_dict()["fallbacks"]] == [
        ("transformer.<rope swaps>", {"rope": 2})
    ]
    assert {type(p) for p in pipe.transformer.attn_processors.values()} == {_CountingFluxProcessor}
    assert_close(_run(pipe), ref, dtype=torch.float32)
    assert proc.calls > 0  # the user's processor ran


@pytest.mark.parametrize("order", ["before", "after"])
def test_a_processor_method_patched_in_from_elsewhere_is_kept(order, monkeypatch):
    """What cache-dit's async Ulysses does: it replaces ``FluxAttnProcessor.__call__`` on diffusers'
    class; our fused-rope subclass overrides ``__call__`` and would bypass it."""
    import functools

    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    original, calls = FluxAttnProcessor.__call__, []

    @functools.wraps(original)
    def patched(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    pipe = tiny_flux_pipeline()
    ref = _run(pipe)
    if order == "before":
        monkeypatch.setattr(FluxAttnProcessor, "__call__", patched)
        with pytest.warns(
            UserWarning,
            match=r"2 FluxAttnProcessor object\(s\) kept.*FluxAttnProcessor.__call__ from "
            r".*test_composition.py",
        ):
            pipe.enable_ascend_compile(**SWAPS_ONLY)
        report = pipe.ascend_report()
        assert [(fb["module"], fb["lost"]) for fb in report.to_dict()["fallbacks"]] == [
            ("transformer.<rope swaps>", {"rope": 2})
        ]
        assert "rope" not in report.swaps
        assert_close(_run(pipe), ref, dtype=torch.float32)
        assert calls  # the patch ran
    else:
        pipe.enable_ascend_compile(**SWAPS_ONLY)
        monkeypatch.setattr(FluxAttnProcessor, "__call__", patched)
        with pytest.warns(
            UserWarning,
            match=r"2 FluxAttnProcessor object\(s\) run our FusedRopeFluxAttnProcessor.*"
            r"patched in after enabling",
        ):
            report = pipe.ascend_report()
        assert [fb["module"] for fb in report.to_dict()["fallbacks"]] == ["transformer.<FluxAttnProcessor>"]
        with pytest.warns(UserWarning, match=r"2 FluxAttnProcessor object\(s\) kept"):
            pipe.enable_ascend_compile(**SWAPS_ONLY)  # enabling again leaves the swap out
        assert {type(p) for p in pipe.transformer.attn_processors.values()} == {FluxAttnProcessor}


_CACHE_DIT_ASYNC_ULYSSES = """
import json, warnings
import diffusers_ascend
from cache_dit.distributed.async_ulysses import AsyncUlyssesRegistry
from diffusers_ascend.tiny import tiny_flux_transformer

model = tiny_flux_transformer()
# What cache-dit's Flux context-parallel planner runs for ParallelismConfig(ulysses_async=True):
# a class-level patch of FluxAttnProcessor.__call__ (it needs no process group).
assert AsyncUlyssesRegistry.apply(model)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    diffusers_ascend.enable_ascend_compile(model, fusions="all", compile="none")
report = diffusers_ascend.ascend_report(model)
print(json.dumps({"warnings": [str(w.message) for w in caught], "fallbacks": report.to_dict()["fallbacks"],
                  "swaps": report.swaps, "processors": sorted({type(p).__name__ for p in model.attn_processors.values()})}))
"""


def test_cache_dit_async_ulysses_processor_is_kept():
    import importlib.util

    from tests.integration._fresh_process import run_json

    if importlib.util.find_spec("cache_dit") is None:
        pytest.skip("cache-dit is not installed")
    # Its own process: importing cache-dit registers attention backends and patches diffusers'
    # classes for the rest of the process.
    got = run_json(_CACHE_DIT_ASYNC_ULYSSES, timeout=300)
    assert got["processors"] == ["FluxAttnProcessor"]  # cache-dit's patched class, not our fused one
    assert "rope" not in got["swaps"]
    assert [fb["module"] for fb in got["fallbacks"]] == ["<rope swaps>"]
    assert (
        "cache_dit" in got["fallbacks"][0]["reason"] and "FluxAttnProcessor.__call__" in got["fallbacks"][0]["reason"]
    )
    assert any("kept, not fused by the 'rope' swap" in w for w in got["warnings"])


_CACHE_DIT_ULYSSES_COMPILED = """
import json, sys, warnings, torch
import diffusers_ascend
from ascend_kernels.testing import assert_close

model_name = sys.argv[1]
if model_name == "wan":
    from cache_dit import ParallelismConfig
    from cache_dit.distributed.transformers.wan import WanContextParallelismPlanner
    from diffusers_ascend.tiny import tiny_wan_transformer as make, wan_model_inputs as inputs

    model = make()
    # What cache-dit's Wan context-parallel planner runs for ParallelismConfig(ulysses_size=N): a
    # class-level patch of WanAttnProcessor.__call__; `_cp_config` is what its parallelize step sets
    # on each processor (None: this one process, no all-to-all).
    WanContextParallelismPlanner()._apply(model, ParallelismConfig(ulysses_size=2))
    for p in model.attn_processors.values():
        p._cp_config = None
else:
    from cache_dit.distributed.async_ulysses import AsyncUlyssesRegistry
    from diffusers_ascend.tiny import tiny_flux_transformer as make, flux_model_inputs as inputs

    model = make()
    assert AsyncUlyssesRegistry.apply(model)  # ParallelismConfig(ulysses_async=True)'s class-level patch
with torch.no_grad():
    ref = model(**inputs())[0]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    diffusers_ascend.enable_ascend_compile(model, fusions="all", executor="eager")
with torch.no_grad():
    out = model(**inputs())[0]
assert_close(out, ref, dtype=torch.float32)
report = diffusers_ascend.ascend_report(model)
print(json.dumps({"fallbacks": [[fb.module, fb.lost] for fb in report.fallbacks],
                  "matches": {f: n for f, n in report.matches.items() if n}, "swaps": report.swaps,
                  "processors": sorted({type(p).__name__ for p in model.attn_processors.values()})}))
"""


@pytest.mark.parametrize(
    "model,processor,rope_kept,matches",
    [
        # Wan: 2 blocks x (self + cross) processors kept; the rope runs in the self-attention only.
        ("wan", "WanAttnProcessor", 4, {"rope": 2, "adaln": 2, "mul_add": 2}),
        ("flux", "FluxAttnProcessor", 2, {"rope": 4, "adaln": 5, "mul_add": 5}),
    ],
)
def test_cache_dit_ulysses_processors_are_kept_and_their_rope_fused_in_the_graph(model, processor, rope_kept, matches):
    """cache-dit's Ulysses on Wan (and its async Ulysses on Flux) patch the processor class's
    ``__call__``: our fused-rope processor would bypass that code (the all-to-all), so the swap is
    left out and reported; with compilation on (the default) the rope graph pass fuses the rope that
    code computes, so the rope is fused after all, inside cache-dit's processor."""
    import importlib.util

    from tests.integration._fresh_process import run_json

    if importlib.util.find_spec("cache_dit") is None:
        pytest.skip("cache-dit is not installed")
    got = run_json(_CACHE_DIT_ULYSSES_COMPILED, model)
    assert got["processors"] == [processor]  # cache-dit's patched class kept
    assert got["fallbacks"] == [["<rope swaps>", {"rope": rope_kept}]]
    assert "rope" not in got["swaps"]
    assert got["matches"] == matches  # the rope fused by the graph pass, in cache-dit's code
