"""The int8 linear fusions (`passes/int8_dynamic_linear.py`, `passes/int8_weight_only_linear.py`) on
graphs of torchao-quantized modules: exact match counts, torchao's matmul ops gone, and the fused
graph's output bit-equal to torchao's eager path (the ops' native providers are torchao's math).
Schemes we do not fuse keep torchao's graph and numbers."""

from __future__ import annotations

import pytest
import torch

from ..conftest import SnapshotBackend, compile_module

torchao = pytest.importorskip("torchao")
from torchao.quantization import (  # noqa: E402
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    MappingType,
    PerGroup,
    quantize_,
)

aten = torch.ops.aten
SCHEMES = {
    "int8_dynamic_linear": lambda: Int8DynamicActivationInt8WeightConfig(set_inductor_config=False),
    "int8_weight_only_linear": lambda: Int8WeightOnlyConfig(set_inductor_config=False),
}
# The aten op torchao's graph multiplies with, per scheme: gone once fused.
MATMUL = {"int8_dynamic_linear": aten._int_mm.default, "int8_weight_only_linear": aten.mm.default}


@pytest.fixture(params=["s8s8", "u8s8"])
def cpu_int_mm_branch(request, monkeypatch):
    """torchao's CPU W8A8 matmul takes a u8s8 branch (VNNI without AMX) or s8s8 by the CPU's features:
    pin each, so that what is matched does not depend on the machine."""
    import torchao.kernel.intmm as intmm

    monkeypatch.setattr(intmm, "_cpu_is_amx_tile_supported", lambda: request.param == "s8s8")
    monkeypatch.setattr(intmm, "_cpu_is_vnni_supported", lambda: request.param == "u8s8")
    return request.param


class TwoLinears(torch.nn.Module):
    """Two quantized linears around a GELU, and one left in float (not quantized): two sites."""

    def __init__(self, bias: bool):
        super().__init__()
        self.up = torch.nn.Linear(32, 64, bias=bias)
        self.down = torch.nn.Linear(64, 24, bias=bias)
        self.plain = torch.nn.Linear(24, 24)

    def forward(self, x):
        return self.plain(self.down(torch.nn.functional.gelu(self.up(x))))


def _quantized(module, config, dtype):
    torch.manual_seed(0)  # nn.Linear's init draws from torch's global RNG: seed it for the test's order
    module = module.to(dtype)
    quantize_(module, config, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and fqn != "plain")
    return module


def _compiled(module, x, fusions):
    backend = SnapshotBackend(fusions=fusions, executor="eager")
    with torch.no_grad():
        expected = module(x)
        actual = compile_module(module, backend)(x)
    return backend, expected, actual


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_fuses_each_quantized_linear_equal_to_torchao(scheme, dtype, bias, cpu_int_mm_branch):
    module = _quantized(TwoLinears(bias), SCHEMES[scheme](), dtype)
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    backend, expected, actual = _compiled(module, x, [scheme])
    assert backend.report.matches[scheme] == 2
    backend.assert_fused(scheme, 2, gone=[MATMUL[scheme]])
    assert backend.after[-1][aten.addmm.default] + backend.after[-1][aten.mm.default] == 1  # `plain`, untouched
    assert actual.dtype == expected.dtype and torch.equal(actual, expected), (actual - expected).abs().max()


def test_all_fusions_leave_the_quantized_linear_to_its_own_pass():
    # Under every fusion the W8A8 sites go to int8_dynamic_linear, none of their ops to mul_add & co.
    from diffusers_ascend.fusions import default_fusions

    module = _quantized(TwoLinears(True), SCHEMES["int8_dynamic_linear"](), torch.bfloat16)
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    backend, expected, actual = _compiled(module, x, list(default_fusions()))
    assert backend.report.matches["int8_dynamic_linear"] == 2
    assert backend.report.matches["int8_weight_only_linear"] == 0
    assert torch.equal(actual, expected)


@pytest.mark.parametrize(
    ("config", "name"),
    [
        (lambda: Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC), "asymmetric"),
        (lambda: Int8WeightOnlyConfig(granularity=PerGroup(16)), "per-group"),
    ],
    ids=["asymmetric_activations", "per_group_weight"],
)
def test_schemes_we_do_not_fuse_keep_torchaos_path(config, name):
    cfg = config()
    cfg.set_inductor_config = False
    module = _quantized(TwoLinears(True), cfg, torch.bfloat16)
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    backend, expected, actual = _compiled(module, x, list(SCHEMES))
    assert backend.report.matches["int8_dynamic_linear"] == 0, name
    assert backend.report.matches["int8_weight_only_linear"] == 0, name
    assert torch.equal(actual, expected)
