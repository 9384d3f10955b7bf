"""Per-model adapters keyed by model class name, and the generic one for any model with
``_repeated_blocks``.

Adapters are found the way ``ascend_kernels`` ops are: every public module of the package is
imported (here on first use, as family modules import diffusers' model classes) and registers
what it defines with one call, ``register_adapter("<ModelClass>", ADAPTER)`` (an op file calls
``register_provider`` with its native provider). A new family is one file in this package;
nothing lists it. `_ADAPTERS` is the table.

>>> registered_adapters()["FluxTransformer2DModel"].name
'flux'
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..layers import Swap

__all__ = ["Adapter", "adapter_for", "adapter_swaps", "generic_adapter", "register_adapter", "registered_adapters"]

# The modules of this package that define no family.
_NOT_FAMILIES = ("registry",)


@dataclass(frozen=True)
class Adapter:
    """What the integration needs to know about one diffusers model family.

    Args:
        name: family name used in reports.
        blocks: class names of the repeated blocks compiled in place under ``compile="blocks"``.
        swaps: family-specific `diffusers_ascend.layers.Swap`s, matched by exact class name.
        pattern_forms: fusion -> the ``FusionPattern.FORMS`` its blocks use (documentation).
        preconditions: facts the fusions rely on that no pass can check at compile time.

    >>> Adapter(name="mine", blocks=("MyBlock",)).blocks
    ('MyBlock',)
    """

    name: str
    blocks: tuple[str, ...]
    swaps: tuple[Swap, ...] = ()
    pattern_forms: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)
    preconditions: tuple[str, ...] = ()

    def block_modules(self, model: torch.nn.Module) -> tuple[list[tuple[str, torch.nn.Module]], list[str]]:
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

    >>> register_adapter("MyTransformer2DModel", Adapter(name="mine", blocks=("MyBlock",)))
    """
    _ADAPTERS[model_class_name] = adapter


def _load_families() -> None:
    from .._diffusers_compat import DiffusersCompatError

    # Every public module of the package, as ascend_kernels/ops/__init__.py imports the op files.
    for info in pkgutil.iter_modules(sys.modules[__package__].__path__):
        if info.name.startswith("_") or info.name in _NOT_FAMILIES:
            continue
        try:
            importlib.import_module(f"{__package__}.{info.name}")
        except ImportError as e:
            # A diffusers without this family has none of its models; our own failures surface.
            if not (e.name or "").startswith("diffusers"):
                raise
        except DiffusersCompatError:
            # A private name of the family moved: `enable_ascend_compile` refuses this diffusers
            # first (`check_diffusers`); a plain from_pretrained, which looks for saved settings
            # here, loads as with a diffusers without the family.
            continue


def registered_adapters() -> dict[str, Adapter]:
    """Model class name -> registered `Adapter` (every family module imported)."""
    _load_families()
    return dict(_ADAPTERS)


def adapter_swaps() -> tuple[Swap, ...]:
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
    """An `Adapter` built from ``type(model)._repeated_blocks`` (no swaps), or None without them.

    >>> from diffusers_ascend.tiny import tiny_wan_transformer
    >>> generic_adapter(tiny_wan_transformer()).blocks
    ('WanTransformerBlock',)
    """
    from .._diffusers_compat import repeated_blocks

    blocks = repeated_blocks(model)
    return Adapter(name=f"generic:{type(model).__name__}", blocks=blocks) if blocks else None
