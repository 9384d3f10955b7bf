"""Saving: the compile results of the enabled models of a pipeline or model, as one cache directory."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

from ..enabled import EnabledModel
from ..errors import warn
from .kernels import isa_probes, pack_kernels
from .manifest import ARTIFACTS_NAME, KERNELS_NAME, MECHANISM, expected_keys, new_manifest
from .packages import build_package
from .store import commit, save_target


def save_cache(models: dict[str, EnabledModel], save_directory: str | os.PathLike, owner: str) -> dict[str, Any]:
    """Writes the compile artifacts of `models` (the records of the enabled models of `owner`, a
    class name for messages, by component name) to `save_directory`; see `save_ascend_cache`. Returns the manifest written."""
    from ..compilation import _compat

    target = save_target(save_directory)  # before any compile: a file in the way fails now, not after it
    if not models:
        raise ValueError(f"{owner} is not enabled: call enable_ascend_compile(..., executor='inductor') first.")
    cfg = next(iter(models.values())).config
    keys = expected_keys(cfg)
    if cfg.compile == "none":
        raise ValueError(
            "compile='none' compiles nothing, so there is nothing to save; use compile='blocks' or 'model'."
        )
    if keys["executor"] == "eager":
        from .eager import save_eager_cache

        return save_eager_cache(models, target, owner, keys)
    backends = [m.backend for m in models.values() if m.backend is not None]
    for backend in backends:  # caches loaded lazily must be in torch before its artifacts are collected
        if backend.deferred_caches is not None:
            backend.deferred_caches()
    if not any(b.report.graphs_compiled for b in backends):
        raise ValueError(f"{owner} has compiled no graph yet: call it once, then save.")
    api = _compat.cache_artifacts_api()
    if api is None:
        raise ValueError(
            f"torch {torch.__version__} has no portable compile cache (torch.compiler.save_cache_artifacts, "
            "torch 2.7+): nothing can be saved on it."
        )
    saved = api[0]()
    if saved is None or not saved[0]:
        raise ValueError(
            "torch.compiler.save_cache_artifacts() returned nothing: Inductor's caches were off or bypassed for "
            "these graphs (TORCHINDUCTOR_FX_GRAPH_CACHE=0?), so there is nothing to save."
        )
    blobs = {ARTIFACTS_NAME: saved[0]}
    root = _compat.inductor_cache_dir()
    kernels = pack_kernels(_compat.compiled_cpp_libraries() + isa_probes(root), root)
    if kernels is not None:
        blobs[KERNELS_NAME] = kernels
    # After the kernels are collected: packaging builds libraries of its own, inside the package.
    blocks = build_packages(models, blobs)
    manifest = new_manifest(MECHANISM, keys, blobs, blocks)
    commit(target, blobs, manifest)
    return manifest


def build_packages(models: dict[str, EnabledModel], blobs: dict[str, bytes]) -> list[dict[str, Any]]:
    """One block package per recorded call signature, added to `blobs`; returns their manifest
    entries. A signature that cannot be packaged is left to torch's caches, with a warning."""
    from ..compilation import _compat
    from ..compilation.backend import describe_failure

    entries: list[dict[str, Any]] = []
    for model_name, m in models.items():
        if m.backend is None or not m.signatures:
            continue
        if _compat.aoti_api() is None:
            warn(
                f"torch {torch.__version__} has no AOTInductor packaging: the cache holds torch's compile caches only.",
                stacklevel=3,
            )
            return entries
        m.backend.ensure_verified()
        for label, signature, ref in [(k, sig, ref) for k, v in sorted(m.signatures.items()) for sig, ref in v]:
            block = ref()
            if block is None:
                continue
            name = f"ascend_aoti_{len(entries)}.pt2"
            with tempfile.TemporaryDirectory(prefix="ascend-aoti-") as tmp:
                path = os.path.join(tmp, name)
                try:
                    info = build_package(block, signature, m.backend.manager, path)
                except Exception as e:  # noqa: BLE001 - any failure leaves the class to the JIT caches
                    warn(
                        f"{model_name or m.model_class}.{label} was not packaged "
                        f"ahead of time ({describe_failure(e)}); a process loading this cache compiles it "
                        "from torch's caches.",
                        stacklevel=3,
                    )
                    continue
                with open(path, "rb") as f:
                    blobs[name] = f.read()
            entries.append(
                {"model": model_name, "class": label, "file": name, "signature": signature.to_json(), **info}
            )
    return entries
