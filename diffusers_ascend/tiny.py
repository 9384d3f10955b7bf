"""Tiny Flux and Wan models, blocks and pipelines built from configs with seeded random weights.

Used by the offline demo, the benchmarks and the tests: nothing is downloaded. The configs mirror
the ones diffusers' own test-suite uses for these models, so every code path of the real
architectures (joint attention, single blocks, rotary embeddings, adaLN, qk RMSNorm) runs, just
with small widths.

>>> from diffusers_ascend.tiny import tiny_flux_pipeline, flux_pipeline_inputs
>>> pipe = tiny_flux_pipeline(seed=0)
>>> image = pipe(**flux_pipeline_inputs(height=16, width=16)).images[0]
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "FLUX_TRANSFORMER_CONFIG",
    "WAN_TRANSFORMER_CONFIG",
    "FLUX_RELOAD_KWARGS",
    "WAN_RELOAD_KWARGS",
    "tiny_flux_transformer",
    "tiny_wan_transformer",
    "tiny_flux_blocks",
    "tiny_wan_block",
    "flux_block_inputs",
    "flux_single_block_inputs",
    "wan_block_inputs",
    "flux_model_inputs",
    "wan_model_inputs",
    "tiny_flux_pipeline",
    "tiny_wan_pipeline",
    "flux_pipeline_inputs",
    "wan_pipeline_inputs",
]

# diffusers' tests/pipelines/flux/test_pipeline_flux.py uses the same shape of config.
# The components the tiny pipelines are built without: `from_pretrained` of a folder they were saved
# to must be told they are None (else: "expected [..., 'text_encoder', ...] but only {...} were passed").
FLUX_RELOAD_KWARGS: dict[str, Any] = dict(text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)
WAN_RELOAD_KWARGS: dict[str, Any] = dict(text_encoder=None, tokenizer=None)

FLUX_TRANSFORMER_CONFIG: dict[str, Any] = dict(
    patch_size=1,
    in_channels=4,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    axes_dims_rope=[4, 4, 8],
)

# diffusers' tests/pipelines/wan/test_wan.py uses the same shape of config.
WAN_TRANSFORMER_CONFIG: dict[str, Any] = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=16,
    out_channels=16,
    text_dim=32,
    freq_dim=256,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)


def _seeded(seed: int):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    return gen


def _cast(module: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
    return module.to(dtype) if dtype is not None else module


def tiny_flux_transformer(seed: int = 0, dtype: torch.dtype | None = None, **overrides):
    """A `FluxTransformer2DModel` with `FLUX_TRANSFORMER_CONFIG` (plus `overrides`) and seeded weights.

    Args:
        seed: seeds `torch.manual_seed` before construction, so weights are reproducible.
        dtype: optional dtype to cast the parameters to.
        overrides: config keys replacing those of `FLUX_TRANSFORMER_CONFIG` (e.g. `num_layers=4`).

    >>> model = tiny_flux_transformer(num_layers=2)
    >>> len(model.transformer_blocks)
    2
    """
    from diffusers import FluxTransformer2DModel

    _seeded(seed)
    return _cast(FluxTransformer2DModel(**{**FLUX_TRANSFORMER_CONFIG, **overrides}).eval(), dtype)


def tiny_wan_transformer(seed: int = 0, dtype: torch.dtype | None = None, **overrides):
    """A `WanTransformer3DModel` with `WAN_TRANSFORMER_CONFIG` (plus `overrides`) and seeded weights.

    >>> model = tiny_wan_transformer()
    >>> len(model.blocks)
    2
    """
    from diffusers import WanTransformer3DModel

    _seeded(seed)
    return _cast(WanTransformer3DModel(**{**WAN_TRANSFORMER_CONFIG, **overrides}).eval(), dtype)


def tiny_flux_blocks(seed: int = 0, dtype: torch.dtype | None = None, dim_head: int = 16, heads: int = 2):
    """One `FluxTransformerBlock` (double stream) and one `FluxSingleTransformerBlock`, seeded.

    Returns:
        `(double_block, single_block)`, both in eval mode.
    """
    from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock

    _seeded(seed)
    dim = dim_head * heads
    double = FluxTransformerBlock(dim=dim, num_attention_heads=heads, attention_head_dim=dim_head)
    single = FluxSingleTransformerBlock(dim=dim, num_attention_heads=heads, attention_head_dim=dim_head)
    return _cast(double.eval(), dtype), _cast(single.eval(), dtype)


def tiny_wan_block(
    seed: int = 0, dtype: torch.dtype | None = None, dim_head: int = 12, heads: int = 2, ffn_dim: int = 32
):
    """One `WanTransformerBlock` with the tiny Wan config's widths, seeded, in eval mode."""
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    _seeded(seed)
    block = WanTransformerBlock(
        dim=dim_head * heads, ffn_dim=ffn_dim, num_heads=heads, qk_norm="rms_norm_across_heads", cross_attn_norm=True
    )
    return _cast(block.eval(), dtype)


