"""Each fusion on isolated modules, in every written form it claims, fp32 and bf16:
exact replacement count, the unfused ops gone, the fused op present, numerics vs eager."""

from __future__ import annotations

import collections
import copy
import operator

import pytest
import torch
import torch.nn.functional as F

from .conftest import SnapshotBackend, assert_close, compile_module, tolerances

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16]


def run(module, *inputs, fusions, dtype, expected, gone=(), fusion=None, reference="eager"):
    """Compiles `module`, asserts the exact match count and the numerics: against eager, or with
    ``reference="fp64"`` as close to an fp64 run as eager is (for code that rounds every step in
    low precision, where the fused op's single rounding differs from eager by more than the
    tolerance although it is the more accurate of the two)."""
    fusion = fusion or fusions[0]
    module = module.to(dtype)
    backend = SnapshotBackend(fusions=list(fusions), executor="eager")
    with torch.no_grad():
        out = compile_module(module, backend)(*inputs)
        ref = module(*inputs)
        exact = copy.deepcopy(module).double()(*(i.double() for i in inputs)) if reference == "fp64" else None
    assert backend.report.matches[fusion] == expected
    backend.assert_fused(fusion, expected, gone=gone)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if exact is None:
        assert_close(out, ref, dtype)
    else:
        err, eager_err = (out.double() - exact).abs().max(), (ref.double() - exact).abs().max()
        assert err <= eager_err + tolerances(dtype)["atol"], (float(err), float(eager_err))
    return backend


# ----------------------------------------------------------------------------------------- RMSNorm
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
    eps = sorted(n.args[2] for n in backend.after_graphs[-1].nodes
                 if n.target == torch.ops.ascend_kernels.rms_norm.default)
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
    not _has_fused_rms_norm(), reason="torch < 2.9: no _fused_rms_norm(input, normalized_shape, ...)")


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


# -------------------------------------------------------------------------------------------- RoPE
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
    run(FluxRope(), x, cos, sin, fusions=["rope"], dtype=dtype, expected=1,
        gone=[aten.unbind.int, aten.stack.default, aten.neg.default])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_wan(dtype):
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    # WanRotaryPosEmbed's tables satisfy the documented precondition cos[2i] == cos[2i+1].
    cos, sin = WanRotaryPosEmbed(attention_head_dim=12, patch_size=(1, 1, 1), max_seq_len=16)(
        torch.zeros(1, 1, 2, 2, 2))
    assert torch.equal(cos[..., 0::2], cos[..., 1::2]) and torch.equal(sin[..., 0::2], sin[..., 1::2])
    x = torch.randn(1, 8, 2, 12, dtype=dtype)
    run(WanRope(), x, cos, sin, fusions=["rope"], dtype=dtype, expected=1,
        gone=[aten.slice_scatter.default, aten.empty_like.default, aten.sub.Tensor])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("upcast", [False, True], ids=["model_dtype", "upcast"])
def test_rope_rotate_half(dtype, upcast):
    cos, sin = _rope_tables(6, 8, interleaved=False)
    if not upcast:
        cos, sin = cos.to(dtype), sin.to(dtype)
    x = torch.randn(2, 3, 6, 8, dtype=dtype)
    run(HalfRope(upcast), x, cos, sin, fusions=["rope"], dtype=dtype, expected=1,
        gone=[aten.cat.default, aten.neg.default])


def test_rope_rejects_a_cos_that_broadcasts_x_larger():
    # x * cos with cos larger than x changes the result's shape: not a rope, not replaced.
    x = torch.randn(1, 1, 1, 8)
    cos, sin = torch.randn(2, 6, 3, 8), torch.randn(2, 6, 3, 8)
    run(HalfRope(), x, cos, sin, fusions=["rope"], dtype=torch.float32, expected=0)


# -------------------------------------------------------------------------------------------- GELU
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gelu_tanh(dtype):
    from diffusers.models.attention import FeedForward

    torch.manual_seed(0)
    ff = FeedForward(16, dim_out=16, activation_fn="gelu-approximate")
    run(ff, torch.randn(2, 5, 16, dtype=dtype), fusions=["gelu_tanh"], dtype=dtype, expected=1,
        gone=[aten.gelu.default])


def test_gelu_exact_is_not_tanh():
    run(torch.nn.GELU(), torch.randn(4, 16), fusions=["gelu_tanh"], dtype=torch.float32, expected=0)


