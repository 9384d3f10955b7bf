"""Flux (`FluxTransformer2DModel`): double- and single-stream blocks, Flux's attention processor.

Rope is the interleaved layout on ``(S, D)`` tables; ``FusedRopeFluxAttnProcessor`` runs it as one
``ascend_kernels.rope`` per tensor, also under ``compile="none"``.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

from .._diffusers_compat import attention_backend, parallel_config, require
from ..layers import Swap, _ops
from .registry import Adapter, register_adapter

__all__ = ["FLUX", "FusedRopeFluxAttnProcessor"]

# Imported with this family (at enable time): a diffusers that moved it raises our error then.
_get_qkv_projections = require("Flux qkv projections")


def _rope(x, freqs):
    # apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=1)
    cos, sin = freqs
    return _ops().rope(x, cos[None, :, None, :], sin[None, :, None, :], "interleaved")


# Mirrors diffusers 0.42's `FluxAttnProcessor.__call__` line for line except the rotary step;
# tests/integration/test_layers.py compares it with the stock processor.
class FusedRopeFluxAttnProcessor(FluxAttnProcessor):
    """`FluxAttnProcessor` with the rotary embedding as one ``ascend_kernels.rope`` per tensor.

    >>> from diffusers_ascend.tiny import tiny_flux_blocks
    >>> double, _ = tiny_flux_blocks()
    >>> double.attn.processor.__class__ = FusedRopeFluxAttnProcessor
    """

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        query, key, value, encoder_query, encoder_key, encoder_value = _get_qkv_projections(
            attn, hidden_states, encoder_hidden_states
        )
        query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
        key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
        value = value.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            encoder_query = attn.norm_added_q(encoder_query.unflatten(-1, (-1, attn.head_dim)))
            encoder_key = attn.norm_added_k(encoder_key.unflatten(-1, (-1, attn.head_dim)))
            encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)
        if image_rotary_emb is not None:
            query, key = _rope(query, image_rotary_emb), _rope(key, image_rotary_emb)
        hidden_states = dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            backend=attention_backend(self),
            parallel_config=parallel_config(self),
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return hidden_states
        encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
            [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1
        )
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states.contiguous())
        return hidden_states, encoder_hidden_states


FLUX = Adapter(
    name="flux",
    blocks=("FluxTransformerBlock", "FluxSingleTransformerBlock"),
    # Only diffusers' own class: other modules define look-alikes of the same name
    # (transformer_chronoedit.WanAttnProcessor) whose code this class does not mirror.
    swaps=(
        Swap(
            "rope",
            "FluxAttnProcessor",
            lambda: FusedRopeFluxAttnProcessor,
            applies=lambda p: type(p).__module__ == "diffusers.models.transformers.transformer_flux",
        ),
    ),
    pattern_forms={"adaln": ("flux", "continuous"), "rms_norm": ("torch",), "rope": ("flux",)},
)
register_adapter("FluxTransformer2DModel", FLUX)
