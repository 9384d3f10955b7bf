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
    "enable_ascend_compile": ("diffusers_ascend.integration", "enable_ascend_compile"),
    "disable_ascend_compile": ("diffusers_ascend.integration", "disable_ascend_compile"),
    "ascend_report": ("diffusers_ascend.integration", "ascend_report"),
    "save_ascend_cache": ("diffusers_ascend.integration", "save_ascend_cache"),
    # The backend torch.compile finds by the name "ascend" (docs/named-backend.md), and what it compiled.
    "ascend_backend": ("diffusers_ascend.compilation.named_backend", "ascend_backend"),
    "backend_from_options": ("diffusers_ascend.compilation.named_backend", "backend_from_options"),
    "compiled_report": ("diffusers_ascend.compilation.named_backend", "compiled_report"),
    # The category of every warning we emit (filter ours with it).
    "AscendWarning": ("diffusers_ascend.errors", "AscendWarning"),
    # Raised when the running torch cannot serve the fusion engine (see docs/troubleshooting.md).
    "TorchCompatError": ("diffusers_ascend.compilation._compat", "TorchCompatError"),
    # Raised when a fusion pattern fails its self-check for a reason of its own (not torch's).
    "FusionSelfCheckError": ("diffusers_ascend.compilation.passes.base", "FusionSelfCheckError"),
    # Raised at enable time when the installed diffusers moved a private name we use (see docs/troubleshooting.md).
    "DiffusersCompatError": ("diffusers_ascend._diffusers_compat", "DiffusersCompatError"),
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
    # Deferred until diffusers defines the classes: importing them costs ~3 s (transformers, peft).
    from ._diffusers_compat import MODEL_BASE, PIPELINE_BASE
    from ._import_hooks import when_imported

    def patch(module, cls_name, is_pipeline):
        from .integration import patch_class

        patch_class(getattr(module, cls_name), is_pipeline)

    when_imported(PIPELINE_BASE[0], lambda m: patch(m, PIPELINE_BASE[1], True))
    when_imported(MODEL_BASE[0], lambda m: patch(m, MODEL_BASE[1], False))


_patch()
