"""What ``torch.npu.graph`` does around a capture, on a simulated Ascend host: CONTRACT tests, not hardware.

The stand-in (`tests.compilation.graph_standins.NpuRuntime`) models torch_npu/npu/graphs.py and
libtorch_npu.so of the wheels users install (2.10.0.post6, 2.14.0): each capture synchronizes and
empties the cache (2.14.0 also the host cache); acl_op kernels and ``TASK_QUEUE_ENABLE=2`` are
refused during a capture; under ``capture_error_mode="global"`` another thread's allocation fails
the capture. The first tests pin the stand-in to those rules; the rest hold diffusers-ascend to
them: the capture error mode a multi-threaded service needs, the cache emptying per enable on a
tiny Flux (one capture per block graph), and ``TASK_QUEUE_ENABLE=2`` refused with its reason.
"""

from __future__ import annotations

import threading

import pytest
import torch

import diffusers_ascend
from diffusers_ascend.platform import NPU_CAPTURE_ERROR_MODE
from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, flux_model_inputs, tiny_flux_transformer
from tests.compilation.graph_standins import RELEASES, NpuRuntime, StandInGraph
from tests.kernels.npu_standins import StandInTorchNpu

BF16 = torch.bfloat16
LAYERS = dict(num_layers=2, num_single_layers=2)


def _in_thread(fn) -> list:
    """Runs `fn` in another thread, to its end; returns what it raised (empty: nothing)."""
    raised = []

    def run():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - returned to the test
            raised.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return raised


# -- the stand-in: what the wheels do -----------------------------------------------------------
@pytest.mark.parametrize("release", RELEASES)
def test_each_capture_synchronizes_and_empties_the_cache(release):
    runtime = NpuRuntime(release)
    x = torch.ones(3)
    for _ in range(2):
        with runtime.graph(npu_graph=StandInGraph()):
            x + 1
    host = 2 if release == "2.14.0" else 0  # host_empty_cache: graphs.py of 2.14.0 only
    assert runtime.calls == {"synchronize": 2, "empty_cache": 2, **({"host_empty_cache": host} if host else {})}
    assert runtime.modes == ["global", "global"]  # torch.npu.graph's default


def test_an_unknown_mode_and_task_queue_2_are_refused(monkeypatch):
    runtime = NpuRuntime()
    with pytest.raises(
        RuntimeError, match="Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`"
    ):
        with runtime.graph(npu_graph=StandInGraph(), capture_error_mode="local"):
            pass
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "2")
    with pytest.raises(RuntimeError, match="Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture"):
        with runtime.graph(npu_graph=StandInGraph()):
            pass
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "1")
    with runtime.graph(npu_graph=StandInGraph()):
        pass


@pytest.mark.parametrize(
    "mode, other_thread_fails, own_sync_fails",
    [("global", True, True), ("thread_local", False, True), ("relaxed", False, False)],
)
def test_capture_error_modes(mode, other_thread_fails, own_sync_fails):
    """graphs.py: "global" errors on unsafe actions in other threads, "thread_local" only on the
    capturing thread's, "relaxed" on none; a broken capture fails at its end."""
    runtime = NpuRuntime()
    raised = []
    runtime.on_capture_begin.append(lambda: raised.extend(_in_thread(lambda: runtime.caching_allocator_alloc(1024))))
    if other_thread_fails:
        with pytest.raises(RuntimeError, match="invalidated by npuMalloc in another thread"):
            with runtime.graph(npu_graph=StandInGraph(), capture_error_mode=mode):
                pass
        assert len(raised) == 1 and "npuMalloc is not permitted" in str(raised[0])
    else:
        with runtime.graph(npu_graph=StandInGraph(), capture_error_mode=mode):
            runtime.caching_allocator_alloc(16)  # the capturing thread's own: the graph's pool
        assert raised == []
    runtime.on_capture_begin.clear()
    if own_sync_fails:
        with pytest.raises(RuntimeError, match="synchronize is not permitted"):
            with runtime.graph(npu_graph=StandInGraph(), capture_error_mode=mode):
                runtime.synchronize()
    else:
        with runtime.graph(npu_graph=StandInGraph(), capture_error_mode=mode):
            runtime.synchronize()