def test_fast_gelu_runs_only_when_named():
    x = torch.randn(4, 16)
    gelu = torch.nn.GELU(approximate="tanh")
    backend = SnapshotBackend(fusions=["fast_gelu"], executor="eager")
    with torch.no_grad():
        out = compile_module(gelu, backend)(x)
    assert backend.report.matches == {"fast_gelu": 1}
    backend.assert_fused("fast_gelu", 1, gone=[aten.gelu.default])
    torch.testing.assert_close(out, x * torch.sigmoid(1.702 * x))  # the approximation, as documented
    tanh_only = SnapshotBackend(fusions=["gelu_tanh"], executor="eager")
    with torch.no_grad():
        compile_module(gelu, tanh_only)(x)
    assert tanh_only.fused_calls("gelu_tanh") == 1
    assert torch.ops.ascend_kernels.fast_gelu.default not in tanh_only.after[-1]


# ------------------------------------------------------------------------------------------- adaLN
class FluxModulate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16, elementwise_affine=False, eps=1e-6)

    def forward(self, x, scale, shift):
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None]


class WanModulate(torch.nn.Module):
    def __init__(self, cast_back=True):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16, elementwise_affine=False, eps=1e-6)
        self.cast_back = cast_back

    def forward(self, x, scale, shift):
        y = self.norm(x.float()) * (1 + scale) + shift
        return y.type_as(x) if self.cast_back else y


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_adaln_flux(dtype):
    x, scale, shift = torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 16, dtype=dtype), torch.randn(2, 16, dtype=dtype)
    run(FluxModulate(), x, scale, shift, fusions=["adaln"], dtype=dtype, expected=1,
        gone=[aten.native_layer_norm.default])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_adaln_continuous_norm_out(dtype):
    # diffusers' AdaLayerNormContinuous (Flux's norm_out), with its real module and conditioning.
    from diffusers.models.normalization import AdaLayerNormContinuous

    norm = AdaLayerNormContinuous(16, 16, elementwise_affine=False, eps=1e-6)
    x, emb = torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 16, dtype=dtype)
    run(norm, x, emb, fusions=["adaln"], dtype=dtype, expected=1, gone=[aten.native_layer_norm.default])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cast_back", [True, False], ids=["type_as", "fp32_out"])
def test_adaln_wan(dtype, cast_back):
    x = torch.randn(2, 5, 16, dtype=dtype)
    scale, shift = torch.randn(2, 1, 16), torch.randn(2, 1, 16)  # fp32 modulation, as Wan
    backend = run(WanModulate(cast_back), x, scale, shift, fusions=["adaln"], dtype=dtype, expected=1,
                  gone=[aten.native_layer_norm.default])
    out_dtype = [n.args[6] if len(n.args) > 6 else n.kwargs.get("out_dtype") for n in backend.after_graphs[-1].nodes
                 if n.target == torch.ops.ascend_kernels.adaln_modulate.default]
    assert out_dtype == [dtype if cast_back else torch.float32]


def test_adaln_rejects_lower_rank_broadcast():
    # scale of shape (S, D) broadcasting over the batch is not the op's (B, 1, D) reading.
    x, scale, shift = torch.randn(2, 5, 16), torch.randn(5, 16), torch.randn(5, 16)

    class M(torch.nn.Module):
        def forward(self, x, scale, shift):
            return F.layer_norm(x, (16,), eps=1e-6) * (1 + scale) + shift

    run(M(), x, scale, shift, fusions=["adaln"], dtype=torch.float32, expected=0)


# ----------------------------------------------------------------------------------------- mul_add
class Gate(torch.nn.Module):
    def __init__(self, order):
        super().__init__()
        self.order = order

    def forward(self, residual, gate, y):
        return residual + gate * y if self.order == "add_first" else gate * y + residual


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("order", ["add_first", "mul_first"])
def test_mul_add_orders(order, dtype):
    r, g, y = torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 1, 16, dtype=dtype), torch.randn(2, 5, 16, dtype=dtype)
    run(Gate(order), r, g, y, fusions=["mul_add"], dtype=dtype, expected=1, gone=[aten.mul.Tensor, aten.add.Tensor])