def _flux_rotary(txt_len: int, height: int, width: int, axes_dim=(4, 4, 8)):
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    img_ids = torch.zeros(height, width, 3)
    img_ids[..., 1] = torch.arange(height)[:, None]
    img_ids[..., 2] = torch.arange(width)[None, :]
    ids = torch.cat([torch.zeros(txt_len, 3), img_ids.reshape(-1, 3)], dim=0)
    return FluxPosEmbed(theta=10000, axes_dim=list(axes_dim))(ids)


def flux_block_inputs(
    batch: int = 1,
    txt_len: int = 8,
    height: int = 4,
    width: int = 4,
    dim: int = 32,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    axes_dim: tuple[int, ...] = (4, 4, 8),
) -> dict[str, Any]:
    """Keyword inputs for `FluxTransformerBlock.forward`: image tokens `height*width`, text tokens `txt_len`.

    The rotary embedding comes from diffusers' `FluxPosEmbed` over real text/image ids (`axes_dim`
    sums to the head dim), so the rope pattern sees exactly what it sees inside `FluxTransformer2DModel`.
    """
    gen = _seeded(seed)
    rotary = _flux_rotary(txt_len, height, width, axes_dim)
    return dict(
        hidden_states=torch.randn(batch, height * width, dim, generator=gen).to(dtype),
        encoder_hidden_states=torch.randn(batch, txt_len, dim, generator=gen).to(dtype),
        temb=torch.randn(batch, dim, generator=gen).to(dtype),
        image_rotary_emb=tuple(t.to(torch.float32) for t in rotary),
    )


def flux_single_block_inputs(**kwargs) -> dict[str, Any]:
    """Keyword inputs for `FluxSingleTransformerBlock.forward` (same arguments as `flux_block_inputs`)."""
    return flux_block_inputs(**kwargs)


