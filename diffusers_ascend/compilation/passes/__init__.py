"""Fusion passes, one file per fusion, and the registry that wires them to fusion names.

Adding a fusion: one file with ``XxxPattern`` + ``XxxFusionPass`` and one entry in
`FUSION_PASSES`. Nothing is imported or registered until a backend first compiles a graph.
"""

from __future__ import annotations

import importlib

__all__ = ["FUSION_PASSES", "PASS_ORDER", "get_pass_class", "ordered_fusions"]

# fusion name -> "module:class" (imported lazily).
FUSION_PASSES: dict[str, str] = {
    "rms_norm": "rms_norm:RMSNormFusionPass",
    "rope": "rope:RopeFusionPass",
    "fast_gelu": "gelu:FastGeluFusionPass",
    "gelu_tanh": "gelu:GeluTanhFusionPass",
    "adaln": "adaln:AdaLNFusionPass",
    "swiglu": "swiglu:SwiGLUFusionPass",
    "mul_add": "mul_add:MulAddFusionPass",
}

# The order passes run in: fast_gelu before gelu_tanh (when a user names both, the explicit
# approximation wins), swiglu before mul_add (``silu(a) * b + c`` is a SwiGLU feeding an add, not
# a residual gate), the greedy mul_add last. (`diffusers_ascend.config.FUSIONS` is the order of
# names in configs, not this one.)
PASS_ORDER: tuple[str, ...] = tuple(FUSION_PASSES)


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
