"""Fallback for any diffusers model that declares `_repeated_blocks`."""

from __future__ import annotations

from .registry import Adapter


def generic_adapter(model) -> Adapter | None:
    blocks = tuple(getattr(model, "_repeated_blocks", None) or ())
    return Adapter(name=f"generic:{type(model).__name__}", blocks=blocks) if blocks else None
