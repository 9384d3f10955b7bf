"""The ``add_rms_norm`` fusion (residual add + RMSNorm -> one op returning both) on Z-Image's real
transformer block, where diffusers writes ``x = x + gate * attention_norm2(attn_out)`` and then
``ffn_norm1(x)`` (diffusers' RMSNorm) with ``x`` kept as the next residual: exact match counts,
numerics vs eager per dtype, the two outputs' users, its place next to the default fusions, the
layer-swapped form and autograd."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.transformers.transformer_z_image import ADALN_EMBED_DIM, ZImageTransformerBlock

from diffusers_ascend.compilation.passes.add_rms_norm import AddRMSNormFusionPass
from diffusers_ascend.layers import apply_swaps

from ..conftest import SnapshotBackend, assert_as_accurate_as_eager, assert_close, compile_module, to_fp64

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def zimage_block(dtype, modulation=True, dim=32):
    """A real Z-Image block (``modulation=False``: its context/noise refiner form, no gates) and
    seeded inputs (complex rotary table, as the model computes it)."""
    gen = torch.Generator().manual_seed(0)
    block = ZImageTransformerBlock(
        0, dim=dim, n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, modulation=modulation
    )
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    seq = 6
    angles = torch.randn(1, seq, dim // 4, generator=gen)
    inputs = dict(
        x=torch.randn(1, seq, dim, generator=gen).to(dtype),
        attn_mask=torch.ones(1, seq, dtype=torch.bool),
        freqs_cis=torch.polar(torch.ones_like(angles), angles),
    )
    if modulation:
        inputs["adaln_input"] = torch.randn(1, min(dim, ADALN_EMBED_DIM), generator=gen).to(dtype)
    return block.to(dtype).eval(), inputs


def compiled(block, inputs, fusions):
    backend = SnapshotBackend(fusions=fusions, executor="eager")
    with torch.no_grad():
        out = compile_module(block, backend)(**inputs)
        ref = block(**inputs)
    return backend, out, ref


def assert_numerics(block, inputs, out, ref, dtype):
    """fp32: eager's numbers. bf16/fp16: the op normalizes and weights in fp32 and rounds once where
    diffusers' RMSNorm rounds before its weight, so it must be as close to an fp64 run as eager is."""
    if dtype == torch.float32:
        assert_close(out, ref, dtype)
        return
    with torch.no_grad():
        ref64 = block.double()(**to_fp64(inputs))
    block.to(dtype)
    assert_as_accurate_as_eager(out, ref, ref64, dtype)


