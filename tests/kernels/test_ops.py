"""Numerics of every op: against its fp64 reference and against the diffusers code it replaces,
in fp32, bf16 and fp16, with odd shapes (D=77 for norms, S=13)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ascend_kernels  # noqa: F401
from ascend_kernels.ops.adaln import adaln_modulate_native
from ascend_kernels.ops.gelu import fast_gelu_native
from ascend_kernels.ops.mul_add import mul_add_native
from ascend_kernels.ops.rms_norm import rms_norm_native
from ascend_kernels.ops.rope import rope_native
from ascend_kernels.ops.swiglu import swiglu_native
from ascend_kernels.testing import assert_close

from .conftest import flux_rope, wan_apply_rotary_emb, wan_rope

ops = torch.ops.ascend_kernels


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def f64(*ts):
    return [t.double() if isinstance(t, torch.Tensor) else t for t in ts]


# ------------------------------------------------------------------------------------- rms_norm


@pytest.mark.parametrize("shape", [(2, 13, 77), (3, 64), (1, 5, 2, 16)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_vs_reference_and_torch(dtype, shape, with_weight):
    x = randn(*shape, dtype=dtype, scale=3.0)
    norm = torch.nn.RMSNorm(shape[-1], eps=1e-6, elementwise_affine=with_weight, dtype=dtype)
    if with_weight:
        with torch.no_grad():
            norm.weight.copy_(randn(shape[-1], seed=1))
    w = norm.weight if with_weight else None
    out = ops.rms_norm(x, w, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, rms_norm_native(x, w, 1e-6))  # the CPU path is the reference
    ref = rms_norm_native(*f64(x, w), 1e-6)
    assert_close(out, ref.to(dtype), msg="rms_norm vs fp64 reference")
    with torch.no_grad():
        assert_close(out, norm(x), msg="rms_norm vs torch.nn.RMSNorm")


def test_rms_norm_vs_diffusers_rmsnorm(dtype):
    from diffusers.models.normalization import RMSNorm

    x = randn(2, 13, 77, dtype=dtype, scale=2.0)
    norm = RMSNorm(77, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(randn(77, seed=1))
        expected = norm(x)
    assert_close(ops.rms_norm(x, norm.weight, 1e-6), expected, msg="rms_norm vs diffusers RMSNorm")


def test_rms_norm_out_dtype():
    x = randn(2, 13, 77, dtype=torch.bfloat16)
    out = ops.rms_norm(x, None, 1e-6, torch.float32)
    assert out.dtype == torch.float32
    # Returned before any bf16 rounding: closer to fp64 than the bf16 result can be.
    assert_close(out, rms_norm_native(x.double(), None, 1e-6).float(), msg="fp32 out of bf16 x")


# ------------------------------------------------------------------------------------- rope


@pytest.mark.parametrize("seq", [13, 16])
def test_rope_interleaved_vs_flux_apply_rotary_emb(dtype, seq):
    from diffusers.models.embeddings import apply_rotary_emb

    cos, sin = flux_rope(seq)  # (S, 16) fp32, as FluxPosEmbed returns them
    x = randn(2, seq, 3, 16, dtype=dtype)  # (B, S, H, D): Flux's sequence_dim=1 layout
    expected = apply_rotary_emb(x, (cos, sin), sequence_dim=1)
    out = ops.rope(x, cos[None, :, None], sin[None, :, None], "interleaved")
    assert out.dtype == dtype
    assert_close(out, expected, msg="rope vs diffusers apply_rotary_emb (Flux)")
    ref = rope_native(*f64(x, cos[None, :, None], sin[None, :, None]), "interleaved")
    assert_close(out, ref.to(dtype), msg="rope vs fp64 reference")


def test_rope_interleaved_vs_wan_rotary(dtype):
    wan = wan_apply_rotary_emb()
    cos, sin = wan_rope(head_dim=24, frames=1, height=3, width=5)  # S = 15, (1, S, 1, D)
    assert torch.equal(cos[..., 0::2], cos[..., 1::2]) and torch.equal(sin[..., 0::2], sin[..., 1::2])
    x = randn(2, cos.shape[1], 3, 24, dtype=dtype)
    expected = wan(x, cos, sin)
    out = ops.rope(x, cos, sin, "interleaved")
    assert out.dtype == dtype
    assert_close(out, expected, msg="rope vs Wan's rotary closure")


def test_rope_half_is_rotate_half(dtype):
    x = randn(1, 4, 13, 32, dtype=dtype)  # (B, H, S, D)
    theta = randn(13, 16, seed=3)
    cos = torch.cat([theta.cos()] * 2, -1)[None, None]
    sin = torch.cat([theta.sin()] * 2, -1)[None, None]
    x1, x2 = x.float().chunk(2, -1)
    expected = (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(dtype)
    assert_close(ops.rope(x, cos, sin, "half"), expected, msg="rope half vs rotate-half")
    # The two layouts are different rotations.
    assert (ops.rope(x, cos, sin, "interleaved").float() - expected.float()).abs().max() > 0.1


def test_rope_rejects_bad_layout_and_shapes():
    x = randn(1, 4, 2, 8)
    cos = sin = randn(1, 4, 1, 8)
    with pytest.raises(ValueError, match="valid layouts: interleaved, half"):
        ops.rope(x, cos, sin, "neox")
    with pytest.raises(ValueError, match="even last dimension"):
        ops.rope(randn(1, 4, 2, 7), randn(1, 4, 1, 7), randn(1, 4, 1, 7), "half")
    with pytest.raises(ValueError, match="must broadcast to x"):
        ops.rope(x, randn(3, 4, 1, 8), randn(3, 4, 1, 8), "half")


# ------------------------------------------------------------------------------------- gelu


@pytest.mark.parametrize("shape", [(2, 13, 77), (5,)])
def test_gelu_tanh_vs_nn_gelu(dtype, shape):
    x = randn(*shape, dtype=dtype, scale=3.0)
    out = ops.gelu_tanh(x)
    assert out.dtype == dtype
    # Exact: the same ATen kernel as nn.GELU(approximate="tanh") on this path.
    assert torch.equal(out, torch.nn.GELU(approximate="tanh")(x))
    assert_close(out, F.gelu(x.double(), approximate="tanh").to(dtype), msg="gelu_tanh vs fp64")


def test_fast_gelu_formula_and_not_gelu_tanh(dtype):
    x = randn(2, 13, 77, dtype=dtype, scale=3.0)
    out = ops.fast_gelu(x)
    assert out.dtype == dtype
    xd = x.double()
    assert_close(out, (xd * torch.sigmoid(1.702 * xd)).to(dtype), msg="fast_gelu vs x*sigmoid(1.702x)")
    assert torch.equal(out, fast_gelu_native(x))
    # Not an implementation of gelu_tanh: differs by far more than any tolerance.
    assert (out.double() - F.gelu(xd, approximate="tanh")).abs().max() > 1e-2


# ------------------------------------------------------------------------------------- adaln


def test_adaln_vs_flux_ada_layer_norm_zero(dtype):
    from diffusers.models.normalization import AdaLayerNormZero

    torch.manual_seed(0)
    norm = AdaLayerNormZero(77).to(dtype)
    x, temb = randn(2, 13, 77, dtype=dtype), randn(2, 77, dtype=dtype, seed=1)
    with torch.no_grad():
        expected, *_ = norm(x, emb=temb)
        shift, scale, *_ = norm.linear(norm.silu(temb)).chunk(6, dim=1)  # (B, D) each
    out = ops.adaln_modulate(x, scale, shift, 1e-6)
    assert out.dtype == dtype
    assert_close(out, expected, msg="adaln vs AdaLayerNormZero modulation (Flux)")
    ref = adaln_modulate_native(*f64(x, scale, shift), 1e-6)
    assert_close(out, ref.to(dtype), msg="adaln vs fp64 reference")


def test_adaln_vs_wan_fp32_layernorm_modulation(dtype):
    from diffusers.models.normalization import FP32LayerNorm

    norm1 = FP32LayerNorm(77, 1e-6, elementwise_affine=False)
    table = randn(1, 6, 77, seed=2) / 77**0.5
    h, temb = randn(2, 13, 77, dtype=dtype), randn(2, 6, 77, seed=3)
    shift, scale, *_ = (table + temb.float()).chunk(6, dim=1)  # (B, 1, D) fp32
    expected = (norm1(h.float()) * (1 + scale) + shift).type_as(h)  # WanTransformerBlock's form
    out = ops.adaln_modulate(h, scale, shift, 1e-6, None, None, h.dtype)
    assert out.dtype == dtype
    assert_close(out, expected, msg="adaln vs Wan fp32 LayerNorm + scale_shift_table")
    # Without type_as (out_dtype fp32) the op keeps fp32.
    out32 = ops.adaln_modulate(h, scale, shift, 1e-6, None, None, torch.float32)
    assert out32.dtype == torch.float32
    assert_close(out32, norm1(h.float()) * (1 + scale) + shift, msg="adaln fp32 out")


def test_adaln_affine_weight_bias():
    x, scale, shift = randn(2, 13, 77), randn(2, 77, seed=1), randn(2, 77, seed=2)
    w, b = randn(77, seed=3), randn(77, seed=4)
    expected = F.layer_norm(x, (77,), w, b, 1e-5) * (1 + scale[:, None]) + shift[:, None]
    assert_close(ops.adaln_modulate(x, scale, shift, 1e-5, w, b), expected, msg="adaln with affine")


# ------------------------------------------------------------------------------------- mul_add


def test_mul_add_flux_residual_gate(dtype):
    h, attn, gate = (
        randn(2, 13, 77, dtype=dtype),
        randn(2, 13, 77, dtype=dtype, seed=1),
        randn(2, 77, dtype=dtype, seed=2),
    )
    expected = h + gate.unsqueeze(1) * attn  # FluxTransformerBlock's residual
    out = ops.mul_add(gate.unsqueeze(1), attn, h)
    assert out.dtype == dtype and out.shape == h.shape
    assert_close(out, expected, msg="mul_add vs Flux residual gate")
    assert_close(out, mul_add_native(*f64(gate.unsqueeze(1), attn, h)).to(dtype), msg="mul_add vs fp64")


def test_mul_add_wan_mixed_dtype(dtype):
    h, attn = randn(2, 13, 77, dtype=dtype), randn(2, 13, 77, dtype=dtype, seed=1)
    gate = randn(2, 1, 77, seed=2)  # fp32, from the fp32 scale_shift_table
    expected = h.float() + attn * gate  # WanTransformerBlock before .type_as
    out = ops.mul_add(attn, gate, h.float())
    assert out.dtype == torch.float32
    assert_close(out, expected, msg="mul_add vs Wan mixed-dtype residual")


@pytest.mark.parametrize(
    "x, y, z",
    [
        (torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.float16), torch.ones(3, dtype=torch.bfloat16)),
        (torch.ones(3, dtype=torch.bfloat16), torch.tensor(2.0), torch.ones(3, dtype=torch.bfloat16)),
        (
            torch.tensor(2.0, dtype=torch.float64),
            torch.ones(3, dtype=torch.float16),
            torch.ones(3, dtype=torch.float16),
        ),
        (torch.tensor(2.0), torch.tensor(3.0, dtype=torch.float64), torch.ones(3, dtype=torch.bfloat16)),
    ],
    ids=["bf16*fp16+bf16", "bf16*0dim+bf16", "0dim64*fp16+fp16", "0dim*0dim64+bf16"],
)
def test_mul_add_type_promotion_matches_eager(x, y, z):
    out = ops.mul_add(x, y, z)
    expected = x * y + z
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert_close(out, expected, msg="mul_add promotion")


# ------------------------------------------------------------------------------------- swiglu


def test_swiglu_packed_is_flux2_swiglu(dtype):
    from diffusers.models.transformers.transformer_flux2 import Flux2SwiGLU

    h = randn(2, 13, 2 * 77, dtype=dtype)
    out = ops.swiglu(h)
    assert out.dtype == dtype and out.shape == (2, 13, 77)
    assert_close(out, Flux2SwiGLU()(h), msg="swiglu vs Flux2SwiGLU")
    assert_close(out, swiglu_native(*f64(h)).to(dtype), msg="swiglu vs fp64")


def test_swiglu_two_tensors_is_diffusers_swiglu(dtype):
    # diffusers' SwiGLU gates the second half: swiglu(gate, up) on the halves, gate first
    h = randn(2, 13, 2 * 77, dtype=dtype)
    a, gate = h.chunk(2, -1)
    out = ops.swiglu(gate, a)
    assert out.dtype == dtype and out.shape == a.shape
    assert_close(out, a * F.silu(gate), msg="swiglu(gate, up) vs diffusers SwiGLU")
    assert_close(out, swiglu_native(*f64(gate, a)).to(dtype), msg="swiglu(gate, up) vs fp64")


def test_swiglu_packed_along_another_dim():
    h = randn(6, 5, 3)
    expected = F.silu(h[:3]) * h[3:]
    torch.testing.assert_close(ops.swiglu(h, None, 0), expected)
    torch.testing.assert_close(ops.swiglu(h, None, -3), expected)


@pytest.mark.parametrize(
    "args, match",
    [
        ((randn(2, 7),), "even size"),
        ((randn(2, 8), None, 2), "not a dimension"),
        ((randn(2, 8), randn(2, 4)), "shape and dtype"),
        ((randn(2, 8), randn(2, 8, dtype=torch.bfloat16)), "shape and dtype"),
        ((randn(2, 8), randn(2, 8), 0), "packed layout"),
    ],
)
def test_swiglu_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        ops.swiglu(*args)
