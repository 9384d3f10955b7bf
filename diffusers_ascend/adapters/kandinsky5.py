"""Kandinsky 5 (`Kandinsky5Transformer3DModel`): rotary embedding as 2x2 rotation matrices.

Facts specific to Kandinsky 5 (diffusers 0.42):

- blocks: ``Kandinsky5TransformerEncoderBlock`` (text) and ``Kandinsky5TransformerDecoderBlock``
  (visual), the model's ``_repeated_blocks``.
- rotary embedding: ``Kandinsky5AttnProcessor``'s ``apply_rotary`` multiplies each pair of the head
  dim by a 2x2 matrix (``Kandinsky5RoPE1D`` / ``Kandinsky5RoPE3D`` build ``[[cos, -sin], [sin, cos]]``)
  and casts the result to bf16 whatever the model dtype: rope pattern form ``rotation_matrix``. The
  fused op reproduces any 2x2 matrices exactly, so there is no precondition; the head dim must have
  one matrix per pair (``axes_dims`` even, as in the released configs), otherwise the site stays unfused.
"""

from __future__ import annotations

from .registry import Adapter, register_adapter

__all__ = ["KANDINSKY5"]

KANDINSKY5 = Adapter(
    name="kandinsky5",
    blocks=("Kandinsky5TransformerEncoderBlock", "Kandinsky5TransformerDecoderBlock"),
    pattern_forms={"rope": ("rotation_matrix",)},
)
register_adapter("Kandinsky5Transformer3DModel", KANDINSKY5)
