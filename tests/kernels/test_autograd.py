"""Gradients of every op against autograd of the composite it replaces, eager and under
``torch.compile(backend="aot_eager")`` (aot_autograd traces the backward custom ops)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ascend_kernels  # noqa: F401
from ascend_kernels.testing import assert_close

ops = torch.ops.ascend_kernels


def _rot_interleaved(x):
    re, im = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([-im, re], -1).flatten(-2)


def _rot_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([-x2, x1], -1)


# name -> (fused call, composite written as in diffusers/torch, input shapes)
CASES = {
    "rms_norm": (
        lambda x, w: ops.rms_norm(x, w, 1e-6),
        lambda x, w: F.rms_norm(x.float(), (x.shape[-1],), w.float(), 1e-6).to(x.dtype),
        [(2, 13, 77), (77,)],
    ),
    "rms_norm_no_weight": (
        lambda x: ops.rms_norm(x, None, 1e-6),
        lambda x: F.rms_norm(x.float(), (x.shape[-1],), None, 1e-6).to(x.dtype),
        [(3, 13, 16)],
    ),
    "rope_interleaved": (
        lambda x, c, s: ops.rope(x, c, s, "interleaved"),
        lambda x, c, s: (x.float() * c + _rot_interleaved(x).float() * s).to(x.dtype),
        [(2, 13, 3, 16), (1, 13, 1, 16), (1, 13, 1, 16)],
    ),
    "rope_half": (
        lambda x, c, s: ops.rope(x, c, s, "half"),
        lambda x, c, s: (x.float() * c + _rot_half(x).float() * s).to(x.dtype),
        [(2, 3, 13, 16), (1, 1, 13, 16), (1, 1, 13, 16)],
    ),
    "gelu_tanh": (ops.gelu_tanh, lambda x: F.gelu(x, approximate="tanh"), [(2, 13, 77)]),
    "fast_gelu": (ops.fast_gelu, lambda x: (x.float() * torch.sigmoid(1.702 * x.float())).to(x.dtype), [(2, 13, 77)]),
    "adaln_flux": (
        lambda x, sc, sh: ops.adaln_modulate(x, sc, sh, 1e-6),
        lambda x, sc, sh: (
            F.layer_norm(x.float(), (x.shape[-1],), eps=1e-6) * (1 + sc[:, None].float()) + sh[:, None].float()
        ).to(x.dtype),
        [(2, 13, 77), (2, 77), (2, 77)],
    ),
    "adaln_affine": (
        lambda x, sc, sh, w, b: ops.adaln_modulate(x, sc, sh, 1e-6, w, b),
        lambda x, sc, sh, w, b: (
            F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), 1e-6) * (1 + sc.float()) + sh.float()
        ).to(x.dtype),
        [(2, 13, 77), (2, 1, 77), (2, 1, 77), (77,), (77,)],
    ),
    "swiglu_packed": (
        ops.swiglu,
        lambda h: (F.silu(h[..., :77].float()) * h[..., 77:].float()).to(h.dtype),
        [(2, 13, 154)],
    ),
    "swiglu_two_tensors": (
        ops.swiglu,
        lambda g, u: (F.silu(g.float()) * u.float()).to(g.dtype),
        [(2, 13, 77), (2, 13, 77)],
    ),
    "mul_add": (
        ops.mul_add,
        lambda x, y, z: (x.float() * y.float() + z.float()).to(x.dtype),
        [(2, 1, 77), (2, 13, 77), (2, 13, 77)],
    ),
}


def _inputs(shapes, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]


def _grads(fn, inputs, seed=1):
    out = fn(*inputs)
    g = torch.Generator().manual_seed(seed)
    cot = torch.randn(out.shape, generator=g).to(out.dtype)
    return out, torch.autograd.grad(out, inputs, cot)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_grad_matches_composite(case, dtype):
    fused, composite, shapes = CASES[case]
    inputs = _inputs(shapes, dtype)
    out, grads = _grads(fused, inputs)
    ref_out, ref_grads = _grads(composite, inputs)
    assert_close(out, ref_out, msg=f"{case} forward")
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert g.dtype == inputs[i].dtype and g.shape == inputs[i].shape
        assert_close(g, r, msg=f"{case} grad of input {i}")


def test_grad_only_where_required():
    x = torch.randn(2, 13, 16, requires_grad=True)
    w = torch.randn(16)  # no grad wanted
    ops.rms_norm(x, w, 1e-6).sum().backward()
    assert x.grad is not None and w.grad is None


def test_backward_through_aot_eager_compile():
    """A function using every op, compiled with aot_eager: gradients equal eager composites'."""

    def fused(x, w, c, s, scale, shift, gate):
        h = ops.adaln_modulate(x, scale, shift, 1e-6)
        q = ops.rope(ops.rms_norm(h, w, 1e-6).unflatten(-1, (2, 16)), c, s, "interleaved").flatten(-2)
        y = ops.gelu_tanh(q) + ops.fast_gelu(q)
        return ops.mul_add(gate[:, None], y, x)

    def composite(x, w, c, s, scale, shift, gate):
        h = F.layer_norm(x, (32,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        q = F.rms_norm(h, (32,), w, 1e-6).unflatten(-1, (2, 16))
        q = (q * c + _rot_interleaved(q) * s).flatten(-2)
        y = F.gelu(q, approximate="tanh") + q * torch.sigmoid(1.702 * q)
        return x + gate[:, None] * y

    shapes = [(2, 13, 32), (32,), (1, 13, 1, 16), (1, 13, 1, 16), (2, 32), (2, 32), (2, 32)]
    inputs = _inputs(shapes, torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True)
    out, grads = _grads(compiled, inputs)
    ref_out, ref_grads = _grads(composite, inputs)
    assert_close(out, ref_out, msg="compiled forward")
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(g, r, atol=1e-4, rtol=1e-4, msg=f"compiled grad of input {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("use", ["both", "normed_only"])
def test_two_output_op_grads_match_composite(dtype, use):
    # add_rms_norm returns (normed, residual_sum): its backward takes one gradient per output, and
    # autograd's zeros where the caller used only one.
    def composite(x1, x2, w):
        s = x1 + x2
        return F.rms_norm(s.float(), (s.shape[-1],), w.float(), 1e-6).to(s.dtype), s

    inputs = _inputs([(2, 13, 77), (2, 13, 77), (77,)], dtype)
    g = torch.Generator().manual_seed(1)
    cots = [torch.randn(2, 13, 77, generator=g).to(dtype) for _ in range(2)]

    def grads(fn):
        y, s = fn(*inputs)
        outs, cot = ([y, s], cots) if use == "both" else ([y], cots[:1])
        return (y, s), torch.autograd.grad(outs, inputs, cot)

    (y, s), got = grads(lambda x1, x2, w: ops.add_rms_norm(x1, x2, w, 1e-6))
    (ry, rs), ref = grads(composite)
    assert_close(y, ry, msg="add_rms_norm normed")
    assert torch.equal(s, rs)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert a.dtype == inputs[i].dtype and a.shape == inputs[i].shape
        assert_close(a, b, msg=f"add_rms_norm grad of input {i} ({use})")
