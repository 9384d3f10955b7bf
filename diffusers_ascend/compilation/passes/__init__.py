"""Fusion passes, one file per fusion (``XxxPattern`` + ``XxxFusionPass``), wired to fusion names
by `diffusers_ascend.fusions.TABLE`. Nothing is imported or registered until a backend first
compiles a graph.
"""

from __future__ import annotations

import importlib

from ...fusions import PASS_ORDER, TABLE

__all__ = ["FUSION_PASSES", "PASS_ORDER", "get_pass_class", "ordered_fusions"]

# fusion name -> "module:class" (imported lazily), in the order the passes run.
FUSION_PASSES: dict[str, str] = {name: TABLE[name].pass_class for name in PASS_ORDER}


def get_pass_class(fusion: str):
    """The `FusionPass` subclass of `fusion` (imports its module)."""
    try:
        spec = FUSION_PASSES[fusion]
    except KeyError:
        raise ValueError(f"unknown fusion {fusion!r}; valid: {tuple(FUSION_PASSES)}") from None
    module, cls = spec.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def ordered_fusions(fusions) -> tuple[str, ...]:
    """`fusions` (any iterable of names) deduplicated, validated and sorted into `PASS_ORDER`."""
    names = set(fusions)
    unknown = sorted(names - set(FUSION_PASSES))
    if unknown:
        raise ValueError(f"unknown fusion(s) {unknown}; valid: {tuple(FUSION_PASSES)}")
    return tuple(f for f in PASS_ORDER if f in names)
