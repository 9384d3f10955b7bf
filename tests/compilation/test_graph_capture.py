"""Graph capture on CPU: CONTRACT tests of the capture logic against a stand-in graph class.

No GPU or NPU exists here. `graph_standins.StandInGraph` reproduces what the wrapper relies on
(a capture runs nothing usable, a replay re-runs the captured work on the same static tensors and
overwrites the same outputs); it proves nothing about device graphs themselves, streams or speed.
The platform is pinned to "cuda" (graph capture is refused on the CPU) and `graph_api` returns the
stand-in. The hardware suite is `test_graph_capture_cuda.py` (marked ``cuda``).
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

import diffusers_ascend
from diffusers_ascend import platform as P
from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.compilation._compat import compiled_blocks_share_graphs
from diffusers_ascend.compilation.backend import root_cause
from diffusers_ascend.compilation.graph_capture import (
    UNCAPTURABLE_OPS,
    WARMUP_CALLS,
    GraphCaptureManager,
    TokenBuckets,
)
from diffusers_ascend.config import AscendConfig
from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks, tiny_flux_transformer

from .conftest import EXPECTED_BLOCK_COUNTS, assert_close
from .graph_standins import StandInGraph, standin_graph_api

CAPTURE = dict(executor="eager", graph_capture="graph_with_compile")


@pytest.fixture(autouse=True)
def _standin(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(P, "graph_api", lambda platform=None: standin_graph_api())
    with P.override_platform("cuda"), torch.no_grad():
        yield
    torch._dynamo.reset()


def _manager(**kw) -> GraphCaptureManager:
    return GraphCaptureManager(kw.pop("mode", "graph_with_compile"), standin_graph_api(), **kw)


class _Counted:
    """``fn(x, w, n) = x * w + n`` (n a non-tensor input), counting its eager calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x, w, n):
        self.calls += 1
        return (x * w + n,)


def _graphs(backend) -> list[StandInGraph]:
    return [g.graph for e in backend.graph_capture._entries.values() for g in e.graphs.values()]


# ------------------------------------------------------------------------------------------ keys
def test_signature_keys_shape_stride_dtype_device_values_and_parameter_addresses():
    call = _manager().wrap(_Counted(), static_indices=[1])
    x, w = torch.randn(2, 3), torch.randn(3)
    shape, params, activations = call.signature([x, w, 1])
    assert activations == [0] and params == ((1, w.data_ptr()),)
    assert shape == (
        (0, (2, 3), (3, 1), torch.float32, x.device),
        (1, (3,), (1,), torch.float32, w.device),
        (2, "int", 1),
    )
    key = lambda *a: call.signature(list(a))[:2]  # noqa: E731
    base = key(x, w, 1)
    assert key(torch.randn(2, 3), w, 1) == base  # another activation tensor: same graph
    assert key(torch.randn(3, 3), w, 1) != base  # shape
    assert key(torch.randn(3, 2).t(), w, 1) != base  # strides
    assert key(x.double(), w, 1) != base  # dtype
    assert key(x, w, 2) != base  # a non-tensor input is baked into a graph
    other_w = w.clone()
    assert key(x, other_w, 1)[0] == base[0] and key(x, other_w, 1)[1] != base[1]  # another instance


def test_warmup_then_one_capture_then_replays_only():
    fn = _Counted()
    mgr = _manager()
    call = mgr.wrap(fn, static_indices=[1])
    w = torch.randn(3)
    for _ in range(4):
        x = torch.randn(2, 3)
        (out,) = call([x, w, 1])
        torch.testing.assert_close(out, x * w + 1)
    assert fn.calls == WARMUP_CALLS + 1  # warm-up, capture; every later call is a replay
    assert mgr.stats["captures"] == 1 and mgr.stats["replays"] == 4 and mgr.stats["input_copies"] == 4


def test_capture_outputs_are_never_returned_unreplayed():
    # The stand-in poisons what a capture produced (a real capture runs no kernels): the first
    # call's result is only right if the wrapper replays after capturing.
    (out,) = _manager().wrap(_Counted())([torch.ones(2), torch.ones(2), 0])
    assert torch.equal(out, torch.ones(2))


