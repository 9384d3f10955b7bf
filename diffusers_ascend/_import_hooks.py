"""Run a callback when a module finishes importing, without importing it ourselves.

`import diffusers_ascend` must add methods to `DiffusionPipeline` and `ModelMixin`, but importing
those classes pulls in transformers, peft and accelerate (about 3 s on 2 cores). So the patch is
applied the moment diffusers defines them: now, if the user already imported them, else when the
defining module's `exec_module` returns (the post-import-hook technique of `wrapt`, PEP 369).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable

_lock = threading.Lock()
_hooks: dict[str, list[Callable]] = {}


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of a hooked module found by the finders after it."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_hook(module):
            exec_module(module)
            _fire(fullname, module)

        # Source loaders are one instance per module file, so this wraps only `fullname`.
        loader.exec_module = exec_then_hook
        return spec


_finder = _PostImportFinder()


def _fire(name: str, module) -> None:
    with _lock:
        callbacks = _hooks.pop(name, [])
    for cb in callbacks:
        cb(module)


def when_imported(name: str, callback: Callable) -> None:
    """Calls `callback(module)` once `name` is imported: at once if it already is, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    with _lock:
        _hooks.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
