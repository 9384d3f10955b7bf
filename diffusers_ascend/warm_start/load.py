"""Loading: a cache directory validated against this process, its packages put before the compiled
blocks of the models being enabled, and torch's caches handed over when first needed."""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..enabled import EnabledModel
from ..errors import warn
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


@dataclass(frozen=True)
class LoadedPackage:
    """One block package `load_ascend_cache` loaded, with what its manifest entry says of it.

    Attributes:
        model: the enabled model it belongs to (the pipeline component name; ``""`` for a model
            enabled on its own).
        block_class: the name of the block class it serves (the manifest's ``"class"``).
        file: its file in the cache (``ascend_aoti_<n>.pt2`` or ``ascend_export_<n>.json``).
        matches: fusion -> pattern replacements in its graph.
        ops_before / ops_after: operator calls in its graph before and after rewriting.
        block: the loaded package: an `AotBlock`, or an `EagerBlock` from an ``executor="eager"``
            cache.
    """

    model: str
    block_class: str
    file: str
    matches: dict[str, int]
    ops_before: int
    ops_after: int
    block: Any


@dataclass(frozen=True)
class LoadedCache:
    """What `load_ascend_cache` loaded from a cache made for this process.

    Attributes:
        source: the local directory or Hub repo id it was read from.
        artifacts: the names of the files read (each verified against the manifest's sha256).
        blocks: the block packages loaded (one that failed to load is left out, with a warning).
        caches: torch's compile caches, handed to torch when first needed (already handed over
            when no package was loaded); None for an eager cache.
    """

    source: str
    artifacts: tuple[str, ...]
    blocks: tuple[LoadedPackage, ...]
    caches: TorchCaches | None


def load_ascend_cache(source, cfg, *, trust_remote_artifacts: bool = False, **hub_kwargs) -> LoadedCache | None:
    """Validates the artifacts at `source` for `cfg`, loads its block packages and hands the rest to
    torch's caches (see `TorchCaches`).

    Args:
        source: a local directory written by `save_ascend_cache`, or a Hub repo id.
        cfg: the `AscendConfig` the model is about to be enabled with.
        trust_remote_artifacts: required for a Hub repo id: the artifacts hold compiled code
            that runs in this process.
        **hub_kwargs: ``revision``, ``cache_dir``, ``local_files_only``, ``token``, ``subfolder``.

    Returns:
        a `LoadedCache`: the loaded block packages and torch's caches; or None when the manifest
        was made for another process (with a warning naming each difference: compilation
        proceeds normally).

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
        return (
            manifest,
            diffs,
            {
                name: read_verified(resolve(source, name, **hub_kwargs), entry)
                for name, entry in manifest["files"].items()
            },
        )

    if is_remote(source):
        manifest, diffs, blobs = read()
    else:  # a save may swap the directory meanwhile: read one save's files
        manifest, diffs, blobs = read_one_save(os.path.join(source, hub_kwargs.get("subfolder") or ""), read)
    if blobs is None:
        warn(
            f"the compile artifacts at {source!r} were made for another setup "
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
    return LoadedCache(os.fspath(source), tuple(sorted(blobs)), tuple(blocks), caches)


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

                warn(
                    f"torch did not take the compile caches of {self.source!r} "
                    f"({describe_failure(e)}); compiling without them.",
                    stacklevel=2,
                )


def _load_packages(entries: list[dict[str, Any]], blobs: dict[str, bytes], source) -> list[LoadedPackage]:
    """Loads each block package from a private copy of its verified bytes. One that fails to load is
    left out with a warning (its class compiles normally); one bound to another entry is a
    ValueError: the manifest was edited, and nothing is loaded."""
    from ..compilation.backend import describe_failure

    out = []
    for entry in entries:
        try:
            block = _load_package(entry, blobs[entry["file"]])
        except PackageMismatchError as e:
            raise ValueError(
                f"{entry['file']} at {source!r}, the package of {entry['class']}: {e} (tampered?): nothing was loaded."
            ) from None
        except Exception as e:  # noqa: BLE001 - the JIT caches still serve this class
            warn(
                f"the package of {entry['class']} at {source!r} did not load "
                f"({describe_failure(e)}); it compiles normally.",
                stacklevel=4,
            )
            continue
        out.append(
            LoadedPackage(
                entry["model"],
                entry["class"],
                entry["file"],
                entry["matches"],
                entry["ops_before"],
                entry["ops_after"],
                block,
            )
        )
    return out


def _load_package(entry: dict[str, Any], data: bytes) -> AotBlock:
    if entry["file"].endswith(".json"):  # an eager package: read as data, never written to disk
        from .eager import EagerBlock

        return EagerBlock.read(data, entry["signature"], entry["state"], entry["outputs"])
    with temporary_file(data, suffix=".pt2") as path:
        return AotBlock.load(path, entry["signature"], entry["state"], entry["outputs"])


def install_packages(
    models: dict[str, EnabledModel], blocks: Sequence[LoadedPackage], caches: TorchCaches | None
) -> None:
    """Puts each loaded package (`LoadedCache.blocks`) before the compiled path of its
    model's block class and lists it in the model's report; the backends hand `caches` to torch
    before their first compile."""
    for m in models.values():
        if m.backend is not None:
            m.backend.deferred_caches = caches
    for entry in blocks:
        m = models.get(entry.model)
        if m is None or m.backend is None:
            continue
        block = entry.block
        m.aot_blocks.setdefault(entry.block_class, []).append(block)
        # Saving again from this process packages this signature again (from a block of the class).
        instance = next((c for c in m.compiled if type(c).__name__ == entry.block_class), None)
        recorded = m.signatures.setdefault(entry.block_class, [])
        if instance is not None and m.record_signatures and all(block.signature != s for s, _ in recorded):
            recorded.append((block.signature, weakref.ref(instance)))
        eager = hasattr(block, "attach")
        name = f"{entry.block_class}:{'export' if eager else 'aoti'}"
        report = m.backend.report
        listed = [i for i, g in enumerate(report.graphs) if g.package == entry.file and g.name == name]
        if listed:  # a backend reused from an earlier enable lists it already (moved last: see `attach`)
            report.graphs.append(report.graphs.pop(listed[0]))
        else:
            report.add_graph(
                name,
                entry.matches,
                entry.ops_before,
                entry.ops_after,
                executor="eager" if eager else "aoti",
                package=entry.file,
                training=False,
                dynamic=False,
            )
        if eager:
            block.attach(m.backend)


def count_packages(models: dict[str, EnabledModel]) -> dict[str, int]:
    """`package_counters` of these models."""
    blocks = [b for m in models.values() for v in m.aot_blocks.values() for b in v]
    return {
        "packages": len(blocks),
        "calls": sum(b.hits for b in blocks),
        "passed_on": sum(m.packages_passed_on for m in models.values()),
    }


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
