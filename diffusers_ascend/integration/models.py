"""Which models of a pipeline or model enabling acts on, and the saved-config key they carry."""

from __future__ import annotations

import sys

import torch

from .. import _diffusers_compat as dc
from ..enabled import ASCEND_CONFIG_KEY


def is_pipeline(obj) -> bool:
    # A pipeline object exists only once its base class's module was imported; importing it just
    # to answer no (``from diffusers import DiffusionPipeline`` loads every pipeline family's
    # package) was more than half of a warm-started enable.
    module_name, class_name = dc.PIPELINE_BASE
    module = sys.modules.get(module_name)
    return module is not None and isinstance(obj, getattr(module, class_name))


def unwrapped(obj):
    """`obj` without the ``OptimizedModule``s that ``torch.compile(module)`` wraps it in."""
    from ..compilation._compat import unwrap_compiled_module

    return unwrap_compiled_module(obj)


def models_of(obj) -> list[tuple[str, torch.nn.Module]]:
    """The models of `obj` that have an adapter: the model itself (name ``""``), or a pipeline's
    transformers by component name; each without torch.compile's wrapper (see `outer_compiled`)."""
    from ..adapters import adapter_for

    if not is_pipeline(obj):
        return [("", unwrapped(obj))]
    out = []
    for name, comp in obj.components.items():
        comp = unwrapped(comp)
        if isinstance(comp, torch.nn.Module) and adapter_for(comp) is not None:
            out.append((name, comp))
    return out


def outer_compiled(obj) -> set[str]:
    """The names (as in `models_of`) of the models that `obj` holds inside a ``torch.compile(module)``
    wrapper: ``pipe.transformer = torch.compile(pipe.transformer)``, or `obj` itself (``""``)."""
    if is_pipeline(obj):
        return {name for name, comp in obj.components.items() if unwrapped(comp) is not comp}
    return {""} if unwrapped(obj) is not obj else set()


def set_config_key(obj, value) -> None:
    """Sets (or, with None, removes) `ASCEND_CONFIG_KEY` in `obj`'s diffusers config."""
    dc.set_config_entry(obj, ASCEND_CONFIG_KEY, value)