def test_mul_add_wan_mixed_dtypes():
    class M(torch.nn.Module):
        def forward(self, h, y, gate):
            return (h.float() + y * gate).type_as(h)

    h, y, gate = torch.randn(2, 5, 16, dtype=torch.bfloat16), torch.randn(2, 5, 16, dtype=torch.bfloat16), torch.randn(2, 1, 16)
    run(M(), h, y, gate, fusions=["mul_add"], dtype=torch.bfloat16, expected=1)


def test_mul_add_leaves_scalar_operands():
    class M(torch.nn.Module):
        def forward(self, x, y):
            # gelu's tanh polynomial, written out, and a scalar gate
            inner = x + x * x * x * 0.044715
            return inner * 2.0 + y

    run(M(), torch.randn(4, 16), torch.randn(4, 16), fusions=["mul_add"], dtype=torch.float32, expected=0)


# adaLN written scale first (Flux 2), and without a shift
class ScaleFirstModulate(torch.nn.Module):
    def __init__(self, form):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16, elementwise_affine=False, eps=1e-6)
        self.form = form

    def forward(self, x, scale, shift=None):
        if self.form == "scale_first":
            return (1 + scale) * self.norm(x) + shift
        if self.form == "scale_only":
            return self.norm(x) * (1 + scale)
        return (1 + scale) * self.norm(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", ["scale_first", "scale_only", "scale_only_first"])
def test_adaln_scale_first_and_scale_only(form, dtype):
    x = torch.randn(2, 5, 16, dtype=dtype)
    scale, shift = torch.randn(2, 1, 16, dtype=dtype), torch.randn(2, 1, 16, dtype=dtype)
    inputs = (x, scale, shift) if form == "scale_first" else (x, scale)
    run(ScaleFirstModulate(form), *inputs, fusions=["adaln"], dtype=dtype, expected=1,
        gone=[aten.native_layer_norm.default, aten.mul.Tensor])


def test_adaln_scale_first_in_a_real_flux2_block():
    # Flux 2's blocks write every modulation scale first: 4 sites in the double block
    # (2 streams x attention/MLP), 1 in the single block.
    from diffusers.models.transformers.transformer_flux2 import Flux2SingleTransformerBlock

    torch.manual_seed(0)
    block = Flux2SingleTransformerBlock(dim=32, num_attention_heads=2, attention_head_dim=16).eval()
    x, temb = torch.randn(1, 12, 32), torch.randn(1, 1, 3 * 32)
    backend = SnapshotBackend(fusions=["adaln"], executor="eager")
    with torch.no_grad():
        out = compile_module(block, backend)(x, None, temb, None)
        ref = block(x, None, temb, None)
    assert backend.report.matches["adaln"] == 1
    assert_close(out[-1] if isinstance(out, tuple) else out, ref[-1] if isinstance(ref, tuple) else ref, torch.float32)


def test_adaln_scale_only_does_not_cut_a_shifted_form_short():
    # the shift-less forms run last: a full modulation is one match with its shift, not a
    # scale-only match plus a leftover add
    x, scale, shift = torch.randn(2, 5, 16), torch.randn(2, 1, 16), torch.randn(2, 1, 16)
    backend = run(ScaleFirstModulate("scale_first"), x, scale, shift, fusions=["adaln"], dtype=torch.float32,
                  expected=1)
    assert aten.add.Tensor not in backend.after[-1]


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
    run(ComplexRope(), x, freqs, fusions=["rope"], dtype=dtype, expected=1,
        gone=[aten.view_as_complex.default])  # view_as_real(freqs) stays: the cos/sin tables


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
    seen = {(2, 6): True, (2, 7): True, (2, 8): True, (2, 10): True, (2, 11): False, (2, 13): False, (2, 14): False, (2, 15): False}
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
    x, freqs = torch.randn(2, 6, 3, 8, dtype=torch.float64), torch.polar(torch.ones(2, 6, 4, dtype=torch.float64),
                                                                      torch.randn(2, 6, 4, dtype=torch.float64))
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

    backend = run(M(), torch.randn(5, 1, 16), torch.randn(3, 16), fusions=["rms_norm"], dtype=torch.float32,
                  expected=1)
    (node,) = [n for n in backend.after_graphs[-1].nodes if n.target == torch.ops.ascend_kernels.rms_norm.default]
    assert node.args[1] is None and backend.after[-1][aten.mul.Tensor] == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mul_add_qwen_image_broadcast_residual(dtype):
    # FINDINGS section 5: Qwen-Image's `x + y * gate` where the residual broadcasts against the
    # product (x (B, 1, D), y (B, S, D)) false-matched MindIE SD's same-shape residual-gate
    # pattern. Here the op broadcasts like eager and every match re-checks the result's shape and
    # dtype, so the fused result is eager's.
    class M(torch.nn.Module):
        def forward(self, x, y, gate):
            return x + y * gate

    x, y, gate = torch.randn(2, 1, 16, dtype=dtype), torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 1, 16, dtype=dtype)
    run(M(), x, y, gate, fusions=["mul_add"], dtype=dtype, expected=1)


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
    run(HeliosRope(), x, freqs, fusions=["rope"], dtype=dtype, expected=1,
        gone=[aten.slice_scatter.default, aten.empty_like.default, aten.sub.Tensor])


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
    ((_, cos, sin, _),) = [n.args for n in backend.after_graphs[-1].nodes if n.target == torch.ops.ascend_kernels.rope.default]
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
    run(LTX2SplitRope(), x, cos, sin, fusions=["rope"], dtype=dtype, expected=1,
        gone=[aten.addcmul.default, aten.slice_scatter.default])


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
    run(module(), x, _kandinsky_rope(6, 8), fusions=["rope"], dtype=dtype, expected=1,
        gone=[aten.sum.dim_IntList])


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