@pytest.mark.parametrize("modulation", [True, False], ids=["gated", "refiner"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zimage_block(dtype, modulation):
    block, inputs = zimage_block(dtype, modulation)
    backend, out, ref = compiled(block, inputs, ["add_rms_norm"])
    # one site per block: the attention residual feeding ffn_norm1 (the FFN residual is the output)
    assert backend.report.matches == {"add_rms_norm": 1}
    backend.assert_fused("add_rms_norm", 1)
    # the sum has users besides the norm (the FFN residual): both outputs of the op are read
    (node,) = [n for n in backend.after_graphs[-1].nodes if n.target is torch.ops.ascend_kernels.add_rms_norm.default]
    assert sorted(u.args[1] for u in node.users) == [0, 1]
    assert backend.after[-1][aten.rsqrt.default] == backend.before[-1][aten.rsqrt.default] - 1
    assert out.dtype == ref.dtype == dtype
    assert_numerics(block, inputs, out, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opt_in_takes_the_add_mul_add_would_fuse(dtype):
    """Next to the default fusions it runs first and takes the attention residual's add, which
    mul_add fuses otherwise: why it is opt-in (``"all"`` keeps its counts)."""
    block, inputs = zimage_block(dtype)
    default = ["rms_norm", "mul_add", "swiglu"]
    backend, out, ref = compiled(block, inputs, default)
    assert backend.report.matches == {"rms_norm": 6, "mul_add": 2, "swiglu": 1}
    backend, out_with, _ = compiled(block, inputs, default + ["add_rms_norm"])
    assert backend.report.matches == {"add_rms_norm": 1, "rms_norm": 5, "mul_add": 1, "swiglu": 1}
    assert_numerics(block, inputs, out_with, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_after_the_rms_norm_swap(dtype):
    """With the rms_norm layer swap (enable_ascend_compile), the graph holds ``ascend_kernels.rms_norm``
    of the sum: the op form matches it."""
    block, inputs = zimage_block(dtype)
    with torch.no_grad():
        ref = block(**inputs)
    _, counts = apply_swaps(block, ["rms_norm"])
    assert counts == {"rms_norm": 6}  # the block's four and the attention's norm_q, norm_k
    backend, out, _ = compiled(block, inputs, ["add_rms_norm"])
    assert backend.report.matches == {"add_rms_norm": 1}
    assert backend.before[-1][torch.ops.ascend_kernels.rms_norm.default] == 6
    assert backend.after[-1][torch.ops.ascend_kernels.rms_norm.default] == 5
    assert_numerics(block, inputs, out, ref, dtype)


class ResidualNorm(torch.nn.Module):
    """``x + h`` then diffusers' RMSNorm; `keep_sum`: the sum is also returned (a second user)."""

    def __init__(self, dim, keep_sum):
        super().__init__()
        from diffusers.models.normalization import RMSNorm

        self.norm, self.keep_sum = RMSNorm(dim, eps=1e-6), keep_sum

    def forward(self, x, h):
        s = x + h
        y = self.norm(s)
        return (y, s * 2) if self.keep_sum else y


@pytest.mark.parametrize("keep_sum", [True, False], ids=["sum_used", "sum_unused"])
def test_both_outputs_replaced_or_the_unused_one_dropped(keep_sum):
    module = ResidualNorm(16, keep_sum)
    x, h = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    backend, out, ref = compiled(module, dict(x=x, h=h), ["add_rms_norm"])
    assert backend.report.matches == {"add_rms_norm": 1}
    assert backend.after[-1][aten.add.Tensor] == 0 and backend.after[-1][aten.rsqrt.default] == 0
    for o, r in zip(out if keep_sum else [out], ref if keep_sum else [ref]):
        assert_close(o, r, torch.float32)


def test_inductor_executor_runs_the_two_output_op():
    module = ResidualNorm(16, keep_sum=True)
    x, h = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    backend = SnapshotBackend(fusions=["add_rms_norm"], executor="inductor")
    with torch.no_grad():
        out = compile_module(module, backend)(x, h)
        ref = module(x, h)
    assert backend.report.matches == {"add_rms_norm": 1}
    for o, r in zip(out, ref):
        assert_close(o, r, torch.float32)


def test_a_norm_of_no_sum_is_left_alone():
    block = ResidualNorm(16, False)
    backend, out, ref = compiled(block.norm, dict(hidden_states=torch.randn(2, 5, 16)), ["add_rms_norm"])
    assert backend.report.matches == {"add_rms_norm": 0}


def test_training_grads_match_eager():
    block, inputs = zimage_block(torch.float32, modulation=False)
    x = inputs.pop("x")
    backend = SnapshotBackend(fusions=["add_rms_norm"], executor="eager")
    grads = []
    for fn in (compile_module(block, backend), block):
        xi = x.clone().requires_grad_()
        block.zero_grad()
        fn(x=xi, **inputs).square().sum().backward()
        grads.append([xi.grad] + [p.grad.clone() for p in block.parameters()])
    assert backend.report.matches == {"add_rms_norm": 1}
    for g, r in zip(*grads):
        assert_close(g, r, torch.float32)


def test_self_check_counts_one_match_per_form():
    AddRMSNormFusionPass.verify()  # every form replaced exactly once (two outputs: one match)
    groups = {p.group for p in AddRMSNormFusionPass.patterns()}
    assert len(AddRMSNormFusionPass.pattern_matcher_passes()) == len(groups) == 11


def test_a_warm_start_package_carries_the_two_output_op():
    """Eager warm-start packages are torch.export JSON programs: the op's node and its two getitems
    survive the round trip and the package check."""
    import json

    from diffusers_ascend.compilation import _compat
    from diffusers_ascend.warm_start.eager import _read_program, check_program

    class Fused(torch.nn.Module):
        def forward(self, x, h, w):
            y, s = torch.ops.ascend_kernels.add_rms_norm.default(x, h, w, 1e-6, torch.bfloat16)
            return y * 2, s - 1

    args = [torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(8)]
    with torch.no_grad():
        program = json.loads(_compat.export_to_json(_compat.export_program(Fused(), args)))
    for node in program["graph_module"]["graph"]["nodes"]:
        node["metadata"] = {}  # as build_eager_package writes it
    check_program(program)
    gm = _read_program(program)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"][:1] == [
        torch.ops.ascend_kernels.add_rms_norm.default
    ]
    for out, ref in zip(gm(*args), Fused()(*args)):
        assert torch.equal(out, ref)


def test_zimage_model_through_enable_with_the_rms_norm_swap():
    """The public path: enable_ascend_compile swaps Z-Image's 19 RMSNorms to the fused class, its three
    block classes (layers, noise and context refiners) compile one graph each, and each graph's
    attention residual feeding ``ffn_norm1`` (now one ``ascend_kernels.rms_norm``) is fused."""
    from tests.models.test_zoo import _build  # the zoo's model (zero-initialised weights drawn)

    model, inputs = _build("ZImageTransformer2DModel")
    with torch.no_grad():
        ref = model(**inputs)[0][0]
    model.enable_ascend_compile(fusions=["rms_norm", "add_rms_norm"], executor="eager", compile="blocks")
    try:
        with torch.no_grad():
            out = model(**inputs)[0][0]
        report = model.ascend_report()
        assert report.swaps == {"rms_norm": 19} and len(report.graphs) == 3
        assert report.matches == {"add_rms_norm": 3, "rms_norm": 0}
        assert_close(out, ref, torch.float32)
    finally:
        model.disable_ascend_compile()
