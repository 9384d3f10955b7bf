"""Graph capture on an Ascend NPU (NPUGraph): marked ``npu``, skipped where there is none.

NOT YET RUN: no NPU has been available. Run on a 910B host: ``pytest -m npu tests/compilation/test_graph_capture_npu.py``.
The same paths on a simulated host (stand-ins, every CI run): tests/integration/test_npu_fia_capture.py.
"""

from __future__ import annotations

import pytest
import torch

from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.platform import graph_api
from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks

from .conftest import assert_close

pytestmark = [pytest.mark.npu, pytest.mark.usefixtures("fresh_dynamo_no_grad")]


def test_platform_supplies_npugraph():
    api = graph_api("npu")
    assert api is not None and api.graph_class is torch.npu.NPUGraph and api.device_type == "npu"


@pytest.mark.parametrize("mode", ["graph_only", "graph_with_compile"])
def test_flux_block_replays_on_npu_and_equals_eager(mode):
    dtype = torch.bfloat16
    block = tiny_flux_blocks(dtype=dtype)[0].to("npu")  # diffusers' default attention (SDPA), not _native_npu
    backend = AscendBackend(executor="eager", graph_capture=mode, attention=None)
    compiled = torch.compile(block, backend=backend)
    for seed in range(3):
        x = {
            k: (v.to("npu") if isinstance(v, torch.Tensor) else tuple(t.to("npu") for t in v))
            for k, v in flux_block_inputs(seed=seed, dtype=dtype).items()
        }
        for o, r in zip(compiled(**x), block(**x)):
            assert_close(o, r, dtype)
    assert backend.graph_capture.stats["captures"] == 1 and not backend.report.fallbacks


@pytest.mark.parametrize("mode", ["graph_only", "graph_with_compile"])
def test_full_width_flux_block_with_npu_fia_replays_equal_eager(mode):
    """A Flux.1 block at full width (dim 3072, 24 heads x 128) and 1024 image + 512 text tokens,
    attention through npu_fia (FIA), captured in an NPUGraph: replays equal eager, FIA ran."""
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed, FluxTransformerBlock

    from diffusers_ascend.attention import backend_for, processors

    dtype, dev = torch.bfloat16, "npu"
    torch.manual_seed(0)
    block = FluxTransformerBlock(dim=3072, num_attention_heads=24, attention_head_dim=128).to(dev, dtype).eval()
    for p in processors(block):
        p._attention_backend = backend_for("npu_fia")
    txt, side = 512, 32
    ids = torch.cat(
        [
            torch.zeros(txt, 3),
            torch.stack(
                torch.meshgrid(torch.zeros(1), torch.arange(side * 1.0), torch.arange(side * 1.0), indexing="ij"), -1
            ).reshape(-1, 3),
        ]
    )
    rotary = tuple(t.to(dev) for t in FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(ids))
    backend = AscendBackend(executor="eager", graph_capture=mode, attention="npu_fia")
    compiled = torch.compile(block, backend=backend)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x = dict(
            hidden_states=torch.randn(1, side * side, 3072, generator=g).to(dev, dtype),
            encoder_hidden_states=torch.randn(1, txt, 3072, generator=g).to(dev, dtype),
            temb=torch.randn(1, 3072, generator=g).to(dev, dtype),
            image_rotary_emb=rotary,
        )
        for o, r in zip(compiled(**x), block(**x)):
            assert_close(o, r, dtype)
    assert backend.graph_capture.stats["captures"] == 1 and backend.graph_capture.stats["replays"] >= 3
    assert not backend.report.fallbacks
