"""Loading: a cache directory validated against this process, its packages put before the compiled
blocks of the models being enabled, and torch's caches handed over when first needed."""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any

import torch

from ..integration.state import EnabledModel
from .kernels import check_kernels, install_kernels
from .manifest import (
    ARTIFACTS_NAME,
    EAGER_MECHANISM,
    FORMAT,
    KERNELS_NAME,
    KEY_FIELDS,
    MANIFEST_NAME,
    mismatches,
    read_manifest,
)
from .packages import AotBlock, PackageMismatchError, temporary_file
from .store import is_remote, local_source, read_one_save, read_verified, resolve, trusted_opt_in


def load_ascend_cache(source, cfg, *, trust_remote_artifacts: bool = False, **hub_kwargs) -> dict[str, Any] | None:
    """Validates the artifacts at `source` for `cfg`, loads its block packages and hands the rest to
    torch's caches (see `TorchCaches`).

    Args:
        source: a local directory written by `save_ascend_cache`, or a Hub repo id.
        cfg: the `AscendConfig` the model is about to be enabled with.
        trust_remote_artifacts: required for a Hub repo id: the artifacts hold compiled code
            that runs in this process.
        **hub_kwargs: ``revision``, ``cache_dir``, ``local_files_only``, ``token``, ``subfolder``.

    Returns:
        ``{"source", "artifacts", "blocks", "caches"}``: the loaded block packages (`AotBlock` or,
        from an ``executor="eager"`` cache, `EagerBlock` entries) and the `TorchCaches` (already
        handed to torch unless packages were loaded; None for an eager cache); or
        None when the manifest was made for another process (with a warning naming each
        difference: compilation proceeds normally).

    Raises:
        ValueError: a remote source without `trust_remote_artifacts`, a malformed manifest, or an
            artifact whose sha256 differs from the manifest. Nothing is loaded or written then.
        AscendConfigNotFoundError: no manifest at `source`.

    >>> load_ascend_cache("/nonexistent", None)  # doctest: +SKIP
    """
    from ..compilation import _compat

    trusted = trusted_opt_in(trust_remote_artifacts)
    source = local_source(source)
    if is_remote(source) and not trusted:
        raise ValueError(
            f"{source!r} is not a local directory, so it names a Hub repo: refusing to load compile artifacts from it "
            "without trust_remote_artifacts=True: they contain compiled code that runs "
            "in this process. Pass trust_remote_artifacts=True if you trust the repo (like trust_remote_code), or "
            "download and inspect them, then pass the local directory."
        )

    def read() -> tuple[dict[str, Any], list[str], dict[str, bytes] | None]:
        manifest = read_manifest(resolve(source, MANIFEST_NAME, **hub_kwargs))
        diffs = mismatches(manifest, cfg)
        eager = manifest.get("mechanism") == EAGER_MECHANISM
        if not eager and _compat.cache_artifacts_api() is None:
            diffs.append(f"torch {torch.__version__} cannot load portable compile caches (torch 2.7+)")
        if diffs:  # made for another setup: no artifact is read
            return manifest, diffs, None
        return manifest, diffs, {name: read_verified(resolve(source, name, **hub_kwargs), entry)
                                 for name, entry in manifest["files"].items()}

    if is_remote(source):
        manifest, diffs, blobs = read()
    else:  # a save may swap the directory meanwhile: read one save's files
        manifest, diffs, blobs = read_one_save(os.path.join(source, hub_kwargs.get("subfolder") or ""), read)
    if blobs is None:
        warnings.warn(
            f"diffusers_ascend: the compile artifacts at {source!r} were made for another setup "
            f"({'; '.join(diffs)}); ignoring them and compiling normally.",
            stacklevel=3,
        )
        return None
    caches = None  # eager packages: nothing of torch's caches to hand over
    if manifest.get("mechanism") != EAGER_MECHANISM:
        members = check_kernels(blobs[KERNELS_NAME]) if KERNELS_NAME in blobs else []
        caches = TorchCaches(blobs[ARTIFACTS_NAME], blobs.get(KERNELS_NAME), members, source)
    blocks = _load_packages(manifest["blocks"], blobs, source)
    if not blocks and caches is not None:
        caches()  # no package takes any call: every graph compiles, from these caches
    return {"source": os.fspath(source), "artifacts": sorted(blobs), "blocks": blocks, "caches": caches}


class TorchCaches:
    """The validated mega-cache and kernel archive of a cache, handed to torch when first needed: at
    enable when no package was loaded, else before the first graph a backend compiles, or at a save.
    A process whose packages take every call never pays the hand-over.

    Calling it again does nothing; a failure is a warning (the graphs compile without the caches).
    """

    def __init__(self, artifacts: bytes, kernels: bytes | None, members: list, source) -> None:
        self.artifacts, self.kernels, self.members, self.source = artifacts, kernels, members, source
        self.done = False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        from ..compilation import _compat

        # Possibly inside a compile: torch's cache loaders must not see dynamo's fake mode.
        with _compat.unset_fake_mode(), _compat.no_tracing_context():
            try:
                _compat.cache_artifacts_api()[1](self.artifacts)
                if self.members:
                    install_kernels(self.kernels, self.members, _compat.inductor_cache_dir())
            except Exception as e:  # noqa: BLE001 - the graphs still compile, without the caches
                from ..compilation.backend import describe_failure

                warnings.warn(f"diffusers_ascend: torch did not take the compile caches of {self.source!r} "
                              f"({describe_failure(e)}); compiling without them.", stacklevel=2)


