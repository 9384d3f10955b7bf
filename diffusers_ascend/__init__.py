"""diffusers-ascend: run Hugging Face diffusers pipelines fast on Huawei Ascend NPUs.

`import diffusers_ascend` adds `enable_ascend_compile` / `disable_ascend_compile` / `ascend_report`
to `diffusers.DiffusionPipeline` and `diffusers.ModelMixin` (as `import torch_npu` patches torch)
and makes `from_pretrained` re-apply a saved `_ascend_config`. Nothing heavy happens here: no
pattern registration, no Inductor import, no op registration until enable time.
"""

__version__ = "0.1.0"

_LAZY = {
    "AscendConfig": ("diffusers_ascend.config", "AscendConfig"),
    "AscendBackend": ("diffusers_ascend.compilation", "AscendBackend"),
    "FusionReport": ("diffusers_ascend.compilation", "FusionReport"),
    "enable_ascend_compile": ("diffusers_ascend.mixin", "enable_ascend_compile"),
    "disable_ascend_compile": ("diffusers_ascend.mixin", "disable_ascend_compile"),
    "ascend_report": ("diffusers_ascend.mixin", "ascend_report"),
}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'diffusers_ascend' has no attribute {name!r}")


def _patch():
    try:
        import diffusers  # noqa: F401
    except ImportError:  # diffusers is optional for ascend_kernels-only users
        return
    from .mixin import patch_diffusers

    patch_diffusers()


_patch()