# --------------------------------------------------------------------------- blocks, instances
def test_each_block_instance_replays_its_own_graph_and_weights_are_read_in_place():
    d1, _ = tiny_flux_blocks(seed=0)
    d2, _ = tiny_flux_blocks(seed=1)
    backend = AscendBackend(fusions=["rms_norm", "mul_add"], **CAPTURE)
    c1, c2 = torch.compile(d1, backend=backend), torch.compile(d2, backend=backend)
    for seed in range(3):
        x = flux_block_inputs(seed=seed)
        for block, compiled in ((d1, c1), (d2, c2)):
            for o, r in zip(compiled(**x), block(**x)):
                assert_close(o, r)
    mgr = backend.graph_capture
    dynamo_graphs = 1 if compiled_blocks_share_graphs() else 2  # torch < 2.8: one per instance
    assert backend.report.graphs_compiled == dynamo_graphs  # one dynamo graph for the class ...
    assert mgr.num_signatures == 1 and mgr.num_graphs == 2  # ... one device graph per instance
    assert mgr.stats["captures"] == 2 and mgr.stats["replays"] == 6
    # Only the 5 activations (hidden, encoder hidden, temb, cos, sin) are copied, never a weight.
    assert all(len(e.buffers) == 5 for e in mgr._entries.values()) and mgr.stats["input_copies"] == 6 * 5
    # The graph reads the weights where they live: an in-place update is seen by the next replay.
    x = flux_block_inputs(seed=7)
    d1.ff.net[2].weight.add_(0.5)
    for o, r in zip(c1(**x), d1(**x)):
        assert_close(o, r)
    assert mgr.stats["captures"] == 2


def test_graphs_of_one_backend_share_one_pool_and_backends_do_not():
    d1, _ = tiny_flux_blocks(seed=0)
    d2, _ = tiny_flux_blocks(seed=1)
    x = flux_block_inputs()
    b1, b2 = AscendBackend(**CAPTURE, fusions="none"), AscendBackend(**CAPTURE, fusions="none")
    torch.compile(d1, backend=b1)(**x)
    torch.compile(d2, backend=b1)(**x)
    torch.compile(d1, backend=b2)(**x)
    pools1 = {g.pool for g in _graphs(b1)}
    (pool2,) = {g.pool for g in _graphs(b2)}
    assert len(pools1) == 1 and pool2 not in pools1
    assert len({id(g.stream) for g in _graphs(b1)}) == 1  # one capture stream per backend, as pools need
    assert b1.graph_capture.num_graphs == 2 and b2.graph_capture.num_graphs == 1


# ------------------------------------------------------------------------------------ eviction
def test_fifo_eviction_at_max_captured_graphs_and_recapture():
    d, _ = tiny_flux_blocks()
    backend = AscendBackend(fusions="none", max_captured_graphs=2, **CAPTURE)
    compiled = torch.compile(d, backend=backend, dynamic=False)
    sizes = [(2, 2), (2, 4), (4, 4)]
    mgr = backend.graph_capture
    first = {}
    for h, w in sizes:
        x = flux_block_inputs(height=h, width=w)
        for o, r in zip(compiled(**x), d(**x)):
            assert_close(o, r)
        first.setdefault((h, w), _graphs(backend)[-1])
    assert mgr.num_signatures == 2 and mgr.stats["evictions"] == 1 and mgr.stats["captures"] == 3
    assert first[(2, 2)].was_reset and not first[(4, 4)].was_reset  # the oldest went first
    x = flux_block_inputs(height=2, width=2)  # evicted: captured again, still right
    for o, r in zip(compiled(**x), d(**x)):
        assert_close(o, r)
    assert mgr.stats["captures"] == 4 and mgr.stats["evictions"] == 2 and first[(2, 4)].was_reset


def test_cap_counts_signatures_not_block_instances():
    blocks = [tiny_flux_blocks(seed=s)[0] for s in range(3)]
    backend = AscendBackend(fusions="none", max_captured_graphs=1, **CAPTURE)
    compiled = [torch.compile(b, backend=backend) for b in blocks]
    x = flux_block_inputs()
    for _ in range(2):
        for c in compiled:
            c(**x)
    mgr = backend.graph_capture
    assert mgr.num_graphs == 3 and mgr.stats["evictions"] == 0 and mgr.stats["captures"] == 3


