"""The ``ascend_kernels`` custom ops: one module per op (schema, native impl, fake, autograd).

Every public module here is imported, which registers its ops: a new op is a new file whose
native provider (``register_provider(Provider("<op>", "native", ...))``) defines the op. The
model-family adapters are found the same way (`diffusers_ascend.adapters.registry`).
"""

import importlib as _importlib
import pkgutil as _pkgutil

for _module in _pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_module.name}")
