"""Warm start: the compile results of an enabled model travel with it, like its `AscendConfig`.

`save_ascend_cache(obj, path)` writes, after at least one call of an enabled pipeline or model:

- ``ascend_cache.json``: the manifest. What the artifacts were built for (torch version,
  platform, machine, device capability, Python, diffusers-ascend version,
  `AscendConfig.cache_key()`, the pass source hash `FusionPassManager.uuid()`, the executor),
  the sha256 of every artifact file, and one entry per block package.
- ``ascend_aoti_<n>.pt2`` (``compile="blocks"``): one AOTInductor package per compiled block
  class and call signature (`compilation/aot_blocks.py`). A warm process runs a block call with
  that signature through it: no dynamo trace, no fusion pass, no Inductor compile.
- ``ascend_inductor_cache.bin``: torch's own portable compile cache
  (`torch.compiler.save_cache_artifacts`: Inductor's FX graph cache and the AOTAutograd cache),
  which serves every other call.
- ``ascend_cpp_kernels.tar`` (CPU only): the C++ kernel libraries Inductor built, which the
  portable cache leaves out and a fresh process would rebuild with the host compiler.

`enable_ascend_compile(obj, ..., cache=path_or_repo_id)` validates the manifest against the
running process before it reads any artifact: a mismatch (another torch, platform, CPU, config or
pass source) is a warning and a normal compile. A manifest that is not what `save_ascend_cache`
writes, or an artifact whose sha256 differs from the manifest, is a `ValueError` and nothing is
loaded. Artifacts from the Hub need ``trust_remote_artifacts=True`` (the bool; anything else is a
TypeError): they hold compiled code that runs in this process.

A save is all or nothing: the cache is written into a staging directory beside the target and
swapped in whole, under a lock for concurrent savers, so a save that fails, is killed or races
another leaves a complete cache, old or new (docs/warm-start.md, "Saving: all or nothing").

``executor="eager"`` (the NPU default) produces no compiled artifact: `save_ascend_cache`
refuses it with that reason. What each part saves a warm process: docs/warm-start.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform as _platform
import re
import secrets
import shutil
import stat
import sys
import tarfile
import tempfile
import warnings
from typing import Any

import torch

__all__ = [
    "ARTIFACTS_NAME",
    "TorchCaches",
    "KERNELS_NAME",
    "MANIFEST_NAME",
    "cache_info",
    "load_ascend_cache",
    "package_counters",
    "save_ascend_cache",
]

MANIFEST_NAME = "ascend_cache.json"
ARTIFACTS_NAME = "ascend_inductor_cache.bin"
KERNELS_NAME = "ascend_cpp_kernels.tar"
FORMAT = 2
MECHANISM = "inductor-mega-cache+aoti-blocks"
_PACKAGE_NAME = re.compile(r"^ascend_aoti_[0-9]{1,4}\.pt2$")
# What must equal the running process for the artifacts to be used (manifest key -> meaning).
KEY_FIELDS = {
    "torch": "torch version",
    "platform": "platform",
    "machine": "machine architecture",
    "device": "device capability (AOTInductor packages hold code for it)",
    "python": "Python version",
    "diffusers_ascend": "diffusers-ascend version",
    "config_hash": "AscendConfig.cache_key()",
    "pass_hash": "fusion pass source hash (FusionPassManager.uuid())",
    "executor": "executor",
}
_MANIFEST_KEYS = {"format", "mechanism", "files", "blocks", *KEY_FIELDS}
_BLOCK_KEYS = {"model", "class", "file", "signature", "state", "outputs", "matches", "ops_before", "ops_after"}
_FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
# Bounds on what a manifest or kernel archive may claim (far above any real cache: the largest
# files are the block packages, megabytes each for a real DiT; a kernel library is kilobytes).
MAX_ARTIFACT_BYTES = 1 << 40
MAX_KERNEL_BYTES = 1 << 28
MAX_KERNEL_MEMBERS = 1 << 16
_READ_ATTEMPTS = 5  # a load that meets a save swapping the directory reads the new cache


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_keys(cfg) -> dict[str, str]:
    """The manifest keys the running process produces for `cfg` (an `AscendConfig`).

    >>> from diffusers_ascend.config import AscendConfig
    >>> sorted(expected_keys(AscendConfig(executor="inductor")))[:3]
    ['config_hash', 'device', 'diffusers_ascend']
    """
    from . import __version__
    from .compilation.passes import ordered_fusions
    from .compilation.passes.manager import FusionPassManager
    from .platform import current_platform

    plat = current_platform()
    return {
        "torch": torch.__version__,
        "platform": plat,
        "machine": _platform.machine(),
        "device": _device_capability(plat),
        "python": "%d.%d" % sys.version_info[:2],
        "diffusers_ascend": __version__,
        "config_hash": cfg.cache_key(),
        "pass_hash": FusionPassManager(ordered_fusions(cfg.resolved_fusions(plat))).uuid(),
        "executor": cfg.resolved_executor(plat),
    }


def _device_capability(plat: str) -> str:
    """What compiled code is specific to beyond the architecture. Inductor builds CPU code (the
    C++ kernels, AOTInductor packages and their host-side wrappers) with ``-march=native``, so it
    may use any instruction of the building CPU: its ATen capability and a hash of its feature
    flags must both match. On an accelerator, its generation too."""
    parts = [f"cpu:{torch.backends.cpu.get_cpu_capability()}:{_cpu_features()}"]
    if plat == "cuda" and torch.cuda.is_available():
        parts.append("cuda:sm_%d%d" % torch.cuda.get_device_capability())
    elif plat == "npu":
        npu = getattr(torch, "npu", None)
        parts.append(f"npu:{npu.get_device_name() if npu is not None and hasattr(npu, 'get_device_name') else 'unknown'}")
    return ";".join(parts)


def _cpu_features() -> str:
    """A short hash of the CPU's feature flags (Linux ``/proc/cpuinfo``: ``flags`` on x86,
    ``Features`` on Arm), else of the processor name."""
    text = _platform.processor() or _platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    text = " ".join(sorted(value.split()))
                    break
    except OSError:
        pass
    return _sha256(text.encode())[:16]


def _enabled_states(obj) -> list:
    from .mixin import _models

    states = [getattr(m, "_ascend_state", None) for _, m in _models(obj)]
    return [s for s in states if s is not None]


# -- save ------------------------------------------------------------------------------------------
def save_ascend_cache(obj, save_directory: str | os.PathLike) -> dict[str, Any]:
    """Writes the compile artifacts of an enabled, called pipeline or model to `save_directory`.

    Args:
        obj: a pipeline or model enabled with ``executor="inductor"`` (or ``"auto"`` resolving to
            it) whose compiled blocks ran at least once in this process.
        save_directory: a directory (created if missing), replaced whole by the new cache; plain
            files in it that are not the cache's (a model's ``save_pretrained`` output) are
            carried over, a subdirectory is refused.

    Returns:
        The manifest written (a dict).

    Raises:
        ValueError: `obj` is not enabled, has compiled nothing yet, uses the eager executor,
            torch has no portable compile cache (2.6), or `save_directory` is a file or holds a
            subdirectory (checked before anything is compiled). Nothing is written then.
        OSError: writing failed (the previous cache at `save_directory` is left as it was).

    >>> import diffusers_ascend, tempfile
    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> model = diffusers_ascend.enable_ascend_compile(tiny_flux_transformer(), executor="inductor")
    >>> diffusers_ascend.save_ascend_cache(model, tempfile.mkdtemp())  # doctest: +SKIP
    """
    from .compilation import _compat

    target = _save_target(save_directory)  # before any compile: a file in the way fails now, not after it
    states = _enabled_states(obj)
    if not states:
        raise ValueError(f"{type(obj).__name__} is not enabled: call enable_ascend_compile(..., executor='inductor') first.")
    cfg = states[0].config
    keys = expected_keys(cfg)
    if cfg.compile == "none":
        raise ValueError("compile='none' compiles nothing, so there is nothing to save; use compile='blocks' or 'model'.")
    if keys["executor"] != "inductor":
        raise ValueError(
            f"executor={keys['executor']!r} produces no compiled artifact to save: it runs the fused graph op by op, "
            "and dynamo tracing, the aot trace and the fusion passes run in every process (torch has no portable "
            "form of them). Use executor='inductor' to save Inductor's compile results."
        )
    for s in states:  # caches loaded lazily must be in torch before its artifacts are collected
        if s.backend is not None and s.backend.deferred_caches is not None:
            s.backend.deferred_caches()
    if not any(s.backend is not None and s.backend.report.graphs_compiled for s in states):
        raise ValueError(f"{type(obj).__name__} has compiled no graph yet: call it once, then save.")
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
    kernels = _pack_kernels(_compat.compiled_cpp_libraries() + _isa_probes(root), root)
    if kernels is not None:
        blobs[KERNELS_NAME] = kernels
    # After the kernels are collected: packaging builds libraries of its own, inside the package.
    blocks = _build_packages(obj, blobs)
    manifest = {
        "format": FORMAT,
        "mechanism": MECHANISM,
        **keys,
        "files": {name: {"sha256": _sha256(data), "size": len(data)} for name, data in blobs.items()},
        "blocks": blocks,
    }
    _commit(target, blobs, manifest)
    return manifest


def _build_packages(obj, blobs: dict[str, bytes]) -> list[dict[str, Any]]:
    """One AOTInductor package per recorded call signature of a compiled block class
    (`compilation/aot_blocks.py`), added to `blobs`; returns their manifest entries. A signature
    that cannot be packaged is left to torch's caches, with a warning naming the cause."""
    from .compilation import _compat
    from .compilation.aot_blocks import build_package
    from .compilation.backend import describe_failure
    from .mixin import _models

    entries: list[dict[str, Any]] = []
    for model_name, model in _models(obj):
        state = getattr(model, "_ascend_state", None)
        if state is None or not state.signatures:
            continue
        if _compat.aoti_api() is None:
            warnings.warn(f"diffusers_ascend: torch {torch.__version__} has no AOTInductor packaging: the cache holds "
                          "torch's compile caches only.", stacklevel=3)
            return entries
        state.backend.ensure_verified()
        for label, signature, ref in [(k, sig, ref) for k, v in sorted(state.signatures.items()) for sig, ref in v]:
            block = ref()
            if block is None:
                continue
            name = f"ascend_aoti_{len(entries)}.pt2"
            with tempfile.TemporaryDirectory(prefix="ascend-aoti-") as tmp:
                path = os.path.join(tmp, name)
                try:
                    info = build_package(block, signature, state.backend.manager, path)
                except Exception as e:  # noqa: BLE001 - any failure leaves the class to the JIT caches
                    warnings.warn(f"diffusers_ascend: {model_name or type(model).__name__}.{label} was not packaged "
                                  f"ahead of time ({describe_failure(e)}); a process loading this cache compiles it "
                                  "from torch's caches.", stacklevel=3)
                    continue
                with open(path, "rb") as f:
                    blobs[name] = f.read()
            entries.append({"model": model_name, "class": label, "file": name, "signature": signature.to_json(), **info})
    return entries


