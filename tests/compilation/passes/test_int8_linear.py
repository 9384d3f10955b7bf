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


def _aot_graph_on_meta(module, x):
    """The forward graph aot_autograd hands a backend for `module` on the meta device: torchao takes
    its non-CPU branch there (scales expanded, ``out_dtype(aten.mm, int32)``), the graph an NPU or
    CUDA host compiles."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    with torch.no_grad():
        compile_module(module, aot_autograd(fw_compiler=keep))(x)
    return graphs[0]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_fuses_torchaos_non_cpu_graph_equal_to_it(bias):
    """torchao's device graph, made on the meta device, its device constants then pointed at the CPU
    (Inductor's matcher skips meta tensors, and the graph must run here): one match, and the rewritten
    graph returns the original graph's numbers bit for bit."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from diffusers_ascend.compilation.passes.int8_dynamic_linear import Int8DynamicLinearFusionPass
    from diffusers_ascend.compilation.passes.manager import eliminate_noops

    dtype = torch.bfloat16
    module = _quantized(TwoLinears(bias), SCHEMES["int8_dynamic_linear"](), dtype)  # the weights, on the CPU
    torch.manual_seed(0)
    on_meta = TwoLinears(bias).to(dtype).to("meta")
    quantize_(
        on_meta,
        SCHEMES["int8_dynamic_linear"](),
        filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and fqn != "plain",
    )
    gm = _aot_graph_on_meta(on_meta, torch.empty(2, 7, 32, dtype=dtype, device="meta"))
    assert any(n.target is torch.ops.higher_order.out_dtype for n in gm.graph.nodes)  # the non-CPU form
    assert not any(n.target is aten._int_mm.default for n in gm.graph.nodes)
    for node in gm.graph.nodes:
        if node.kwargs.get("device") is not None:
            node.kwargs = {**node.kwargs, "device": torch.device("cpu")}
    gm.recompile()
    # aot's inputs: each parameter's inner tensors (an Int8Tensor's qdata, scale, zero_point) and x, in
    # the order dynamo lifted them (by first use): taken from the pool by each placeholder's shape and dtype
    pool = []
    for p in module.parameters():
        inner = [getattr(p, a, None) for a in ("qdata", "scale", "zero_point")]
        pool += [t for t in inner if t is not None] if hasattr(p, "qdata") else [p.detach()]
    pool.append(torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1)).to(dtype))
    inputs = []
    for node in (n for n in gm.graph.nodes if n.op == "placeholder"):
        val = node.meta["val"]
        inputs.append(pool.pop(next(i for i, t in enumerate(pool) if t.shape == val.shape and t.dtype == val.dtype)))
    assert pool == []
    with torch.no_grad():
        expected = gm(*inputs)[0]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(t) for t in inputs])
    eliminate_noops(gm.graph)
    fusion = Int8DynamicLinearFusionPass()
    assert fusion(gm.graph) == 2
    gm.recompile()
    assert sum(n.target is torch.ops.ascend_kernels.int8_dynamic_linear.default for n in gm.graph.nodes) == 2
    assert not any(n.target is torch.ops.higher_order.out_dtype for n in gm.graph.nodes)
    with torch.no_grad():
        actual = gm(*inputs)[0]
    assert torch.equal(actual, expected)
