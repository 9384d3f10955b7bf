"""Kandinsky 5 (`Kandinsky5Transformer3DModel`): rope as 2x2 rotation matrices, cast to bf16.

Rope form ``rotation_matrix``: exact for any matrices, so no precondition; an odd ``axes_dims``
(no matrix per pair) leaves the site unfused.
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