# adaLN: per-frame modulation with the tokens split by frame between the norm and the modulation
class SanaWMPerFrame(torch.nn.Module):
    """`SanaVideoMSCamCtrlBlock`'s modulation of diffusers' Sana-WM, verbatim (tokens grouped by frame)."""

    def __init__(self, dim):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x, scale_msa, shift_msa):
        B, N, C = x.shape
        num_frames = scale_msa.shape[1]
        x_norm1 = self.norm1(x).reshape(B, num_frames, -1, C)
        return (x_norm1 * (1 + scale_msa) + shift_msa).reshape(B, N, C)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_adaln_per_frame(dtype):
    x = torch.randn(2, 12, 16, dtype=dtype)  # 3 frames of 4 tokens
    scale, shift = torch.randn(2, 3, 1, 16, dtype=dtype), torch.randn(2, 3, 1, 16, dtype=dtype)
    # Eager rounds the bf16 LayerNorm output before modulating it, the op once at the end: one draw
    # under xdist differed from eager by 0.0122 (> atol 0.01), so the check is against fp64.
    run(SanaWMPerFrame(16), x, scale, shift, fusions=["adaln", "mul_add"], dtype=dtype, expected=1,
        gone=[aten.native_layer_norm.default], reference="fp64")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_adaln_per_frame_sana_wm_final_layer(dtype):
    from diffusers.models.transformers.transformer_sana_wm import T2IFinalLayer

    torch.manual_seed(0)
    layer = T2IFinalLayer(16, (1, 2, 2), 4)
    x, t = torch.randn(1, 12, 16, dtype=dtype), torch.randn(1, 1, 3, 16, dtype=dtype)  # t: (B, 1, F, D)
    backend = run(layer, x, t, fusions=["adaln", "mul_add"], dtype=dtype, expected=1,
                  gone=[aten.native_layer_norm.default])
    assert backend.report.matches.get("mul_add", 0) == 0  # the modulation is not cut into mul_adds


def test_adaln_per_frame_look_alikes_are_left_alone():
    # tokens split frame-minor, (B, N/F, F, D) with one row per position in the frame: not this form
    class FrameMinor(torch.nn.Module):
        def forward(self, x, scale, shift):
            y = F.layer_norm(x, (16,), eps=1e-6).reshape(x.shape[0], -1, scale.shape[2], 16)
            return (y * (1 + scale) + shift).reshape(x.shape)

    x = torch.randn(2, 12, 16)
    scale, shift = torch.randn(2, 1, 3, 16), torch.randn(2, 1, 3, 16)
    run(FrameMinor(), x, scale, shift, fusions=["adaln"], dtype=torch.float32, expected=0)
    # per-token rows (B, F, N/F, D): a modulation of another shape than one row per frame
    scale, shift = torch.randn(2, 3, 4, 16), torch.randn(2, 3, 4, 16)
    run(SanaWMPerFrame(16), x, scale, shift, fusions=["adaln"], dtype=torch.float32, expected=0)


