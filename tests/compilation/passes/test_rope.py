"""The RoPE fusion (`passes/rope.py`) on isolated modules: interleaved (Flux, Wan, Helios),
rotate-half, complex multiplication, LTX-2's split layout and 2x2 rotation matrices (Kandinsky),
each with the look-alikes it must leave alone."""

from __future__ import annotations

import operator

import pytest
import torch

from .harness import DTYPES, aten, run


def _rope_tables(seq, dim, interleaved=True):
    freqs = torch.outer(torch.arange(seq).float(), 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim))
    if interleaved:
        return freqs.cos().repeat_interleave(2, -1), freqs.sin().repeat_interleave(2, -1)
    return torch.cat([freqs.cos()] * 2, -1), torch.cat([freqs.sin()] * 2, -1)


class FluxRope(torch.nn.Module):
    def forward(self, x, cos, sin):
        from diffusers.models.embeddings import apply_rotary_emb

        return apply_rotary_emb(x, (cos, sin), sequence_dim=1)


class WanRope(torch.nn.Module):
    """The closure of diffusers' `WanAttnProcessor.__call__`, verbatim."""

    def forward(self, hidden_states, freqs_cos, freqs_sin):
        x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
        cos = freqs_cos[..., 0::2]
        sin = freqs_sin[..., 1::2]
        out = torch.empty_like(hidden_states)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out.type_as(hidden_states)