# -- writing a cache directory: staged, then swapped in whole ---------------------------------------
# A save writes the whole cache into a staging directory beside the target, then swaps it in with
# one rename, under a lock on the parent directory: a reader sees the complete old or the complete
# new cache, never a manifest naming other bytes; a save that fails or is killed leaves the previous
# cache as it was (and a staging directory that the next save of that target removes).
_STAGING = ".{name}.ascend-staging-"
_RETIRED = ".{name}.ascend-old-"
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _save_target(save_directory) -> str:
    """The real path a save writes; checked before any expensive work."""
    if not isinstance(save_directory, (str, os.PathLike)):
        raise TypeError(f"save_directory must be a path, got {type(save_directory).__name__}")
    target = os.path.realpath(os.fspath(save_directory))  # a symlinked directory: swap what it points to
    if os.path.lexists(target) and not os.path.isdir(target):
        raise ValueError(f"cannot save the compile artifacts to {os.fspath(save_directory)!r}: it exists and is not a "
                         "directory (pass a new or existing directory)")
    if os.path.dirname(target) == target:
        raise ValueError(f"cannot save the compile artifacts to {target!r}: a cache directory cannot be a file system root")
    if os.path.isdir(target):
        _foreign_entries(target)
    return target


def _foreign_entries(target: str) -> list[str]:
    """The entries of an existing cache directory that are not the cache's, which a save carries
    into the new directory: plain files and symbolic links only. A subdirectory (a pipeline's
    ``save_pretrained`` layout, a mount point...) is refused: the previous directory is removed
    after the swap, and a save never removes more than files it can carry over."""
    out = []
    for entry in os.scandir(target):
        if _owned(entry.name):
            continue
        if not (entry.is_symlink() or entry.is_file(follow_symlinks=False)):
            raise ValueError(f"cannot save the compile artifacts to {target!r}: it holds {entry.name!r}, which is not a "
                             "file; a save replaces the directory whole, carrying over only plain files (a model's "
                             "save_pretrained output). Save the cache into its own directory.")
        out.append(entry.name)
    return out


