"""The kernels inside compiled diffusers blocks (tiny Flux double/single and Wan, fp32 and bf16):
``AscendBackend(fusions="all", executor="eager")`` binds the triton provider to every fused
rms_norm / rope / adaln / mul_add node, and the block's output matches eager. Interpreter only."""

from __future__ import annotations

import pytest
import torch

from .cases import assert_block_matches, compile_block, tiny_block

pytestmark = pytest.mark.usefixtures("interpreter")

# Replacements per block with fusions="all" (FINDINGS section 1); gelu_tanh has no Triton kernel.
TRITON_NODES = {"flux_double": 4 + 2 + 4 + 4, "flux_single": 2 + 2 + 1 + 1, "wan": 4 + 2 + 2 + 2}
GELU_NODES = {"flux_double": 2, "flux_single": 1, "wan": 1}
ROPE_NODES = 2  # q and k, in each block
RMS_NORM_NODES = {"flux_double": 4, "flux_single": 2}  # q and k norms (and the text stream's)
ADALN_NODES = {"flux_double": 4, "flux_single": 1, "wan": 2}
MUL_ADD_NODES = {"flux_double": 4, "flux_single": 1, "wan": 2}


def _run(block, inputs, monkeypatch, ascend: bool):
    """`compile_block`, counting the kernels launched (in order): (launched, backend, outputs,
    eager outputs); ``ascend``: planned as Ascend plans (`_common.AFFINE_TILE_DEVICES` with CPU)."""
    from ascend_kernels.triton import _common

    launched = []
    real_launch = _common.Launch.__call__
    monkeypatch.setattr(
        _common.Launch, "__call__", lambda self: launched.append(self.kernel.__name__) or real_launch(self)
    )
    if ascend:
        monkeypatch.setattr(_common, "AFFINE_TILE_DEVICES", (*_common.AFFINE_TILE_DEVICES, "cpu"))
    return (launched, *compile_block(block, inputs))


@pytest.mark.parametrize("batch,tiles", [(1, "row_tiles"), (1, "affine_tiles"), (2, "affine_tiles")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(TRITON_NODES))
def test_block_runs_the_triton_kernels(name, dtype, batch, tiles, monkeypatch):
    """Also as Ascend plans them (`_common.AFFINE_TILE_DEVICES`): every rope node takes token tiles
    (tables per token, shared by the batch at batch 2), and at batch 2 every adaLN and mul_add node
    takes batch tiles (a modulation or gate row per sample)."""
    block, inputs = tiny_block(name, dtype, batch)
    ascend = tiles == "affine_tiles"
    launched, backend, out, ref = _run(block, inputs, monkeypatch, ascend)
    assert len(launched) == TRITON_NODES[name], launched  # one forward: a launch per fused node
    assert launched.count("_rope_tokens_kernel") == (ROPE_NODES if ascend else 0), launched
    assert launched.count("_adaln_batches_kernel") == (ADALN_NODES[name] if ascend and batch == 2 else 0), launched
    assert launched.count("_mul_add_batches_kernel") == (MUL_ADD_NODES[name] if ascend and batch == 2 else 0), launched
    assert launched.count("_rms_norm_tokens_kernel") == 0, launched  # q/k of separate projections are flat
    (graph,) = backend.report.graphs
    bound = list(graph["bound_providers"].values())
    assert bound.count("triton") == TRITON_NODES[name], graph["bound_providers"]
    assert bound.count("native") == GELU_NODES[name], graph["bound_providers"]
    assert_block_matches(out, ref, dtype, name)


@pytest.mark.parametrize("tiles", ["row_tiles", "affine_tiles"])
@pytest.mark.parametrize("name", ["flux_double", "flux_single"])
def test_fused_qkv_projections(name, tiles, monkeypatch):
    """After diffusers' ``fuse_projections()`` the q/k norms read chunks of one QKV output (token
    stride 3 x H x D): Ascend plans every rms_norm node as token tiles, CUDA as row tiles, and the
    block still matches eager. Batch 2, bf16."""
    dtype = torch.bfloat16
    block, inputs = tiny_block(name, dtype, 2)
    block.attn.fuse_projections()
    ascend = tiles == "affine_tiles"
    launched, backend, out, ref = _run(block, inputs, monkeypatch, ascend)
    assert len(launched) == TRITON_NODES[name], launched
    rms_nodes = RMS_NORM_NODES[name]
    assert launched.count("_rms_norm_tokens_kernel") == (rms_nodes if ascend else 0), launched
    assert launched.count("_rms_norm_kernel") == (0 if ascend else rms_nodes), launched
    assert_block_matches(out, ref, dtype, name)
