"""Helios (`HeliosTransformer3DModel`): Wan's even/odd rotary writes on tables chunked from one tensor.

Facts specific to Helios (diffusers 0.42):

- blocks: ``HeliosTransformerBlock`` (the model's ``_repeated_blocks``).
- rotary embedding: ``apply_rotary_emb_transposed`` takes one table ``freqs_cis`` (cos then sin
  on the last dim), splits it with ``chunk(2, dim=-1)`` and writes even/odd slices as Wan does:
  rope pattern form ``wan_chunk``. It reads only ``cos[..., 0::2]`` and ``sin[..., 1::2]``; the
  interleaved op reads the whole halves. They agree because ``HeliosRotaryPosEmbed`` builds them
  with ``repeat_interleave(2)``: the precondition below, which no pass can check.
"""

from __future__ import annotations

from .registry import Adapter, register_adapter

__all__ = ["HELIOS"]

ROPE_PRECONDITION = (
    "rope: the cos and sin halves of freqs_cis satisfy cos[..., 2i] == cos[..., 2i+1] and sin[..., 2i] == "
    "sin[..., 2i+1] (HeliosRotaryPosEmbed's repeat_interleave(2) tables); disable the 'rope' fusion for other tables"
)

HELIOS = Adapter(
    name="helios",
    blocks=("HeliosTransformerBlock",),
    pattern_forms={"rope": ("wan_chunk",)},
    preconditions=(ROPE_PRECONDITION,),
)
register_adapter("HeliosTransformer3DModel", HELIOS)
