"""Per-model adapters: what is specific to one diffusers model family, keyed by model class name,
and the generic fallback for any model that declares ``_repeated_blocks``.

Adding a model family is one file in this package (an `Adapter` and a `register_adapter` call)
plus one line in `_FAMILIES` below. Everything model-independent (fused RMSNorm/GELU modules,
the swap machinery) lives in `diffusers_ascend.layers`; the fusion patterns in
`diffusers_ascend.compilation.passes`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..layers import Swap

__all__ = ["Adapter", "adapter_for", "adapter_swaps", "generic_adapter", "register_adapter", "registered_adapters"]

# One module per family; imported (and so registered) on first use.
_FAMILIES: tuple[str, ...] = ("flux", "wan", "krea2", "helios", "kandinsky5", "kandinsky6")


@dataclass(frozen=True)
class Adapter:
    """What the integration needs to know about one diffusers model family.

    Args:
        name: family name used in reports.
        blocks: class names of the repeated blocks compiled in place under ``compile="blocks"``.
        swaps: family-specific `diffusers_ascend.layers.Swap`s (attention processors with fused
            RoPE); matched by exact class name, so they never touch another family's objects.
        pattern_forms: fusion -> the written forms (``FusionPattern.FORMS`` of that fusion's
            pattern) its blocks use; documentation (tests check the names are real forms).
        preconditions: facts the fusions rely on that no pass can check at compile time.

    >>> from diffusers_ascend.adapters import Adapter
    >>> Adapter(name="mine", blocks=("MyBlock",)).blocks
    ('MyBlock',)
    """

    name: str
    blocks: tuple[str, ...]
    swaps: tuple["Swap", ...] = ()
    pattern_forms: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)
    preconditions: tuple[str, ...] = ()

    def block_modules(self, model: "torch.nn.Module") -> tuple[list[tuple[str, "torch.nn.Module"]], list[str]]:
        """The submodules of `model` compiled under ``compile="blocks"``, and the block class names
        that match no submodule (a config can build other block classes than the model declares).

        >>> from diffusers_ascend.tiny import tiny_flux_transformer
        >>> found, missing = adapter_for(tiny_flux_transformer()).block_modules(tiny_flux_transformer())
        >>> len(found), missing
        (2, [])
        """
        found = [(n, m) for n, m in model.named_modules() if type(m).__name__ in self.blocks]
        present = {type(m).__name__ for _, m in found}
        return found, [b for b in self.blocks if b not in present]


_ADAPTERS: dict[str, Adapter] = {}


def register_adapter(model_class_name: str, adapter: Adapter) -> None:
    """Registers `adapter` for models whose class (or a base class) is named `model_class_name`.

    >>> from diffusers_ascend.adapters import Adapter, register_adapter
    >>> register_adapter("MyTransformer2DModel", Adapter(name="mine", blocks=("MyBlock",)))
    """
    _ADAPTERS[model_class_name] = adapter


def _load_families() -> None:
    for family in _FAMILIES:
        try:
            importlib.import_module(f"{__package__}.{family}")
        except ImportError as e:
            # A diffusers without this family's module has none of its models either; anything
            # else (a module of ours that fails) must surface.
            if not (e.name or "").startswith("diffusers"):
                raise


def registered_adapters() -> dict[str, Adapter]:
    """Model class name -> registered `Adapter` (every family module imported)."""
    _load_families()
    return dict(_ADAPTERS)


def adapter_swaps() -> tuple["Swap", ...]:
    """The family-specific swaps of every registered adapter (each once, in registration order)."""
    out: list = []
    for adapter in registered_adapters().values():
        out.extend(s for s in adapter.swaps if s not in out)
    return tuple(out)


def adapter_for(model) -> Adapter | None:
    """The adapter for `model`: registered by class (MRO), else `generic_adapter`, else None.

    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> adapter_for(tiny_flux_transformer()).name
    'flux'
    """
    _load_families()
    for cls in type(model).__mro__:
        if cls.__name__ in _ADAPTERS:
            return _ADAPTERS[cls.__name__]
    return generic_adapter(model)


def generic_adapter(model) -> Adapter | None:
    """An `Adapter` built from ``type(model)._repeated_blocks`` (no swaps), or None when it declares
    none. A block name that matches no submodule is reported by the integration
    (`Adapter.block_modules`).

    >>> from diffusers_ascend.tiny import tiny_wan_transformer
    >>> generic_adapter(tiny_wan_transformer()).blocks
    ('WanTransformerBlock',)
    """
    blocks = tuple(getattr(model, "_repeated_blocks", None) or ())
    return Adapter(name=f"generic:{type(model).__name__}", blocks=blocks) if blocks else None
