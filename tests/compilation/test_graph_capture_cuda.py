"""Graph capture on a real GPU (CUDA graphs): marked ``cuda``, skipped where there is none.

Run: ``pytest -m cuda tests/compilation/test_graph_capture_cuda.py`` (first run on an NVIDIA H100,
torch 2.11.0+cu130, 2026-11-23).
"""

from __future__ import annotations

import copy

import pytest
import torch

import diffusers_ascend  # noqa: F401  (adds enable_ascend_compile to pipelines)
from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.tiny import (
    flux_block_inputs,
    flux_pipeline_inputs,
    tiny_flux_blocks,
    tiny_flux_pipeline,
    tiny_wan_block,
    tiny_wan_pipeline,
    wan_block_inputs,
    wan_pipeline_inputs,
)

from .conftest import as_tuple, assert_as_accurate_as_eager, assert_close, to_fp64

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("fresh_dynamo_no_grad")]
MODES = ["graph_only", "graph_with_compile"]
EXECUTORS = ["eager", "inductor"]


def _cuda(inputs: dict) -> dict:
    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to("cuda")
        return tuple(move(t) for t in v) if isinstance(v, tuple) else v

    return {k: move(v) for k, v in inputs.items()}


def _check(outs, refs, dtype):
    for o, r in zip(as_tuple(outs), as_tuple(refs)):
        assert_close(o, r, dtype)


def _check_block(outs, block, x, dtype):
    """Replayed outputs of ``block(**x)`` against eager; in bf16 by the rule of the CPU block test
    (`assert_as_accurate_as_eager`: Inductor's kernels round once where eager rounds per op)."""
    refs = block(**x)
    if dtype == torch.float32:
        return _check(outs, refs, dtype)
    refs64 = copy.deepcopy(block).double()(**to_fp64(x))
    for o, r, r64 in zip(as_tuple(outs), as_tuple(refs), as_tuple(refs64)):
        assert_as_accurate_as_eager(o, r, r64, dtype)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("mode", MODES)
def test_flux_block_replay_equals_eager(mode, executor):
    dtype = torch.bfloat16
    d1, s1 = (b.cuda() for b in tiny_flux_blocks(dtype=dtype))
    d2, _ = (b.cuda() for b in tiny_flux_blocks(seed=1, dtype=dtype))
    backend = AscendBackend(executor=executor, graph_capture=mode)
    c1, c2, cs = (torch.compile(b, backend=backend) for b in (d1, d2, s1))
    for seed in range(3):
        x = _cuda(flux_block_inputs(seed=seed, dtype=dtype))
        _check_block(c1(**x), d1, x, dtype)
        _check_block(c2(**x), d2, x, dtype)  # a second instance replays its own graph
        _check_block(cs(**x), s1, x, dtype)
    mgr = backend.graph_capture
    assert mgr.num_graphs == 3 and mgr.stats["replays"] == 9 and not backend.report.fallbacks


@pytest.mark.parametrize("executor", EXECUTORS)
def test_wan_block_replay_equals_eager(executor):
    dtype = torch.bfloat16
    block = tiny_wan_block(dtype=dtype).cuda()
    backend = AscendBackend(executor=executor, graph_capture="graph_with_compile")
    compiled = torch.compile(block, backend=backend)
    for seed in range(3):
        x = _cuda(wan_block_inputs(seed=seed, dtype=dtype))
        _check_block(compiled(**x), block, x, dtype)
    assert backend.graph_capture.stats["captures"] == 1 and not backend.report.fallbacks


