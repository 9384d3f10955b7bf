"""Executors (eager, Inductor) and training: gradients through fused blocks match eager."""

from __future__ import annotations

import pytest
import torch

from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks, tiny_wan_block, wan_block_inputs

from .conftest import EXPECTED_BLOCK_COUNTS, as_tuple, assert_close


def _grads(block, inputs, grad_inputs, compiled=None):
    """Loss gradients w.r.t. `grad_inputs` and every parameter, through `compiled` or eager `block`."""
    inputs = {k: (v.detach().clone().requires_grad_(True) if k in grad_inputs else v) for k, v in inputs.items()}
    block.zero_grad(set_to_none=True)
    outs = as_tuple((block if compiled is None else compiled)(**inputs))
    loss = sum((o.float() * torch.linspace(-1, 1, o.shape[-1])).square().sum() for o in outs)
    loss.backward()
    return outs, [inputs[k].grad for k in grad_inputs] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize("name", ["flux_double", "wan"])
def test_training_gradients_match_eager(name):
    if name == "wan":
        block, inputs = tiny_wan_block(), wan_block_inputs()
        grad_inputs = ["hidden_states", "encoder_hidden_states", "temb"]
    else:
        block, inputs = tiny_flux_blocks()[0], flux_block_inputs()
        grad_inputs = ["hidden_states", "encoder_hidden_states", "temb"]
    block.train()  # dropout p=0 in these blocks: train mode changes nothing numerically
    backend = AscendBackend(fusions="all", executor="eager")
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    outs, grads = _grads(block, inputs, grad_inputs, compiled)
    ref_outs, ref_grads = _grads(block, inputs, grad_inputs)

    report = backend.report
    assert report.matches == EXPECTED_BLOCK_COUNTS[name]  # fused, not a silent fallback
    assert report.graphs[0]["training"] and not report.fallbacks
    for o, r in zip(outs, ref_outs):
        assert_close(o, r, torch.float32)
    assert len(grads) == len(ref_grads) and all(g is not None for g in ref_grads)
    for g, r in zip(grads, ref_grads):
        assert g is not None
        assert_close(g, r, torch.float32, atol=1e-4, rtol=1e-4)


def test_training_graph_with_input_mutation_falls_back_with_warning():
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(8)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)  # a buffer mutation: aot handles it outside the graph
            return self.norm(x)

    m = Counting()
    backend = AscendBackend(fusions=["rms_norm"], executor="eager")
    x = torch.randn(3, 8, requires_grad=True)
    with pytest.warns(UserWarning, match="without fusion"):
        out = torch.compile(m, backend=backend)(x)
    out.sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    torch.nn.functional.rms_norm(x_ref, (8,), m.norm.weight.detach(), m.norm.eps).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert backend.report.fallbacks and "mutates" in backend.report.fallbacks[0]["reason"]
    assert m.calls.item() == 1


def test_inductor_executor_inference():
    _, single = tiny_flux_blocks()
    inputs = flux_block_inputs()
    backend = AscendBackend(fusions="all", executor="inductor")
    with torch.no_grad():
        out = as_tuple(torch.compile(single, backend=backend, fullgraph=True)(**inputs))
        ref = as_tuple(single(**inputs))
    assert backend.report.matches == EXPECTED_BLOCK_COUNTS["flux_single"]
    assert backend.report.graphs[0]["executor"] == "inductor"
    for o, r in zip(out, ref):
        assert_close(o, r, torch.float32)


def test_inductor_executor_training():
    _, single = tiny_flux_blocks()
    inputs = flux_block_inputs()
    backend = AscendBackend(fusions="all", executor="inductor")
    compiled = torch.compile(single, backend=backend, fullgraph=True)
    outs, grads = _grads(single, inputs, ["hidden_states", "temb"], compiled)
    ref_outs, ref_grads = _grads(single, inputs, ["hidden_states", "temb"])
    assert backend.report.matches == EXPECTED_BLOCK_COUNTS["flux_single"]
    for g, r in zip(grads, ref_grads):
        assert_close(g, r, torch.float32, atol=1e-4, rtol=1e-4)


def test_mode_goes_to_inductor():
    backend = AscendBackend(fusions="none", executor="inductor", mode="max-autotune-no-cudagraphs")
    patches = backend._inductor_patches(training=False)
    assert patches.get("max_autotune") is True and not patches.get("triton.cudagraphs")
    assert AscendBackend(fusions="none", executor="inductor")._inductor_patches(training=False) == {}


def test_eager_executor_binds_providers_once():
    from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks

    torch._dynamo.reset()
    double, _ = tiny_flux_blocks()
    backend = AscendBackend(fusions="all", executor="eager")
    with torch.no_grad():
        torch.compile(double, backend=backend)(**flux_block_inputs())
    bound = backend.report.graphs[0]["bound_providers"]
    # Every fused op of the block (4 + 2 + 2 + 4 + 4) calls its provider directly: native on CPU.
    assert len(bound) == 16 and set(bound.values()) == {"native"}