def wan_block_inputs(
    batch: int = 1,
    frames: int = 2,
    height: int = 4,
    width: int = 4,
    txt_len: int = 8,
    dim_head: int = 12,
    heads: int = 2,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict[str, Any]:
    """Positional-friendly keyword inputs for `WanTransformerBlock.forward`.

    Token count is `frames * height * width` (already patchified); `temb` is `(B, 6, D)` as
    `WanTransformer3DModel` hands it to its blocks; the rotary embedding comes from diffusers'
    `WanRotaryPosEmbed` with patch size (1, 1, 1).
    """
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    gen = _seeded(seed)
    dim = dim_head * heads
    rope = WanRotaryPosEmbed(attention_head_dim=dim_head, patch_size=(1, 1, 1), max_seq_len=32)
    cos, sin = rope(torch.zeros(batch, 1, frames, height, width))
    return dict(
        hidden_states=torch.randn(batch, frames * height * width, dim, generator=gen).to(dtype),
        encoder_hidden_states=torch.randn(batch, txt_len, dim, generator=gen).to(dtype),
        temb=torch.randn(batch, 6, dim, generator=gen).to(torch.float32),
        rotary_emb=(cos, sin),
    )


def flux_model_inputs(
    height: int = 4,
    width: int = 4,
    txt_len: int = 8,
    config: dict[str, Any] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """Keyword inputs of a `FluxTransformer2DModel` with `config` (default `FLUX_TRANSFORMER_CONFIG`)
    for a packed `height x width` latent and `txt_len` text tokens.

    >>> out = tiny_flux_transformer()(**flux_model_inputs(4, 4))[0]
    >>> tuple(out.shape)
    (1, 16, 4)
    """
    config = config or FLUX_TRANSFORMER_CONFIG
    gen = torch.Generator().manual_seed(seed)
    img_ids = torch.zeros(height, width, 3)
    img_ids[..., 1] = torch.arange(height)[:, None]
    img_ids[..., 2] = torch.arange(width)[None, :]
    return dict(
        hidden_states=torch.randn(1, height * width, config["in_channels"], generator=gen).to(dtype),
        encoder_hidden_states=torch.randn(1, txt_len, config["joint_attention_dim"], generator=gen).to(dtype),
        pooled_projections=torch.randn(1, config["pooled_projection_dim"], generator=gen).to(dtype),
        timestep=torch.tensor([0.5]),
        img_ids=img_ids.reshape(-1, 3),
        txt_ids=torch.zeros(txt_len, 3),
        return_dict=False,
    )


def wan_model_inputs(
    frames: int = 2,
    height: int = 4,
    width: int = 4,
    txt_len: int = 8,
    config: dict[str, Any] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Keyword inputs of a `WanTransformer3DModel` (default `WAN_TRANSFORMER_CONFIG`) for a
    `frames x height x width` latent.

    >>> out = tiny_wan_transformer()(**wan_model_inputs(2, 4, 4))[0]
    >>> tuple(out.shape)
    (1, 16, 2, 4, 4)
    """
    config = config or WAN_TRANSFORMER_CONFIG
    gen = torch.Generator().manual_seed(seed)
    return dict(
        hidden_states=torch.randn(1, config["in_channels"], frames, height, width, generator=gen),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, txt_len, config["text_dim"], generator=gen),
        return_dict=False,
    )


def _flux_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def tiny_flux_pipeline(seed: int = 0, dtype: torch.dtype | None = None, **transformer_overrides):
    """A `FluxPipeline` with a tiny transformer and VAE and no text encoders (pass `prompt_embeds`).

    Saved with ``save_pretrained(path)``, it reloads with
    ``FluxPipeline.from_pretrained(path, **FLUX_RELOAD_KWARGS)`` (``text_encoder=None, tokenizer=None,
    text_encoder_2=None, tokenizer_2=None``): the components it has none of must be named.

    Args:
        seed: seeds every component's weights.
        dtype: optional dtype for the transformer and VAE.
        transformer_overrides: config overrides for the transformer (e.g. `num_layers=4`).

    >>> pipe = tiny_flux_pipeline()
    >>> out = pipe(**flux_pipeline_inputs())
    >>> sorted(FLUX_RELOAD_KWARGS)
    ['text_encoder', 'text_encoder_2', 'tokenizer', 'tokenizer_2']
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer = tiny_flux_transformer(seed, dtype, **transformer_overrides)
    _seeded(seed + 1)
    vae = _cast(_flux_vae().eval(), dtype)
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        transformer=transformer,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
    )


def flux_pipeline_inputs(
    height: int = 16, width: int = 16, steps: int = 2, seed: int = 0, dtype: torch.dtype = torch.float32, batch: int = 1
) -> dict[str, Any]:
    """Call arguments for `tiny_flux_pipeline()`: seeded prompt embeddings, latents from a seeded generator."""
    gen = _seeded(seed)
    return dict(
        prompt_embeds=torch.randn(batch, 8, 32, generator=gen).to(dtype),
        pooled_prompt_embeds=torch.randn(batch, 32, generator=gen).to(dtype),
        height=height,
        width=width,
        num_inference_steps=steps,
        guidance_scale=3.5,
        generator=torch.Generator().manual_seed(seed),
        output_type="pt",
    )


def tiny_wan_pipeline(
    seed: int = 0, dtype: torch.dtype | None = None, two_stage: bool = False, **transformer_overrides
):
    """A `WanPipeline` with a tiny transformer (and `transformer_2` when `two_stage`, as Wan 2.2) and VAE.

    No text encoder: pass `prompt_embeds`. `two_stage=True` sets `boundary_ratio=0.5` so both
    transformers run during denoising. Saved with ``save_pretrained(path)``, it reloads with
    ``WanPipeline.from_pretrained(path, **WAN_RELOAD_KWARGS)`` (``text_encoder=None, tokenizer=None``).

    >>> sorted(WAN_RELOAD_KWARGS)
    ['text_encoder', 'tokenizer']
    """
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline

    transformer = tiny_wan_transformer(seed, dtype, **transformer_overrides)
    transformer_2 = tiny_wan_transformer(seed + 7, dtype, **transformer_overrides) if two_stage else None
    _seeded(seed + 1)
    vae = _cast(
        AutoencoderKLWan(
            base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
        ).eval(),
        dtype,
    )
    return WanPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        transformer=transformer,
        transformer_2=transformer_2,
        boundary_ratio=0.5 if two_stage else None,
    )


def wan_pipeline_inputs(
    height: int = 16,
    width: int = 16,
    num_frames: int = 5,
    steps: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """Call arguments for `tiny_wan_pipeline()` (guidance off, so no negative embeddings are needed)."""
    gen = _seeded(seed)
    return dict(
        prompt_embeds=torch.randn(1, 8, 32, generator=gen).to(dtype),
        height=height,
        width=width,
        num_frames=num_frames,
        num_inference_steps=steps,
        guidance_scale=1.0,
        generator=torch.Generator().manual_seed(seed),
        output_type="pt",
    )
