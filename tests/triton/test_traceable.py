"""The kernels as ``torch.library.triton_op``s, and the inductor executor's binding to them.

Without a GPU (fake CUDA tensors, no kernel launched): `bind_compiler_ops` swaps exactly the fused
nodes whose provider is the Triton kernel for ``ascend_kernels_triton`` ops, and the functional
re-trace that Inductor's `compile_fx` runs (aot's FunctionalTensorMode, here `aot_export_module`)
decomposes each into one ``triton_kernel_wrapper_functional`` launch of the kernel, with the grid
and scalar arguments the launch plan computes, and torch's analysis of the kernel's TTIR (for
sm_90) finds that it writes only its output. In Triton's interpreter: each op, called eagerly,
equals the native provider. That Inductor then compiles and launches the kernels from its own
code is checked on a GPU (``test_cuda.py``).
"""

from __future__ import annotations

import os

import pytest
import torch

import ascend_kernels  # noqa: F401
from ascend_kernels.registry import use_providers
from ascend_kernels.testing import assert_close

from .cases import CASES

pytest.importorskip("triton", reason="needs triton")

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
compiled_only = pytest.mark.skipif(INTERPRET, reason="kernels are interpreter functions under TRITON_INTERPRET=1")
ALL_TRITON = {op: "triton" for op in ("rms_norm", "rope", "adaln_modulate", "mul_add")}
ops = torch.ops.ascend_kernels


def _block(x, w, cos, sin, scale, shift, gate):
    q = ops.rope(ops.rms_norm(x, w, 1e-6), cos, sin, "interleaved")
    h = ops.adaln_modulate(q.flatten(2), scale, shift, 1e-6)
    return (ops.mul_add(gate, h, h),)


