"""Fixtures and the snapshot test backend shared by the compilation tests (all CPU)."""

from __future__ import annotations

import collections
import copy

import pytest
import torch

from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.fusions import FUSION_TO_OP, default_fusions

ALL = default_fusions()  # fusions="all"

# FINDINGS section 1: replacements per block with these fusions (fp32 and bf16 alike). Flux's and
# Wan's feed-forwards are tanh-GELU: no SwiGLU site.
_FLOAT = {"int8_dynamic_linear": 0, "int8_weight_only_linear": 0}  # float blocks: no quantized linear
EXPECTED_BLOCK_COUNTS = {
    "flux_double": {"rms_norm": 4, "rope": 2, "gelu_tanh": 2, "adaln": 4, "mul_add": 4, "swiglu": 0, **_FLOAT},
    "flux_single": {"rms_norm": 2, "rope": 2, "gelu_tanh": 1, "adaln": 1, "mul_add": 1, "swiglu": 0, **_FLOAT},
    "wan": {"rms_norm": 4, "rope": 2, "gelu_tanh": 1, "adaln": 2, "mul_add": 2, "swiglu": 0, **_FLOAT},
}

FUSED_OP = dict(FUSION_TO_OP)


def tolerances(dtype: torch.dtype) -> dict:
    """Per-dtype tolerances of ``ascend_kernels.testing`` (the kernels' own contract)."""
    from ascend_kernels.testing import TOLERANCES

    return dict(TOLERANCES[dtype])


def assert_close(actual, expected, dtype=None, **kw):
    dtype = dtype or expected.dtype
    tol = {**tolerances(dtype), **kw}
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


def as_tuple(out) -> tuple:
    """A module's output as a tuple of tensors (blocks return one tensor or a pair)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def to_fp64(inputs: dict) -> dict:
    """Block kwargs with every floating tensor (also inside tuples, e.g. rotary tables) in fp64."""

    def cast(v):
        if isinstance(v, tuple):
            return tuple(cast(t) for t in v)
        return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    return {k: cast(v) for k, v in inputs.items()}


def assert_as_accurate_as_eager(out, ref, ref64, dtype):
    """Low-precision numerics of a compiled block. The fused ops and Inductor's kernels round once
    where eager rounds after every op, so they may differ from eager by more than the bf16
    tolerance while being the more accurate: against an fp64 run of the same weights (`ref64`) the
    output must be about as close as eager's (`ref`) is, and within a loose tolerance of eager."""
    err = (out.double() - ref64).abs().max().item()
    eager_err = (ref.double() - ref64).abs().max().item()
    assert err <= 1.5 * eager_err + 1e-3, (err, eager_err)
    assert_close(out, ref, dtype, atol=0.1, rtol=0.05)


def _targets(graph: torch.fx.Graph) -> collections.Counter:
    return collections.Counter(
        n.target for n in graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    )


class SnapshotBackend(AscendBackend):
    """`AscendBackend` that keeps each graph before and after rewriting, to assert on ops.

    ``before[i]`` / ``after[i]`` are `collections.Counter`s of op overloads of the i-th graph;
    ``after_graphs[i]`` the rewritten graph itself.
    """

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.before, self.after, self.after_graphs = [], [], []

    def _rewrite(self, gm, name, *args, **kwargs):
        self.before.append(_targets(gm.graph))
        entry = super()._rewrite(gm, name, *args, **kwargs)
        self.after.append(_targets(gm.graph))
        self.after_graphs.append(copy.deepcopy(gm.graph))
        return entry

    def fused_calls(self, fusion: str, graph: int = -1) -> int:
        op = getattr(torch.ops.ascend_kernels, FUSED_OP[fusion]).default
        return self.after[graph][op]

    def assert_fused(self, fusion: str, count: int, gone=(), graph: int = -1) -> None:
        """`count` calls of the fused op in the rewritten graph, none of the ops in `gone` left
        (that were there before)."""
        assert self.fused_calls(fusion, graph) == count, (fusion, self.after[graph])
        for op in gone:
            assert self.before[graph][op] > 0, f"{op} was not in the graph before: test is vacuous"
            assert self.after[graph][op] == 0, f"{op} still in the rewritten graph"


def compile_module(module, backend, fullgraph=True, **kw):
    torch._dynamo.reset()
    return torch.compile(module, backend=backend, fullgraph=fullgraph, **kw)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fresh_dynamo_no_grad():
    """A fresh dynamo cache before and after the test, which runs under ``torch.no_grad()``."""
    torch._dynamo.reset()
    with torch.no_grad():
        yield
    torch._dynamo.reset()