# --------------------------------------------------------------------------- static buffers
def test_static_buffers_are_reused_and_the_buffer_itself_is_not_copied():
    mgr = _manager()
    call = mgr.wrap(_Counted(), static_indices=[1])
    w = torch.randn(3)
    call([torch.randn(2, 3), w, 0])
    (entry,) = mgr._entries.values()
    buf = entry.buffers[0]
    x = torch.randn(2, 3)
    (out,) = call([x, w, 0])
    assert entry.buffers[0] is buf and torch.equal(buf, x)  # copied into the same buffer
    assert mgr.stats["input_copies"] == 2 and mgr.stats["input_copies_skipped"] == 0
    buf.copy_(torch.full((2, 3), 2.0))  # a caller that writes the buffer and passes it
    (out,) = call([buf, w, 0])
    assert mgr.stats["input_copies"] == 2 and mgr.stats["input_copies_skipped"] == 1
    torch.testing.assert_close(out, 2.0 * w.expand(2, 3))


def test_input_mutations_reach_the_callers_tensor():
    # Through the backend (aot returns the new value and writes it back) ...
    backend = AscendBackend(fusions="none", executor="eager", graph_capture="graph_only")

    def f(x, y):
        x.add_(1)
        return x * y

    compiled = torch.compile(f, backend=backend)
    for step in range(3):
        x = torch.full((3,), float(step))
        out = compiled(x, torch.full((3,), 2.0))
        assert torch.equal(x, torch.full((3,), step + 1.0)) and torch.equal(out, 2 * x)
    # ... and a graph that writes its input itself (aot may keep inference mutations in the graph).
    g = torch.fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (g.call_function(torch.ops.aten.add_.Tensor, (x, y)), 2)),))
    gm = torch.fx.GraphModule({}, g)
    call = _manager().wrap(lambda *a: gm(*a), gm)
    assert call.mutated == {0}
    for step in range(3):
        x = torch.full((2,), float(step))
        (out,) = call([x, torch.ones(2)])
        assert torch.equal(x, torch.full((2,), step + 1.0)) and torch.equal(out, 2 * x)


# ---------------------------------------------------------------------------------- outputs
@pytest.mark.parametrize("safe_output", [True, False])
def test_safe_output_aliasing(safe_output):
    call = _manager(safe_output=safe_output).wrap(_Counted())
    w = torch.ones(2)
    (a,) = call([torch.full((2,), 1.0), w, 0])
    (b,) = call([torch.full((2,), 5.0), w, 0])
    assert torch.equal(b, torch.full((2,), 5.0))
    if safe_output:  # clones: an earlier output survives later replays
        assert a is not b and torch.equal(a, torch.full((2,), 1.0))
    else:  # the graph's static output: overwritten by the next replay
        assert a is b and torch.equal(a, torch.full((2,), 5.0))


# ---------------------------------------------------------------------------------- timestep
def test_timestep_is_an_input_not_a_baked_constant():
    model = tiny_flux_transformer()
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 16, 4, generator=gen)
    kw = dict(
        encoder_hidden_states=torch.randn(1, 8, 32, generator=gen),
        pooled_projections=torch.randn(1, 32, generator=gen),
        img_ids=torch.zeros(16, 3),
        txt_ids=torch.zeros(8, 3),
        return_dict=False,
    )
    refs = [model(hidden, timestep=torch.tensor([t]), **kw)[0] for t in (1.0, 0.5, 0.25)]
    diffusers_ascend.enable_ascend_compile(
        model, compile="model", fusions=["rms_norm", "mul_add"], attention=None, **CAPTURE
    )
    outs = [model(hidden, timestep=torch.tensor([t]), **kw)[0] for t in (1.0, 0.5, 0.25)]
    for o, r in zip(outs, refs):
        assert_close(o, r)
    assert not torch.allclose(outs[0], outs[1])  # the step changes the output
    mgr = model._ascend_state.backend.graph_capture
    assert mgr.stats["captures"] == 1 and mgr.stats["replays"] == 3