@pytest.mark.parametrize("executor", EXECUTORS)
def test_replay_equals_the_uncaptured_compiled_block(executor):
    """Capture changes nothing but the launch: a replay runs the kernels of the uncaptured graph on
    the same inputs, so the outputs agree to the last bit or nearly (cuBLAS may pick another
    algorithm inside a graph)."""
    dtype = torch.bfloat16
    block = tiny_wan_block(dtype=dtype).cuda()
    plain = torch.compile(block, backend=AscendBackend(executor=executor))
    captured = torch.compile(
        copy.deepcopy(block), backend=AscendBackend(executor=executor, graph_capture="graph_with_compile")
    )
    for seed in range(3):
        x = _cuda(wan_block_inputs(seed=seed, dtype=dtype))
        assert_close(captured(**x), plain(**x), dtype, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("compile_scope", ["blocks", "model"])
def test_flux_pipeline_across_steps_equals_eager(compile_scope):
    pipe = tiny_flux_pipeline(num_layers=2, num_single_layers=2).to("cuda")
    inputs = lambda: {  # noqa: E731
        **flux_pipeline_inputs(steps=4),
        "prompt_embeds": flux_pipeline_inputs()["prompt_embeds"].cuda(),
        "pooled_prompt_embeds": flux_pipeline_inputs()["pooled_prompt_embeds"].cuda(),
    }
    ref = pipe(**inputs()).images
    pipe.enable_ascend_compile(compile=compile_scope, graph_capture="graph_with_compile")
    out = pipe(**inputs()).images  # 4 steps: 4 timesteps through the same graphs
    assert_close(out, ref, torch.float32, atol=1e-4, rtol=1e-4)
    assert pipe.ascend_report().fallbacks == []


def test_wan_pipeline_across_steps_equals_eager():
    pipe = tiny_wan_pipeline().to("cuda")
    inputs = lambda: {**wan_pipeline_inputs(steps=3), "prompt_embeds": wan_pipeline_inputs()["prompt_embeds"].cuda()}  # noqa: E731
    ref = pipe(**inputs()).frames
    pipe.enable_ascend_compile(graph_capture="graph_with_compile")
    out = pipe(**inputs()).frames
    assert_close(torch.as_tensor(out), torch.as_tensor(ref), torch.float32, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("safe_output", [True, False])
def test_safe_output_on_and_off(safe_output):
    d, _ = (b.cuda() for b in tiny_flux_blocks())
    backend = AscendBackend(executor="eager", graph_capture="graph_only", safe_output=safe_output)
    compiled = torch.compile(d, backend=backend)
    x1, x2 = _cuda(flux_block_inputs(seed=1)), _cuda(flux_block_inputs(seed=2))
    a = compiled(**x1)
    a_values = [t.clone() for t in a]
    b = compiled(**x2)
    _check(b, d(**x2), torch.float32)
    if safe_output:
        _check(a, a_values, torch.float32)
        assert all(t.data_ptr() != u.data_ptr() for t, u in zip(a, b))
    else:  # static outputs: the second replay overwrote the first call's tensors
        assert all(t.data_ptr() == u.data_ptr() for t, u in zip(a, b))
        _check(a, b, torch.float32)


def test_eviction_and_recapture_on_a_new_shape():
    d, _ = (b.cuda() for b in tiny_flux_blocks())
    backend = AscendBackend(executor="eager", graph_capture="graph_only", max_captured_graphs=2)
    compiled = torch.compile(d, backend=backend, dynamic=False)
    for h, w in [(2, 2), (2, 4), (4, 4), (2, 2)]:
        x = _cuda(flux_block_inputs(height=h, width=w))
        _check(compiled(**x), d(**x), torch.float32)
    mgr = backend.graph_capture
    assert mgr.stats["captures"] == 4 and mgr.stats["evictions"] == 2 and mgr.num_signatures == 2


def test_memory_does_not_grow_across_replays():
    d, _ = (b.cuda() for b in tiny_flux_blocks(dtype=torch.bfloat16))
    backend = AscendBackend(executor="eager", graph_capture="graph_with_compile")
    compiled = torch.compile(d, backend=backend)
    x = _cuda(flux_block_inputs(dtype=torch.bfloat16))
    for _ in range(3):
        compiled(**x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(50):
        compiled(**x)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert backend.graph_capture.stats["captures"] == 1


def test_enable_on_cuda_records_capture_in_the_report():
    pipe = tiny_flux_pipeline().to("cuda")
    pipe.enable_ascend_compile(graph_capture="graph_only")
    kw = flux_pipeline_inputs()
    pipe(
        **{**kw, "prompt_embeds": kw["prompt_embeds"].cuda(), "pooled_prompt_embeds": kw["pooled_prompt_embeds"].cuda()}
    )
    graphs = pipe.ascend_report().graphs
    assert graphs and all(g.get("graph_capture") == "graph_only" for g in graphs)
