"""Which accelerator this process runs on: ``"npu"`` (Ascend via torch_npu), ``"cuda"`` or ``"cpu"``.

Detection is lazy (nothing is imported until first asked) and cached per process: it is a fact
about the machine, not configuration. A torch_npu that is installed but fails to import is
reported by `platform_info()` and never raised. Tests can exercise NPU-only branches on any machine
with `override_platform`, which is context-local (``contextvars``), not process-global.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
from typing import Any, Iterator

__all__ = [
    "PLATFORMS",
    "current_platform",
    "graph_capture_supported",
    "graph_class",
    "override_platform",
    "platform_info",
]

PLATFORMS = ("npu", "cuda", "cpu")

_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("diffusers_ascend_platform", default=None)


@functools.lru_cache(maxsize=1)
def _detect() -> tuple[str, str | None]:
    """Returns (platform, torch_npu import error or None). Cached: the hardware does not change."""
    import torch

    npu_error = None
    if importlib.util.find_spec("torch_npu") is not None:
        try:
            import torch_npu  # noqa: F401  registers torch.npu

            if torch.npu.is_available():
                return "npu", None
        except Exception as e:  # a broken CANN install must not break `import diffusers_ascend`
            npu_error = f"{type(e).__name__}: {e}"
    if torch.cuda.is_available():
        return "cuda", npu_error
    return "cpu", npu_error


def _check(platform: str) -> str:
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; valid: {PLATFORMS}")
    return platform


def current_platform() -> str:
    """The platform of this process: ``"npu"``, ``"cuda"`` or ``"cpu"``.

    Returns:
        The `override_platform` value when one is active, else the detected platform.

    >>> from diffusers_ascend.platform import current_platform
    >>> current_platform() in ("npu", "cuda", "cpu")
    True
    """
    forced = _override.get()
    return forced if forced is not None else _detect()[0]


@contextlib.contextmanager
def override_platform(platform: str) -> Iterator[str]:
    """Makes `current_platform()` return ``platform`` inside the ``with`` block (context-local).

    Meant for tests of platform-dependent decisions (e.g. ``fusions="auto"`` on NPU); it does not
    make NPU kernels runnable.

    Args:
        platform: one of `PLATFORMS`.

    >>> from diffusers_ascend.platform import current_platform, override_platform
    >>> with override_platform("npu"):
    ...     current_platform()
    'npu'
    """
    token = _override.set(_check(platform))
    try:
        yield platform
    finally:
        _override.reset(token)


def platform_info() -> dict[str, Any]:
    """What detection found, for bug reports and the CLI.

    Returns:
        dict with ``platform``, ``detected``, ``overridden``, ``torch_npu_installed``,
        ``torch_npu_error`` (the import error string or None), ``graph_capture_supported``.

    >>> from diffusers_ascend.platform import platform_info
    >>> sorted(platform_info())[:2]
    ['detected', 'graph_capture_supported']
    """
    detected, err = _detect()
    plat = current_platform()
    return {
        "platform": plat,
        "detected": detected,
        "overridden": _override.get() is not None,
        "torch_npu_installed": importlib.util.find_spec("torch_npu") is not None,
        "torch_npu_error": err,
        "graph_capture_supported": graph_capture_supported(plat),
    }


def graph_capture_supported(platform: str | None = None) -> bool:
    """Whether device graphs (NPUGraph / CUDAGraph) exist on ``platform`` (default: current).

    >>> from diffusers_ascend.platform import graph_capture_supported
    >>> graph_capture_supported("cpu")
    False
    """
    return _check(platform or current_platform()) in ("npu", "cuda")


def graph_class(platform: str | None = None):
    """The device-graph class of ``platform``: ``torch.npu.NPUGraph``, ``torch.cuda.CUDAGraph`` or None.

    >>> from diffusers_ascend.platform import graph_class
    >>> graph_class("cpu") is None
    True
    """
    import torch

    platform = _check(platform or current_platform())
    if platform == "npu":
        return getattr(getattr(torch, "npu", None), "NPUGraph", None)
    if platform == "cuda":
        return torch.cuda.CUDAGraph
    return None