# ------------------------------------------------------------------------------------------ SwiGLU
class HalvesSwiGLU(torch.nn.Module):
    """The packed forms, gate first, written by slicing or chunking, in both operand orders."""

    def __init__(self, split, order):
        super().__init__()
        self.split, self.order = split, order

    def forward(self, h):
        if self.split == "slice":
            half = h.shape[-1] // 2
            gate, up = h[..., :half], h[..., half:]
        else:
            gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up if self.order == "silu_first" else up * F.silu(gate)


class TwoTensorSwiGLU(torch.nn.Module):
    def __init__(self, order):
        super().__init__()
        self.order = order

    def forward(self, gate, up):
        return F.silu(gate) * up if self.order == "silu_first" else up * F.silu(gate)


def _swiglu_calls(backend):
    """(x, up) of each ``ascend_kernels.swiglu`` node in the rewritten graph: up None = packed."""
    return [(n.args[0], n.args[1] if len(n.args) > 1 else n.kwargs.get("up"))
            for n in backend.after_graphs[-1].nodes if n.target == torch.ops.ascend_kernels.swiglu.default]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("order", ["silu_first", "silu_last"])
@pytest.mark.parametrize("split", ["slice", "chunk"])
def test_swiglu_packed_halves(split, order, dtype):
    h = torch.randn(2, 5, 16, dtype=dtype)
    backend = run(HalvesSwiGLU(split, order), h, fusions=["swiglu"], dtype=dtype, expected=1,
                  gone=[aten.silu.default, aten.mul.Tensor])
    ((x, up),) = _swiglu_calls(backend)
    assert up is None and x.op == "placeholder"  # one packed call on h itself: npu_swiglu's layout


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("order", ["silu_first", "silu_last"])
def test_swiglu_two_tensors(order, dtype):
    gate, up = torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 5, 16, dtype=dtype)
    backend = run(TwoTensorSwiGLU(order), gate, up, fusions=["swiglu"], dtype=dtype, expected=1,
                  gone=[aten.silu.default, aten.mul.Tensor])
    ((x, y),) = _swiglu_calls(backend)
    inputs = [n for n in backend.after_graphs[-1].nodes if n.op == "placeholder"]
    assert [x, y] == inputs  # silu's operand is the gate, whichever side of the product it was written on


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_flux2_feed_forward(dtype):
    # Flux 2's FFN: linear_in to 2x inner, Flux2SwiGLU (silu of the first half by slices), linear_out
    from diffusers.models.transformers.transformer_flux2 import Flux2FeedForward

    torch.manual_seed(0)
    backend = run(Flux2FeedForward(16, mult=2.0), torch.randn(2, 5, 16, dtype=dtype), fusions=["swiglu"], dtype=dtype,
                  expected=1, gone=[aten.silu.default])
    ((_, up),) = _swiglu_calls(backend)
    assert up is None


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_diffusers_gate_second_half(dtype):
    # diffusers' SwiGLU: `h, gate = proj(x).chunk(2, -1); h * silu(gate)`: the gate is the SECOND
    # half, so it is the two-tensor call on the two halves (views), gate first.
    from diffusers.models.activations import SwiGLU

    torch.manual_seed(0)
    backend = run(SwiGLU(16, 16), torch.randn(2, 5, 16, dtype=dtype), fusions=["swiglu"], dtype=dtype, expected=1,
                  gone=[aten.silu.default, aten.mul.Tensor])
    ((gate, up),) = _swiglu_calls(backend)
    assert gate.target == operator.getitem and gate.args[1] == 1  # the second chunk gates
    assert up.target == operator.getitem and up.args[1] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("model", ["hidream", "qwenimage21"])
def test_swiglu_separate_projections(model, dtype):
    # silu(w1(x)) * w3(x): HiDream's and Qwen-Image 2.1's feed-forwards, with their real modules
    from diffusers.models.transformers.transformer_hidream_image import HiDreamImageFeedForwardSwiGLU
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21SwiGLUFeedForward

    torch.manual_seed(0)
    ff = HiDreamImageFeedForwardSwiGLU(16, 32, multiple_of=8) if model == "hidream" else QwenImage21SwiGLUFeedForward(16, 32)
    backend = run(ff, torch.randn(2, 5, 16, dtype=dtype), fusions=["swiglu"], dtype=dtype, expected=1,
                  gone=[aten.silu.default])
    ((gate, up),) = _swiglu_calls(backend)
    assert up is not None and gate is not up