def test_symbolic_shapes_keep_runtime_dispatch():
    from diffusers_ascend.compilation.backend import bind_providers

    torch._dynamo.reset()
    graphs = []

    class Keep(AscendBackend):
        def _execute(self, gm, example_inputs):
            out = super()._execute(gm, example_inputs)
            graphs.append(gm)
            return out

    norm = torch.nn.RMSNorm(8)
    backend = Keep(fusions=["rms_norm"], executor="eager")
    with torch.no_grad():
        torch.compile(norm, backend=backend, dynamic=True)(torch.randn(3, 8))
    assert backend.report.graphs[0]["bound_providers"] == {}
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.ascend_kernels.rms_norm.default in targets
    assert bind_providers(graphs[0]) == {}


# -- the inductor executor's binding to a provider's compiler op ------------------------------------
# On CUDA the triton provider's compiler op is a torch.library.triton_op, which only a GPU compiles
# (tests/triton/test_traceable.py checks the trace without one, test_cuda.py on one). Here a plain
# custom op with the native semantics stands in for it on CPU, so the executor's plumbing runs.


@torch.library.custom_op("ascend_test::mul_add_kernel", mutates_args=())
def _kernel_stand_in(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    from ascend_kernels.ops.mul_add import mul_add_native

    return mul_add_native(x, y, z)


@_kernel_stand_in.register_fake
def _(x, y, z):
    from ascend_kernels.ops.mul_add import mul_add_native

    return mul_add_native(x, y, z)


STAND_IN = torch.ops.ascend_test.mul_add_kernel.default
# mul_add matches of a Flux double block with that fusion alone: its 4 gated residuals, plus the 4
# `* (1 + scale) + shift` modulations and the 2 rope sums that the adaln and rope fusions take first.
MUL_ADD_ALONE = 10


@pytest.fixture
def mul_add_compiler_op(monkeypatch):
    """The native mul_add provider with `STAND_IN` as its compiler op on every device type."""
    import dataclasses

    from ascend_kernels import registry

    native = registry._REGISTRY["mul_add"]["native"]
    monkeypatch.setitem(
        registry._REGISTRY["mul_add"], "native", dataclasses.replace(native, compiler_op=lambda device_type: STAND_IN)
    )


def _compile_double(on_error="fallback"):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    double, _ = tiny_flux_blocks()
    inputs = flux_block_inputs()
    backend = AscendBackend(fusions=["mul_add"], executor="inductor", on_error=on_error)
    try:
        with torch.no_grad():
            out, codes = run_and_get_code(torch.compile(double, backend=backend, fullgraph=True), **inputs)
            ref = double(**inputs)
    finally:
        torch._dynamo.reset()
    return backend, out, ref, "\n".join(codes)


@pytest.mark.usefixtures("mul_add_compiler_op")
def test_inductor_executor_compiles_the_providers_compiler_op():
    backend, out, ref, code = _compile_double()
    (graph,) = backend.report.graphs
    assert graph["matches"]["mul_add"] == MUL_ADD_ALONE
    assert list(graph["bound_providers"].values()) == ["native"] * MUL_ADD_ALONE
    assert "torch.ops.ascend_test.mul_add_kernel.default(" in code
    assert "torch.ops.ascend_kernels.mul_add.default(" not in code
    for o, r in zip(as_tuple(out), as_tuple(ref)):
        assert_close(o, r, torch.float32)


@pytest.mark.usefixtures("mul_add_compiler_op")
def test_inductor_failing_on_a_compiler_op_falls_back_to_the_ops(monkeypatch):
    from diffusers_ascend.compilation import _compat

    real = _compat.compile_fx

    def no_gpu_driver(gm, example_inputs, config_patches=None):
        if any(n.target is STAND_IN for n in gm.graph.nodes):
            raise RuntimeError("0 active drivers ([]). There should only be one.")
        return real(gm, example_inputs, config_patches=config_patches)

    monkeypatch.setattr(_compat, "compile_fx", no_gpu_driver)
    with pytest.warns(UserWarning, match="could not launch the Triton kernels .* 0 active drivers"):
        backend, out, ref, code = _compile_double()
    (graph,) = backend.report.graphs
    assert graph["bound_providers"] == {} and graph["unbound_reason"].startswith("RuntimeError: 0 active drivers")
    assert graph["matches"]["mul_add"] == MUL_ADD_ALONE  # still fused
    assert "torch.ops.ascend_kernels.mul_add.default(" in code
    assert "torch.ops.ascend_test.mul_add_kernel.default(" not in code
    for o, r in zip(as_tuple(out), as_tuple(ref)):
        assert_close(o, r, torch.float32)
    with pytest.raises(Exception, match="0 active drivers"):
        _compile_double(on_error="raise")
