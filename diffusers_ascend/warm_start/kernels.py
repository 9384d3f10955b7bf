"""The C++ kernel archive (``ascend_cpp_kernels.tar``, CPU only).

Torch's portable cache carries the Python wrapper of a CPU graph but not the kernel libraries it
loads: without them a fresh process rebuilds each with the host compiler. Inductor finds a
library by a path derived from the hash of its source and compile command, so the archive holds
each at its path relative to Inductor's cache root.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import secrets
import shutil
import tarfile

from .manifest import KERNELS_NAME

# Bounds on what an archive may hold (a kernel library is kilobytes).
MAX_KERNEL_BYTES = 1 << 28
MAX_KERNEL_MEMBERS = 1 << 16
_FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def isa_probes(root: str) -> list[str]:
    """The vector-ISA probe libraries Inductor built under `root` since this process started (one
    build of a fixed source per ISA and ISA extension, the first time a process on this machine
    picks one: AVX-512 BF16 and VNNI add their own), which the portable cache leaves out too. A
    probe is told by its ``.cpp`` source, not by its time alone: another process's kernel library
    in the shared cache is not ours to ship (ours are `_compat.compiled_cpp_libraries`). Linux:
    the start time is the ctime of ``/proc/<pid>``."""
    from ..compilation import _compat

    probes = _compat.vec_isa_probe_sources()
    try:
        start = os.stat(f"/proc/{os.getpid()}").st_ctime
    except OSError:
        return []
    if not probes:
        return []
    longest = max(len(p) for p in probes)
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
                with open(path[: -len(".so")] + ".cpp", encoding="utf-8") as f:
                    if f.read(longest + 1) in probes:
                        out.append(path)
            except (OSError, UnicodeDecodeError):
                continue
    return out


def pack_kernels(paths: list[str], root: str) -> bytes | None:
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


def check_kernels(data: bytes) -> list[tarfile.TarInfo]:
    """The members of a kernel archive, each a regular ``.so`` file at a plain relative path,
    stored whole (no sparse member: its size is not bounded by the archive's), at most
    `MAX_KERNEL_BYTES` each and `MAX_KERNEL_MEMBERS` in all; else a ValueError."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            members = []
            for m in tar:  # iterated, so a long member list is refused as it is read
                members.append(m)
                if len(members) > MAX_KERNEL_MEMBERS:
                    raise ValueError(
                        f"{KERNELS_NAME} holds more than {MAX_KERNEL_MEMBERS} members (tampered?); nothing was loaded."
                    )
    except tarfile.TarError as e:
        raise ValueError(
            f"{KERNELS_NAME} is not a readable tar archive ({e}; tampered?): nothing was loaded."
        ) from None
    names = set()
    for m in members:
        parts = m.name.split("/")
        if (
            m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE)
            or m.issparse()
            or not m.name.endswith(".so")
            or m.name.startswith("/")
            or any(p in ("", ".", "..") or not _FILE_NAME.match(p) for p in parts)
        ):
            raise ValueError(
                f"{KERNELS_NAME} holds {m.name!r}: only regular .so files at plain relative paths are "
                "allowed (tampered?); nothing was loaded."
            )
        if m.size > MAX_KERNEL_BYTES or m.offset_data + m.size > len(data) or m.name in names:
            raise ValueError(
                f"{KERNELS_NAME} holds {m.name!r} of {m.size} bytes: a member must be stored whole in "
                f"the archive, at most {MAX_KERNEL_BYTES} bytes, once (tampered?); nothing was loaded."
            )
        names.add(m.name)
    return members


def install_kernels(data: bytes, members: list[tarfile.TarInfo], root: str) -> int:
    """Writes each library (checked by `check_kernels`) under `root`, streamed from the archive;
    existing files are kept. Returns how many were written."""
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