def test_swiglu_look_alikes_are_left_alone():
    class SiluTimesItself(torch.nn.Module):  # x * silu(x): a one-input activation
        def forward(self, x):
            return F.silu(x) * x

    class PerChannelGate(torch.nn.Module):  # silu(a) * b with b only broadcasting against a
        def forward(self, a, b):
            return F.silu(a) * b

    class ScalarGate(torch.nn.Module):
        def forward(self, a):
            return F.silu(a) * 2.0

    class OddHalves(torch.nn.Module):  # slices that do not split the last dim in two halves
        def forward(self, h):
            return F.silu(h[..., :6]) * h[..., 10:]

    x = torch.randn(2, 5, 16)
    run(SiluTimesItself(), x, fusions=["swiglu"], dtype=torch.float32, expected=0)
    run(PerChannelGate(), x, torch.randn(16), fusions=["swiglu"], dtype=torch.float32, expected=0)
    run(PerChannelGate(), torch.randn(2, 1, 16), x, fusions=["swiglu"], dtype=torch.float32, expected=0)
    run(ScalarGate(), x, fusions=["swiglu"], dtype=torch.float32, expected=0)
    backend = run(OddHalves(), x, fusions=["swiglu"], dtype=torch.float32, expected=1)
    ((_, up),) = _swiglu_calls(backend)
    assert up is not None  # not the packed call (whose halves would be [:8] and [8:]): the two slices


def test_swiglu_runs_before_mul_add():
    # silu(a) * b + c: the SwiGLU is fused, the add stays (mul_add finds no product left)
    class M(torch.nn.Module):
        def forward(self, a, b, c):
            return F.silu(a) * b + c

    a, b, c = torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    backend = run(M(), a, b, c, fusions=["swiglu", "mul_add"], dtype=torch.float32, expected=1)
    assert backend.report.matches == {"swiglu": 1, "mul_add": 0}


# ------------------------------------------------------------------------------ graph normalisation
class TwiceCastRMSNorm(torch.nn.Module):
    """A hand-written RMSNorm that casts x to fp32 twice: once for the variance, once for the product."""

    def __init__(self, dim, weight_first):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim))
        self.weight_first = weight_first

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        y = (x.to(torch.float32) * torch.rsqrt(variance + 1e-6)).to(x.dtype)
        return self.weight * y if self.weight_first else y * self.weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_first", [True, False], ids=["weight_first", "weight_last"])
def test_rms_norm_with_the_cast_written_twice(weight_first, dtype):
    # The two casts are one after common-subexpression elimination, as the patterns are traced.
    torch.manual_seed(0)
    run(TwiceCastRMSNorm(16, weight_first), torch.randn(2, 5, 16, dtype=dtype), fusions=["rms_norm"], dtype=dtype,
        expected=1, gone=[aten.rsqrt.default, aten.mean.dim])


def test_cse_merges_repeated_pure_calls_only():
    from diffusers_ascend.compilation.passes.normalize import eliminate_common_subexpressions

    def f(x, y):
        a, b = x.to(torch.float32), x.to(torch.float32)  # merged
        c, d = x.to(torch.float64), y.to(torch.float32)  # another dtype, another input: kept
        e, g = x.add(1), x.add(1.0)  # 1 and 1.0 are different arguments
        r1, r2 = torch.rand_like(x), torch.rand_like(x)  # random: never merged
        return a + b + c.float() + d + e + g + r1 + r2, x.to(torch.float32)  # returned: kept

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f)(torch.randn(3, dtype=torch.bfloat16), torch.randn(3, dtype=torch.bfloat16))
    before = collections.Counter(n.target for n in gm.graph.nodes)
    assert eliminate_common_subexpressions(gm.graph) == 1
    gm.graph.eliminate_dead_code()
    after = collections.Counter(n.target for n in gm.graph.nodes)
    assert before - after == collections.Counter({aten._to_copy.default: 1})
    assert after[aten.rand_like.default] == 2 and after[aten.add.Tensor] >= 2
