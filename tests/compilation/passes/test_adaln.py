"""The adaLN fusion (`passes/adaln.py`) on isolated modules: Flux's and Wan's modulations,
scale-first and scale-only forms (Flux 2), per-frame modulation (Sana-WM) and the look-alikes
left alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import SnapshotBackend, assert_close, compile_module
from .harness import DTYPES, aten, run


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
    x, scale, shift = (
        torch.randn(2, 5, 16, dtype=dtype),
        torch.randn(2, 16, dtype=dtype),
        torch.randn(2, 16, dtype=dtype),
    )
    run(
        FluxModulate(),
        x,
        scale,
        shift,
        fusions=["adaln"],
        dtype=dtype,
        expected=1,
        gone=[aten.native_layer_norm.default],
    )


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
    backend = run(
        WanModulate(cast_back),
        x,
        scale,
        shift,
        fusions=["adaln"],
        dtype=dtype,
        expected=1,
        gone=[aten.native_layer_norm.default],
    )
    out_dtype = [
        n.args[6] if len(n.args) > 6 else n.kwargs.get("out_dtype")
        for n in backend.after_graphs[-1].nodes
        if n.target == torch.ops.ascend_kernels.adaln_modulate.default
    ]
    assert out_dtype == [dtype if cast_back else torch.float32]


def test_adaln_rejects_lower_rank_broadcast():
    # scale of shape (S, D) broadcasting over the batch is not the op's (B, 1, D) reading.
    x, scale, shift = torch.randn(2, 5, 16), torch.randn(5, 16), torch.randn(5, 16)

    class M(torch.nn.Module):
        def forward(self, x, scale, shift):
            return F.layer_norm(x, (16,), eps=1e-6) * (1 + scale) + shift

    run(M(), x, scale, shift, fusions=["adaln"], dtype=torch.float32, expected=0)


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
    run(
        ScaleFirstModulate(form),
        *inputs,
        fusions=["adaln"],
        dtype=dtype,
        expected=1,
        gone=[aten.native_layer_norm.default, aten.mul.Tensor],
    )


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
    backend = run(
        ScaleFirstModulate("scale_first"), x, scale, shift, fusions=["adaln"], dtype=torch.float32, expected=1
    )
    assert aten.add.Tensor not in backend.after[-1]


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
    run(
        SanaWMPerFrame(16),
        x,
        scale,
        shift,
        fusions=["adaln", "mul_add"],
        dtype=dtype,
        expected=1,
        gone=[aten.native_layer_norm.default],
        reference="fp64",
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_adaln_per_frame_sana_wm_final_layer(dtype):
    from diffusers.models.transformers.transformer_sana_wm import T2IFinalLayer

    torch.manual_seed(0)
    layer = T2IFinalLayer(16, (1, 2, 2), 4)
    x, t = torch.randn(1, 12, 16, dtype=dtype), torch.randn(1, 1, 3, 16, dtype=dtype)  # t: (B, 1, F, D)
    backend = run(
        layer, x, t, fusions=["adaln", "mul_add"], dtype=dtype, expected=1, gone=[aten.native_layer_norm.default]
    )
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
