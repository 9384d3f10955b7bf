"""A compiled block's fallback to eager when several threads call blocks at the same moment: one
warning and one report entry per block, and only the failing call's graphs stop counting."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

import diffusers_ascend
from ascend_kernels.testing import assert_close
from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_transformer

FAST = dict(fusions="all", executor="eager")
TIMEOUT = 60


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _enable_with_failing(model, failing, gate):
    """Enables `model`; the compiled call of block `failing` waits for `gate()` and then raises
    (a compile failure), after the call has started: the window where other threads compile.
    Every block of a config calls one dynamo wrapper (`integration.block_compile.CompiledCall`), given the block."""
    diffusers_ascend.enable_ascend_compile(model, **FAST)
    compiled_call = model._ascend_state.compiled_call
    cfg = compiled_call.cfg
    real = torch.compile(compiled_call.fn, backend=compiled_call.backend, dynamic=cfg.dynamic, fullgraph=cfg.fullgraph)

    def wrapper(module, *args, **kwargs):
        if module is failing:
            gate()
            raise RuntimeError("injected compile failure")
        return real(module, *args, **kwargs)

    compiled_call._wrapper = wrapper


def _run_threads(*targets):
    errors = []

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return [str(w.message) for w in caught if "failed to compile" in str(w.message)]


def test_a_failing_block_does_not_discard_another_threads_graph():
    """Thread A's call of the single block starts, thread B compiles the double block meanwhile,
    then A's compile fails: only A's graphs stop counting, B's graph still counts."""
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    double, single = model.transformer_blocks[0], model.single_transformer_blocks[0]
    inputs = flux_block_inputs(dim=model.inner_dim)
    ref = double(**inputs)
    b_compiled = threading.Event()
    _enable_with_failing(model, single, lambda: b_compiled.wait(TIMEOUT))
    results = {}

    def a():
        results["a"] = single(**inputs)

    def b():
        results["b"] = double(**inputs)
        b_compiled.set()

    messages = _run_threads(a, b)
    assert len(messages) == 1 and "injected compile failure" in messages[0]
    for got, want in zip(results["b"], ref):
        assert_close(got, want, dtype=torch.float32)
    report = diffusers_ascend.ascend_report(model)
    assert [g["name"].split(":")[0] for g in report.graphs] == ["FluxTransformerBlock"]
    assert not report.graphs[0].get("fell_back")  # the double block's graph runs
    assert report.matches == report.graphs[0]["matches"]
    assert [(fb["module"], "lost" in fb) for fb in report.to_dict()["fallbacks"]] == [
        ("single_transformer_blocks.0", False)
    ]


def test_two_threads_failing_on_one_block_record_one_fallback():
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    single = model.single_transformer_blocks[0]
    inputs = flux_block_inputs(dim=model.inner_dim)
    ref = single(**inputs)
    both_in = threading.Barrier(2, timeout=TIMEOUT)
    _enable_with_failing(model, single, both_in.wait)
    outs = []
    messages = _run_threads(*[lambda: outs.append(single(**inputs))] * 2)
    for out in outs:  # both calls ran eager
        assert_close(out[1], ref[1], dtype=torch.float32)
    assert len(outs) == 2
    assert len(messages) == 1
    report = diffusers_ascend.ascend_report(model)
    assert [fb["module"] for fb in report.to_dict()["fallbacks"]] == ["single_transformer_blocks.0"]
    assert single._compiled_call_impl is None