def test_blocks_scope_pipeline_across_steps_matches_eager():
    from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline

    pipe = tiny_flux_pipeline(num_layers=2, num_single_layers=2)  # two instances per block class
    ref = pipe(**flux_pipeline_inputs(steps=3)).images
    pipe.enable_ascend_compile(fusions=["rms_norm", "mul_add"], attention=None, **CAPTURE)
    out = pipe(**flux_pipeline_inputs(steps=3)).images
    assert_close(out, ref)
    mgr = pipe.transformer._ascend_state.backend.graph_capture
    blocks = len(pipe.transformer.transformer_blocks) + len(pipe.transformer.single_transformer_blocks)
    # Every block call of every step is a replay. There are more graphs than blocks: the first
    # single block gets slices of the joint sequence (other strides than the next block's inputs),
    # and strides are part of a signature (dynamo compiles a graph per stride pattern too).
    assert mgr.stats["replays"] == 3 * blocks and blocks <= mgr.num_graphs == mgr.stats["captures"] <= blocks + 2


# ------------------------------------------------------------------------------------- modes
def test_graph_only_runs_no_fusion_pass_and_graph_with_compile_fuses():
    d, _ = tiny_flux_blocks()
    x = flux_block_inputs()
    ref = d(**x)
    only = AscendBackend(executor="eager", graph_capture="graph_only")
    fused = AscendBackend(executor="eager", graph_capture="graph_with_compile", fusions="all")
    assert only.fusions == () and AscendConfig(graph_capture="graph_only", fusions="all").resolved_fusions("npu") == ()
    for backend in (only, fused):
        torch._dynamo.reset()
        for o, r in zip(torch.compile(d, backend=backend)(**x), ref):
            assert_close(o, r)
        assert backend.graph_capture.stats["captures"] == 1
        assert backend.report.graphs[0]["graph_capture"] == backend.config.graph_capture
    assert only.report.matches == {} and fused.report.matches == EXPECTED_BLOCK_COUNTS["flux_double"]


def test_graph_only_swaps_no_layer():
    model = tiny_flux_transformer()
    diffusers_ascend.enable_ascend_compile(model, fusions="all", graph_capture="graph_only", executor="eager")
    assert model._ascend_state.swapped == []  # fusions="all" would swap RMSNorm, GELU and processors
    assert model._ascend_state.backend.fusions == ()


def test_graph_only_with_explicit_fusions_is_refused():
    with pytest.raises(ValueError, match=r"graph_only.*without fusion passes.*\['rms_norm'\].*graph_with_compile"):
        AscendBackend(executor="eager", graph_capture="graph_only", fusions=["rms_norm"])


def test_capture_takes_precedence_over_inductor_cuda_graphs():
    with pytest.raises(ValueError, match=r"reduce-overhead.*both capture device graphs"):
        AscendBackend(executor="inductor", mode="reduce-overhead", graph_capture="graph_only")
    backend = AscendBackend(executor="inductor", mode="max-autotune", graph_capture="graph_only")
    assert backend._inductor_patches(training=False)["triton.cudagraphs"] is False
    assert AscendBackend(executor="inductor", mode="max-autotune")._inductor_patches(False)["triton.cudagraphs"] is True


# ------------------------------------------------------------------------------------ errors
def test_cpu_refuses_and_enable_changes_nothing():
    d, _ = tiny_flux_blocks()
    with P.override_platform("cpu"):
        with pytest.raises(ValueError, match=r"(?s)graph_capture='graph_only'.*'cpu' has none.*graph_capture=None"):
            AscendBackend(graph_capture="graph_only")
        model = tiny_flux_transformer()
        with pytest.raises(ValueError, match="'cpu' has none"):
            diffusers_ascend.enable_ascend_compile(model, graph_capture="graph_only")
        assert not hasattr(model, "_ascend_state")


def test_npu_refuses_the_uncapturable_native_npu_attention():
    with P.override_platform("npu"):
        with pytest.raises(ValueError, match=r"npu_fusion_attention.*aclgraph.*attention='auto' or 'npu_fia'"):
            AscendConfig(graph_capture="graph_only", attention="_native_npu").check_backend("npu")
    # "auto" resolves to the capturable npu_fia under capture (tests/integration/test_npu_fia_capture.py).
    for attention in ("auto", "npu_fia", None):
        AscendConfig(graph_capture="graph_only", attention=attention).check_backend("npu")
    model = tiny_flux_transformer()
    with P.override_platform("npu"), pytest.raises(ValueError, match="npu_fusion_attention"):
        diffusers_ascend.enable_ascend_compile(model, graph_capture="graph_with_compile", attention="_native_npu")
    assert not hasattr(model, "_ascend_state")  # refused before anything changed
    AscendConfig(graph_capture="graph_only", attention="_native_npu").check_backend("cuda")  # NPU-only rule