@pytest.fixture
def fake_cuda(monkeypatch):
    """A graph of the four fused ops traced on fake CUDA tensors, with the H100's SM count standing
    in for the device query of the launch grid and sm_90 as Triton's compile target."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from ascend_kernels.triton import _common

    monkeypatch.setattr(_common, "_cuda_sms", lambda index: 132)
    _target_sm90(monkeypatch)
    mode = FakeTensorMode()
    with mode:
        bf, dev = torch.bfloat16, "cuda"
        args = (
            torch.empty(2, 33, 3, 64, dtype=bf, device=dev),
            torch.empty(64, device=dev),
            torch.empty(1, 33, 1, 64, device=dev),
            torch.empty(1, 33, 1, 64, device=dev),
            torch.empty(2, 192, device=dev),
            torch.empty(2, 1, 192, device=dev),
            torch.empty(2, 1, 192, device=dev),
        )
    return make_fx(_block, tracing_mode="fake")(*args), args, mode


def _target_sm90(monkeypatch):
    """Triton's active driver, for code generation only (for this test): this machine has no GPU
    driver, and torch's kernel analysis (which tensors a user kernel writes, from its TTIR) asks
    the driver for nothing but the compile target (and, on triton 3.2, an Autotuner for its
    benchmarker, which nothing here calls)."""
    import triton
    from triton.backends.compiler import GPUTarget

    class Sm90:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_benchmarker(self):
            def no_gpu(*args, **kwargs):
                raise RuntimeError("no GPU to time kernels on")

            return no_gpu

    config = triton.runtime.driver
    if isinstance(getattr(type(config), "active", None), property):  # triton >= 3.5
        monkeypatch.setattr(type(config), "active", property(lambda self: Sm90()))
    else:  # an attribute set at import
        monkeypatch.setattr(config, "active", Sm90())


def _namespaces(gm):
    return sorted(
        n.target.namespace
        for n in gm.graph.nodes
        if n.op == "call_function"
        and isinstance(n.target, torch._ops.OpOverload)
        and n.target.namespace.startswith("ascend_kernels")
    )


@compiled_only
def test_binds_only_nodes_whose_provider_is_the_triton_kernel(fake_cuda, monkeypatch):
    from ascend_kernels.triton import measurements
    from diffusers_ascend.compilation.backend import bind_compiler_ops

    gm, _, _ = fake_cuda
    # No choice: on CUDA the registry picks the triton provider only for an op measured faster than
    # Inductor; with no such measurement every node stays an ascend_kernels op.
    monkeypatch.setattr(measurements, "MEASUREMENTS", ())
    assert bind_compiler_ops(gm) == {}
    assert _namespaces(gm) == ["ascend_kernels"] * 4
    with use_providers(rope="triton"):
        assert list(bind_compiler_ops(gm).values()) == ["triton"]
    assert _namespaces(gm) == ["ascend_kernels"] * 3 + ["ascend_kernels_triton"]
    with use_providers(**ALL_TRITON):  # rope is bound already
        assert list(bind_compiler_ops(gm).values()) == ["triton"] * 3
    assert _namespaces(gm) == ["ascend_kernels_triton"] * 4


@compiled_only
def test_the_functional_retrace_launches_each_kernel_once(fake_cuda):
    from torch._functorch.aot_autograd import aot_export_module
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    from ascend_kernels.triton import _common
    from ascend_kernels.triton.adaln import _adaln_kernel, plan_adaln_modulate
    from ascend_kernels.triton.mul_add import _mul_add_kernel
    from ascend_kernels.triton.rms_norm import _rms_norm_kernel
    from ascend_kernels.triton.rope import _rope_kernel
    from diffusers_ascend.compilation.backend import bind_compiler_ops

    gm, args, mode = fake_cuda
    with use_providers(**ALL_TRITON):
        bind_compiler_ops(gm)
    with mode:
        traced, _ = aot_export_module(gm, args, trace_joint=False)
        _, adaln_plan = plan_adaln_modulate(
            torch.empty(2, 33, 192, dtype=torch.bfloat16, device="cuda"), args[4], args[5], 1e-6
        )
    launches = [n for n in traced.graph.nodes if n.target is torch.ops.higher_order.triton_kernel_wrapper_functional]
    kernels = [kernel_side_table.get_kernel(n.kwargs["kernel_idx"]) for n in launches]
    # num_warps travels as the single config of an Autotuner around the jit function.
    assert [getattr(k, "fn", k) for k in kernels] == [_rms_norm_kernel, _rope_kernel, _adaln_kernel, _mul_add_kernel]
    assert _namespaces(traced) == []  # no op left for the dispatcher
    # torch's analysis of each kernel's TTIR finds that it writes only its output: Inductor then
    # reuses that buffer in place and copies no input (a kernel it cannot analyse gets every
    # input cloned before each launch).
    assert [n.kwargs["tensors_to_clone"] for n in launches] == [["out_ptr"]] * 4
    (adaln,) = [n for n, k in zip(launches, kernels) if getattr(k, "fn", k) is _adaln_kernel]
    assert list(adaln.kwargs["grid"]) == [(*adaln_plan.grid, 1, 1)]  # 1-D grid, padded to 3-D
    scalars = {k: v for k, v in adaln.kwargs["kwargs"].items() if not isinstance(v, torch.fx.Node)}
    names = [p.name for p in _adaln_kernel.params]
    expected = {name: a for name, a in zip(names, adaln_plan.args) if not isinstance(a, torch.Tensor)}
    assert scalars == {**expected, **adaln_plan.constexprs}
    assert adaln_plan.constexprs["MOD_SHARED"] is False and _common.num_warps(16 * 256) == 8


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("op", list(ALL_TRITON))
def test_eager_call_equals_the_native_op(op, dtype):
    from ascend_kernels.triton import traceable_op

    kernel_op = traceable_op(op)
    signature = str(kernel_op._schema).split("(", 1)[1]  # "(args) -> Tensor", without the name
    assert kernel_op.namespace == "ascend_kernels_triton"
    assert signature == str(getattr(ops, op).default._schema).split("(", 1)[1]
    calls = [(case, build(dtype, "cpu")) for case, build in CASES[op].items()]
    if op == "rope":  # the rope cases leave the layout to the caller
        calls = [(f"{case} {layout}", (*args, layout)) for case, args in calls for layout in ("interleaved", "half")]
    for case, args in calls:
        with use_providers(**{op: "native"}):
            expected = getattr(ops, op)(*args)
        assert_close(kernel_op(*args), expected, msg=f"{op} {case}")
