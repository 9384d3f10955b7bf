"""Fusion switches and isolation: a fusion switched off matches nothing and leaves the others'
counts; two backends with different configs in one process keep their own counts."""

from __future__ import annotations

import pytest
import torch

from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks

from .conftest import ALL, EXPECTED_BLOCK_COUNTS, SnapshotBackend, compile_module


@pytest.fixture(scope="module")
def single_block():
    _, single = tiny_flux_blocks()
    return single, flux_block_inputs()


@pytest.mark.parametrize("off", ALL)
def test_fusion_switched_off(single_block, off):
    block, inputs = single_block
    enabled = [f for f in ALL if f != off]
    backend = SnapshotBackend(fusions=enabled, executor="eager")
    with torch.no_grad():
        out = compile_module(block, backend)(**inputs)
        ref = block(**inputs)
    expected = {f: n for f, n in EXPECTED_BLOCK_COUNTS["flux_single"].items() if f != off}
    # What a switched-off fusion leaves is partly a multiply-add, which the generic pass then takes:
    # adaLN's `norm(x) * (1 + scale) + shift` (1), rope's `x * cos + rot * sin` (1 per rope).
    if off != "mul_add":
        expected["mul_add"] += {"adaln": 1, "rope": 2}.get(off, 0)
    assert backend.report.matches == expected
    assert off not in backend.report.matches
    assert backend.fused_calls(off) == 0
    torch.testing.assert_close(out, ref)


def test_no_fusions_rewrites_nothing(single_block):
    block, inputs = single_block
    backend = SnapshotBackend(fusions="none", executor="eager")
    with torch.no_grad():
        compile_module(block, backend)(**inputs)
    assert backend.report.matches == {}
    assert backend.report.ops_after == backend.report.ops_before > 0
    assert not any(op.namespace == "ascend_kernels" for op in backend.after[-1])


def test_two_backends_two_configs_in_one_process(single_block):
    block, inputs = single_block
    a = AscendBackend(fusions=["rms_norm", "rope"], executor="eager")
    b = AscendBackend(fusions=["gelu_tanh", "adaln"], executor="eager")
    with torch.no_grad():
        compile_module(block, a)(**inputs)
        torch._dynamo.reset()
        compile_module(block, b)(**inputs)
        torch._dynamo.reset()
        compile_module(block, a)(**inputs)  # a again, after b registered its passes
    assert a.report.matches == {"rms_norm": 4, "rope": 4}  # two compiles of 2 + 2
    assert b.report.matches == {"gelu_tanh": 1, "adaln": 1}
    assert a.report.graphs_compiled == 2 and b.report.graphs_compiled == 1


def test_unknown_fusion_is_a_clear_error():
    from diffusers_ascend.compilation.passes import get_pass_class, ordered_fusions

    with pytest.raises(ValueError, match="valid"):
        ordered_fusions(["rms_norm", "layer_norm"])
    with pytest.raises(ValueError, match="rms_norm"):
        get_pass_class("rmsnorm")
