"""The self-check verdict cache: a process skips the pattern self-check another process passed.

`AscendBackend.ensure_verified` checks torch's APIs, registers every pattern and proves each one
replaces its own form: seconds of tracing in every process, with the same result for the same
torch build and pattern code. A pass writes a verdict file named by the sha256 of everything the
result depends on; a later process that finds it skips the check, and its patterns are registered
when a graph first needs them (`FusionPass.pattern_matcher_passes`), from the search graphs the
first process traced (`pretraced.py`, under ``patterns/`` in the same directory). Any change of those inputs is
another name, so a torch that breaks a pattern is always checked again.

The key: torch's version and git revision, Python's version, the machine architecture, the
fusion set and the source of every pass, of the pass machinery (`FusionPassManager.uuid`), of
`_compat` and of the ``ascend_kernels`` op definitions (their fake implementations decide
what matches). The directory: ``$DIFFUSERS_ASCEND_VERDICT_DIR``, else
``$XDG_CACHE_HOME/diffusers_ascend/verdicts`` (``~/.cache`` by default); the variable set to an
empty string turns the cache off. A verdict file holds its own key, checked when read; it is
written atomically (a reader never sees half a file), and a directory that cannot be written
only means the next process checks again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import platform
import secrets
import sys

import torch

ENV = "DIFFUSERS_ASCEND_VERDICT_DIR"


def verdict_dir() -> str | None:
    """Where verdicts live, or None when the cache is turned off."""
    configured = os.environ.get(ENV)
    if configured is not None:
        return configured or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "diffusers_ascend", "verdicts")


def engine_key(*parts: str) -> str:
    """sha256 of `parts` and of what every result cached here depends on: torch's version and git
    revision, Python's version, the machine, and the source of `_compat` and of the
    ``ascend_kernels`` op definitions (their fake implementations decide what matches)."""
    import ascend_kernels.ops  # noqa: F401  (all op definitions loaded: the key never depends on import order)

    from .. import _compat

    h = hashlib.sha256()
    for part in (
        torch.__version__,
        str(getattr(torch.version, "git_version", "")),
        sys.version,
        platform.machine(),
        *parts,
    ):
        h.update(part.encode())
        h.update(b"\0")
    modules = [_compat] + sorted(
        (m for n, m in list(sys.modules.items()) if n == "ascend_kernels.ops" or n.startswith("ascend_kernels.ops.")),
        key=lambda m: m.__name__,
    )
    for module in modules:
        h.update(module.__name__.encode())
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()


def verdict_key(manager, fusions_checked: bool) -> str:
    """sha256 of everything the self-check of `manager` (a `FusionPassManager`) depends on."""
    return engine_key(str(fusions_checked), manager.uuid())


def cache_path(key: str, *subdir: str) -> str | None:
    """``<verdict dir>/<subdir...>/<key>.json``, or None when the cache is turned off."""
    directory = verdict_dir()
    return None if directory is None else os.path.join(directory, *subdir, f"{key}.json")


def write_json(path: str, data: dict) -> bool:
    """Writes `data` to `path` atomically (a reader never sees half a file); silently not where the
    directory cannot be written (the next process then computes again). Returns whether it wrote."""
    return write_text(path, json.dumps(data, separators=(",", ":")))


def write_text(path: str, text: str) -> bool:
    """Writes `text` to `path` atomically, as `write_json`; returns whether it wrote."""
    tmp = f"{path}.tmp-{secrets.token_hex(8)}"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_digest(key: str, kind: str, digest: str) -> None:
    """Records the sha256 of the `kind` file of `key` this process wrote (``<verdict
    dir>/digests/<kind>-<key>.json``): a reader uses that file only while its bytes still have it."""
    path = cache_path(f"{kind}-{key}", "digests")
    if path is not None:
        write_json(path, {"key": key, "kind": kind, "sha256": digest})


def recorded_digest(key: str, kind: str) -> str | None:
    """The sha256 `record_digest` recorded for the `kind` file of `key`, or None (none, or unreadable)."""
    data = _read_json(cache_path(f"{kind}-{key}", "digests"))
    if data is None or data.get("key") != key or data.get("kind") != kind:
        return None
    digest = data.get("sha256")
    return digest if isinstance(digest, str) else None


def forget_digest(key: str, kind: str) -> None:
    path = cache_path(f"{kind}-{key}", "digests")
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def _path(key: str) -> str | None:
    return cache_path(key)


def passed_before(key: str) -> bool:
    """Whether a process on this machine passed the self-check of `key`."""
    data = _read_json(_path(key))
    return data is not None and data.get("key") == key and data.get("torch") == torch.__version__


def _read_json(path: str | None) -> dict | None:
    """The JSON object at `path`, or None (no path, no file, unreadable, not an object)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def record_pass(key: str) -> None:
    """Records that the self-check of `key` passed (atomically; silently not where it cannot be written)."""
    path = _path(key)
    if path is not None:
        write_json(path, {"key": key, "torch": torch.__version__})
