"""What the installed Ascend stack offers: torch_npu op schemas, SoC, compile mode, aclnn symbols.

The npu providers' ``supports_args`` ask these questions so that a call goes to the native
provider where the torch_npu call would fail or run out of contract. Everything here is read from
the installed torch_npu (never assumed from its version number, which does not name the op-plugin
release it was built from):

- op schemas: ``torch_npu.<op>`` is ``torch.ops.npu.<op>``, an ``OpOverloadPacket`` whose
  ``.default._schema`` lists the arguments of the build (op-plugin
  ``op_plugin/config/op_plugin_functions.yaml``; e.g. ``npu_rotary_mul`` has ``rotary_mode`` only
  from op-plugin 7.0.0).
- SoC: ``torch_npu.npu.get_soc_version()``, the ``c10_npu::SocVersion`` value the C++ code
  compares against (``torch_npu/csrc/core/npu/NpuVariables.h``: 910B1..910B4-1 = 220..225,
  910_93xx (A3) = 250..256, Ascend950 = 260; older parts are smaller).
- compile mode: ``torch_npu.npu.is_jit_compile_false()``. op-plugin ops with both an ``acl_op``
  and an ``op_api`` (aclnn) implementation dispatch to ``op_api`` only when jit compile is off
  (``torchnpugen/utils.py``: ``if ((force_aclnn || CheckJitDisable()) && base format)``); with
  ``jit_compile=True`` the older ``acl_op`` kernel runs.
- aclnn symbols: op_api kernels fall back to ``acl_op`` when ``aclnn<Op>`` is missing from the
  CANN op-api libraries (``DO_COMPATIBILITY`` in ``op_plugin/utils/op_api_common.h``). Looked up
  with ``ctypes`` in ``libopapi.so`` and ``$ASCEND_HOME_PATH/lib64/libopapi*.so``; a symbol that
  cannot be found counts as missing (the call would take the ``acl_op`` path).

The SoC, schemas and symbols are facts of the machine and install, cached per process; the compile
mode can be changed at run time (``torch_npu.npu.set_compile_mode``) and is read on every call.
`cache_clear` drops the caches (tests swap stand-in modules).
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
    """Whether torch_npu runs with ``jit_compile=True`` (then ``acl_op`` kernels run, not aclnn).

    Unknown counts as True: the conservative answer (only the paths every build has).
    """
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
    """Whether ``aclnn<Op>`` and ``aclnn<Op>GetWorkspaceSize`` are in the CANN op-api libraries.

    Mirrors ``DO_COMPATIBILITY``: either symbol missing means torch_npu takes the ``acl_op`` path.
    """
    for lib in filter(None, map(_open, _op_api_libraries())):
        if hasattr(lib, api) and hasattr(lib, api + "GetWorkspaceSize"):
            return True
    return False


_CACHED = (op_arguments, soc_version, soc_name, aclnn_available, _open)


def cache_clear() -> None:
    """Forgets the cached facts (after swapping torch_npu, in tests)."""
    for f in _CACHED:
        f.cache_clear()
