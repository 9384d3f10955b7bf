"""A cache directory: written all or nothing, read back checked, and moved to and from the Hub.

A save writes the whole cache into a staging directory beside the target and swaps it in with one
rename, under a lock on the parent directory, and a save that fails or is killed leaves the
previous cache as it was. A reader reads the manifest and the files of one directory, a directory
no save ever writes again (`read_one_save`), so it gets one save's whole cache, never a manifest
naming another save's bytes (docs/warm-start.md, "Saving: all or nothing").
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .kernels import check_kernels
from .manifest import ARTIFACTS_NAME, FORMAT, KERNELS_NAME, MANIFEST_NAME, PACKAGE_NAME, read_manifest, sha256

_STAGING = ".{name}.ascend-staging-"
_RETIRED = ".{name}.ascend-old-"
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
# Reads that a save may interrupt before one under the savers' lock (which always completes).
_LOCK_FREE_READS = 3
T = TypeVar("T")


# -- writing ----------------------------------------------------------------------------------------
def save_target(save_directory) -> str:
    """The real path a save writes; checked before any expensive work."""
    if not isinstance(save_directory, (str, os.PathLike)):
        raise TypeError(f"save_directory must be a path, got {type(save_directory).__name__}")
    target = os.path.realpath(os.fspath(save_directory))  # a symlinked directory: swap what it points to
    if os.path.lexists(target) and not os.path.isdir(target):
        raise ValueError(
            f"cannot save the compile artifacts to {os.fspath(save_directory)!r}: it exists and is not a "
            "directory (pass a new or existing directory)"
        )
    if os.path.dirname(target) == target:
        raise ValueError(
            f"cannot save the compile artifacts to {target!r}: a cache directory cannot be a file system root"
        )
    if os.path.isdir(target):
        _foreign_entries(target)
    return target


def _foreign_entries(target: str) -> list[str]:
    """The entries of an existing cache directory that are not the cache's, which a save carries
    over: plain files and symbolic links. A subdirectory is refused: the previous directory is
    removed after the swap, and a save never removes more than files it can carry over."""
    out = []
    for entry in os.scandir(target):
        if _owned(entry.name):
            continue
        if not (entry.is_symlink() or entry.is_file(follow_symlinks=False)):
            raise ValueError(
                f"cannot save the compile artifacts to {target!r}: it holds {entry.name!r}, which is not a "
                "file; a save replaces the directory whole, carrying over only plain files (a model's "
                "save_pretrained output). Save the cache into its own directory."
            )
        out.append(entry.name)
    return out


def _owned(name: str) -> bool:
    return (
        name in (MANIFEST_NAME, ARTIFACTS_NAME, KERNELS_NAME)
        or bool(PACKAGE_NAME.match(name))
        or name.startswith(".tmp-")
    )  # what an older diffusers-ascend's killed save left


@contextlib.contextmanager
def _directory_lock(parent: str, shared: bool = False):
    """An exclusive ``flock`` on `parent`, serializing saves into it across threads and processes;
    released when the descriptor closes, so a killed saver holds nothing. ``shared=True``: a
    reader's lock, which no save holds at the same time; where `parent` cannot be opened (a reader
    without read permission on it) the reader goes unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: saves are not serialized
        yield
        return
    try:
        fd = os.open(parent, os.O_RDONLY)
    except OSError:
        if not shared:
            raise
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_file(path: str, data: bytes) -> None:
    """A new file, 0666 less the umask (what ``open`` gives), flushed to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
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
    """The same file (a hard link, else a copy) or the same symbolic link at `dst`."""
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


def commit(target: str, blobs: dict[str, bytes], manifest: dict[str, Any]) -> None:
    """Writes `blobs` and `manifest` as the cache directory `target`, all or nothing."""
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
            _write_file(
                os.path.join(staging, MANIFEST_NAME), (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
            )
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


# -- reading --------------------------------------------------------------------------------------
def read_one_save(directory: str, read: Callable[[], T]) -> T:
    """`read()` (which reads the cache files of `directory` by path) as of one save.

    A save never writes into a directory it has swapped in: it swaps a new one in and deletes the
    old one. So the files `read` opened all came from one save exactly when `directory` names the
    same directory before and after: the directory is held open meanwhile, so its inode number
    cannot pass to a new one. Comparing what was read cannot tell this: two saves of equal content
    (cache A, then B, then A again) give equal manifests over different files. A read a save
    interrupted is read again; after `_LOCK_FREE_READS` such reads, under the savers' lock on the
    parent directory (no save swaps meanwhile). A read that fails while `directory` is unchanged
    raises: the cache itself is corrupt.
    """
    parent = os.path.dirname(os.path.realpath(directory))
    for attempt in range(_LOCK_FREE_READS + 1):
        last = attempt == _LOCK_FREE_READS
        with _directory_lock(parent, shared=True) if last else contextlib.nullcontext():
            try:
                fd = os.open(directory, os.O_RDONLY)
            except FileNotFoundError:  # a save renaming twice (`commit`'s fallback) is between its renames
                if last:
                    raise
                continue
            try:
                held = os.fstat(fd)
                try:
                    result = read()
                except (OSError, ValueError):
                    if last or _same_directory(directory, held):
                        raise
                    continue
                if _same_directory(directory, held):
                    return result
            finally:
                os.close(fd)
    raise ValueError(
        f"{directory} was replaced while it was read, by something other than a diffusers-ascend save "
        "(which holds the lock it was read under): nothing was loaded; read it again"
    )


def _same_directory(directory: str, held: os.stat_result) -> bool:
    try:
        now = os.stat(directory)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def is_remote(source) -> bool:
    return isinstance(source, str) and not os.path.exists(source)


def local_source(source):
    """`source`, with a path to the manifest itself taken as its directory; any other local file is
    refused, naming what is expected."""
    if isinstance(source, (str, os.PathLike)) and os.path.isfile(source):
        path = os.fspath(source)
        if os.path.basename(path) != MANIFEST_NAME:
            raise ValueError(
                f"{path!r} is a file: pass the directory that save_ascend_cache wrote (holding "
                f"{MANIFEST_NAME}), the manifest itself, or a Hub repo id"
            )
        return os.path.dirname(path) or "."
    return source


def resolve(source, name: str, **hub_kwargs) -> str:
    from ..hub import resolve_config_file

    return resolve_config_file(source, name, **hub_kwargs)


def read_verified(path: str, entry: dict[str, Any]) -> bytes:
    """The bytes of `path` if their size and sha256 are the manifest's `entry`. The size is
    compared before anything is read, so a manifest cannot make this read more than the file."""
    with open(path, "rb") as f:
        on_disk = os.fstat(f.fileno()).st_size
        data = f.read(entry["size"] + 1) if on_disk == entry["size"] else b""
    if on_disk != entry["size"] or len(data) != entry["size"] or sha256(data) != entry["sha256"]:
        raise ValueError(
            f"{path} does not match the sha256/size in its {MANIFEST_NAME} (tampered or corrupt?): nothing was loaded."
        )
    return data


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
    raise TypeError(f"trust_remote_artifacts must be True or False (or None), got {value!r} ({type(value).__name__})")


# -- the Hub --------------------------------------------------------------------------------------
def push_ascend_cache(save_directory: str | os.PathLike, repo_id: str, **kwargs) -> Any:
    """Uploads the manifest and artifacts of `save_directory` to the Hub repo `repo_id` in one commit
    (next to ``ascend_config.json``). The directory is checked first as a load checks it, and the
    bytes checked are the bytes uploaded.

    Args:
        save_directory: a directory written by `save_ascend_cache` (or its manifest file).
        repo_id: the Hub model repo (created if missing).
        kwargs: ``token``, ``private``, ``revision``, ``commit_message``, ``create_pr``.

    Raises:
        ValueError: a malformed manifest or a file that does not match it; nothing is uploaded.

    >>> push_ascend_cache("flux-ascend-cache", "me/flux-ascend")  # doctest: +SKIP
    """
    from ..hub import upload_files

    directory = local_source(save_directory)
    manifest_path = os.path.join(directory, MANIFEST_NAME)

    def read() -> dict[str, str | bytes]:
        with open(manifest_path, "rb") as f:
            files: dict[str, str | bytes] = {MANIFEST_NAME: f.read()}
        manifest = read_manifest(manifest_path)
        if manifest["format"] != FORMAT:
            raise ValueError(
                f"{manifest_path} is of format {manifest['format']!r}, written by diffusers-ascend "
                f"{manifest['diffusers_ascend']!r}: no process of this version loads it; save it again"
            )
        if json.loads(files[MANIFEST_NAME]) != manifest:
            raise ValueError(f"{manifest_path} changed while it was read: nothing was uploaded")
        for name, entry in manifest["files"].items():
            files[name] = read_verified(os.path.join(directory, name), entry)
        return files

    files = read_one_save(directory, read)
    if KERNELS_NAME in files:
        check_kernels(files[KERNELS_NAME])
    kwargs.setdefault("commit_message", "Upload diffusers-ascend compile artifacts")
    return upload_files(files, repo_id, **kwargs)


def pull_ascend_cache(
    repo_id: str, save_directory: str | os.PathLike, *, trust_remote_artifacts: bool = False, **hub_kwargs
) -> dict[str, Any]:
    """Downloads a Hub repo's manifest and artifacts into `save_directory` after checking them
    (``trust_remote_artifacts=True`` is required, as for loading: the files hold compiled code).
    The directory is replaced whole, as a save replaces it. Nothing is loaded into torch.

    >>> pull_ascend_cache("me/flux-ascend", "flux-ascend-cache", trust_remote_artifacts=True)  # doctest: +SKIP
    """
    if not trusted_opt_in(trust_remote_artifacts):
        raise ValueError(
            f"refusing to download compile artifacts from {repo_id!r} without trust_remote_artifacts=True: "
            "they contain compiled code that runs when loaded."
        )
    target = save_target(save_directory)
    manifest = read_manifest(resolve(repo_id, MANIFEST_NAME, **hub_kwargs))
    if manifest["format"] != FORMAT:
        raise ValueError(
            f"{repo_id}'s {MANIFEST_NAME} is of format {manifest['format']!r}; this diffusers-ascend "
            f"reads format {FORMAT}: nothing was written."
        )
    blobs = {
        name: read_verified(resolve(repo_id, name, **hub_kwargs), entry) for name, entry in manifest["files"].items()
    }
    if KERNELS_NAME in blobs:
        check_kernels(blobs[KERNELS_NAME])
    commit(target, blobs, manifest)
    return manifest