def _load_packages(entries: list[dict[str, Any]], blobs: dict[str, bytes], source) -> list[dict[str, Any]]:
    """Loads each block package from a private copy of its verified bytes. One that fails to load is
    left out with a warning (its class compiles normally); one bound to another entry is a
    ValueError: the manifest was edited, and nothing is loaded."""
    from ..compilation.backend import describe_failure

    out = []
    for entry in entries:
        try:
            block = _load_package(entry, blobs[entry["file"]])
        except PackageMismatchError as e:
            raise ValueError(f"{entry['file']} at {source!r}, the package of {entry['class']}: {e} "
                             "(tampered?): nothing was loaded.") from None
        except Exception as e:  # noqa: BLE001 - the JIT caches still serve this class
            warnings.warn(f"diffusers_ascend: the package of {entry['class']} at {source!r} did not load "
                          f"({describe_failure(e)}); it compiles normally.", stacklevel=4)
            continue
        out.append({**{k: entry[k] for k in ("model", "class", "file", "matches", "ops_before", "ops_after")},
                    "block": block})
    return out


def _load_package(entry: dict[str, Any], data: bytes) -> AotBlock:
    if entry["file"].endswith(".json"):  # an eager package: read as data, never written to disk
        from .eager import EagerBlock

        return EagerBlock.read(data, entry["signature"], entry["state"], entry["outputs"])
    with temporary_file(data, suffix=".pt2") as path:
        return AotBlock.load(path, entry["signature"], entry["state"], entry["outputs"])


def install_packages(models: dict[str, EnabledModel], blocks: list[dict[str, Any]], caches: TorchCaches) -> None:
    """Puts each loaded package (`load_ascend_cache`'s ``"blocks"``) before the compiled path of its
    model's block class and lists it in the model's report; the backends hand `caches` to torch
    before their first compile."""
    for m in models.values():
        if m.backend is not None:
            m.backend.deferred_caches = caches
    for entry in blocks:
        m = models.get(entry["model"])
        if m is None or m.backend is None:
            continue
        block = entry["block"]
        m.aot_blocks.setdefault(entry["class"], []).append(block)
        # Saving again from this process packages this signature again (from a block of the class).
        instance = next((c for c in m.compiled if type(c).__name__ == entry["class"]), None)
        recorded = m.signatures.setdefault(entry["class"], [])
        if instance is not None and m.record_signatures and all(block.signature != s for s, _ in recorded):
            recorded.append((block.signature, weakref.ref(instance)))
        eager = hasattr(block, "attach")
        name = f"{entry['class']}:{'export' if eager else 'aoti'}"
        report = m.backend.report
        listed = [i for i, g in enumerate(report.graphs) if g.get("package") == entry["file"] and g["name"] == name]
        if listed:  # a backend reused from an earlier enable lists it already (moved last: see `attach`)
            report.graphs.append(report.graphs.pop(listed[0]))
        else:
            report.add_graph(name, entry["matches"], entry["ops_before"], entry["ops_after"],
                             executor="eager" if eager else "aoti", package=entry["file"], training=False,
                             dynamic=False)
        if eager:
            block.attach(m.backend)


def count_packages(models: dict[str, EnabledModel]) -> dict[str, int]:
    """`package_counters` of these models."""
    blocks = [b for m in models.values() for v in m.aot_blocks.values() for b in v]
    return {"packages": len(blocks), "calls": sum(b.hits for b in blocks),
            "passed_on": sum(m.packages_passed_on for m in models.values())}


def cache_info(source, cfg=None, **hub_kwargs) -> dict[str, Any]:
    """The manifest at `source` (a local directory, its manifest file, or a Hub repo id; only the
    JSON is downloaded), plus ``"matches_here"`` and ``"mismatches"`` against `cfg` (the saved
    config hash is not checked without `cfg`).

    Raises:
        ValueError: the manifest is malformed (names the problem).
        AscendConfigNotFoundError: no manifest at `source`.

    >>> cache_info("/nonexistent")  # doctest: +SKIP
    """
    from ..config import AscendConfig

    manifest = read_manifest(resolve(local_source(source), MANIFEST_NAME, **hub_kwargs))
    given = cfg is not None
    if not given and manifest["format"] == FORMAT:
        try:
            cfg = AscendConfig(executor=manifest["executor"])
        except (TypeError, ValueError):  # an executor this version does not know: reported as a mismatch
            cfg = AscendConfig(executor="inductor")
    diffs = mismatches(manifest, cfg)
    if not given:
        diffs = [d for d in diffs if not d.startswith((KEY_FIELDS["config_hash"], KEY_FIELDS["pass_hash"]))]
    return {**manifest, "matches_here": not diffs, "mismatches": diffs}
