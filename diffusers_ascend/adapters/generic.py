"""Fallback for any diffusers model that declares `_repeated_blocks` (no family-specific swaps).

The blocks compiled are the classes the model names in `_repeated_blocks`; a name that matches
no submodule is warned about and reported by the integration (see `Adapter.block_modules`).
"""

from __future__ import annotations

from .registry import Adapter


def generic_adapter(model) -> Adapter | None:
    """An `Adapter` built from ``type(model)._repeated_blocks``, or None when it declares none.

    >>> from diffusers_ascend.tiny import tiny_wan_transformer
    >>> generic_adapter(tiny_wan_transformer()).blocks
    ('WanTransformerBlock',)
    """
    blocks = tuple(getattr(model, "_repeated_blocks", None) or ())
    return Adapter(name=f"generic:{type(model).__name__}", blocks=blocks) if blocks else None
