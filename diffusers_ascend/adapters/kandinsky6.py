"""Kandinsky 6 (`Kandinsky6Transformer3DModel`, `Kandinsky6SRTransformer3DModel`): Kandinsky 5's
rotation-matrix rope, cast back to the input's dtype (form ``rotation_matrix_typed``); its
modulation is written as Wan's.
"""

from __future__ import annotations

from .registry import Adapter, register_adapter

__all__ = ["KANDINSKY6", "KANDINSKY6_SR"]

KANDINSKY6 = Adapter(
    name="kandinsky6",
    blocks=("Kandinsky6TransformerEncoderBlock", "Kandinsky6FusedTransformerDecoderBlock"),
    pattern_forms={"rope": ("rotation_matrix_typed",)},
)
KANDINSKY6_SR = Adapter(
    name="kandinsky6_sr",
    blocks=("Kandinsky6SRTransformerBlock",),
    pattern_forms={"rope": ("rotation_matrix_typed",)},
)
register_adapter("Kandinsky6Transformer3DModel", KANDINSKY6)
register_adapter("Kandinsky6SRTransformer3DModel", KANDINSKY6_SR)
