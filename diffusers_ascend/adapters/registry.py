"""Per-model adapters: which blocks to compile in place. Keyed by model class name, not isinstance chains."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Adapter:
    """What the integration needs to know about one diffusers model family.

    Args:
        name: family name used in reports.
        blocks: class names of the repeated blocks compiled in place under ``compile="blocks"``.
    """

    name: str
    blocks: tuple[str, ...]


_ADAPTERS: dict[str, Adapter] = {}


def register_adapter(model_class_name: str, adapter: Adapter) -> None:
    """Registers `adapter` for models whose class is named `model_class_name`."""
    _ADAPTERS[model_class_name] = adapter


def adapter_for(model) -> Adapter | None:
    """The adapter for `model`: registered by class (MRO), else generic from `_repeated_blocks`, else None.

    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> adapter_for(tiny_flux_transformer()).name
    'flux'
    """
    from . import flux, generic, wan  # noqa: F401  (registration on first use)

    for cls in type(model).__mro__:
        if cls.__name__ in _ADAPTERS:
            return _ADAPTERS[cls.__name__]
    return generic.generic_adapter(model)
