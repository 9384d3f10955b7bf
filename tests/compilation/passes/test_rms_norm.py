"""The RMSNorm fusion (`passes/rms_norm.py`) on isolated modules: torch's, diffusers' and Hugging
Face's modules and hand-written forms, with and without a weight or an upcast, and the fused
node CUDA builds of torch >= 2.9 hand over."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import assert_close
from .harness import DTYPES, aten, run


class ManualRMSNorm(torch.nn.Module):
    def __init__(self, dim, weight=True, upcast=False, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim)) if weight else None
        self.upcast, self.eps = upcast, eps

    def forward(self, x):
        if self.upcast:
            xf = x.float()
            y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        else:
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * self.weight if self.weight is not None else y


def _rms_modules():
    from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm

    return {
        "torch.nn.RMSNorm": lambda: torch.nn.RMSNorm(16, eps=1e-6),
        "torch.nn.RMSNorm(no weight)": lambda: torch.nn.RMSNorm(16, eps=1e-6, elementwise_affine=False),
        "diffusers.RMSNorm": lambda: DiffusersRMSNorm(16, eps=1e-6),
        "diffusers.RMSNorm(no weight)": lambda: DiffusersRMSNorm(16, eps=1e-6, elementwise_affine=False),
        "manual": lambda: ManualRMSNorm(16),
        "manual(no weight)": lambda: ManualRMSNorm(16, weight=False),
        "manual upcast": lambda: ManualRMSNorm(16, upcast=True, eps=1e-5),
        "manual upcast(no weight)": lambda: ManualRMSNorm(16, weight=False, upcast=True),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", list(_rms_modules()))
def test_rms_norm_forms(form, dtype):
    torch.manual_seed(0)
    module = _rms_modules()[form]()
    x = torch.randn(2, 5, 3, 16, dtype=dtype)
    run(module, x, fusions=["rms_norm"], dtype=dtype, expected=1, gone=[aten.rsqrt.default, aten.mean.dim])


def test_rms_norm_functional_and_eps_is_captured():
    # Two norms with different eps in one graph: each replacement carries its own eps.
    def f(x, w):
        return F.rms_norm(x, (16,), w, 1e-5) + F.rms_norm(x * 3, (16,), None, 0.25)

    class M(torch.nn.Module):
        def forward(self, x, w):
            return f(x, w)

    x, w = torch.randn(4, 16), torch.randn(16)
    backend = run(M(), x, w, fusions=["rms_norm"], dtype=torch.float32, expected=2)
    eps = sorted(
        n.args[2] for n in backend.after_graphs[-1].nodes if n.target == torch.ops.ascend_kernels.rms_norm.default
    )
    assert eps == pytest.approx([1e-5, 0.25], rel=1e-6)


def test_rms_norm_not_over_the_last_dim_is_left_alone():
    class M(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)

    run(M(), torch.randn(2, 5, 16), fusions=["rms_norm"], dtype=torch.float32, expected=0)


def _has_fused_rms_norm() -> bool:
    from diffusers_ascend.compilation import _compat

    return _compat.fused_rms_norm() is not None


_needs_fused_rms_norm = pytest.mark.skipif(
    not _has_fused_rms_norm(), reason="torch < 2.9: no _fused_rms_norm(input, normalized_shape, ...)"
)


def _fused_rms_norm_graph(x, shape, w, eps, then_scale=False):
    """An aot-style graph of ``_fused_rms_norm(x, shape, w, eps)[0]`` as CUDA builds of torch >= 2.9
    hand F.rms_norm on a CUDA tensor to a backend (built by hand: on CPU the op decomposes)."""
    from diffusers_ascend.compilation import _compat

    graph = _compat.one_op_graph(_compat.fused_rms_norm(), [x, shape, w, eps], index=0)
    if then_scale:  # a pointwise consumer after the norm, so the match is not the graph's output
        (out,) = graph.find_nodes(op="output")
        (y,) = out.args[0]
        with graph.inserting_before(out):
            z = graph.call_function(aten.mul.Tensor, (y, 2.0))
        z.meta["val"] = y.meta["val"] * 2.0
        out.args = ((z,),)
    return graph


@_needs_fused_rms_norm
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_as_cuda_presents_it_fused(dtype, weight):
    """torch >= 2.9 on CUDA: nn.RMSNorm reaches the backend as one ``aten._fused_rms_norm`` node
    (seen on an H100 with torch 2.11: Flux's norm_q/norm_k matched 0 times before this form).
    Replaced once, the result equal to the op's own."""
    from diffusers_ascend.compilation.passes import get_pass_class

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, 64, generator=g).to(dtype)
    w = torch.randn(64, generator=g).to(dtype) if weight else None
    gm = torch.fx.GraphModule(torch.nn.Module(), _fused_rms_norm_graph(x, [64], w, 1e-6, then_scale=True))
    args = [x, w] if weight else [x]
    with torch.no_grad():
        ref = gm(*args)[0]
        assert get_pass_class("rms_norm")()(gm.graph) == 1
        gm.recompile()
        out = gm(*args)[0]
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten._fused_rms_norm.default not in targets and torch.ops.ascend_kernels.rms_norm.default in targets
    assert out.dtype == ref.dtype
    assert_close(out, ref, dtype)


@_needs_fused_rms_norm
@pytest.mark.parametrize("case", ["two_dims", "eps_none", "weight_per_token"])
def test_rms_norm_fused_node_the_op_cannot_take_is_left_alone(case):
    from diffusers_ascend.compilation.passes import get_pass_class

    x = torch.randn(2, 5, 64)
    shape, w, eps = {
        "two_dims": ([5, 64], torch.randn(5, 64), 1e-6),  # normalizes over two dims
        "eps_none": ([64], torch.randn(64), None),  # dtype-dependent default eps
        "weight_per_token": ([64], torch.randn(5, 64), 1e-6),  # no (D,) weight
    }[case]
    graph = _fused_rms_norm_graph(x, shape, w, eps)
    assert get_pass_class("rms_norm")()(graph) == 0


# RMSNorm, LLaMA form (weight first), with Hugging Face's own module
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_llama_form(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(16, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(2, 5, 16, dtype=dtype)
    run(norm, x, fusions=["rms_norm"], dtype=dtype, expected=1, gone=[aten.rsqrt.default, aten.mean.dim])


def test_rms_norm_weight_of_another_shape_stays_outside_the_op():
    # w * norm(x) where w broadcasts x larger (w of shape (3, 16) against x (5, 1, 16)): no RMSNorm
    # weight. The norm itself is fused (weightless form); the multiplication by w stays.
    class M(torch.nn.Module):
        def forward(self, x, w):
            xf = x.float()
            return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    backend = run(M(), torch.randn(5, 1, 16), torch.randn(3, 16), fusions=["rms_norm"], dtype=torch.float32, expected=1)
    (node,) = [n for n in backend.after_graphs[-1].nodes if n.target == torch.ops.ascend_kernels.rms_norm.default]
    assert node.args[1] is None and backend.after[-1][aten.mul.Tensor] == 1
