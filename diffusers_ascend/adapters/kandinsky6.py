"""Kandinsky 6 (`Kandinsky6Transformer3DModel`, `Kandinsky6SRTransformer3DModel`): Kandinsky 5's
rotation-matrix rope, cast back to the input's dtype.

Facts specific to Kandinsky 6 (diffusers 0.42):

- blocks: ``Kandinsky6TransformerEncoderBlock`` (text) and ``Kandinsky6FusedTransformerDecoderBlock``
  (visual, with the optional audio stream), and ``Kandinsky6SRTransformerBlock`` for the
  super-resolution model: the models' ``_repeated_blocks``.
- rotary embedding: the module-level ``apply_rotary`` multiplies each pair of the head dim by a
  2x2 matrix in fp32 and casts back to ``x.dtype`` (Kandinsky 5 cast to bf16 whatever the model
  dtype): rope pattern form ``rotation_matrix_typed``. Exact for any 2x2 matrices, so no
  precondition; the head dim must have one matrix per pair (even ``axes_dims``, as released).
- modulation: ``apply_scale_shift_norm`` / ``apply_gate_sum`` upcast to fp32 and cast back, the
  adaLN and mul_add forms Wan also writes.
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
