"""`bench e2e --quant`: the weight bytes it reports for torchao-quantized weights, its argument
checks, and the result's file stem and repeat command (the run itself: docs/quantization.md's result)."""

from __future__ import annotations

import pytest
import torch

from diffusers_ascend.benchmarks import bench_e2e

torchao = pytest.importorskip("torchao")


@pytest.mark.parametrize("quant", bench_e2e.QUANTS)
def test_weight_bytes_count_int8_data_and_scales(quant):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16, bias=False)).to(torch.bfloat16)
    assert bench_e2e.weight_bytes(model) == (64 * 32 + 32 + 32 * 16) * 2
    bench_e2e._quantize(model, quant)
    assert type(model[0].weight).__name__ == "Int8Tensor"
    # int8 data (1 byte), an fp32 scale and an int8 zero point (torchao keeps one) per output channel,
    # the bf16 bias untouched
    assert bench_e2e.weight_bytes(model) == (64 * 32 + 32 * 4 + 32) + 32 * 2 + (32 * 16 + 16 * 4 + 16)


def test_unknown_quant_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown quant 'int4'; valid: 'int8-dynamic', 'int8-weight'"):
        bench_e2e.run_e2e("wan", depth=1, steps=1, height=16, width=16, frames=1, device="cpu", quant="int4")


def test_stem_and_command_name_the_scheme():
    result = dict(
        model="wan",
        device="cpu",
        depth={"num_layers": 1},
        full_depth={"num_layers": 30},
        job=dict(bench_e2e.model_spec("wan")["job"]),
        dtype="bf16",
        seed=0,
        quant="int8-dynamic",
    )
    assert bench_e2e.result_stem(result) == "e2e-wan-cpu-depth1-int8-dynamic"
    assert bench_e2e.e2e_command(result).endswith("--device cpu --quant int8-dynamic")
