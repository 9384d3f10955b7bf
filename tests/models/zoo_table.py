"""The one table of tiny configs the model-zoo test builds every diffusers DiT from.

Each entry: the model's constructor arguments (the smallest that still run every code path of the
architecture; most mirror the configs diffusers' own model tests use), a function returning
seeded forward inputs, and the coverage the integration reaches on it with ``fusions="all"``
under ``compile="blocks"`` (fp32, eager executor): pattern matches per fusion summed over the
compiled graphs (one graph per block class), module swaps per fusion, and leftover ops (see
`LEFT_OPS`). The zoo test fails when a model's coverage differs from what is recorded here, so
losing a fusion it had (or gaining one) is a visible change to this file.

Discovered models that have no entry yet are listed in `NOT_COVERED` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

# Ops a fusion replaces, counted where they are still present in the rewritten graphs: the
# sites left unfused (a heuristic: a LayerNorm without modulation is not an adaLN site).
LEFT_OPS: dict[str, tuple[str, ...]] = {
    "rms_norm": ("aten.rsqrt.default",),
    "adaln": ("aten.native_layer_norm.default",),
    "gelu_tanh": ("aten.gelu.default",),
    "rope": ("aten.view_as_complex.default", "aten.unbind.int"),
}


@dataclass(frozen=True)
class Tiny:
    """One model of the zoo.

    Args:
        init: constructor arguments.
        inputs: ``inputs(gen) -> forward kwargs`` (draw every random tensor from `gen`).
        matches / swaps / left: the recorded coverage (fusion -> count; zero entries left out).
        atol: fp32 tolerance against eager (the fused ops compute in fp32 like eager).
    """

    init: dict[str, Any]
    inputs: Callable[[torch.Generator], dict[str, Any]]
    matches: dict[str, int] = field(default_factory=dict)
    swaps: dict[str, int] = field(default_factory=dict)
    left: dict[str, int] = field(default_factory=dict)


def _r(gen, *shape):
    return torch.randn(*shape, generator=gen)


def _ids(gen, n, c=3):
    return torch.randn(n, c, generator=gen)


def _flux_ids(h, w):
    ids = torch.zeros(h * w, 3)
    ids[:, 1] = torch.arange(h).repeat_interleave(w)
    ids[:, 2] = torch.arange(w).repeat(h)
    return ids


def _flux2_ids(h, w, txt):
    img = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1))
    text = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(txt))
    return img[None], text[None]


def _flux2_inputs(gen):
    img, txt = _flux2_ids(4, 4, 8)
    return dict(hidden_states=_r(gen, 1, 16, 4), encoder_hidden_states=_r(gen, 1, 8, 32), img_ids=img, txt_ids=txt,
                timestep=torch.tensor([1.0]), guidance=torch.tensor([1.0]))


def _wan_inputs(channels=16, text_dim=32, size=8):
    def inputs(gen):
        return dict(hidden_states=_r(gen, 1, channels, 2, size, size), encoder_hidden_states=_r(gen, 1, 12, text_dim),
                    timestep=torch.tensor([500]))
    return inputs


_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
            text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32)

TINY: dict[str, Tiny] = {
    "FluxTransformer2DModel": Tiny(
        init=dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                  num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]),
        inputs=lambda gen: dict(hidden_states=_r(gen, 1, 16, 4), encoder_hidden_states=_r(gen, 1, 8, 32),
                                pooled_projections=_r(gen, 1, 32), timestep=torch.tensor([0.5]),
                                img_ids=_flux_ids(4, 4), txt_ids=torch.zeros(8, 3)),
    ),
    "Flux2Transformer2DModel": Tiny(
        init=dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                  num_attention_heads=2, joint_attention_dim=32, timestep_guidance_channels=256,
                  axes_dims_rope=[4, 4, 4, 4]),
        inputs=_flux2_inputs,
    ),
    "ChromaTransformer2DModel": Tiny(
        init=dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                  num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[4, 4, 8],
                  approximator_num_channels=8, approximator_hidden_dim=16, approximator_layers=1),
        inputs=lambda gen: dict(hidden_states=_r(gen, 1, 16, 4), encoder_hidden_states=_r(gen, 1, 8, 32),
                                img_ids=_flux_ids(4, 4), txt_ids=torch.zeros(8, 3), timestep=torch.tensor([1.0])),
    ),
    "WanTransformer3DModel": Tiny(init=dict(_WAN), inputs=_wan_inputs()),
    "WanVACETransformer3DModel": Tiny(
        init=dict(_WAN, num_layers=4, vace_layers=[0, 2], vace_in_channels=48),
        inputs=lambda gen: dict(_wan_inputs()(gen), control_hidden_states=_r(gen, 1, 48, 2, 8, 8)),
    ),
    "SkyReelsV2Transformer3DModel": Tiny(
        init=dict(_WAN, in_channels=4, out_channels=4, text_dim=16), inputs=_wan_inputs(channels=4, text_dim=16),
    ),
    "ChronoEditTransformer3DModel": Tiny(
        init=dict(_WAN, attention_head_dim=8, freq_dim=16, rope_max_seq_len=64, rope_temporal_skip_len=8),
        inputs=_wan_inputs(),
    ),
    "QwenImageTransformer2DModel": Tiny(
        init=dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                  num_attention_heads=4, joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)),
        inputs=lambda gen: dict(hidden_states=_r(gen, 1, 16, 16), encoder_hidden_states=_r(gen, 1, 8, 16),
                                encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long),
                                timestep=torch.tensor([1.0]), img_shapes=[(1, 4, 4)]),
    ),
    "ZImageTransformer2DModel": Tiny(
        init=dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=16, n_layers=1, n_refiner_layers=1,
                  n_heads=1, n_kv_heads=2, qk_norm=True, cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0,
                  axes_dims=[8, 4, 4], axes_lens=[256, 32, 32]),
        inputs=lambda gen: dict(x=[_r(gen, 16, 1, 8, 8)], cap_feats=[_r(gen, 16, 16)], t=torch.tensor([0.5])),
    ),
    "HunyuanVideoTransformer3DModel": Tiny(
        init=dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
                  num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
                  text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type=None),
        inputs=lambda gen: dict(hidden_states=_r(gen, 1, 4, 1, 8, 8), timestep=torch.tensor([500.0]),
                                encoder_hidden_states=_r(gen, 1, 12, 16), pooled_projections=_r(gen, 1, 8),
                                encoder_attention_mask=torch.ones(1, 12), guidance=torch.tensor([500.0])),
    ),
    "LTXVideoTransformer3DModel": Tiny(
        init=dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
                  num_layers=1, qk_norm="rms_norm_across_heads", caption_channels=16),
        inputs=lambda gen: dict(hidden_states=_r(gen, 1, 2 * 8 * 8, 4), encoder_hidden_states=_r(gen, 1, 16, 16),
                                timestep=torch.tensor([500]), encoder_attention_mask=torch.ones(1, 16).bool(),
                                num_frames=2, height=8, width=8),
    ),
}

NOT_COVERED: dict[str, str] = {}


def markdown_table() -> str:
    """The model table of docs/support-matrix.md, rendered from the recorded coverage."""
    fusions = ("rms_norm", "rope", "gelu_tanh", "adaln", "mul_add")
    lines = [
        "| model | " + " | ".join(fusions) + " | left unfused |",
        "|---|" + "---|" * len(fusions) + "---|",
    ]
    for name in sorted(TINY):
        t = TINY[name]
        cells = []
        for f in fusions:
            m, s = t.matches.get(f, 0), t.swaps.get(f, 0)
            cells.append(f"{m}" + (f" (+{s} swapped)" if s else ""))
        left = ", ".join(f"{k} {v}" for k, v in sorted(t.left.items())) or "-"
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {left} |")
    for name in sorted(NOT_COVERED):
        lines.append(f"| `{name}` | " + " | ".join("?" for _ in fusions) + f" | not in the zoo test: {NOT_COVERED[name]} |")
    return "\n".join(lines)
