"""The Triton kernels compiled by triton-ascend and run on an Ascend NPU (``pytest -m npu -p no:xdist
tests/triton/test_npu.py`` on a 910B host with torch_npu and triton-ascend; skipped anywhere else,
and under TRITON_INTERPRET=1).

What no CI here can run: CANN's ``bishengir-compile`` of every launch (which decides whether each
tile fits the vector core's unified buffer: `_common.ROW_TILE_LIMIT` is an estimate until this
runs) and the kernels' numerics on the NPU, against the native composite on the same NPU. An NPU
plans Ascend's tilings by itself (rope's and rms_norm's token tiles, adaLN's and mul_add's batch
tiles, row chunks); each test asserts the kernel it meant to run. The provider is chosen
explicitly: on an NPU the torch_npu (and MindIE SD) providers come first where they exist.
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernels.registry import use_providers
from ascend_kernels.triton import triton_ascend_available

from .cases import (
    CASES,
    ROW_REDUCTION_CASES,
    assert_block_matches,
    check_forced,
    compile_block,
    rows_in_chunks,
    tiny_block,
)
from .conftest import randn

pytestmark = [
    pytest.mark.npu,
    pytest.mark.skipif(not triton_ascend_available(), reason="needs triton-ascend (pip install triton-ascend)"),
]

ALL_TRITON = dict(rms_norm="triton", rope="triton", adaln_modulate="triton", mul_add="triton")
bf, f32 = torch.bfloat16, torch.float32


def _planned(op: str, args: tuple) -> str:
    from ascend_kernels.triton import planner

    return planner(op)(*args)[1].kernel.__name__


@pytest.mark.parametrize("op,case", [(op, c) for op in CASES for c in CASES[op]])
def test_cases(op, case, dtype):
    args = CASES[op][case](dtype, "npu")
    for layout in ("interleaved", "half") if op == "rope" else (None,):
        check_forced(op, args + ((layout,) if layout else ()), f"{op} {case} {layout or ''}")


@pytest.mark.parametrize("op,case", ROW_REDUCTION_CASES)
def test_row_chunks(op, case, dtype, monkeypatch):
    """The chunked reductions on every case (a limit of half the case's row: 2-8 chunks)."""
    args = CASES[op][case](dtype, "npu")
    rows_in_chunks(monkeypatch, args)
    assert _planned(op, args).endswith("_chunks_kernel")
    check_forced(op, args, f"{op} {case} (row chunks)")


def _model_size_calls() -> list[tuple[str, str, tuple, str]]:
    """(name, op, args, the kernel Ascend plans): Flux at 1024 px, a slab of Wan 14B's 75600 tokens,
    SD3's width under a batched CFG, bf16 with the models' fp32 tables, weights and modulation."""
    dev = "npu"
    q = randn(1, 4608, 24, 128, dtype=bf, device=dev)
    q2 = randn(2, 4608, 24, 128, dtype=bf, device=dev, seed=1)
    qkv_q = randn(2, 4096, 3 * 3072, dtype=bf, device=dev, seed=2)[..., :3072].unflatten(-1, (24, 128))
    tables = randn(1, 4608, 1, 128, device=dev, seed=3), randn(1, 4608, 1, 128, device=dev, seed=4)
    h, mod = randn(1, 4096, 3072, dtype=bf, device=dev, seed=5), randn(1, 3072, dtype=bf, device=dev, seed=6)
    sd3, sd3_mod = randn(2, 4096, 1536, dtype=bf, device=dev, seed=7), randn(2, 6 * 1536, dtype=bf, device=dev, seed=8)
    wan = randn(1, 75600 // 16, 5120, dtype=bf, device=dev, seed=9)
    wan_q = randn(1, 75600 // 16, 40, 128, dtype=bf, device=dev, seed=10)
    wan_tables = randn(1, 75600 // 16, 1, 128, device=dev, seed=11), randn(1, 75600 // 16, 1, 128, device=dev, seed=12)
    wan_mod = randn(1, 1, 5120, device=dev, seed=13)
    return [
        ("flux q norm", "rms_norm", (q, randn(128, device=dev), 1e-6, None), "_rms_norm_kernel"),
        ("flux fused-QKV q norm", "rms_norm", (qkv_q, randn(128, device=dev), 1e-6, None), "_rms_norm_tokens_kernel"),
        ("wan q/k norm", "rms_norm", (wan, randn(5120, device=dev), 1e-6, None), "_rms_norm_chunks_kernel"),
        ("flux rope", "rope", (q, *tables, "interleaved"), "_rope_tokens_kernel"),
        ("flux rope batch 2", "rope", (q2, *tables, "interleaved"), "_rope_tokens_kernel"),
        ("wan rope", "rope", (wan_q, *wan_tables, "interleaved"), "_rope_tokens_kernel"),
        ("flux adaln", "adaln_modulate", (h, mod, mod, 1e-6, None, None, None), "_adaln_kernel"),
        (
            "sd3 adaln batch 2",
            "adaln_modulate",
            (sd3, sd3_mod[:, :1536], sd3_mod[:, 1536:3072], 1e-6, None, None, None),
            "_adaln_batches_kernel",
        ),
        ("wan adaln", "adaln_modulate", (wan, wan_mod, wan_mod, 1e-6, None, None, bf), "_adaln_chunks_kernel"),
        ("flux gate", "mul_add", (mod[:, None], h, h), "_mul_add_kernel"),
        ("sd3 gate batch 2", "mul_add", (sd3_mod[:, None, 3072:4608], sd3, sd3), "_mul_add_batches_kernel"),
        ("wan gate", "mul_add", (wan, wan_mod, wan.float()), "_mul_add_kernel"),
    ]


def test_model_sizes_bf16():
    for name, op, args, kernel in _model_size_calls():
        assert _planned(op, args) == kernel, name
        check_forced(op, args, name)


@pytest.mark.parametrize("name", ["flux_double", "flux_single", "wan"])
def test_inside_compiled_blocks(name):
    """The tiny Flux/Wan blocks (bf16, batch 2) with every fusion on the eager executor, NPU's
    default: each fused node runs its Triton kernel on the NPU, and the block matches eager there."""
    with use_providers(**ALL_TRITON):
        backend, out, ref = compile_block(*tiny_block(name, bf, 2, device="npu"))
    (graph,) = backend.report.graphs
    assert "triton" in graph["bound_providers"].values(), graph["bound_providers"]
    assert_block_matches(out, ref, bf, name)
