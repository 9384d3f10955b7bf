"""Helios (`HeliosTransformer3DModel`): Wan's even/odd rotary writes on ``cos``/``sin`` chunked
from one table (rope form ``wan_chunk``), under Wan's precondition (``ROPE_PRECONDITION``).
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
