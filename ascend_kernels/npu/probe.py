"""What the installed Ascend stack offers: torch_npu op schemas, SoC, compile mode, aclnn symbols.

The npu providers' ``supports_args`` ask these so that a call goes to the native provider where
the torch_npu call would fail or run out of contract. Everything is read from the install, never
from version numbers (they do not name the op-plugin release); docs/npu-notes.md says where each
fact comes from. SoC, schemas and symbols are cached per process (`cache_clear` drops them); the
compile mode can change at run time and is read on every call.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib
import os
from typing import Optional

__all__ = [
    "SOC_910B1",
    "aclnn_available",
    "cache_clear",
    "has_op",
    "is_a2_a3",
    "jit_compile",
    "op_arguments",
    "soc_name",
    "soc_version",
]

# c10_npu::SocVersion values (torch_npu/csrc/core/npu/NpuVariables.h).
SOC_910B1 = 220  # first Atlas A2 part; op_api kernels of npu_rotary_mul need >= this
_SOC_310B1 = 240  # Atlas 200I/500 A2 inference parts: between A2 (910B) and A3 (910_93)
_SOC_910_93_FIRST, _SOC_950 = 250, 260


def _torch_npu():
    return importlib.import_module("torch_npu")


@functools.lru_cache(maxsize=None)
def op_arguments(op: str) -> Optional[tuple[str, ...]]:
    """Argument names of ``torch_npu.<op>``'s default overload, or None if torch_npu has no such op.

    >>> op_arguments("npu_rotary_mul")  # doctest: +SKIP
    ('self', 'r1', 'r2', 'rotary_mode', 'rotate')
    """
    packet = getattr(_torch_npu(), op, None)
    if packet is None:
        return None
    schema = getattr(getattr(packet, "default", None), "_schema", None)
    if schema is None:  # not an OpOverloadPacket: fall back to the registered op
        import torch

        try:
            schema = getattr(torch.ops.npu, op).default._schema
        except (AttributeError, RuntimeError):
            return ()
    return tuple(a.name for a in schema.arguments)


def has_op(op: str) -> bool:
    """Whether the installed torch_npu exposes ``torch_npu.<op>``."""
    return op_arguments(op) is not None


@functools.lru_cache(maxsize=None)
def soc_version() -> int:
    """``c10_npu::SocVersion`` of the current device (-1 when torch_npu cannot tell)."""
    try:
        return int(_torch_npu().npu.get_soc_version())
    except Exception:  # no device / older torch_npu: "unknown" gates every SoC-dependent path off
        return -1


@functools.lru_cache(maxsize=None)
def soc_name() -> str:
    """The SoC name (e.g. ``"Ascend910B2"``), or ``"unknown"``."""
    try:
        return str(_torch_npu().npu.get_device_name())
    except Exception:
        return "unknown"


def is_a2_a3(soc: Optional[int] = None) -> bool:
    """Atlas A2 (910B) or A3 (910_93) training/inference parts: the targets of the aclnn docs."""
    soc = soc_version() if soc is None else soc
    return SOC_910B1 <= soc < _SOC_310B1 or _SOC_910_93_FIRST <= soc < _SOC_950


def jit_compile() -> bool:
    """Whether torch_npu runs with ``jit_compile=True`` (``acl_op`` kernels); unknown counts as True."""
    try:
        return not bool(_torch_npu().npu.is_jit_compile_false())
    except Exception:
        return True


def _op_api_libraries() -> list[str]:
    names = ["libopapi.so"]
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    if home:
        names += sorted(glob.glob(os.path.join(home, "lib64", "libopapi*.so")))
    return names


@functools.lru_cache(maxsize=None)
def _open(name: str):
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def aclnn_available(api: str) -> bool:
    """Whether ``aclnn<Op>`` and ``aclnn<Op>GetWorkspaceSize`` are in the CANN op-api libraries
    (torch_npu's ``DO_COMPATIBILITY`` takes the ``acl_op`` path when either is missing)."""
    for lib in filter(None, map(_open, _op_api_libraries())):
        if hasattr(lib, api) and hasattr(lib, api + "GetWorkspaceSize"):
            return True
    return False


_CACHED = (op_arguments, soc_version, soc_name, aclnn_available, _open)


def cache_clear() -> None:
    """Forgets the cached facts (after swapping torch_npu, in tests)."""
    for f in _CACHED:
        f.cache_clear()
