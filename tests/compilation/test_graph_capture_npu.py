"""Graph capture on an Ascend NPU (NPUGraph): marked ``npu``, skipped where there is none.

NOT YET RUN: no NPU has been available. Run on a 910B host: ``pytest -m npu tests/compilation/test_graph_capture_npu.py``.
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
        x = {k: (v.to("npu") if isinstance(v, torch.Tensor) else tuple(t.to("npu") for t in v))
             for k, v in flux_block_inputs(seed=seed, dtype=dtype).items()}
        for o, r in zip(compiled(**x), block(**x)):
            assert_close(o, r, dtype)
    assert backend.graph_capture.stats["captures"] == 1 and not backend.report.fallbacks