def test_platform_without_device_graphs_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(P, "graph_api", lambda platform=None: None)  # e.g. a torch_npu without NPUGraph
    with pytest.raises(ValueError, match=r"offers no device graphs.*graph_capture=None"):
        AscendBackend(executor="eager", graph_capture="graph_only")


def test_training_graph_is_refused():
    lin = torch.nn.Linear(4, 4)
    backend = AscendBackend(fusions="none", **CAPTURE)
    with torch.enable_grad(), pytest.raises(Exception) as info:
        torch.compile(lin, backend=backend)(torch.randn(2, 4, requires_grad=True))
    assert isinstance(root_cause(info.value), RuntimeError)
    assert "inference-only" in str(root_cause(info.value)) and "torch.no_grad()" in str(root_cause(info.value))


def test_graph_calling_an_uncapturable_op_runs_uncaptured_with_a_fallback():
    from tests.kernels.npu_standins import npu_attention_ops

    npu_attention_ops()  # npu::npu_fusion_attention with torch_npu's schema (stand-in, CPU kernel)
    q = torch.ones(1, 4, 2, 16, dtype=torch.bfloat16)
    call = lambda q: torch.ops.npu.npu_fusion_attention(q, q, q, 2, "BSND")[0] + 1  # noqa: E731
    backend = AscendBackend(fusions="none", **CAPTURE)
    f = torch.compile(call, backend=backend)
    with pytest.warns(UserWarning, match="without graph capture.*npu_fusion_attention"):
        out = f(q)
    assert torch.equal(out, torch.full_like(q, 2.0)) and backend.graph_capture.num_graphs == 0
    assert "not captured" in backend.report.fallbacks[0]["reason"]
    assert "npu::npu_fusion_attention" in UNCAPTURABLE_OPS
    torch._dynamo.reset()
    strict = AscendBackend(fusions="none", on_error="raise", **CAPTURE)
    with pytest.raises(Exception, match="npu_fusion_attention"):
        torch.compile(call, backend=strict)(q)


def test_failed_capture_falls_back_and_frees_its_buffers(monkeypatch):
    api = standin_graph_api()

    @contextlib.contextmanager
    def failing(graph, pool, stream):
        raise RuntimeError("operation not permitted when stream is capturing")
        yield

    mgr = GraphCaptureManager("graph_only", api.__class__(**{**api.__dict__, "capture": failing}))
    fn = _Counted()
    call = mgr.wrap(fn)
    with pytest.warns(UserWarning, match="capture failed.*not permitted"):
        (out,) = call([torch.ones(2), torch.ones(2), 1])
    assert torch.equal(out, torch.full((2,), 2.0)) and mgr.num_signatures == 0 and call.disabled
    calls = fn.calls
    call([torch.ones(2), torch.ones(2), 1])
    assert fn.calls == calls + 1  # runs uncaptured from now on, no second attempt


def test_input_off_the_device_runs_uncaptured():
    api = standin_graph_api()
    mgr = GraphCaptureManager("graph_only", api.__class__(**{**api.__dict__, "device_type": "cuda"}))
    with pytest.warns(UserWarning, match="input 0 is on cpu, not cuda"):
        (out,) = mgr.wrap(_Counted())([torch.ones(2), torch.ones(2), 1])
    assert torch.equal(out, torch.full((2,), 2.0)) and mgr.num_graphs == 0


def test_freezing_with_capture_ignores_folded_parameters():
    d, _ = tiny_flux_blocks()
    x = flux_block_inputs()
    backend = AscendBackend(fusions=["rms_norm"], freezing=True, **CAPTURE)
    with torch._inductor.config.patch(freezing=True):
        compiled = torch.compile(d, backend=backend)
        outs = [compiled(**flux_block_inputs(seed=s)) for s in range(2)]
    for s, out in enumerate(outs):
        for o, r in zip(out, d(**flux_block_inputs(seed=s))):
            assert_close(o, r)
    (entry,) = backend.graph_capture._entries.values()
    assert len(entry.buffers) == 5 and list(entry.graphs) == [()]  # no parameter in the key: none is read
    assert x  # the fixture inputs are untouched


