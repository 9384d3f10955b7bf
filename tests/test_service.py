"""Service behaviour: repeated enable/disable, threads, torch's global RNG.

A service enables, calls and disables models for hours, from several threads; each test here
reproduces what broke there on a real tiny Flux model, real dynamo and the real backend.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest
import torch

import diffusers_ascend
from ascend_kernels.testing import assert_close
from diffusers_ascend.benchmarks._common import flux_model_inputs
from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, tiny_flux_transformer

LAYERS = dict(num_layers=1, num_single_layers=1)
FAST = dict(fusions="all", executor="eager")


def _inputs(size: int = 4, seed: int = 0):
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return flux_model_inputs({**FLUX_TRANSFORMER_CONFIG, **LAYERS}, size, size)
    finally:
        torch.random.set_rng_state(gen_state)


def _call(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def _report_key(report):
    return (len(report.graphs), dict(report.matches), len(report.fallbacks), report.ops_before, report.ops_after)


# -- enable / call / disable, again and again ------------------------------------------------------
def test_enable_disable_cycles_compile_and_report_like_the_first_with_flat_memory():
    """Every enable used to build a new backend; dynamo keeps each in the block's code cache (the
    guard is the backend's identity) until the recompile limit, then runs the blocks eager with a
    report of 0 graphs and no fallback, and memory grew ~2.5 MiB a cycle. A low recompile limit
    reaches that point in 5 cycles instead of 17."""
    torch._dynamo.reset()
    model = tiny_flux_transformer(**LAYERS)
    inputs = _inputs()
    eager = _call(model, inputs)
    first = None
    grown = []
    for cycle in range(12):
        diffusers_ascend.enable_ascend_compile(model, recompile_limit=4, **FAST)
        out = _call(model, inputs)
        report = diffusers_ascend.ascend_report(model)
        key = _report_key(report)
        if first is None:
            first = key
            assert key[0] == 2 and sum(key[1].values()) > 0  # one graph per block class, fused
        assert key == first, f"cycle {cycle}: report {key} != first {first}"
        assert_close(out, eager)
        diffusers_ascend.disable_ascend_compile(model)
        gc.collect()
        if cycle == 3:
            tracemalloc.start()
        elif cycle > 3:
            grown.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    # Measured before the fix: ~2.5 MiB a cycle (8 cycles: ~20 MiB). Now: a few KiB in all.
    assert grown[-1] < 512 * 1024, f"memory grew {grown[-1] / 2**20:.2f} MiB over {len(grown)} enable/disable cycles"


def test_enable_with_another_config_compiles_with_its_own_backend():
    """Reuse is for equal configs only: another config compiles its own graphs (its fusions)."""
    torch._dynamo.reset()
    model = tiny_flux_transformer(**LAYERS)
    inputs = _inputs()
    diffusers_ascend.enable_ascend_compile(model, **FAST)
    _call(model, inputs)
    all_fused = diffusers_ascend.ascend_report(model).matches
    backend = model._ascend_state.backend
    one = next(f for f, n in all_fused.items() if n > 0)
    diffusers_ascend.enable_ascend_compile(model, fusions=[one], executor="eager")
    _call(model, inputs)
    report = diffusers_ascend.ascend_report(model)
    assert model._ascend_state.backend is not backend
    assert report.matches == {one: all_fused[one]} and len(report.graphs) == 2
    diffusers_ascend.enable_ascend_compile(model, **FAST)  # back to the first: its backend again
    assert model._ascend_state.backend is backend
    _call(model, inputs)
    assert diffusers_ascend.ascend_report(model).matches == all_fused
    torch._dynamo.reset()  # dynamo dropped the graphs: the next enable compiles (and reports) anew
    diffusers_ascend.enable_ascend_compile(model, **FAST)
    assert model._ascend_state.backend is not backend
    _call(model, inputs)
    assert diffusers_ascend.ascend_report(model).matches == all_fused