def _owned(name: str) -> bool:
    """Whether an entry of a cache directory is the cache's (replaced by a save); anything else in
    the directory (a ``save_pretrained`` output...) is carried over to the new one."""
    return (name in (MANIFEST_NAME, ARTIFACTS_NAME, KERNELS_NAME) or bool(_PACKAGE_NAME.match(name))
            or name.startswith(".tmp-"))  # what an older diffusers-ascend's killed save left


@contextlib.contextmanager
def _directory_lock(parent: str):
    """An exclusive ``flock`` on `parent` (a directory), serializing the saves into it across
    threads and processes; released when the descriptor closes, so a killed saver holds nothing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: saves are not serialized
        yield
        return
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_file(path: str, data: bytes) -> None:
    """Writes a new file, 0666 less the process umask (what ``open`` gives), flushed to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    """Flushes a directory's entries (the renames) to disk, where the system can."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - a system that cannot open a directory (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems cannot sync a directory
        pass
    finally:
        os.close(fd)


def _carry_over(src: str, dst: str) -> None:
    """A file of the previous directory that is not the cache's, in the staging directory: the same
    file (a hard link; a copy where links are not supported), or the same symbolic link."""
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _exchange(a: str, b: str) -> bool:
    """Swaps two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system
    or file system cannot, for the caller to fall back to two renames."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import errno

    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc 2.28+
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def _commit(target: str, blobs: dict[str, bytes], manifest: dict[str, Any]) -> None:
    """Writes `blobs` and `manifest` as the cache directory `target`, all or nothing (see above)."""
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    staging_prefix, retired_prefix = _STAGING.format(name=name), _RETIRED.format(name=name)
    with _directory_lock(parent):
        for entry in os.listdir(parent):  # left by a killed save of this target (every live one holds the lock)
            if entry.startswith((staging_prefix, retired_prefix)):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        staging = os.path.join(parent, staging_prefix + secrets.token_hex(8))
        os.mkdir(staging, 0o777)  # the umask applies, as for any directory the user creates
        try:
            exists = os.path.isdir(target)
            if exists:
                os.chmod(staging, stat.S_IMODE(os.stat(target).st_mode))
                for entry in _foreign_entries(target):  # again, under the lock
                    _carry_over(os.path.join(target, entry), os.path.join(staging, entry))
            for file_name, data in blobs.items():
                _write_file(os.path.join(staging, file_name), data)
            _write_file(os.path.join(staging, MANIFEST_NAME),
                        (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
            _fsync_dir(staging)
            if not exists:
                os.rename(staging, target)
            elif _exchange(staging, target):
                pass  # `staging` now holds the previous cache
            else:  # a moment without `target`: a reader finds no cache (an error), never a mixed one
                retired = os.path.join(parent, retired_prefix + secrets.token_hex(8))
                os.rename(target, retired)
                try:
                    os.rename(staging, target)
                except BaseException:
                    os.rename(retired, target)
                    raise
                staging = retired
            _fsync_dir(parent)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _isa_probes(root: str) -> list[str]:
    """The vector-ISA probe libraries (``cpu_vec_isa``: one tiny build of a fixed source per ISA,
    the first time a process on this machine picks one) Inductor wrote under `root` since this
    process started, which the portable cache does not carry either. A probe is told by its source
    (the ``.cpp`` beside it is torch's probe code), not by its time alone: a kernel library that
    another process wrote into the shared cache meanwhile is not this process's to ship (its own
    are `_compat.compiled_cpp_libraries`). Linux: the start time is the ctime of ``/proc/<pid>``."""
    from .compilation import _compat

    probe = _compat.vec_isa_probe_source()
    try:
        start = os.stat(f"/proc/{os.getpid()}").st_ctime
    except OSError:
        return []
    if probe is None:
        return []
    out = []
    for sub in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        d = os.path.join(root, sub)
        if len(sub) != 2 or not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if not name.endswith(".so") or os.path.getmtime(path) < start - 1:
                continue
            try:
                with open(path[:-len(".so")] + ".cpp", encoding="utf-8") as f:
                    if f.read(len(probe) + 1) == probe:
                        out.append(path)
            except (OSError, UnicodeDecodeError):
                continue
    return out


def _pack_kernels(paths: list[str], root: str) -> bytes | None:
    """A tar of the libraries under `root`, named by their path relative to it (None if none)."""
    root = os.path.realpath(root)
    buf = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(set(paths)):
            real = os.path.realpath(path)
            if not real.startswith(root + os.sep) or not os.path.isfile(real):
                continue  # built outside the cache root (an AOTInductor output_path...): not ours to ship
            rel = os.path.relpath(real, root)
            info = tar.gettarinfo(real, arcname=rel.replace(os.sep, "/"))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(real, "rb") as f:
                tar.addfile(info, f)
            count += 1
    return buf.getvalue() if count else None


# -- load ------------------------------------------------------------------------------------------
def _is_remote(source) -> bool:
    return isinstance(source, str) and not os.path.exists(source)


def _local_source(source):
    """`source` with a path to the manifest itself (``DIR/ascend_cache.json``) taken as its
    directory; any other local file is refused, naming what is expected."""
    if isinstance(source, (str, os.PathLike)) and os.path.isfile(source):
        path = os.fspath(source)
        if os.path.basename(path) != MANIFEST_NAME:
            raise ValueError(f"{path!r} is a file: pass the directory that save_ascend_cache wrote (holding "
                             f"{MANIFEST_NAME}), the manifest itself, or a Hub repo id")
        return os.path.dirname(path) or "."
    return source


def trusted_opt_in(value) -> bool:
    """``trust_remote_artifacts`` as given: only the bool True opts in; False and None do not, and
    anything else (a string such as ``"false"``, an int) is refused rather than read as truthy.

    >>> trusted_opt_in(True), trusted_opt_in(None)
    (True, False)
    >>> trusted_opt_in("false")
    Traceback (most recent call last):
    ...
    TypeError: trust_remote_artifacts must be True or False (or None), got 'false' (str)
    """
    if value is True:
        return True
    if value is False or value is None:
        return False
    raise TypeError(f"trust_remote_artifacts must be True or False (or None), got {value!r} "
                    f"({type(value).__name__})")


def _resolve(source, name: str, **hub_kwargs) -> str:
    from .hub import resolve_config_file

    return resolve_config_file(source, name, **hub_kwargs)


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest at `path`, checked to be exactly what `save_ascend_cache` writes.

    A manifest of an older format (1: no block packages, no ``device`` key) is returned as read,
    for `mismatches` to report; nothing of it is loaded.

    Raises:
        ValueError: not a JSON object of the expected keys and types (names the problem).
    """
    from .config import read_json_object

    data = read_json_object(path, what="an ascend cache manifest")
    where = f"{path} is not a valid {MANIFEST_NAME} (tampered or corrupt?)"
    if data.get("format") == 1 and isinstance(data.get("diffusers_ascend"), str):
        # An older diffusers-ascend wrote it: reported as a mismatch, never loaded; only the two
        # keys that report reads are kept.
        return {"format": 1, "diffusers_ascend": data["diffusers_ascend"]}
    if set(data) != _MANIFEST_KEYS:
        missing, extra = sorted(_MANIFEST_KEYS - set(data)), sorted(set(data) - _MANIFEST_KEYS)
        raise ValueError(f"{where}: missing keys {missing}, unknown keys {extra}")
    if data["format"] != FORMAT or data["mechanism"] != MECHANISM:
        raise ValueError(f"{where}: format {data['format']!r} / mechanism {data['mechanism']!r}; "
                         f"this diffusers-ascend reads format {FORMAT} / {MECHANISM!r}")
    for key in KEY_FIELDS:
        if not isinstance(data[key], str):
            raise ValueError(f"{where}: {key!r} must be a string, got {type(data[key]).__name__}")
    files, blocks = data["files"], data["blocks"]
    if not isinstance(blocks, list):
        raise ValueError(f"{where}: 'blocks' must be a list")
    for i, block in enumerate(blocks):
        _check_block_entry(block, where=f"{where}: blocks[{i}]")
    packages = {b["file"] for b in blocks}
    allowed = {ARTIFACTS_NAME, KERNELS_NAME} | packages
    if (not isinstance(files, dict) or ARTIFACTS_NAME not in files or not set(files) <= allowed
            or not packages <= set(files) or len(packages) != len(blocks)):
        raise ValueError(f"{where}: 'files' must name {ARTIFACTS_NAME!r}, optionally {KERNELS_NAME!r}, and each "
                         "block's package exactly once")
    for name, entry in files.items():
        if (not isinstance(entry, dict) or set(entry) != {"sha256", "size"} or not isinstance(entry["sha256"], str)
                or not _SHA.match(entry["sha256"]) or type(entry["size"]) is not int
                or not 0 <= entry["size"] <= MAX_ARTIFACT_BYTES):
            raise ValueError(f"{where}: files[{name!r}] must be {{'sha256': <64 hex digits>, 'size': <bytes, at most "
                             f"{MAX_ARTIFACT_BYTES}>}}")
    return data


def _check_block_entry(block: Any, where: str) -> None:
    """A ``blocks`` entry: the keys `_build_packages` writes, each of its type (the signature and
    the output spec are parsed, as data, by `aot_blocks`)."""
    from .compilation.aot_blocks import CallSignature, parse_outputs, parse_state

    if not isinstance(block, dict) or set(block) != _BLOCK_KEYS:
        raise ValueError(f"{where} must have exactly the keys {sorted(_BLOCK_KEYS)}")
    if not all(isinstance(block[k], str) for k in ("model", "class", "file", "outputs")):
        raise ValueError(f"{where}: 'model', 'class', 'file' and 'outputs' must be strings")
    if not _PACKAGE_NAME.match(block["file"]):
        raise ValueError(f"{where}: package file {block['file']!r} is not named ascend_aoti_<n>.pt2")
    matches = block["matches"]
    if not isinstance(matches, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in matches.items()):
        raise ValueError(f"{where}: 'matches' must map fusion names to counts")
    if not all(type(block[k]) is int and block[k] >= 0 for k in ("ops_before", "ops_after")):
        raise ValueError(f"{where}: 'ops_before' and 'ops_after' must be counts")
    try:
        CallSignature.from_json(block["signature"])
        parse_state(block["state"])
        parse_outputs(block["outputs"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def mismatches(manifest: dict[str, Any], cfg) -> list[str]:
    """``"<meaning>: saved X, here Y"`` for each key of `manifest` that differs from this process."""
    if manifest.get("format") != FORMAT:
        return [f"manifest format: saved {manifest.get('format')!r} by diffusers-ascend "
                f"{manifest.get('diffusers_ascend')!r}, here {FORMAT}"]
    here = expected_keys(cfg)
    return [f"{KEY_FIELDS[k]}: saved {manifest[k]!r}, here {here[k]!r}" for k in KEY_FIELDS if manifest[k] != here[k]]


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
        ``{"source", "artifacts", "blocks", "caches"}``: the loaded block packages (`AotBlock`
        entries) and the `TorchCaches` (already handed to torch unless packages were loaded); or
        None when the manifest was made for another process (with a warning naming each
        difference: compilation proceeds normally).

    Raises:
        ValueError: a remote source without `trust_remote_artifacts`, a malformed manifest, or an
            artifact whose sha256 differs from the manifest. Nothing is loaded or written then.
        AscendConfigNotFoundError: no manifest at `source`.
    """
    from .compilation import _compat

    trusted = trusted_opt_in(trust_remote_artifacts)
    source = _local_source(source)
    if _is_remote(source) and not trusted:
        raise ValueError(
            f"{source!r} is not a local directory, so it names a Hub repo: refusing to load compile artifacts from it "
            "without trust_remote_artifacts=True: they contain compiled code that runs "
            "in this process. Pass trust_remote_artifacts=True if you trust the repo (like trust_remote_code), or "
            "download and inspect them, then pass the local directory."
        )
    for attempt in range(_READ_ATTEMPTS):
        manifest = read_manifest(_resolve(source, MANIFEST_NAME, **hub_kwargs))
        diffs = mismatches(manifest, cfg)
        api = _compat.cache_artifacts_api()
        if api is None:
            diffs.append(f"torch {torch.__version__} cannot load portable compile caches (torch 2.7+)")
        if diffs:
            warnings.warn(
                f"diffusers_ascend: the compile artifacts at {source!r} were made for another setup "
                f"({'; '.join(diffs)}); ignoring them and compiling normally.",
                stacklevel=3,
            )
            return None
        try:
            blobs = {name: _read_verified(_resolve(source, name, **hub_kwargs), entry)
                     for name, entry in manifest["files"].items()}
            break
        except (OSError, ValueError):
            # A save into this directory swapped a new cache in between the manifest and the
            # files: read the new one (saves replace the directory whole, so it is consistent).
            if attempt == _READ_ATTEMPTS - 1 or _is_remote(source) or not _manifest_changed(source, manifest, hub_kwargs):
                raise
    members = _check_kernels(blobs[KERNELS_NAME]) if KERNELS_NAME in blobs else []
    caches = TorchCaches(blobs[ARTIFACTS_NAME], blobs.get(KERNELS_NAME), members, source)
    blocks = _load_packages(manifest["blocks"], blobs, source)
    if not blocks:
        caches()  # no package takes any call: every graph compiles, from these caches
    return {"source": os.fspath(source), "artifacts": sorted(blobs), "blocks": blocks, "caches": caches}


def _read_verified(path: str, entry: dict[str, Any]) -> bytes:
    """The bytes of `path` if their size and sha256 are the manifest's (the size is compared with
    the file's before anything is read, so a manifest cannot make this read more than the file)."""
    with open(path, "rb") as f:
        on_disk = os.fstat(f.fileno()).st_size
        data = f.read(entry["size"] + 1) if on_disk == entry["size"] else b""
    if on_disk != entry["size"] or len(data) != entry["size"] or _sha256(data) != entry["sha256"]:
        raise ValueError(f"{path} does not match the sha256/size in its {MANIFEST_NAME} (tampered or corrupt?): "
                         "nothing was loaded.")
    return data


def _manifest_changed(source, manifest: dict[str, Any], hub_kwargs: dict[str, Any]) -> bool:
    try:
        return read_manifest(_resolve(source, MANIFEST_NAME, **hub_kwargs)) != manifest
    except (OSError, ValueError):
        return True  # gone or half there: a save is swapping the directory


class TorchCaches:
    """The validated mega-cache and kernel archive of a cache directory, handed to torch when first
    needed: at enable when no block package was loaded, else at the first graph a backend compiles
    (a call no package takes) or at `save_ascend_cache`. Handing them over costs a quarter of a
    second on the 2-core CPU, which a process whose packages take every call never pays.

    Calling it again does nothing; a failure is a warning (the graphs compile without the caches).
    """

    def __init__(self, artifacts: bytes, kernels: bytes | None, members: list, source) -> None:
        self.artifacts, self.kernels, self.members, self.source = artifacts, kernels, members, source
        self.done = False
        self.kernels_installed = 0

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        from .compilation import _compat

        # Possibly inside a compile: torch's cache loaders must not see dynamo's fake mode.
        with _compat.unset_fake_mode(), _compat.no_tracing_context():
            try:
                _compat.cache_artifacts_api()[1](self.artifacts)
                if self.members:
                    self.kernels_installed = _install_kernels(self.kernels, self.members, _compat.inductor_cache_dir())
            except Exception as e:  # noqa: BLE001 - the graphs still compile, without the caches
                from .compilation.backend import describe_failure

                warnings.warn(f"diffusers_ascend: torch did not take the compile caches of {self.source!r} "
                              f"({describe_failure(e)}); compiling without them.", stacklevel=2)


def _load_packages(entries: list[dict[str, Any]], blobs: dict[str, bytes], source) -> list[dict[str, Any]]:
    """Loads each block package (already checked against the manifest) from a private copy of its
    verified bytes. One that fails to load is left out with a warning: its class compiles normally.
    One whose own record of its signature differs from its entry is a ValueError: the manifest
    was edited (entries swapped), and nothing is loaded."""
    from .compilation.aot_blocks import AotBlock, PackageMismatchError, temporary_file
    from .compilation.backend import describe_failure

    out = []
    for entry in entries:
        with temporary_file(blobs[entry["file"]], suffix=".pt2") as path:
            try:
                block = AotBlock.load(path, entry["signature"], entry["state"], entry["outputs"])
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


def _check_kernels(data: bytes) -> list[tarfile.TarInfo]:
    """The members of a kernels tar, each a regular ``.so`` file at a plain relative path, stored
    whole in the archive (no sparse member: its size is not bounded by the archive's), at most
    `MAX_KERNEL_BYTES` each and `MAX_KERNEL_MEMBERS` in all."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            members = []
            for m in tar:  # iterated, so a long member list is refused as it is read
                members.append(m)
                if len(members) > MAX_KERNEL_MEMBERS:
                    raise ValueError(f"{KERNELS_NAME} holds more than {MAX_KERNEL_MEMBERS} members (tampered?); "
                                     "nothing was loaded.")
    except tarfile.TarError as e:
        raise ValueError(f"{KERNELS_NAME} is not a readable tar archive ({e}; tampered?): nothing was loaded.") from None
    names = set()
    for m in members:
        parts = m.name.split("/")
        if (m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or m.issparse() or not m.name.endswith(".so")
                or m.name.startswith("/") or any(p in ("", ".", "..") or not _FILE_NAME.match(p) for p in parts)):
            raise ValueError(f"{KERNELS_NAME} holds {m.name!r}: only regular .so files at plain relative paths are "
                             "allowed (tampered?); nothing was loaded.")
        if m.size > MAX_KERNEL_BYTES or m.offset_data + m.size > len(data) or m.name in names:
            raise ValueError(f"{KERNELS_NAME} holds {m.name!r} of {m.size} bytes: a member must be stored whole in "
                             f"the archive, at most {MAX_KERNEL_BYTES} bytes, once (tampered?); nothing was loaded.")
        names.add(m.name)
    return members


def _install_kernels(data: bytes, members: list[tarfile.TarInfo], root: str) -> int:
    """Writes each library under Inductor's cache root where Inductor looks it up (its path is
    derived from the hash of the kernel source and compile command), streamed from the archive
    (each member was bounded by `_check_kernels`). Existing files are kept."""
    n = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in members:
            dest = os.path.join(root, *m.name.split("/"))
            if os.path.exists(dest):
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = os.path.join(os.path.dirname(dest), f".tmp-{secrets.token_hex(8)}")
            try:
                # Executable like the libraries Inductor builds (less the umask).
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o777)
                with os.fdopen(fd, "wb") as f:
                    shutil.copyfileobj(tar.extractfile(m), f, 1 << 20)
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            n += 1
    return n


def package_counters(obj) -> dict[str, int]:
    """Block packages loaded into an enabled pipeline or model, the calls they ran, and the calls of
    a packaged block class that no package took (another signature, gradients, hooks), which went
    to the compiled path.

    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> package_counters(tiny_flux_transformer())
    {'packages': 0, 'calls': 0, 'passed_on': 0}
    """
    states = _enabled_states(obj)
    blocks = [b for s in states for v in s.aot_blocks.values() for b in v]
    return {"packages": len(blocks), "calls": sum(b.hits for b in blocks),
            "passed_on": sum(s.packages_passed_on for s in states)}


# -- info -------------------------------------------------------------------------------------------
def cache_info(source, cfg=None, **hub_kwargs) -> dict[str, Any]:
    """The manifest at `source` (a local directory, its manifest file, or a Hub repo id; only the
    JSON is downloaded), plus ``"matches_here"`` and ``"mismatches"`` against `cfg` (the saved
    config hash is not checked without `cfg`).

    Raises:
        ValueError: the manifest is malformed (names the problem).
        AscendConfigNotFoundError: no manifest at `source`.

    >>> cache_info("/nonexistent")  # doctest: +SKIP
    """
    from .config import AscendConfig

    manifest = read_manifest(_resolve(_local_source(source), MANIFEST_NAME, **hub_kwargs))
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


def push_ascend_cache(save_directory: str | os.PathLike, repo_id: str, **kwargs) -> Any:
    """Uploads the manifest and artifacts of `save_directory` to the Hub repo `repo_id` in one commit
    (next to ``ascend_config.json``). The directory is checked first as a load checks it (the
    manifest, each file's size and sha256, the kernel archive's members), and the bytes checked are
    the bytes uploaded: a directory whose files no longer match its manifest is refused.

    Args:
        save_directory: a directory written by `save_ascend_cache` (or its manifest file).
        repo_id: the Hub model repo (created if missing).
        kwargs: ``token``, ``private``, ``revision``, ``commit_message``, ``create_pr``.

    Raises:
        ValueError: a malformed manifest or a file that does not match it; nothing is uploaded.

    >>> push_ascend_cache("flux-ascend-cache", "me/flux-ascend")  # doctest: +SKIP
    """
    from .hub import upload_files

    directory = _local_source(save_directory)
    manifest_path = os.path.join(directory, MANIFEST_NAME)
    manifest = read_manifest(manifest_path)
    if manifest["format"] != FORMAT:
        raise ValueError(f"{manifest_path} is of format {manifest['format']!r}, written by diffusers-ascend "
                         f"{manifest['diffusers_ascend']!r}: no process of this version loads it; save it again")
    with open(manifest_path, "rb") as f:
        files: dict[str, str | bytes] = {MANIFEST_NAME: f.read()}
    if read_manifest(manifest_path) != manifest:
        raise ValueError(f"{manifest_path} changed while it was read (a save in progress?): nothing was uploaded")
    for name, entry in manifest["files"].items():
        files[name] = _read_verified(os.path.join(directory, name), entry)
    if KERNELS_NAME in files:
        _check_kernels(files[KERNELS_NAME])
    kwargs.setdefault("commit_message", "Upload diffusers-ascend compile artifacts")
    return upload_files(files, repo_id, **kwargs)


def pull_ascend_cache(repo_id: str, save_directory: str | os.PathLike, *, trust_remote_artifacts: bool = False,
                      **hub_kwargs) -> dict[str, Any]:
    """Downloads a Hub repo's manifest and artifacts into `save_directory` after checking them
    (``trust_remote_artifacts=True`` is required, as for loading: the files hold compiled code).
    The directory is replaced whole, as a save replaces it. Nothing is loaded into torch.

    >>> pull_ascend_cache("me/flux-ascend", "flux-ascend-cache", trust_remote_artifacts=True)  # doctest: +SKIP
    """
    if not trusted_opt_in(trust_remote_artifacts):
        raise ValueError(f"refusing to download compile artifacts from {repo_id!r} without trust_remote_artifacts=True: "
                         "they contain compiled code that runs when loaded.")
    target = _save_target(save_directory)
    manifest = read_manifest(_resolve(repo_id, MANIFEST_NAME, **hub_kwargs))
    if manifest["format"] != FORMAT:
        raise ValueError(f"{repo_id}'s {MANIFEST_NAME} is of format {manifest['format']!r}; this diffusers-ascend "
                         f"reads format {FORMAT}: nothing was written.")
    blobs = {name: _read_verified(_resolve(repo_id, name, **hub_kwargs), entry)
             for name, entry in manifest["files"].items()}
    if KERNELS_NAME in blobs:
        _check_kernels(blobs[KERNELS_NAME])
    _commit(target, blobs, manifest)
    return manifest