# --------------------------------------------------------------------------------- platform
def test_platform_supplies_the_documented_npu_graph_api(monkeypatch):
    """Contract: torch_npu's ``torch.npu.graph(npu_graph, pool=None, stream=None,
    auto_dispatch_capture=False, capture_error_mode="global")`` (torch_npu/npu/graphs.py)."""
    seen = {}

    class NPUGraph:
        pass

    def graph(npu_graph, pool=None, stream=None, auto_dispatch_capture=False, capture_error_mode="global"):
        seen.update(npu_graph=npu_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode)
        return contextlib.nullcontext()

    npu = types.SimpleNamespace(
        NPUGraph=NPUGraph,
        graph=graph,
        graph_pool_handle=lambda: "pool",
        Stream=object,
        stream=lambda s: contextlib.nullcontext(),
        current_stream=lambda: None,
    )
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    api = _ORIGINAL_GRAPH_API("npu")
    assert isinstance(api, P.GraphAPI) and api.device_type == "npu" and api.graph_class is NPUGraph
    g = NPUGraph()
    with api.capture(g, "pool", "stream"):
        pass
    # passed explicitly: the default "global" fails a capture on any other thread's allocation
    assert seen == dict(npu_graph=g, pool="pool", stream="stream", capture_error_mode="thread_local")
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(), raising=False)  # torch_npu before NPUGraph
    assert _ORIGINAL_GRAPH_API("npu") is None
    assert _ORIGINAL_GRAPH_API("cpu") is None
    assert _ORIGINAL_GRAPH_API("cuda").graph_class is torch.cuda.CUDAGraph


_ORIGINAL_GRAPH_API = P.graph_api  # at import, before the fixture swaps in the stand-in


# ---------------------------------------------------------------------------------- buckets
def test_token_buckets_pad_unpad_and_errors():
    b = TokenBuckets([1024, 256, 256])
    assert b.buckets == (256, 1024) and b.bucket_for(256) == 256 and b.bucket_for(257) == 1024
    x = torch.randn(2, 300, 4)
    padded, n = b.pad(x)
    assert padded.shape == (2, 1024, 4) and n == 300 and torch.equal(b.unpad(padded, n), x)
    assert b.pad(torch.randn(1, 256, 4))[0].shape == (1, 256, 4)
    mask = b.attention_mask(300, batch=2, prefix=8)
    assert mask.shape == (2, 1, 1, 8 + 1024) and mask.sum() == 2 * 308 and mask[0, 0, 0, :308].all()
    with pytest.raises(ValueError, match=r"length 2000 exceeds the largest bucket; buckets: \[256, 1024\]"):
        b.bucket_for(2000)
    for bad in ([], 256, [0], [2.5], [True]):
        with pytest.raises(ValueError, match="non-empty sequence of ints >= 1"):
            TokenBuckets(bad)


def test_bucketed_flux_transformer_matches_the_unpadded_one():
    model = tiny_flux_transformer()
    gen = torch.Generator().manual_seed(0)
    n, txt = 12, 8
    hidden, img_ids = torch.randn(1, n, 4, generator=gen), torch.randn(n, 3, generator=gen)
    kw = dict(
        encoder_hidden_states=torch.randn(1, txt, 32, generator=gen),
        pooled_projections=torch.randn(1, 32, generator=gen),
        txt_ids=torch.zeros(txt, 3),
        timestep=torch.tensor([0.5]),
        return_dict=False,
    )
    ref = model(hidden, img_ids=img_ids, **kw)[0]
    buckets = TokenBuckets([16, 64])
    padded, length = buckets.pad(hidden)
    mask = buckets.attention_mask(length, prefix=txt)
    out = model(padded, img_ids=buckets.pad(img_ids, dim=0)[0], joint_attention_kwargs={"attention_mask": mask}, **kw)[
        0
    ]
    assert out.shape[1] == 16
    assert_close(buckets.unpad(out, length), ref)


