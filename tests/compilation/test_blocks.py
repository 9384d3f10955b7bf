"""All five fusions on the real diffusers blocks (tiny widths): the per-block replacement counts
of FINDINGS section 1, the op reduction, numerics vs eager, fullgraph."""

from __future__ import annotations

import copy

import pytest
import torch

from diffusers_ascend.tiny import (
    flux_block_inputs,
    flux_model_inputs,
    tiny_flux_blocks,
    tiny_wan_block,
    wan_block_inputs,
    wan_model_inputs,
)

from .conftest import (
    EXPECTED_BLOCK_COUNTS,
    SnapshotBackend,
    as_tuple,
    assert_as_accurate_as_eager,
    assert_close,
    to_fp64,
)

BLOCKS = ["flux_double", "flux_single", "wan"]
DTYPES = [torch.float32, torch.bfloat16]


def make_block(name, dtype):
    if name == "wan":
        return tiny_wan_block(dtype=dtype), wan_block_inputs(dtype=dtype)
    double, single = tiny_flux_blocks(dtype=dtype)
    inputs = flux_block_inputs(dtype=dtype)
    if name == "flux_double":
        return double, inputs
    return single, inputs


@pytest.fixture(scope="module")
def compiled():
    """(block, dtype) -> dict(backend, out, ref, ref64): each block compiled once per dtype."""
    results = {}
    for name in BLOCKS:
        for dtype in DTYPES:
            torch._dynamo.reset()
            block, inputs = make_block(name, dtype)
            backend = SnapshotBackend(fusions="all", executor="eager")
            with torch.no_grad():
                out = as_tuple(torch.compile(block, backend=backend, fullgraph=True)(**inputs))
                ref = as_tuple(block(**inputs))
                ref64 = as_tuple(copy.deepcopy(block).double()(**to_fp64(inputs)))
            results[name, dtype] = dict(backend=backend, out=out, ref=ref, ref64=ref64)
    torch._dynamo.reset()
    return results


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BLOCKS)
def test_block_counts(compiled, name, dtype):
    backend = compiled[name, dtype]["backend"]
    report = backend.report
    assert report.graphs_compiled == 1  # fullgraph, one graph per block
    assert report.matches == EXPECTED_BLOCK_COUNTS[name]
    for fusion, n in EXPECTED_BLOCK_COUNTS[name].items():
        backend.assert_fused(fusion, n)
    assert not report.fallbacks


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BLOCKS)
def test_block_op_reduction(compiled, name, dtype):
    report = compiled[name, dtype]["backend"].report
    assert report.ops_before > 0
    ratio = report.ops_after / report.ops_before
    assert ratio <= (0.45 if dtype == torch.bfloat16 else 0.5), (report.ops_before, report.ops_after)
    # The per-graph detail adds up to the totals.
    (graph,) = report.graphs
    assert (graph["ops_before"], graph["ops_after"]) == (report.ops_before, report.ops_after)
    assert graph["matches"] == report.matches and graph["executor"] == "eager"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BLOCKS)
def test_block_numerics(compiled, name, dtype):
    r = compiled[name, dtype]
    for out, ref, ref64 in zip(r["out"], r["ref"], r["ref64"]):
        assert out.dtype == ref.dtype and out.shape == ref.shape
        if dtype == torch.float32:
            assert_close(out, ref, dtype)
        else:  # the fused ops compute in fp32: in practice closer to fp64 than eager bf16
            assert_as_accurate_as_eager(out, ref, ref64, dtype)


def test_whole_models_compiled_as_one_graph():
    """compile="model": the counts are the blocks' sums plus what the model adds outside them
    (Flux's `norm_out` is an `AdaLayerNormContinuous` adaLN; Wan's `norm_out` an fp32 adaLN and its
    text projection a tanh GELU), and the output equals eager."""
    from diffusers_ascend.tiny import tiny_flux_transformer, tiny_wan_transformer

    d, s, w = (EXPECTED_BLOCK_COUNTS[k] for k in ("flux_double", "flux_single", "wan"))
    flux = tiny_flux_transformer(num_layers=2, num_single_layers=2)
    wan = tiny_wan_transformer(num_layers=2)
    expected = {
        "flux": ({f: 2 * d[f] + 2 * s[f] for f in d}, {"adaln": 1}),
        "wan": ({f: 2 * w[f] for f in w}, {"gelu_tanh": 1, "adaln": 1}),
    }
    for name, model, inputs in [("flux", flux, flux_model_inputs(4, 4)), ("wan", wan, wan_model_inputs(2, 4, 4))]:
        torch._dynamo.reset()
        backend = SnapshotBackend(fusions="all", executor="eager")
        with torch.no_grad():
            out = torch.compile(model, backend=backend, fullgraph=True)(**inputs)[0]
            ref = model(**inputs)[0]
        blocks, outside = expected[name]
        assert backend.report.matches == {f: n + outside.get(f, 0) for f, n in blocks.items()}, name
        assert backend.report.graphs_compiled == 1
        assert_close(out, ref, torch.float32)
