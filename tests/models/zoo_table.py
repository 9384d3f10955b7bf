"""The one table of tiny configs the model-zoo test builds every diffusers DiT from.

`TINY`: per model, the constructor arguments (the smallest that still run every code path of
the architecture; most mirror the configs diffusers' own model tests use) and a function
returning seeded forward inputs. `COVERAGE`: what the integration reaches on it with
``fusions="all"`` under ``compile="blocks"`` (fp32, eager executor): pattern matches per fusion
summed over the compiled graphs (one graph per block class, so a count is per block class, not
per block), module swaps per fusion (per module), and leftover ops (`LEFT_OPS`). The zoo test
fails when a model's coverage differs from what is recorded here, so losing a fusion it had (or
gaining one) is a visible change to this file.

Discovered models that have no entry yet are listed in `NOT_COVERED` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from diffusers_ascend.fusions import default_fusions
from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, WAN_TRANSFORMER_CONFIG

# Ops a fusion replaces, counted (regex over the rewritten graph's code) where they are still
# present: the sites left unfused. A heuristic: a LayerNorm without modulation is no adaLN site.
LEFT_OPS: dict[str, str] = {
    "rms_norm": r"torch\.ops\.aten\.rsqrt\.default\(",
    "adaln": r"torch\.ops\.aten\.native_layer_norm\.default\(",
    "gelu_tanh": r"torch\.ops\.aten\.gelu\.default\([^)]*approximate = 'tanh'",
    # an unbind over the last or second-to-last dim, as diffusers' real-valued rotary code writes it
    # (modulation and q/k/v unbinds name a positive dim, so they are not counted)
    "rope": r"torch\.ops\.aten\.(view_as_complex\.default\(|unbind\.int\([^,()]+, -[12]\))",
    # a silu whose result is a factor of a product (a silu feeding a linear, as adaLN's conditioning
    # does, is no SwiGLU site); the first group names the silu, the product names it as an operand
    "swiglu": r"(?s)(\w+) = torch\.ops\.aten\.silu\.default\((?=.*?torch\.ops\.aten\.mul\.Tensor\([^)]*\b\1\b)",
}


@dataclass(frozen=True)
class Tiny:
    """One model of the zoo.

    Args:
        init: constructor arguments.
        inputs: ``inputs(gen) -> forward kwargs`` (draw every random tensor from `gen`).
    """

    init: dict[str, Any]
    inputs: Callable[[torch.Generator], dict[str, Any]]


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


def _krea2_positions(txt, h, w):
    pos = torch.zeros(txt + h * w, 3)
    pos[txt:, 1] = torch.arange(h).repeat_interleave(w)
    pos[txt:, 2] = torch.arange(w).repeat(h)
    return pos


def _bria_fibo_inputs(gen):
    text = _r(gen, 1, 16, 64)
    return dict(
        hidden_states=_r(gen, 1, 64, 48),
        encoder_hidden_states=text,
        img_ids=_flux_ids(8, 8),
        txt_ids=torch.zeros(16, 3),
        timestep=torch.tensor([1.0]),
        text_encoder_layers=[text[:, :, :32], text[:, :, :32]],
    )


def _ideogram4_inputs(gen, text=4, image=4):
    # one packed sequence: `text` LLM tokens, then a 2x2 grid of image tokens
    from diffusers.models.transformers.transformer_ideogram4 import (
        IMAGE_POSITION_OFFSET,
        LLM_TOKEN_INDICATOR,
        OUTPUT_IMAGE_INDICATOR,
    )

    seq = text + image
    hidden = torch.zeros(1, seq, 16)
    hidden[:, text:] = _r(gen, 1, image, 16)
    encoder = torch.zeros(1, seq, 24)
    encoder[:, :text] = _r(gen, 1, text, 24)
    pos = torch.zeros(1, seq, 3, dtype=torch.long)
    pos[:, :text] = torch.arange(text)[:, None]
    pos[:, text:, 0] = IMAGE_POSITION_OFFSET
    pos[:, text:, 1] = torch.tensor([0, 0, 1, 1]) + IMAGE_POSITION_OFFSET
    pos[:, text:, 2] = torch.tensor([0, 1, 0, 1]) + IMAGE_POSITION_OFFSET
    indicator = torch.full((1, seq), OUTPUT_IMAGE_INDICATOR, dtype=torch.long)
    indicator[:, :text] = LLM_TOKEN_INDICATOR
    return dict(
        hidden_states=hidden,
        encoder_hidden_states=encoder,
        timestep=torch.tensor([0.5]),
        position_ids=pos,
        segment_ids=torch.ones(1, seq, dtype=torch.long),
        indicator=indicator,
    )


def _minimax_h3_inputs(gen, text=4, audio=6, video=8):
    # one packed sequence (text, audio, video rows) with its modality tags and index tensors
    seq = text + audio + video
    text_idx, audio_idx, video_idx = (
        torch.arange(text),
        torch.arange(text, text + audio),
        torch.arange(text + audio, seq),
    )
    tags = torch.zeros(seq, dtype=torch.long)
    tags[text_idx], tags[audio_idx] = 1, 2
    timestep_indices = torch.zeros(seq, dtype=torch.long)
    timestep_indices[audio_idx] = 1
    pos = torch.zeros(seq, 3)
    pos[:, 0] = torch.arange(seq, dtype=torch.float32)
    pos[video_idx, 1] = torch.arange(video, dtype=torch.float32) % 4
    pos[video_idx, 2] = torch.arange(video, dtype=torch.float32) % 2
    return dict(
        hidden_states=_r(gen, 1, video, 16),
        audio_hidden_states=_r(gen, 1, audio, 6),
        encoder_hidden_states=_r(gen, 1, text, 8),
        timestep=torch.tensor([0.7, 0.3]),
        timestep_indices=timestep_indices,
        token_tags=tags,
        position_ids=pos,
        video_indices=video_idx,
        audio_indices=audio_idx,
        text_indices=text_idx,
    )


def _qwenimage21_inputs(gen):
    # a 6-slot VLM prompt whose slot 2 is a 2x2 condition image, then the 4x4 target image's 4 slots
    # (each slot stands for 2x2 latent tokens); the last text token is padding
    img_mask = torch.zeros(1, 10, dtype=torch.bool)
    img_mask[:, 2] = img_mask[:, 6:] = True
    return dict(
        hidden_states=_r(gen, 1, 4 + 16, 4),
        encoder_hidden_states=_r(gen, 1, 6, 16),
        timestep=torch.tensor([0.5]),
        img_shapes=[[(1, 2, 2), (1, 4, 4)]],
        img_mask=img_mask,
        encoder_hidden_states_mask=torch.tensor([[True] * 5 + [False]]),
    )


def _rfd4_masks(n=6):
    # `n` tokens, the last one padding, none of them in-context conditioning
    return dict(
        padding_mask=torch.tensor([[True] * (n - 1) + [False]]),
        token_type=torch.zeros(1, n, dtype=torch.long),
        conditioning=dict(
            is_in_context_conditioning=torch.zeros(1, n, dtype=torch.bool),
            supports_local_latent=torch.ones(1, n, dtype=torch.bool),
        ),
    )


def _rfd4_inputs(gen, n=6):
    inputs = _rfd4_masks(n)
    # the pair features read bond path lengths from `conditioning`
    inputs["conditioning"]["token_bond_path_length"] = (torch.arange(n)[:, None] - torch.arange(n)).abs()[None]
    return dict(
        inputs,
        bb_ca=_r(gen, 1, n, 3),
        local_latents=_r(gen, 1, n, 4),
        bb_ca_time=torch.tensor([0.3]),
        local_latents_time=torch.tensor([0.6]),
    )


def _flux2_inputs(gen):
    img, txt = _flux2_ids(4, 4, 8)
    return dict(
        hidden_states=_r(gen, 1, 16, 4),
        encoder_hidden_states=_r(gen, 1, 8, 32),
        img_ids=img,
        txt_ids=txt,
        timestep=torch.tensor([1.0]),
        guidance=torch.tensor([1.0]),
    )


def _wan_animate2_inputs(gen, layers=2, heads=2, head_dim=12):
    # a generation ("cached") step: 2 latent frames of 2x2 tokens against 1 reference frame whose
    # pre-RoPE K/V (what the reference "extract" pass stores) is drawn into the cache; origin_len 0
    # and a 32x32 origin_area give the full-video grid (1 + 1 frames of 2x2) the flex block mask covers
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    cache = WanAnimate2KVCache(layers)
    for layer in cache.layer_caches:
        layer.store(_r(gen, 1, 4, heads, head_dim), _r(gen, 1, 4, heads, head_dim))
    return dict(
        hidden_states=[_r(gen, 4, 2, 4, 4)],
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=[_r(gen, 8, 16)],
        condition_latents=[_r(gen, 4, 2, 4, 4)],
        kv_cache=cache,
        kv_cache_mode="cached",
        seq_len=8,
        encoder_hidden_states_image=_r(gen, 1, 2, 1280),
        reference_grid_sizes=torch.tensor([[1, 2, 2]]),
        origin_len=0,
        origin_area=[32, 32],
    )


def _sana_wm_refiner_inputs(gen, layers=2, dim=16, heads=2, size=4):
    # an "inject" denoising step of the AR refiner: active frames 2-3 attend to [sink frame 0 (pre-RoPE,
    # re-RoPE'd at its own positions) + history frame 1 (post-RoPE) + themselves]; the RoPE tables are the
    # model's own (its build_rotary_emb_for_absolute_positions over a rope module of the same config)
    from types import SimpleNamespace

    from diffusers.models.transformers.transformer_sana_wm_refiner import (
        SanaWMLTX2AudioVideoRotaryPosEmbed,
        SanaWMLTX2RefinerTransformer3DModel,
        SanaWMRefinerKVCache,
    )

    rope = SimpleNamespace(
        rope=SanaWMLTX2AudioVideoRotaryPosEmbed(dim=dim, modality="video", num_attention_heads=heads)
    )

    def pe(frames):
        return SanaWMLTX2RefinerTransformer3DModel.build_rotary_emb_for_absolute_positions(
            rope, 1, frames, size, size, torch.device("cpu"), fps=25.0
        )

    tokens = size * size
    cache = SanaWMRefinerKVCache(layers)
    cache.sink_pe = pe([0])
    for layer in cache.layer_caches:
        layer.store_sink(_r(gen, 1, tokens, dim), _r(gen, 1, tokens, dim))
        layer.store_history(_r(gen, 1, tokens, dim), _r(gen, 1, tokens, dim))
    mask = torch.ones(1, 8)
    mask[:, 6:] = 0
    return dict(
        hidden_states=_r(gen, 1, 2 * tokens, 4),
        encoder_hidden_states=_r(gen, 1, 8, 16),
        timestep=torch.full((1, 2 * tokens), 500.0),
        video_rotary_emb=pe([2, 3]),
        encoder_attention_mask=mask,
        kv_cache=cache,
        kv_cache_mode="inject",
    )


def _wan_inputs(channels=16, text_dim=32, size=8):
    def inputs(gen):
        return dict(
            hidden_states=_r(gen, 1, channels, 2, size, size),
            encoder_hidden_states=_r(gen, 1, 12, text_dim),
            timestep=torch.tensor([500]),
        )

    return inputs


_WAN = WAN_TRANSFORMER_CONFIG  # the suite's tiny Wan (each row below copies it)

TINY: dict[str, Tiny] = {
    "FluxTransformer2DModel": Tiny(
        init=dict(FLUX_TRANSFORMER_CONFIG),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 4),
            encoder_hidden_states=_r(gen, 1, 8, 32),
            pooled_projections=_r(gen, 1, 32),
            timestep=torch.tensor([0.5]),
            img_ids=_flux_ids(4, 4),
            txt_ids=torch.zeros(8, 3),
        ),
    ),
    "Flux2Transformer2DModel": Tiny(
        init=dict(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            timestep_guidance_channels=256,
            axes_dims_rope=[4, 4, 4, 4],
        ),
        inputs=_flux2_inputs,
    ),
    "ChromaTransformer2DModel": Tiny(
        init=dict(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=[4, 4, 8],
            approximator_num_channels=8,
            approximator_hidden_dim=16,
            approximator_layers=1,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 4),
            encoder_hidden_states=_r(gen, 1, 8, 32),
            img_ids=_flux_ids(4, 4),
            txt_ids=torch.zeros(8, 3),
            timestep=torch.tensor([1.0]),
        ),
    ),
    "WanTransformer3DModel": Tiny(init=dict(_WAN), inputs=_wan_inputs()),
    "WanVACETransformer3DModel": Tiny(
        init=dict(_WAN, num_layers=4, vace_layers=[0, 2], vace_in_channels=48),
        inputs=lambda gen: dict(_wan_inputs()(gen), control_hidden_states=_r(gen, 1, 48, 2, 8, 8)),
    ),
    "WanAnimateTransformer3DModel": Tiny(
        # one face frame: the face encoder keeps 1 frame, plus its leading pad frame = the 2 latent frames
        # (pose covers the 1 after the reference frame); motion encoder at 8x8 runs one res block
        init=dict(
            _WAN,
            in_channels=12,
            latent_channels=4,
            out_channels=4,
            image_dim=16,
            added_kv_proj_dim=24,
            motion_encoder_channel_sizes={"4": 8, "8": 8},
            motion_encoder_size=8,
            motion_style_dim=16,
            motion_dim=4,
            motion_encoder_dim=16,
            face_encoder_hidden_dim=8,
            face_encoder_num_heads=2,
            inject_face_latents_blocks=1,
        ),
        inputs=lambda gen: dict(
            _wan_inputs(channels=12)(gen),
            encoder_hidden_states_image=_r(gen, 1, 4, 16),
            pose_hidden_states=_r(gen, 1, 4, 1, 8, 8),
            face_pixel_values=_r(gen, 1, 3, 1, 8, 8),
        ),
    ),
    "WanAnimate2Transformer3DModel": Tiny(
        init=dict(
            patch_size=(1, 2, 2),
            text_len=12,
            in_dim=8,
            dim=24,
            ffn_dim=32,
            freq_dim=16,
            text_dim=16,
            out_dim=4,
            num_heads=2,
            num_layers=2,
        ),
        inputs=_wan_animate2_inputs,
    ),
    "SkyReelsV2Transformer3DModel": Tiny(
        init=dict(_WAN, in_channels=4, out_channels=4, text_dim=16),
        inputs=_wan_inputs(channels=4, text_dim=16),
    ),
    "ChronoEditTransformer3DModel": Tiny(
        init=dict(_WAN, attention_head_dim=8, freq_dim=16, rope_max_seq_len=64, rope_temporal_skip_len=8),
        inputs=_wan_inputs(),
    ),
    "QwenImageTransformer2DModel": Tiny(
        init=dict(
            patch_size=2,
            in_channels=16,
            out_channels=4,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=4,
            joint_attention_dim=16,
            guidance_embeds=False,
            axes_dims_rope=(8, 4, 4),
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 16),
            encoder_hidden_states=_r(gen, 1, 8, 16),
            encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long),
            timestep=torch.tensor([1.0]),
            img_shapes=[(1, 4, 4)],
        ),
    ),
    "QwenImage21Transformer2DModel": Tiny(
        init=dict(
            in_channels=4,
            out_channels=4,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=2,
            context_in_dim=16,
            axes_dims_rope=(2, 2, 4),
        ),
        inputs=_qwenimage21_inputs,
    ),
    "ZImageTransformer2DModel": Tiny(
        init=dict(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=16,
            dim=16,
            n_layers=1,
            n_refiner_layers=1,
            n_heads=1,
            n_kv_heads=2,
            qk_norm=True,
            cap_feat_dim=16,
            rope_theta=256.0,
            t_scale=1000.0,
            axes_dims=[8, 4, 4],
            axes_lens=[256, 32, 32],
        ),
        inputs=lambda gen: dict(x=[_r(gen, 16, 1, 8, 8)], cap_feats=[_r(gen, 16, 16)], t=torch.tensor([0.5])),
    ),
    "HunyuanVideoTransformer3DModel": Tiny(
        init=dict(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=10,
            num_layers=1,
            num_single_layers=1,
            num_refiner_layers=1,
            patch_size=1,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=16,
            pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4),
            image_condition_type=None,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 1, 8, 8),
            timestep=torch.tensor([500.0]),
            encoder_hidden_states=_r(gen, 1, 12, 16),
            pooled_projections=_r(gen, 1, 8),
            encoder_attention_mask=torch.ones(1, 12),
            guidance=torch.tensor([500.0]),
        ),
    ),
    "LTXVideoTransformer3DModel": Tiny(
        init=dict(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=8,
            cross_attention_dim=16,
            num_layers=1,
            qk_norm="rms_norm_across_heads",
            caption_channels=16,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 2 * 8 * 8, 4),
            encoder_hidden_states=_r(gen, 1, 16, 16),
            timestep=torch.tensor([500]),
            encoder_attention_mask=torch.ones(1, 16).bool(),
            num_frames=2,
            height=8,
            width=8,
        ),
    ),
    "AnyFlowTransformer3DModel": Tiny(
        init=dict(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            rope_max_seq_len=32,
            gate_value=0.25,
            deltatime_type="r",
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 2, 4, 8, 8),
            timestep=torch.full((1, 2), 500.0),
            r_timestep=torch.full((1, 2), 250.0),
            encoder_hidden_states=_r(gen, 1, 12, 16),
        ),
    ),
    "ErnieImageTransformer2DModel": Tiny(
        init=dict(
            hidden_size=16,
            num_attention_heads=1,
            num_layers=1,
            ffn_hidden_size=16,
            in_channels=16,
            out_channels=16,
            patch_size=1,
            text_in_dim=16,
            rope_theta=256,
            rope_axes_dim=(8, 4, 4),
            eps=1e-6,
            qk_layernorm=True,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 8, 8),
            timestep=torch.tensor([1.0]),
            text_bth=_r(gen, 1, 16, 16),
            text_lens=torch.tensor([16]),
        ),
    ),
    "GlmImageTransformer2DModel": Tiny(
        init=dict(
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=2,
            text_embed_dim=32,
            time_embed_dim=16,
            condition_dim=8,
            prior_vq_quantizer_codebook_size=64,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 8, 8),
            encoder_hidden_states=_r(gen, 1, 12, 32),
            prior_token_id=torch.tensor([3]),
            prior_token_drop=torch.zeros(1, dtype=torch.bool),
            timestep=torch.tensor([500]),
            target_size=torch.tensor([[8.0, 8.0]]),
            crop_coords=torch.tensor([[0.0, 0.0]]),
        ),
    ),
    "HeliosTransformer3DModel": Tiny(
        init=dict(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_dim=(4, 4, 4),
            has_multi_term_memory_patch=True,
            guidance_cross_attn=True,
            zero_history_timestep=True,
            is_amplify_history=False,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 2, 8, 8),
            timestep=torch.tensor([500]),
            encoder_hidden_states=_r(gen, 1, 12, 16),
            indices_hidden_states=torch.ones(1, 2),
            indices_latents_history_short=torch.ones(1, 1),
            indices_latents_history_mid=torch.ones(1, 1),
            indices_latents_history_long=torch.ones(1, 4),
            latents_history_short=_r(gen, 1, 4, 1, 8, 8),
            latents_history_mid=_r(gen, 1, 4, 1, 8, 8),
            latents_history_long=_r(gen, 1, 4, 4, 8, 8),
        ),
    ),
    "Krea2Transformer2DModel": Tiny(
        init=dict(
            in_channels=16,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=32,
            timestep_embed_dim=8,
            text_hidden_dim=16,
            num_text_layers=3,
            text_num_attention_heads=2,
            text_num_key_value_heads=1,
            text_intermediate_size=16,
            num_layerwise_text_blocks=1,
            num_refiner_text_blocks=1,
            axes_dims_rope=(4, 2, 2),
            rope_theta=1000.0,
            norm_eps=1e-5,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 16),
            encoder_hidden_states=_r(gen, 1, 4, 3, 16),
            timestep=torch.tensor([0.5]),
            position_ids=_krea2_positions(4, 2, 2),
            encoder_attention_mask=torch.tensor([[True, True, True, False]]),
        ),
    ),
    "LongCatImageTransformer2DModel": Tiny(
        init=dict(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=[4, 4, 8],
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 4),
            encoder_hidden_states=_r(gen, 1, 8, 32),
            img_ids=_flux_ids(4, 4),
            txt_ids=torch.zeros(8, 3),
            timestep=torch.tensor([1.0]),
            guidance=torch.tensor([3.5]),
        ),
    ),
    "OvisImageTransformer2DModel": Tiny(
        init=dict(
            patch_size=1,
            in_channels=4,
            out_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=(4, 4, 8),
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 4),
            encoder_hidden_states=_r(gen, 1, 8, 32),
            img_ids=_flux_ids(4, 4),
            txt_ids=torch.zeros(8, 3),
            timestep=torch.tensor([1.0]),
        ),
    ),
    "NucleusMoEImageTransformer2DModel": Tiny(
        init=dict(
            patch_size=2,
            in_channels=16,
            out_channels=4,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=4,
            joint_attention_dim=16,
            axes_dims_rope=(8, 4, 4),
            moe_enabled=False,
            capacity_factors=[8.0, 8.0],
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 16),
            encoder_hidden_states=_r(gen, 1, 8, 16),
            encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long),
            timestep=torch.tensor([1.0]),
            img_shapes=[(1, 4, 4)],
        ),
    ),
    "MotifVideoTransformer3DModel": Tiny(
        init=dict(
            in_channels=33,
            out_channels=16,
            num_attention_heads=2,
            attention_head_dim=12,
            num_layers=1,
            num_single_layers=1,
            num_decoder_layers=0,
            mlp_ratio=4.0,
            patch_size=1,
            patch_size_t=1,
            qk_norm="rms_norm",
            norm_type="layer_norm",
            text_embed_dim=32,
            image_embed_dim=4,
            rope_theta=256.0,
            rope_axes_dim=(4, 4, 4),
            enable_text_cross_attention_dual=False,
            enable_text_cross_attention_single=False,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 33, 1, 8, 8),
            encoder_hidden_states=_r(gen, 1, 12, 32),
            timestep=torch.tensor([500]),
        ),
    ),
    "HunyuanVideo15Transformer3DModel": Tiny(
        init=dict(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=8,
            num_layers=2,
            num_refiner_layers=1,
            mlp_ratio=2.0,
            patch_size=1,
            patch_size_t=1,
            text_embed_dim=16,
            text_embed_2_dim=8,
            image_embed_dim=12,
            rope_axes_dim=(2, 2, 4),
            target_size=16,
            task_type="t2v",
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 1, 8, 8),
            timestep=torch.tensor([1.0]),
            encoder_hidden_states=_r(gen, 1, 6, 16),
            encoder_hidden_states_2=_r(gen, 1, 4, 8),
            encoder_attention_mask=torch.ones(1, 6),
            encoder_attention_mask_2=torch.ones(1, 4),
            image_embeds=torch.zeros(1, 3, 12),
        ),
    ),
    "LTX2VideoTransformer3DModel": Tiny(
        init=dict(
            in_channels=4,
            out_channels=4,
            patch_size=1,
            patch_size_t=1,
            num_attention_heads=2,
            attention_head_dim=8,
            cross_attention_dim=16,
            audio_in_channels=4,
            audio_out_channels=4,
            audio_num_attention_heads=2,
            audio_attention_head_dim=4,
            audio_cross_attention_dim=8,
            num_layers=1,
            qk_norm="rms_norm_across_heads",
            caption_channels=16,
            rope_double_precision=False,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 2 * 8 * 8, 4),
            audio_hidden_states=_r(gen, 1, 9, 4),
            encoder_hidden_states=_r(gen, 1, 16, 16),
            audio_encoder_hidden_states=_r(gen, 1, 16, 16),
            timestep=torch.tensor([500.0]),
            encoder_attention_mask=torch.ones(1, 16).bool(),
            num_frames=2,
            height=8,
            width=8,
            audio_num_frames=9,
            fps=25.0,
        ),
    ),
    "AnyFlowFARTransformer3DModel": Tiny(
        init=dict(
            patch_size=(1, 2, 2),
            compressed_patch_size=(1, 4, 4),
            full_chunk_limit=3,
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            rope_max_seq_len=32,
            gate_value=0.25,
            deltatime_type="r",
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 4, 8, 8),
            timestep=torch.full((1, 4), 500.0),
            r_timestep=torch.full((1, 4), 250.0),
            encoder_hidden_states=_r(gen, 1, 12, 16),
            chunk_partition=[2, 2],
        ),
    ),
    "BriaFiboTransformer2DModel": Tiny(
        init=dict(
            patch_size=1,
            in_channels=48,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=8,
            num_attention_heads=2,
            joint_attention_dim=64,
            text_encoder_dim=32,
            pooled_projection_dim=None,
            axes_dims_rope=[0, 4, 4],
        ),
        inputs=lambda gen: _bria_fibo_inputs(gen),
    ),
    "BriaFibo2Transformer2DModel": Tiny(
        # one injection block, a context image (per-token noisy/clean modulation in the refiner too), 8 gist tokens
        init=dict(
            in_channels=4,
            patch_size=2,
            dim=32,
            n_layers=2,
            n_refiner_layers=1,
            n_heads=2,
            cap_feat_dim=16,
            injection_layer_ids=(1,),
            perceiver_num_layers=1,
            min_num_gist_tokens=4,
            max_num_gist_tokens=8,
            gist_step=4,
            gist_min_text_len=4,
            gist_max_text_len=12,
            axes_dims=(4, 6, 6),
            axes_lens=(16, 8, 8),
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 4, 4),
            timestep=torch.tensor([0.5]),
            encoder_hidden_states=_r(gen, 1, 2, 6, 16),
            context_latents=[_r(gen, 1, 4, 4, 4)],
        ),
    ),
    "UNet2DConditionModel": Tiny(
        init=dict(
            block_out_channels=(4, 8),
            norm_num_groups=4,
            layers_per_block=1,
            sample_size=16,
            in_channels=4,
            out_channels=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=8,
            attention_head_dim=2,
        ),
        inputs=lambda gen: dict(
            sample=_r(gen, 1, 4, 16, 16), timestep=torch.tensor([10]), encoder_hidden_states=_r(gen, 1, 4, 8)
        ),
    ),
    "DreamLiteUNetModel": Tiny(
        # both attention variants (with and without self-attention), GQA (2 query heads, 1 kv head), qk RMSNorm
        init=dict(
            block_out_channels=(8, 16),
            norm_num_groups=4,
            layers_per_block=1,
            sample_size=8,
            in_channels=4,
            out_channels=4,
            cross_attention_dim=8,
            attention_head_dim=2,
            ff_mult=2,
            down_block_types=("DreamLiteCrossAttnNoSelfAttnDownBlock2D", "DreamLiteCrossAttnDownBlock2D"),
            up_block_types=("DreamLiteCrossAttnUpBlock2D", "DreamLiteCrossAttnNoSelfAttnUpBlock2D"),
        ),
        inputs=lambda gen: dict(
            sample=_r(gen, 1, 4, 8, 8), timestep=torch.tensor([10]), encoder_hidden_states=_r(gen, 1, 4, 8)
        ),
    ),
    "JoyImageEditTransformer3DModel": Tiny(
        init=dict(
            patch_size=[1, 2, 2],
            in_channels=16,
            hidden_size=32,
            num_attention_heads=2,
            text_dim=16,
            num_layers=2,
            rope_dim_list=[4, 6, 6],
            theta=256,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 1, 4, 4),
            encoder_hidden_states=_r(gen, 1, 12, 16),
            timestep=torch.tensor([1.0]),
        ),
    ),
    "JoyImageEditPlusTransformer3DModel": Tiny(
        init=dict(
            patch_size=[1, 2, 2],
            in_channels=16,
            hidden_size=32,
            num_attention_heads=2,
            text_dim=16,
            num_layers=2,
            rope_dim_list=[4, 6, 6],
            theta=256,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 2, 16, 1, 2, 2),
            encoder_hidden_states=_r(gen, 1, 12, 16),
            timestep=torch.tensor([1.0]),
            shape_list=[[(1, 1, 1), (1, 1, 1)]],
        ),
    ),
    "LongCatAudioDiTTransformer": Tiny(
        init=dict(dit_dim=64, dit_depth=2, dit_heads=4, dit_text_dim=32, latent_dim=8, text_conv=False),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 8),
            encoder_hidden_states=_r(gen, 1, 10, 32),
            encoder_attention_mask=torch.ones(1, 10, dtype=torch.bool),
            attention_mask=torch.ones(1, 16, dtype=torch.bool),
            timestep=torch.ones(1),
        ),
    ),
    "MiniMaxMusic3Transformer1DModel": Tiny(
        init=dict(
            in_channels=8,
            condition_dim=16,
            num_layers=2,
            num_attention_heads=2,
            attention_head_dim=8,
            ff_inner_dim=32,
            rotary_dim=4,
            fourier_embedding_dim=8,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 8, 24), encoder_hidden_states=_r(gen, 1, 24, 16), timestep=torch.full((1,), 0.5)
        ),
    ),
    "StableAudio3DiTModel": Tiny(
        init=dict(
            io_channels=8,
            patch_size=1,
            embed_dim=32,
            depth=2,
            num_heads=4,
            cond_token_dim=16,
            global_cond_dim=12,
            local_add_cond_dim=5,
            timestep_features_dim=16,
            ff_mult=2,
            num_memory_tokens=3,
            use_differential_attention=False,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 8, 16),
            timestep=torch.rand(1, generator=gen),
            encoder_hidden_states=_r(gen, 1, 4, 16),
            global_hidden_states=_r(gen, 1, 12),
        ),
    ),
    "Flux3Transformer2DModel": Tiny(
        init=dict(
            in_channels=4,
            cond_in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            timestep_channels=256,
            axes_dims_rope=(4, 4, 4, 4),
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 16, 4),
            encoder_hidden_states=_r(gen, 1, 8, 32),
            timestep=torch.tensor([1.0]),
            img_ids=_flux2_ids(4, 4, 8)[0][0],
            txt_ids=_flux2_ids(4, 4, 8)[1][0],
        ),
    ),
    "HunyuanImageTransformer2DModel": Tiny(
        init=dict(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=8,
            num_layers=1,
            num_single_layers=1,
            num_refiner_layers=1,
            patch_size=(1, 1),
            text_embed_dim=16,
            rope_axes_dim=(4, 4),
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 8, 8),
            timestep=torch.tensor([500.0]),
            encoder_hidden_states=_r(gen, 1, 12, 16),
            encoder_attention_mask=torch.ones(1, 12),
        ),
    ),
    "Cosmos3OmniTransformer": Tiny(
        init=dict(
            head_dim=6,
            hidden_act="relu2",
            hidden_size=12,
            intermediate_size=24,
            latent_channel=2,
            latent_patch_size=1,
            num_attention_heads=2,
            num_hidden_layers=2,
            num_key_value_heads=1,
            patch_latent_dim=2,
            qk_norm_for_text=False,
            rms_norm_eps=1e-5,
            rope_axes_dim=[1, 1, 1],
            rope_theta=1e8,
            vocab_size=32,
        ),
        inputs=lambda gen: dict(
            input_ids=torch.tensor([1, 2]),
            text_indexes=torch.tensor([0, 1]),
            position_ids=torch.zeros(3, 6, dtype=torch.long),
            und_len=2,
            sequence_length=6,
            vision_tokens=[_r(gen, 1, 2, 1, 2, 2)],
            vision_token_shapes=[(1, 2, 2)],
            vision_sequence_indexes=torch.arange(2, 6),
            vision_mse_loss_indexes=torch.arange(2, 6),
            vision_timesteps=torch.ones(4),
            vision_noisy_frame_indexes=[torch.tensor([0])],
        ),
    ),
    "Ideogram4Transformer2DModel": Tiny(
        init=dict(
            in_channels=16,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            intermediate_size=32,
            adaln_dim=16,
            llm_features_dim=24,
            rope_theta=10_000,
            mrope_section=(2, 1, 1),
            norm_eps=1e-5,
        ),
        inputs=lambda gen: _ideogram4_inputs(gen),
    ),
    "AutoencoderKLMiniMaxH3": Tiny(
        # forward = encode (causal 3D CNN, two 3-frame clips, one latent frame dropped) then decode (the ViT decoder
        # whose blocks are the repeated blocks) of the posterior mode: numerics compare the reconstruction. Its layer
        # scales (`scale1`, `scale2`) start at zero; the zoo draws every all-zero parameter, so the blocks count.
        init=dict(
            latent_channels=4,
            block_out_channels=(8,),
            layers_per_block=1,
            spatial_downsample_factors=(2,),
            temporal_downsample_factors=(2,),
            norm_num_groups=4,
            decoder_num_layers=2,
            decoder_num_attention_heads=2,
            decoder_attention_head_dim=8,
            decoder_num_register_tokens=2,
            decoder_ffn_mult=2,
            clip_length=3,
            token_drop=1,
            latents_mean=(0.0,) * 4,
            latents_std=(1.0,) * 4,
        ),
        inputs=lambda gen: dict(sample=_r(gen, 1, 3, 6, 8, 8)),
    ),
    "MiniMaxH3Transformer3DModel": Tiny(
        init=dict(
            num_attention_heads=2,
            attention_head_dim=16,
            hidden_size=24,
            num_layers=2,
            num_refiner_layers=2,
            ffn_dim=32,
            in_channels=4,
            audio_in_channels=6,
            patch_size=(1, 2, 2),
            text_dim=8,
            freq_dim=8,
            time_embed_hidden_dim=24,
            time_embed_dim=16,
            rope_freq_dim=2,
        ),
        inputs=lambda gen: _minimax_h3_inputs(gen),
    ),
    "Kandinsky5Transformer3DModel": Tiny(
        init=dict(
            in_visual_dim=16,
            in_text_dim=32,
            in_text_dim2=16,
            time_dim=16,
            out_visual_dim=16,
            patch_size=(1, 2, 2),
            model_dim=16,
            ff_dim=32,
            num_text_blocks=1,
            num_visual_blocks=2,
            # even axes dims as in the released configs ((16, 24, 24)): with odd ones the
            # visual rotary table has fewer pairs than the head dim and only broadcasts
            axes_dims=(2, 2, 4),
            visual_cond=False,
            attention_type="regular",
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 1, 8, 8, 16),
            encoder_hidden_states=_r(gen, 1, 6, 32),
            pooled_projections=_r(gen, 1, 16),
            timestep=torch.tensor([500.0]),
            visual_rope_pos=[torch.arange(1), torch.arange(4), torch.arange(4)],
            text_rope_pos=torch.arange(6),
        ),
    ),
    "SanaWMLTX2RefinerTransformer3DModel": Tiny(
        init=dict(
            in_channels=4,
            out_channels=4,
            patch_size=1,
            patch_size_t=1,
            num_attention_heads=2,
            attention_head_dim=8,
            cross_attention_dim=16,
            audio_in_channels=4,
            audio_out_channels=4,
            audio_num_attention_heads=2,
            audio_attention_head_dim=4,
            audio_cross_attention_dim=8,
            num_layers=2,
            qk_norm="rms_norm_across_heads",
            caption_channels=16,
        ),
        inputs=_sana_wm_refiner_inputs,
    ),
    "Kandinsky6Transformer3DModel": Tiny(
        # the released flags (ca_rope, cross_gates, fix_modulation) and an audio stream: every path of the fused block
        init=dict(
            in_visual_dim=4,
            out_visual_dim=4,
            in_text_dim=32,
            in_text_dim2=16,
            time_dim=16,
            patch_size=(1, 2, 2),
            model_dim=16,
            ff_dim=32,
            num_text_blocks=1,
            num_visual_blocks=2,
            axes_dims=(2, 2, 4),
            visual_cond=True,
            in_audio_dim=6,
            out_audio_dim=6,
            ca_rope=True,
            cross_gates=True,
            fix_modulation=True,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 1, 4, 4, 9),
            encoder_hidden_states=_r(gen, 1, 6, 32),
            pooled_projections=_r(gen, 1, 16),
            timestep=torch.tensor([500.0]),
            audio_hidden_states=_r(gen, 1, 5, 6),
        ),
    ),
    "Kandinsky6SRTransformer3DModel": Tiny(
        # NABLA attention groups 8x8 token tiles: the smallest grid is one 8x8 frame
        init=dict(
            in_visual_dim=4,
            out_visual_dim=4,
            time_dim=16,
            patch_size=(1, 1, 1),
            model_dim=16,
            ff_dim=32,
            num_visual_blocks=2,
            axes_dims=(2, 2, 4),
        ),
        inputs=lambda gen: dict(hidden_states=_r(gen, 1, 1, 8, 8, 9), timestep=torch.tensor([500.0])),
    ),
    "SanaWMTransformer3DModel": Tiny(
        init=dict(
            in_channels=4,
            num_layers=2,
            hidden_size=32,
            num_attention_heads=2,
            linear_head_dim=16,
            softmax_every_n=2,
            caption_channels=16,
            chunk_plucker_channels=8,
            chunk_plucker_post_attn_blocks=2,
            image_size=16,
            mixed_precision="fp32",
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 2, 4, 4),
            timestep=torch.tensor([[[500, 500]]]),
            encoder_hidden_states=_r(gen, 1, 1, 6, 16),
            encoder_attention_mask=torch.ones(1, 6),
            camera_conditions=_r(gen, 1, 2, 20),
            chunk_plucker=_r(gen, 1, 8, 2, 4, 4),
        ),
    ),
    "RFD4ProteinaAutoencoder": Tiny(
        # forward = decode (local latents + CA positions -> atom37 coordinates, residue types, atom masks); only the
        # decoder's trunk layers run (the encoder, reached through `encode`, is not exercised). The discrete outputs
        # (argmax residue type, thresholded atom presence) sit >= 0.01 from a flip on this draw.
        init=dict(
            atom37_mask=[[slot < 4 + residue for slot in range(37)] for residue in range(5)],
            allowed_residue_types=[[True] * 5] * 7,
            latent_dim=4,
            n_residue_types=5,
            nlayers=2,
            token_dim=16,
            nheads=2,
            dim_cond=8,
            pair_repr_dim=8,
            token_type_emb_dim=4,
        ),
        inputs=lambda gen: dict(_rfd4_masks(), z_latent=_r(gen, 1, 6, 4), ca_coors_nm=_r(gen, 1, 6, 3)),
    ),
    "RFD4ProteinaTransformer": Tiny(
        # a flow-matching velocity denoiser over protein tokens (backbone CA + local latents, a pair representation
        # biasing attention): numerics compare the predicted velocities and logits. Trunk layers and the pair update.
        init=dict(
            nlayers=2,
            token_dim=16,
            nheads=2,
            dim_cond=8,
            pair_repr_dim=8,
            latent_dim=4,
            token_type_emb_dim=4,
            cath_emb_dim=4,
            t_emb_dim=8,
            seq_sep_dim=8,
            xt_pair_dist_dim=8,
            tri_mult_c=8,
            num_sequence_classes=5,
            feats_seq=("xt_bb_ca", "xt_local_latents", "token_type"),
            feats_cond_seq=("time_emb_bb_ca", "time_emb_local_latents"),
            feats_pair_repr=("xt_bb_ca_pair_dists", "token_bond_path_length"),
        ),
        inputs=_rfd4_inputs,
    ),
}

# Models outside the zoo (no `_repeated_blocks`: built tiny and checked under compile="model")
# for a fusion form no zoo model writes: Lumina 2's FFN upcasts the gate's SiLU (`FP32SiLU`).
OUTSIDE_ZOO: dict[str, Tiny] = {
    "Lumina2Transformer2DModel": Tiny(
        # 2 layers and 1 refiner layer each for the image and the caption: 4 feed-forwards
        init=dict(
            sample_size=4,
            patch_size=2,
            in_channels=4,
            hidden_size=24,
            num_layers=2,
            num_refiner_layers=1,
            num_attention_heads=3,
            num_kv_heads=1,
            multiple_of=2,
            ffn_dim_multiplier=None,
            norm_eps=1e-5,
            scaling_factor=1.0,
            axes_dim_rope=(4, 2, 2),
            axes_lens=(128, 128, 128),
            cap_feat_dim=8,
        ),
        inputs=lambda gen: dict(
            hidden_states=_r(gen, 1, 4, 4, 4),
            encoder_hidden_states=_r(gen, 1, 6, 8),
            timestep=torch.rand(1, generator=gen),
            encoder_attention_mask=torch.ones(1, 6, dtype=torch.bool),
        ),
    ),
}

# SwiGLU sites fused per dtype with fusions=["swiglu"] (every model whose fp32 COVERAGE has any,
# plus OUTSIDE_ZOO): casts an fp32 graph drops (an upcast SiLU) stay in a bf16 graph, so a form
# can match in one dtype and not in the other. None: that tiny model does not run in that dtype
# on the CPU, eager included. The zoo's fp32 counts are COVERAGE's (asserted equal).
SWIGLU_SITES: dict[str, dict[str, int | None]] = {
    "AutoencoderKLMiniMaxH3": {"float32": 1, "bfloat16": 1},
    "BriaFibo2Transformer2DModel": {"float32": 3, "bfloat16": 3},
    "Flux2Transformer2DModel": {"float32": 3, "bfloat16": 3},
    "Flux3Transformer2DModel": {"float32": 3, "bfloat16": 3},
    "Ideogram4Transformer2DModel": {"float32": 1, "bfloat16": 1},
    "Krea2Transformer2DModel": {"float32": 1, "bfloat16": 1},
    "Lumina2Transformer2DModel": {"float32": 4, "bfloat16": 4, "float16": 4},
    "MiniMaxH3Transformer3DModel": {"float32": 2, "bfloat16": 2},
    "MiniMaxMusic3Transformer1DModel": {"float32": 1, "bfloat16": 1},
    "NucleusMoEImageTransformer2DModel": {"float32": 1, "bfloat16": 1},
    "OvisImageTransformer2DModel": {"float32": 3, "bfloat16": 3},
    "QwenImage21Transformer2DModel": {"float32": 1, "bfloat16": 1},
    "RFD4ProteinaAutoencoder": {"float32": 1, "bfloat16": 1},
    "RFD4ProteinaTransformer": {"float32": 1, "bfloat16": 1},
    # its eager bf16 forward raises on the CPU ("torch.bfloat16 is not supported by cpu")
    "SanaWMTransformer3DModel": {"float32": 4, "bfloat16": None},
    "StableAudio3DiTModel": {"float32": 1, "bfloat16": 1},
    "ZImageTransformer2DModel": {"float32": 3, "bfloat16": 3},
}

# Discovered models without a TINY entry, each with the reason (none in diffusers 0.42.1).
NOT_COVERED: dict[str, str] = {}

# Tiny configs an older torch cannot run at all, eager included: model -> (first torch that can, why).
# (CI runs the zoo on torch 2.13 (full suite) and in the engine session of 2.10; the by-hand sessions run it too: noxfile.py.)
MIN_TORCH: dict[str, tuple[tuple[int, int], str]] = {
    "WanAnimate2Transformer3DModel": (
        (2, 11),
        "before torch 2.11 flex_attention needs a power-of-two head dim; "
        "the tiny config's cached K/V fix it at 12 (real models use 128)",
    ),
}

# Recorded with DIFFUSERS_ASCEND_ZOO_RECORD=1 (diffusers 0.42.1, torch 2.13).
COVERAGE: dict[str, dict[str, dict[str, int]]] = {
    "AnyFlowFARTransformer3DModel": dict(
        matches={"adaln": 4, "mul_add": 4}, swaps={"gelu_tanh": 3, "rms_norm": 8}, left={"adaln": 2, "rope": 4}
    ),
    "AnyFlowTransformer3DModel": dict(
        matches={"adaln": 4, "mul_add": 4}, swaps={"gelu_tanh": 3, "rms_norm": 8}, left={"adaln": 2, "rope": 4}
    ),
    "AutoencoderKLMiniMaxH3": dict(matches={"mul_add": 2, "rope": 2, "swiglu": 1}, swaps={"rms_norm": 8}, left={}),
    "BriaFibo2Transformer2DModel": dict(
        matches={"mul_add": 7, "rope": 6, "swiglu": 3}, swaps={"rms_norm": 30}, left={}
    ),
    "BriaFiboTransformer2DModel": dict(
        matches={"adaln": 5, "mul_add": 5, "rope": 4}, swaps={"gelu_tanh": 3, "rms_norm": 6}, left={}
    ),
    "ChromaTransformer2DModel": dict(
        matches={"adaln": 5, "mul_add": 5}, swaps={"gelu_tanh": 3, "rms_norm": 7, "rope": 2}, left={}
    ),
    "ChronoEditTransformer3DModel": dict(
        matches={"adaln": 4, "mul_add": 4, "rope": 4}, swaps={"gelu_tanh": 3, "rms_norm": 8}, left={"adaln": 2}
    ),
    "Cosmos3OmniTransformer": dict(matches={"rms_norm": 6, "rope": 5}, swaps={}, left={}),
    "DreamLiteUNetModel": dict(matches={}, swaps={"rms_norm": 22}, left={"adaln": 6}),
    "ErnieImageTransformer2DModel": dict(matches={"mul_add": 4, "rope": 2}, swaps={"rms_norm": 4}, left={}),
    "Flux2Transformer2DModel": dict(
        matches={"adaln": 5, "mul_add": 5, "rope": 4, "swiglu": 3}, swaps={"rms_norm": 6}, left={}
    ),
    "Flux3Transformer2DModel": dict(
        matches={"adaln": 4, "mul_add": 4, "rope": 6, "swiglu": 3}, swaps={"rms_norm": 8}, left={}
    ),
    "FluxTransformer2DModel": dict(
        matches={"adaln": 5, "mul_add": 5}, swaps={"gelu_tanh": 3, "rms_norm": 6, "rope": 2}, left={}
    ),
    "GlmImageTransformer2DModel": dict(
        matches={"adaln": 4, "mul_add": 4, "rope": 2}, swaps={"gelu_tanh": 1}, left={"adaln": 2}
    ),
    "HeliosTransformer3DModel": dict(
        matches={"adaln": 2, "mul_add": 2, "rope": 2}, swaps={"gelu_tanh": 3, "rms_norm": 8}, left={"adaln": 1}
    ),
    "HunyuanImageTransformer2DModel": dict(
        matches={"adaln": 5, "mul_add": 5, "rope": 4}, swaps={"gelu_tanh": 3, "rms_norm": 6}, left={}
    ),
    "HunyuanVideo15Transformer3DModel": dict(
        matches={"adaln": 8, "mul_add": 10, "rope": 4}, swaps={"gelu_tanh": 4, "rms_norm": 8}, left={"adaln": 2}
    ),
    "HunyuanVideoTransformer3DModel": dict(
        matches={"adaln": 5, "mul_add": 7, "rope": 4}, swaps={"gelu_tanh": 3, "rms_norm": 6}, left={"adaln": 2}
    ),
    "Ideogram4Transformer2DModel": dict(
        matches={"mul_add": 2, "rope": 2, "swiglu": 1}, swaps={"rms_norm": 13}, left={}
    ),
    "JoyImageEditPlusTransformer3DModel": dict(
        matches={"adaln": 4, "mul_add": 4, "rope": 2}, swaps={"gelu_tanh": 5, "rms_norm": 8}, left={}
    ),
    "JoyImageEditTransformer3DModel": dict(
        matches={"adaln": 8, "mul_add": 8, "rope": 4}, swaps={"gelu_tanh": 5, "rms_norm": 8}, left={}
    ),
    "Kandinsky5Transformer3DModel": dict(
        matches={"adaln": 5, "mul_add": 5, "rope": 4}, swaps={"rms_norm": 10}, left={}
    ),
    "Kandinsky6SRTransformer3DModel": dict(
        matches={"adaln": 2, "mul_add": 2, "rope": 2}, swaps={"rms_norm": 4}, left={}
    ),
    "Kandinsky6Transformer3DModel": dict(
        matches={"adaln": 10, "mul_add": 10, "rope": 10}, swaps={"rms_norm": 28}, left={}
    ),
    "Krea2Transformer2DModel": dict(
        matches={"mul_add": 4, "rope": 2, "swiglu": 1}, swaps={"rms_norm": 18}, left={"rope": 1}
    ),
    "LTX2VideoTransformer3DModel": dict(
        matches={"mul_add": 14, "rope": 8}, swaps={"gelu_tanh": 4, "rms_norm": 20}, left={}
    ),
    "LTXVideoTransformer3DModel": dict(
        matches={"mul_add": 4, "rope": 2}, swaps={"gelu_tanh": 2, "rms_norm": 6}, left={}
    ),
    "LongCatAudioDiTTransformer": dict(
        matches={"adaln": 2, "mul_add": 2, "rope": 4}, swaps={"gelu_tanh": 2, "rms_norm": 8}, left={}
    ),
    "LongCatImageTransformer2DModel": dict(
        matches={"adaln": 5, "mul_add": 5, "rope": 4}, swaps={"gelu_tanh": 3, "rms_norm": 6}, left={}
    ),
    "MiniMaxH3Transformer3DModel": dict(
        matches={"mul_add": 4, "rope": 2, "swiglu": 2}, swaps={"rms_norm": 18}, left={}
    ),
    "MiniMaxMusic3Transformer1DModel": dict(matches={"rope": 2, "swiglu": 1}, swaps={}, left={"adaln": 2}),
    "MotifVideoTransformer3DModel": dict(
        matches={"adaln": 5, "mul_add": 5, "rope": 4}, swaps={"gelu_tanh": 4, "rms_norm": 6}, left={}
    ),
    "NucleusMoEImageTransformer2DModel": dict(
        matches={"adaln": 2, "mul_add": 2, "rope": 3, "swiglu": 1}, swaps={"rms_norm": 10}, left={}
    ),
    "OvisImageTransformer2DModel": dict(
        matches={"adaln": 5, "mul_add": 5, "rope": 4, "swiglu": 3}, swaps={"rms_norm": 7}, left={}
    ),
    "QwenImage21Transformer2DModel": dict(
        matches={"adaln": 2, "mul_add": 2, "rope": 2, "swiglu": 1}, swaps={"gelu_tanh": 1, "rms_norm": 4}, left={}
    ),
    "QwenImageTransformer2DModel": dict(
        matches={"adaln": 4, "mul_add": 4, "rope": 4}, swaps={"gelu_tanh": 4, "rms_norm": 9}, left={}
    ),
    "RFD4ProteinaAutoencoder": dict(matches={"mul_add": 4, "swiglu": 1}, swaps={}, left={"adaln": 7}),
    "RFD4ProteinaTransformer": dict(matches={"mul_add": 8, "swiglu": 1}, swaps={"rms_norm": 25}, left={"adaln": 6}),
    "SanaWMLTX2RefinerTransformer3DModel": dict(
        matches={"mul_add": 4, "rope": 3}, swaps={"gelu_tanh": 6, "rms_norm": 40}, left={}
    ),
    "SanaWMTransformer3DModel": dict(
        matches={"adaln": 4, "rope": 10, "swiglu": 4}, swaps={"gelu_tanh": 1, "rms_norm": 13}, left={}
    ),
    "SkyReelsV2Transformer3DModel": dict(
        matches={"adaln": 4, "mul_add": 4, "rope": 4}, swaps={"gelu_tanh": 3, "rms_norm": 8}, left={"adaln": 2}
    ),
    "StableAudio3DiTModel": dict(matches={"mul_add": 4, "rms_norm": 7, "rope": 2, "swiglu": 1}, swaps={}, left={}),
    "UNet2DConditionModel": dict(matches={}, swaps={}, left={"adaln": 6}),
    "WanAnimate2Transformer3DModel": dict(
        matches={"adaln": 2, "mul_add": 2}, swaps={"gelu_tanh": 3, "rms_norm": 10}, left={"adaln": 1, "rope": 2}
    ),
    "WanAnimateTransformer3DModel": dict(
        matches={"adaln": 2, "mul_add": 2, "rope": 2}, swaps={"gelu_tanh": 3, "rms_norm": 14}, left={"adaln": 1}
    ),
    "WanTransformer3DModel": dict(
        matches={"adaln": 2, "mul_add": 2}, swaps={"gelu_tanh": 3, "rms_norm": 8, "rope": 4}, left={"adaln": 1}
    ),
    "WanVACETransformer3DModel": dict(
        matches={"adaln": 8, "mul_add": 8}, swaps={"gelu_tanh": 7, "rms_norm": 24, "rope": 12}, left={"adaln": 4}
    ),
    "ZImageTransformer2DModel": dict(matches={"mul_add": 4, "rope": 6, "swiglu": 3}, swaps={"rms_norm": 19}, left={}),
}


def markdown_table() -> str:
    """The model table of docs/support-matrix.md, rendered from the recorded coverage."""
    fusions = default_fusions()  # the coverage is of fusions="all": one column per fusion it holds
    lines = [
        "| model | " + " | ".join(fusions) + " | left unfused |",
        "|---|" + "---|" * len(fusions) + "---|",
    ]
    for name in sorted(TINY):
        t = COVERAGE[name]
        cells = []
        for f in fusions:
            m, s = t["matches"].get(f, 0), t["swaps"].get(f, 0)
            cells.append(f"{m}" + (f" (+{s} swapped)" if s else ""))
        left = ", ".join(f"{k} {v}" for k, v in sorted(t["left"].items())) or "-"
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {left} |")
    for name in sorted(NOT_COVERED):
        lines.append(
            f"| `{name}` | " + " | ".join("?" for _ in fusions) + f" | not in the zoo test: {NOT_COVERED[name]} |"
        )
    return "\n".join(lines)