def _load(relative: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / relative
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bucketing_example_replays_one_graph_per_bucket():
    example = _load("examples/bucketing.py")
    model = tiny_flux_transformer()
    buckets = TokenBuckets([16, 64])
    requests = [(2, 3), (4, 4), (5, 6), (8, 8), (3, 4)]
    refs = [model(**example.flux_inputs(h, w, 8, "cpu"), return_dict=False)[0] for h, w in requests]
    diffusers_ascend.enable_ascend_compile(
        model, compile="model", dynamic=False, fusions="none", attention=None, **CAPTURE
    )
    for (h, w), ref in zip(requests, refs):
        assert_close(example.bucketed_call(model, buckets, example.flux_inputs(h, w, 8, "cpu")), ref)
    mgr = model._ascend_state.backend.graph_capture
    assert mgr.num_graphs == 2 and mgr.stats["captures"] == 2 and mgr.stats["replays"] == len(requests)


def test_benchmark_refuses_without_cuda(monkeypatch):
    from diffusers_ascend.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["bench", "graph_capture", "--iters", "1"])


# ---------------------------------------------------------------------------------- threads
def _in_threads(n: int, target, timeout: float = 120.0) -> list:
    """Runs ``target(i)`` in `n` threads started together; returns their results (a bounded wait:
    a deadlock fails the test instead of hanging the suite)."""
    import threading

    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i):
        barrier.wait()
        try:
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), f"threads still running after {timeout}s (deadlock?)"
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def test_threads_with_different_inputs_get_their_own_results():
    """Every caller of a signature shares its static input buffers: without the manager's lock, a
    thread's copy-in lands between another's copy-in and replay (measured: 24 of 50 calls wrong)."""
    block, _ = tiny_flux_blocks(seed=0)
    backend = AscendBackend(fusions=["rms_norm", "mul_add"], **CAPTURE)
    compiled = torch.compile(block, backend=backend)
    inputs = [flux_block_inputs(seed=s) for s in (1, 2)]
    expected = [block(**x) for x in inputs]
    compiled(**inputs[0])  # compile and capture once, so the threads race on replays only

    def calls(i):
        wrong = 0
        for _ in range(25):
            with torch.no_grad():  # grad mode is per thread
                out = compiled(**inputs[i])
            wrong += any(not torch.allclose(o, r, rtol=1e-4, atol=1e-5) for o, r in zip(out, expected[i]))
        return wrong

    assert _in_threads(2, calls) == [0, 0]
    assert backend.graph_capture.stats["captures"] == 1


@pytest.mark.parametrize(
    "kwargs, error, needle",
    [
        # The config's rules (config.check_field), so the manager and AscendConfig say the same.
        (dict(max_captured_graphs=0), ValueError, "max_captured_graphs=0 is invalid; it must be >= 1"),
        (dict(max_captured_graphs=-1), ValueError, "max_captured_graphs=-1 is invalid; it must be >= 1"),
        (dict(max_captured_graphs=2.0), TypeError, "max_captured_graphs must be an int >= 1, got 2.0"),
        (dict(max_captured_graphs=True), TypeError, "max_captured_graphs must be an int >= 1, got True"),
        (dict(warmup=-1), ValueError, "warmup must be an int >= 0"),
        (dict(safe_output="yes"), TypeError, "safe_output must be True or False"),
        (dict(on_error="ignore"), ValueError, "on_error='ignore' is invalid; valid: 'fallback', 'raise'"),
        (
            dict(mode="graph"),
            ValueError,
            "graph_capture='graph' is invalid; valid: None, 'graph_only', 'graph_with_compile'",
        ),
        (dict(mode=None), ValueError, "needs a graph_capture mode; valid: 'graph_only', 'graph_with_compile'"),
    ],
)
def test_manager_arguments_are_validated(kwargs, error, needle):
    # max_captured_graphs=0 used to be accepted and fail with IndexError at the first call.
    with pytest.raises(error, match=needle.replace("(", r"\(").replace(")", r"\)")):
        _manager(**kwargs)
    if "mode" not in kwargs and "warmup" not in kwargs:  # the same words as the config's
        with pytest.raises(error, match=needle.replace("(", r"\(").replace(")", r"\)")):
            AscendConfig(**kwargs)