def test_acl_op_kernels_are_refused_during_capture(monkeypatch):
    torch_npu = StandInTorchNpu(aclnn=())  # no aclnnRmsNorm: npu_rms_norm takes its acl_op kernel
    x, gamma = torch.randn(2, 4, 8, dtype=BF16), torch.ones(8, dtype=BF16)
    torch_npu.npu_rms_norm(x, gamma)  # outside a capture: runs
    runtime = NpuRuntime()
    with pytest.raises(
        RuntimeError, match="Cannot run aclop operators during NPU graph capture. Current working aclop is RmsNorm"
    ):
        with runtime.graph(npu_graph=StandInGraph()):
            torch_npu.npu_rms_norm(x, gamma)
    assert _in_thread(lambda: torch_npu.npu_rms_norm(x, gamma)) == []  # another thread captures nothing


# -- diffusers-ascend on the simulated host ------------------------------------------------------
@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _enabled_flux():
    model = tiny_flux_transformer(dtype=BF16, **LAYERS)
    diffusers_ascend.enable_ascend_compile(model, graph_capture="graph_with_compile")  # attention auto: npu_fia
    return model


def _call(model, side=4):
    with torch.no_grad():
        return model(**flux_model_inputs(side, side, config={**FLUX_TRANSFORMER_CONFIG, **LAYERS}, dtype=BF16))[0]


def test_a_capture_survives_another_threads_allocation(simulated_npu, fresh_dynamo):
    """A service allocates on other threads (another request's VAE decode, inputs moved to the
    device) while a block is captured: under torch.npu.graph's default "global" mode every such
    capture fails and its graph runs uncaptured from then on. diffusers-ascend passes
    "thread_local": the captures hold, and this thread's own unsafe calls still fail them."""
    runtime = simulated_npu.npu.runtime
    raised = []
    runtime.on_capture_begin.append(lambda: raised.extend(_in_thread(lambda: runtime.caching_allocator_alloc(1 << 20))))
    model = _enabled_flux()
    _call(model)
    stats = model._ascend_state.backend.graph_capture.stats
    n_blocks = LAYERS["num_layers"] + LAYERS["num_single_layers"]
    assert raised == [] and not diffusers_ascend.ascend_report(model).fallbacks
    assert stats["captures"] == n_blocks and runtime.calls["alloc"] == n_blocks  # one allocation inside each capture
    assert runtime.modes == [NPU_CAPTURE_ERROR_MODE] * n_blocks == ["thread_local"] * n_blocks


@pytest.mark.parametrize("release", RELEASES)
def test_cache_emptying_is_one_per_captured_block_graph(simulated_npu, fresh_dynamo, release):
    """Each capture synchronizes and empties the cache (2.14.0: the host cache too): one per block
    graph and input signature, at the first call of that signature; replays add none. The bound
    (docs/graph-capture.md): compiled block graphs x signatures kept (`max_captured_graphs`)."""
    runtime = simulated_npu.npu.runtime
    runtime.release = release
    model = _enabled_flux()
    stats = model._ascend_state.backend.graph_capture.stats
    n_blocks = LAYERS["num_layers"] + LAYERS["num_single_layers"]

    def expected(captures):
        return {
            "synchronize": captures,
            "empty_cache": captures,
            **({"host_empty_cache": captures} if release == "2.14.0" else {}),
        }

    _call(model)
    assert stats["captures"] == n_blocks and runtime.calls == expected(n_blocks)
    _call(model)  # dynamo recompiles one single-block graph at the second call: it is captured too
    steady = stats["captures"]
    assert steady <= n_blocks + 1 and runtime.calls == expected(steady)
    replays = stats["replays"]
    _call(model)
    assert stats["replays"] == replays + n_blocks and runtime.calls == expected(steady)  # replays empty nothing
    _call(model, side=6)  # a new input signature: captured again
    assert stats["captures"] > steady and runtime.calls == expected(stats["captures"])


def test_task_queue_enable_2_is_refused_at_enable_with_its_reason(simulated_npu, fresh_dynamo, monkeypatch):
    """torch_npu refuses TASK_QUEUE_ENABLE=2 in every capture: the graphs run uncaptured and say
    why, without a capture attempt (each would synchronize and empty the cache for nothing)."""
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "2")
    model = _enabled_flux()
    with pytest.warns(UserWarning, match="TASK_QUEUE_ENABLE=2"):
        out = _call(model)
    assert torch.isfinite(out).all()
    reasons = [f["reason"] for f in diffusers_ascend.ascend_report(model).fallbacks]
    assert reasons and all("TASK_QUEUE_ENABLE=2" in r for r in reasons)
    assert model._ascend_state.backend.graph_capture.stats["captures"] == 0 and runtime_calls(simulated_npu) == {}


def runtime_calls(host) -> dict:
    return dict(host.npu.runtime.calls)
