"""The kernels inside compiled diffusers blocks (tiny Flux double/single and Wan, fp32 and bf16):
``AscendBackend(fusions="all", executor="eager")`` binds the triton provider to every fused
rms_norm / rope / adaln / mul_add node, and the block's output matches eager. Interpreter only."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels.testing import assert_close
from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks, tiny_wan_block, wan_block_inputs

pytestmark = pytest.mark.usefixtures("interpreter")

# Replacements per block with fusions="all" (FINDINGS section 1); gelu_tanh has no Triton kernel.
TRITON_NODES = {"flux_double": 4 + 2 + 4 + 4, "flux_single": 2 + 2 + 1 + 1, "wan": 4 + 2 + 2 + 2}
GELU_NODES = {"flux_double": 2, "flux_single": 1, "wan": 1}
ROPE_NODES = 2  # q and k, in each block


def _block(name, dtype):
    if name == "wan":
        return tiny_wan_block(dtype=dtype), wan_block_inputs(dtype=dtype)
    double, single = tiny_flux_blocks(dtype=dtype)
    return (double if name == "flux_double" else single), flux_block_inputs(dtype=dtype)


@pytest.mark.parametrize("tiles", ["row_tiles", "token_tiles"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(TRITON_NODES))
def test_block_runs_the_triton_kernels(name, dtype, tiles, monkeypatch):
    """Also as Ascend plans rope (token tiles): every rope node of these blocks takes them."""
    from ascend_kernels.triton import rope

    token_plans = []
    real = rope._plan_tokens
    monkeypatch.setattr(rope, "_plan_tokens", lambda *a: token_plans.append(a[0][0].shape) or real(*a))
    if tiles == "token_tiles":
        monkeypatch.setattr(rope, "TOKEN_TILE_DEVICES", (*rope.TOKEN_TILE_DEVICES, "cpu"))
    torch._dynamo.reset()
    block, inputs = _block(name, dtype)
    backend = AscendBackend(fusions="all", executor="eager", on_error="raise")
    try:
        with torch.no_grad():
            out = torch.compile(block, backend=backend, fullgraph=True)(**inputs)
            ref = block(**inputs)
    finally:
        torch._dynamo.reset()
    assert len(token_plans) == (ROPE_NODES if tiles == "token_tiles" else 0), token_plans
    (graph,) = backend.report.graphs
    bound = list(graph["bound_providers"].values())
    assert bound.count("triton") == TRITON_NODES[name], graph["bound_providers"]
    assert bound.count("native") == GELU_NODES[name], graph["bound_providers"]
    out, ref = (out if isinstance(out, tuple) else (out,)), (ref if isinstance(ref, tuple) else (ref,))
    for o, r in zip(out, ref):
        # Same tolerance as tests/compilation/test_blocks.py: fused fp32 math vs eager's bf16 steps.
        kw = {} if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
        assert_close(o, r, dtype, **kw, msg=name)
