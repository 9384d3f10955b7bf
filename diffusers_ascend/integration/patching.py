"""Class patching: `import diffusers_ascend` adds the entry points as methods of diffusers'
``DiffusionPipeline`` and ``ModelMixin`` and makes their ``from_pretrained`` re-apply a saved
``_ascend_config``."""

from __future__ import annotations

import contextvars
import functools
import os
from typing import TYPE_CHECKING, Any

from .. import _diffusers_compat as dc
from ..enabled import ASCEND_CONFIG_KEY
from .api import ascend_report, disable_ascend_compile, enable_ascend_compile, save_ascend_cache
from .models import models_of

if TYPE_CHECKING:
    from ..compilation import FusionReport
    from ..config import AscendConfig

# Set while a pipeline loads its components: the pipeline applies the config once, at the end.
_LOADING_PIPELINE = contextvars.ContextVar("diffusers_ascend_loading_pipeline", default=False)


class AscendAccelerationMixin:
    """Methods added to `diffusers.DiffusionPipeline` and `diffusers.ModelMixin` by `import diffusers_ascend`."""

    def enable_ascend_compile(
        self, config: AscendConfig | dict[str, Any] | str | os.PathLike[str] | None = None, **overrides: Any
    ):
        """See `diffusers_ascend.enable_ascend_compile`."""
        return enable_ascend_compile(self, config, **overrides)

    def save_ascend_cache(self, save_directory: str | os.PathLike[str]) -> dict[str, Any]:
        """See `diffusers_ascend.save_ascend_cache`."""
        return save_ascend_cache(self, save_directory)

    def disable_ascend_compile(self):
        """See `diffusers_ascend.disable_ascend_compile`."""
        return disable_ascend_compile(self)

    def ascend_report(self) -> FusionReport | None:
        """See `diffusers_ascend.ascend_report`."""
        return ascend_report(self)


def _wrap_from_pretrained(cls, is_pipeline: bool) -> None:
    orig = cls.__dict__["from_pretrained"].__func__
    if getattr(orig, "_ascend_wrapped", False):
        return

    @functools.wraps(orig)
    def from_pretrained(klass, *args, ascend_config=None, **kwargs):
        if not is_pipeline and _LOADING_PIPELINE.get():
            return orig(klass, *args, **kwargs)
        token = _LOADING_PIPELINE.set(True) if is_pipeline else None
        try:
            obj = orig(klass, *args, **kwargs)
        finally:
            if token is not None:
                _LOADING_PIPELINE.reset(token)
        if ascend_config is False:  # the saved key stays in the configs (a re-save keeps it); nothing is applied
            return obj
        if ascend_config is None:
            try:
                ascend_config = saved_config(obj)
            except ValueError as e:
                sep = " " if str(e).endswith((".", "?")) else ". "
                raise ValueError(
                    f"{e}{sep}Load without it with from_pretrained(..., ascend_config=False), or replace it with "
                    "ascend_config=AscendConfig(...)."
                ) from e
        if ascend_config is not None:
            enable_ascend_compile(obj, ascend_config)
        return obj

    from_pretrained._ascend_wrapped = True
    cls.from_pretrained = classmethod(from_pretrained)


def saved_config(obj) -> AscendConfig | None:
    """The `AscendConfig` saved in the first adapted model's config, loaded as data (None if absent).

    Raises:
        ValueError: the saved value is not an object of valid fields; names the model.
    """
    from ..config import AscendConfig

    for name, model in models_of(obj):
        saved = model.config.get(ASCEND_CONFIG_KEY) if hasattr(model, "config") else None
        if saved is None or (isinstance(saved, dict) and not saved):
            continue
        origin = dc.config_origin(model) or getattr(obj, "name_or_path", None)
        where = f"{type(model).__name__}{f' ({name})' if name else ''}" + (f" loaded from {origin!r}" if origin else "")
        return AscendConfig.from_dict(saved, source=f"`{ASCEND_CONFIG_KEY}` of the {where}")
    return None


def patch_class(cls: type, is_pipeline: bool) -> None:
    """Adds `AscendAccelerationMixin`'s methods to `cls` (DiffusionPipeline or ModelMixin) and wraps its
    `from_pretrained`."""
    for meth in ("enable_ascend_compile", "disable_ascend_compile", "ascend_report", "save_ascend_cache"):
        if not hasattr(cls, meth):
            setattr(cls, meth, AscendAccelerationMixin.__dict__[meth])
    _wrap_from_pretrained(cls, is_pipeline)
