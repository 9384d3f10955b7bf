"""Wan 2.1 / 2.2 (`WanTransformer3DModel`; Wan 2.2 pipelines hold `transformer` and `transformer_2`).

adaLN and residual gates are computed in fp32 (pattern forms ``upcast`` / ``upcast_fp32_out``).
Rope: ``WanAttnProcessor`` reads only even cos / odd sin, the fused op whole tables, equal under
``ROPE_PRECONDITION`` (no pass can check it). The processor swap also serves the Wan-derived
models (VACE, Animate, ChronoEdit) the generic adapter compiles.
"""

from __future__ import annotations

from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from .._diffusers_compat import attention_backend, parallel_config, require
from ..layers import Swap, _ops
from .registry import Adapter, register_adapter

__all__ = ["WAN", "FusedRopeWanAttnProcessor"]

# Imported with this family (at enable time): a diffusers that moved them raises our error then.
_get_qkv_projections = require("Wan qkv projections")
_get_added_kv_projections = require("Wan added kv projections")

ROPE_PRECONDITION = (
    "rope: cos[..., 2i] == cos[..., 2i+1] and sin[..., 2i] == sin[..., 2i+1] (WanRotaryPosEmbed's "
    "repeat_interleave(2) tables); disable the 'rope' fusion for a model that feeds Wan's processor other tables"
)


def _rope(x, cos, sin):
    return _ops().rope(x, cos, sin, "interleaved")


# Mirrors diffusers 0.42's `WanAttnProcessor.__call__` line for line except the rotary step;
# tests/integration/test_layers.py compares it with the stock processor.
class FusedRopeWanAttnProcessor(WanAttnProcessor):
    """`WanAttnProcessor` with the rotary embedding as one ``ascend_kernels.rope`` per tensor.

    >>> from diffusers_ascend.tiny import tiny_wan_block
    >>> block = tiny_wan_block()
    >>> block.attn1.processor.__class__ = FusedRopeWanAttnProcessor
    """

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        encoder_hidden_states_img = None
        if attn.add_k_proj is not None:
            image_context_length = encoder_hidden_states.shape[1] - 512  # as diffusers: text context is 512
            encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
            encoder_hidden_states = encoder_hidden_states[:, image_context_length:]
        query, key, value = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query, key = _rope(query, *rotary_emb), _rope(key, *rotary_emb)
        hidden_states_img = None
        if encoder_hidden_states_img is not None:
            key_img, value_img = _get_added_kv_projections(attn, encoder_hidden_states_img)
            key_img = attn.norm_added_k(key_img).unflatten(2, (attn.heads, -1))
            value_img = value_img.unflatten(2, (attn.heads, -1))
            hidden_states_img = dispatch_attention_fn(
                query,
                key_img,
                value_img,
                attn_mask=None,
                dropout_p=0.0,
                is_causal=False,
                backend=attention_backend(self),
                parallel_config=None,
            )
            hidden_states_img = hidden_states_img.flatten(2, 3).type_as(query)
        hidden_states = dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
            backend=attention_backend(self),
            parallel_config=(parallel_config(self) if encoder_hidden_states is None else None),
        )
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        if hidden_states_img is not None:
            hidden_states = hidden_states + hidden_states_img
        return attn.to_out[1](attn.to_out[0](hidden_states))


WAN = Adapter(
    name="wan",
    blocks=("WanTransformerBlock",),
    # Only diffusers' own class: other modules define look-alikes of the same name
    # (transformer_chronoedit.WanAttnProcessor) whose code this class does not mirror.
    swaps=(
        Swap(
            "rope",
            "WanAttnProcessor",
            lambda: FusedRopeWanAttnProcessor,
            applies=lambda p: type(p).__module__ == "diffusers.models.transformers.transformer_wan",
        ),
    ),
    pattern_forms={"adaln": ("upcast", "upcast_fp32_out"), "rms_norm": ("torch",), "rope": ("wan",)},
    preconditions=(ROPE_PRECONDITION,),
)
register_adapter("WanTransformer3DModel", WAN)