class HalfRope(torch.nn.Module):
    def __init__(self, upcast=False):
        super().__init__()
        self.upcast = upcast

    def forward(self, x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
        if self.upcast:
            return (x.float() * cos + rotated.float() * sin).to(x.dtype)
        return x * cos + rotated * sin


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_flux(dtype):
    cos, sin = _rope_tables(6, 8)
    x = torch.randn(2, 6, 3, 8, dtype=dtype)
    run(
        FluxRope(),
        x,
        cos,
        sin,
        fusions=["rope"],
        dtype=dtype,
        expected=1,
        gone=[aten.unbind.int, aten.stack.default, aten.neg.default],
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_wan(dtype):
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    # WanRotaryPosEmbed's tables satisfy the documented precondition cos[2i] == cos[2i+1].
    cos, sin = WanRotaryPosEmbed(attention_head_dim=12, patch_size=(1, 1, 1), max_seq_len=16)(
        torch.zeros(1, 1, 2, 2, 2)
    )
    assert torch.equal(cos[..., 0::2], cos[..., 1::2]) and torch.equal(sin[..., 0::2], sin[..., 1::2])
    x = torch.randn(1, 8, 2, 12, dtype=dtype)
    run(
        WanRope(),
        x,
        cos,
        sin,
        fusions=["rope"],
        dtype=dtype,
        expected=1,
        gone=[aten.slice_scatter.default, aten.empty_like.default, aten.sub.Tensor],
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("upcast", [False, True], ids=["model_dtype", "upcast"])
def test_rope_rotate_half(dtype, upcast):
    cos, sin = _rope_tables(6, 8, interleaved=False)
    if not upcast:
        cos, sin = cos.to(dtype), sin.to(dtype)
    x = torch.randn(2, 3, 6, 8, dtype=dtype)
    run(
        HalfRope(upcast),
        x,
        cos,
        sin,
        fusions=["rope"],
        dtype=dtype,
        expected=1,
        gone=[aten.cat.default, aten.neg.default],
    )


def test_rope_rejects_a_cos_that_broadcasts_x_larger():
    # x * cos with cos larger than x changes the result's shape: not a rope, not replaced.
    x = torch.randn(1, 1, 1, 8)
    cos, sin = torch.randn(2, 6, 3, 8), torch.randn(2, 6, 3, 8)
    run(HalfRope(), x, cos, sin, fusions=["rope"], dtype=torch.float32, expected=0)


# RoPE: complex multiplication, use_real_unbind_dim=-2, rotate-half by slices
class ComplexRope(torch.nn.Module):
    # Z-Image's closure (Qwen-Image's `apply_rotary_emb_qwen(use_real=False)` is the same code)
    def forward(self, x, freqs_cis):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs_cis.unsqueeze(2)).flatten(3).type_as(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_complex_multiplication(dtype):
    x = torch.randn(2, 6, 3, 8, dtype=dtype)
    freqs = torch.polar(torch.ones(2, 6, 4), torch.randn(2, 6, 4))  # (B, S, D/2)
    run(
        ComplexRope(), x, freqs, fusions=["rope"], dtype=dtype, expected=1, gone=[aten.view_as_complex.default]
    )  # view_as_real(freqs) stays: the cos/sin tables


class ConjComplexRope(torch.nn.Module):
    # SanaWM's inverse rotation (transformer_sana_wm: `rotary_emb.conj() if inverse_rope`)
    def forward(self, x, freqs_cis):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs_cis.unsqueeze(2).conj()).flatten(3).type_as(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_complex_conjugate(dtype):
    # One match on every torch: torch <= 2.8 leaves a bare conjugate view after no-op removal (the
    # complex_conj form, sin negated), 2.11+ a materialized one (the complex form).
    x = torch.randn(2, 6, 3, 8, dtype=dtype)
    freqs = torch.polar(torch.ones(2, 6, 4), torch.randn(2, 6, 4))
    run(ConjComplexRope(), x, freqs, fusions=["rope"], dtype=dtype, expected=1, gone=[aten.view_as_complex.default])


def test_rope_complex_conj_form_exactly_where_the_graphs_hold_a_bare_conjugate():
    from diffusers_ascend.compilation import _compat
    from diffusers_ascend.compilation.passes.rope import RopeFusionPass

    forms = {p.form for p in RopeFusionPass.patterns()}
    assert ("complex_conj" in forms) == _compat.conj_views_reach_graphs()
    seen = {
        (2, 6): True,
        (2, 7): True,
        (2, 8): True,
        (2, 10): True,
        (2, 11): False,
        (2, 13): False,
        (2, 14): False,
        (2, 15): False,
    }
    if _compat.torch_version() in seen:
        assert _compat.conj_views_reach_graphs() is seen[_compat.torch_version()]


def test_rope_complex_qwen_image_function():
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    class M(torch.nn.Module):
        def forward(self, x, freqs):
            return apply_rotary_emb_qwen(x, freqs, use_real=False)

    x, freqs = torch.randn(1, 6, 2, 8), torch.polar(torch.ones(6, 4), torch.randn(6, 4))
    run(M(), x, freqs, fusions=["rope"], dtype=torch.float32, expected=1, gone=[aten.view_as_complex.default])


def test_rope_complex_rejects_complex128():
    # fp64 rotation: the fp32 op would lose precision
    x, freqs = (
        torch.randn(2, 6, 3, 8, dtype=torch.float64),
        torch.polar(torch.ones(2, 6, 4, dtype=torch.float64), torch.randn(2, 6, 4, dtype=torch.float64)),
    )
    run(ComplexRope(), x, freqs, fusions=["rope"], dtype=torch.float64, expected=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_use_real_unbind_dim_minus_2(dtype):
    from diffusers.models.embeddings import apply_rotary_emb

    class M(torch.nn.Module):
        def forward(self, x, cos, sin):
            return apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-2, sequence_dim=2)

    x = torch.randn(2, 3, 6, 8, dtype=dtype)  # (B, H, S, D)
    cos, sin = torch.randn(6, 8), torch.randn(6, 8)
    run(M(), x, cos, sin, fusions=["rope"], dtype=dtype, expected=1, gone=[aten.unbind.int])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_rotate_half_by_slices(dtype):
    class M(torch.nn.Module):
        def forward(self, x, cos, sin):
            half = x.shape[-1] // 2
            return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    x = torch.randn(2, 6, 3, 8, dtype=dtype)
    cos, sin = torch.randn(1, 6, 1, 8, dtype=dtype), torch.randn(1, 6, 1, 8, dtype=dtype)
    # Written in the input dtype: eager rounds three times, the op once (fp32 inside).
    run(M(), x, cos, sin, fusions=["rope"], dtype=dtype, expected=1, gone=[aten.cat.default], reference="fp64")


def test_rope_slices_that_do_not_swap_halves_are_left_alone():
    # a look-alike: the halves concatenated in their own order (no rotation)
    class M(torch.nn.Module):
        def forward(self, x, cos, sin):
            half = x.shape[-1] // 2
            return x * cos + torch.cat((x[..., :half], -x[..., half:]), dim=-1) * sin

    x, cos, sin = torch.randn(2, 6, 3, 8), torch.randn(1, 6, 1, 8), torch.randn(1, 6, 1, 8)
    run(M(), x, cos, sin, fusions=["rope"], dtype=torch.float32, expected=0)


# RoPE: Wan's even/odd writes with cos/sin chunked from one table (Helios)
def _helios_tables(dim):
    from diffusers.models.transformers.transformer_helios import HeliosRotaryPosEmbed

    # HeliosRotaryPosEmbed's tables satisfy the documented precondition cos[2i] == cos[2i+1].
    rope = HeliosRotaryPosEmbed(rope_dim=(dim // 3,) * 3, theta=10000.0)
    freqs = rope(torch.arange(2.0)[None], 2, 2, "cpu")  # (B, 2D, F, H, W)
    freqs = freqs.flatten(2).transpose(1, 2)  # (B, S, 2D) as the model feeds its attention
    cos, sin = freqs.chunk(2, dim=-1)
    assert torch.equal(cos[..., 0::2], cos[..., 1::2]) and torch.equal(sin[..., 0::2], sin[..., 1::2])
    return freqs


class HeliosRope(torch.nn.Module):
    def forward(self, x, freqs):
        from diffusers.models.transformers.transformer_helios import apply_rotary_emb_transposed

        return apply_rotary_emb_transposed(x, freqs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_even_odd_writes_with_chunked_tables(dtype):
    freqs = _helios_tables(12)
    x = torch.randn(1, freqs.shape[1], 2, 12, dtype=dtype)  # (B, S, H, D)
    run(
        HeliosRope(),
        x,
        freqs,
        fusions=["rope"],
        dtype=dtype,
        expected=1,
        gone=[aten.slice_scatter.default, aten.empty_like.default, aten.sub.Tensor],
    )


def test_rope_chunked_tables_look_alikes_are_left_alone():
    # sin first in the table: the chunk's halves used the other way round
    class SinFirst(torch.nn.Module):
        def forward(self, x, freqs):
            x_1, x_2 = x.unflatten(-1, (-1, 2)).unbind(-1)
            sin, cos = freqs.unsqueeze(-2).chunk(2, dim=-1)
            out = torch.empty_like(x)
            out[..., 0::2] = x_1 * cos[..., 0::2] - x_2 * sin[..., 1::2]
            out[..., 1::2] = x_1 * sin[..., 1::2] + x_2 * cos[..., 0::2]
            return out.type_as(x)

    x = torch.randn(1, 8, 2, 12)
    # Not the chunked-table form (cos first). Its repeated slices are one each after CSE: Wan's
    # two-table form as written, cos = the second chunk, and the result is eager's.
    backend = run(SinFirst(), x, _helios_tables(12), fusions=["rope"], dtype=torch.float32, expected=1)
    ((_, cos, sin, _),) = [
        n.args for n in backend.after_graphs[-1].nodes if n.target == torch.ops.ascend_kernels.rope.default
    ]
    assert (cos.target, cos.args[1], sin.target, sin.args[1]) == (operator.getitem, 1, operator.getitem, 0)
    # one (cos, sin) pair per position broadcast over the head dim: tables not x-sized, left alone
    run(HeliosRope(), x, torch.randn(1, 8, 4), fusions=["rope"], dtype=torch.float32, expected=0)


# RoPE: LTX-2's split layout (half-size tables, addcmul_ into the halves)
class LTX2SplitRope(torch.nn.Module):
    """diffusers' `transformer_ltx2.apply_split_rotary_emb`, called as its attention processor does."""

    def forward(self, x, cos, sin):
        from diffusers.models.transformers.transformer_ltx2 import apply_split_rotary_emb

        return apply_split_rotary_emb(x, (cos, sin))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_ltx2_split(dtype):
    x = torch.randn(1, 2, 6, 16, dtype=dtype)  # (B, H, T, D)
    cos, sin = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)  # (B, H, T, D/2), fp32
    run(
        LTX2SplitRope(),
        x,
        cos,
        sin,
        fusions=["rope"],
        dtype=dtype,
        expected=1,
        gone=[aten.addcmul.default, aten.slice_scatter.default],
    )


def test_rope_ltx2_split_look_alike_is_left_alone():
    # the halves swapped in the second write (x1 * sin added to the first half): not a rotation
    class Swapped(torch.nn.Module):
        def forward(self, x, cos, sin):
            split_x = x.reshape(*x.shape[:-1], 2, x.shape[-1] // 2).float()
            out = split_x * cos.unsqueeze(-2)
            out[..., :1, :].addcmul_(-sin.unsqueeze(-2), split_x[..., :1, :])
            out[..., 1:, :].addcmul_(sin.unsqueeze(-2), split_x[..., 1:, :])
            return out.reshape(x.shape).to(x.dtype)

    x, cos, sin = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    run(Swapped(), x, cos, sin, fusions=["rope"], dtype=torch.float32, expected=0)


# RoPE: 2x2 rotation matrices (Kandinsky 5)
def _kandinsky_rope(seq, dim):
    from diffusers.models.transformers.transformer_kandinsky import Kandinsky5RoPE1D

    return Kandinsky5RoPE1D(dim)(torch.arange(seq))[None]  # (1, S, 1, D/2, 2, 2)


class KandinskyRope(torch.nn.Module):
    """The closure `apply_rotary` of diffusers' `Kandinsky5AttnProcessor`, verbatim."""

    def forward(self, x, rope):
        x_ = x.reshape(*x.shape[:-1], -1, 1, 2).to(torch.float32)
        x_out = (rope * x_).sum(dim=-1)
        return x_out.reshape(*x.shape).to(torch.bfloat16)


def test_rope_rotation_matrices_need_no_precondition():
    # any 2x2 matrices, not only rotations: the replacement's tables reproduce them exactly
    x = torch.randn(1, 6, 2, 8)
    run(KandinskyRope(), x, torch.randn(1, 6, 1, 4, 2, 2), fusions=["rope"], dtype=torch.float32, expected=1)


class Kandinsky6Rope(torch.nn.Module):
    """diffusers' `transformer_kandinsky6.apply_rotary`, verbatim: fp32 product, cast back to x's dtype."""

    def forward(self, x, rope):
        from diffusers.models.transformers.transformer_kandinsky6 import apply_rotary

        return apply_rotary(x, rope)


@pytest.mark.parametrize("module", [KandinskyRope, Kandinsky6Rope], ids=["kandinsky5_bf16", "kandinsky6_typed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_rotation_matrices(dtype, module):
    x = torch.randn(1, 6, 2, 8, dtype=dtype)  # (B, S, H, D)
    run(module(), x, _kandinsky_rope(6, 8), fusions=["rope"], dtype=dtype, expected=1, gone=[aten.sum.dim_IntList])


def test_rope_rotation_matrices_cast_back_look_alikes_are_left_alone():
    # one matrix for all pairs: broadcasts, not per-pair tables
    x = torch.randn(1, 6, 2, 8)
    run(Kandinsky6Rope(), x, _kandinsky_rope(6, 2), fusions=["rope"], dtype=torch.float32, expected=0)

    # summed over the rows (dim -2): x's pair times the transposed matrix, another rotation
    class Transposed(torch.nn.Module):
        def forward(self, x, rope):
            x_ = x.reshape(*x.shape[:-1], -1, 2, 1).float()
            return (rope.float() * x_).sum(dim=-2).reshape(*x.shape).to(dtype=x.dtype)

    run(Transposed(), x, _kandinsky_rope(6, 8), fusions=["rope"], dtype=torch.float32, expected=0)


def test_rope_rotation_matrix_look_alikes_are_left_alone():
    # summed over the rows (dim -2) instead: x's pair times the transposed matrix, another rotation
    class Transposed(torch.nn.Module):
        def forward(self, x, rope):
            x_ = x.reshape(*x.shape[:-1], -1, 2, 1).to(torch.float32)
            return (rope * x_).sum(dim=-2).reshape(*x.shape).to(torch.bfloat16)

    x = torch.randn(1, 6, 2, 8)
    run(Transposed(), x, _kandinsky_rope(6, 8), fusions=["rope"], dtype=torch.float32, expected=0)

    # cast to fp16 instead of bf16: not Kandinsky 5's form; on fp32 x the fp32 rotation before the
    # cast is Kandinsky 6's form, fused with the fp16 cast left after it (the same result)
    class ToHalf(torch.nn.Module):
        def forward(self, x, rope):
            x_ = x.reshape(*x.shape[:-1], -1, 1, 2).to(torch.float32)
            return (rope * x_).sum(dim=-1).reshape(*x.shape).to(torch.float16)

    run(ToHalf(), x, _kandinsky_rope(6, 8), fusions=["rope"], dtype=torch.float32, expected=1)
    run(ToHalf(), x.bfloat16(), _kandinsky_rope(6, 8), fusions=["rope"], dtype=torch.bfloat16, expected=0)
    # one matrix for all pairs (a table built with odd axes dims): broadcasts, not per-pair tables
    run(KandinskyRope(), x, _kandinsky_rope(6, 2), fusions=["rope"], dtype=torch.float32, expected=0)
