"""Platform facts: which accelerator this process runs on (``"npu"``, ``"cuda"`` or ``"cpu"``,
detected lazily, once) and what each one defaults to. A new device is added here."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: torch is imported where it is used (nothing heavy at import)
    import torch

__all__ = [
    "PLATFORMS",
    "NPU_CAPTURE_ERROR_MODE",
    "GraphAPI",
    "auto_attention",
    "capture_blocked",
    "current_platform",
    "default_executor",
    "graph_api",
    "graph_capture_supported",
    "graph_class",
    "override_platform",
    "platform_info",
    "prepare_device",
    "uncapturable_attention",
]

PLATFORMS = ("npu", "cuda", "cpu")

_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("diffusers_ascend_platform", default=None)


@functools.lru_cache(maxsize=1)
def _detect() -> tuple[str, str | None]:
    """(platform, torch_npu import error or None)."""
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

    For tests of platform-dependent decisions; it does not make NPU kernels runnable.

    Args:
        platform: one of `PLATFORMS`.

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


def auto_attention(
    platform: str | None = None,
    *,
    graph_capture: str | None = None,
    ring: bool = False,
    dtype: torch.dtype | None = None,
) -> str | None:
    """The attention backend ``attention="auto"`` picks (None: the model's own is kept).

    On NPU ``"npu_fia"`` for ring attention (which needs the log-sum-exp only FIA returns); for a
    model of another dtype than float16/bfloat16 (e.g. float32) ``"native"`` (SDPA): diffusers
    declares ``"_native_npu"`` for those two only, and every FIA call would fall back to SDPA; else
    ``"npu_fia"`` under graph capture (``npu_fusion_attention``, behind ``"_native_npu"``, cannot be
    captured) and ``"_native_npu"`` without.

    Args:
        platform: one of `PLATFORMS` (default: current).
        graph_capture: the config's ``graph_capture`` (None when off).
        ring: the model runs diffusers' context parallelism with ``ring_degree > 1``.
        dtype: the model's dtype (None: unknown, taken as float16/bfloat16).

    >>> auto_attention("npu"), auto_attention("npu", graph_capture="graph_with_compile"), auto_attention("cpu")
    ('_native_npu', 'npu_fia', None)
    >>> import torch
    >>> auto_attention("npu", dtype=torch.float32), auto_attention("npu", graph_capture="graph_only", dtype=torch.float32)
    ('native', 'native')
    """
    if _check(platform or current_platform()) != "npu":
        return None
    if ring:
        return "npu_fia"
    import torch

    if dtype not in (None, torch.float16, torch.bfloat16):
        return "native"
    return "npu_fia" if graph_capture is not None else "_native_npu"


def prepare_device(platform: str) -> None:
    """Makes ``platform``'s torch device usable in this process (``"npu"``: imports torch_npu, which
    registers it); the others need nothing.

    >>> prepare_device("cpu")
    """
    if _check(platform) == "npu":
        import torch_npu  # noqa: F401


def uncapturable_attention(platform: str | None = None) -> str | None:
    """The diffusers attention backend on ``platform`` whose kernel device graphs cannot capture, or
    None: ``"_native_npu"`` on NPU (``npu_fusion_attention``, documented as not aclgraph-capturable).

    >>> uncapturable_attention("npu"), uncapturable_attention("cuda")
    ('_native_npu', None)
    """
    return "_native_npu" if _check(platform or current_platform()) == "npu" else None


def capture_blocked(platform: str | None = None) -> str | None:
    """Why this install captures no device graph on ``platform`` (default: current), or None. NPU
    graphs capture aclnn kernels only, and ``jit_compile=True`` sends every op to acl_op; torch_npu
    refuses every capture under ``TASK_QUEUE_ENABLE=2``.

    >>> capture_blocked("cuda") is None
    True
    """
    if _check(platform or current_platform()) != "npu":
        return None
    from ascend_kernels.npu import probe

    if os.environ.get("TASK_QUEUE_ENABLE", "").strip() == "2":
        return (
            "TASK_QUEUE_ENABLE=2, which torch_npu refuses during NPU graph capture; export TASK_QUEUE_ENABLE=1 "
            "(or 0) before starting the process to capture graphs"
        )
    if probe.jit_compile():
        return (
            "torch_npu runs with jit_compile=True, so ops take acl_op kernels, which NPU graphs cannot capture; "
            "call torch_npu.npu.set_compile_mode(jit_compile=False) before enabling"
        )
    return None


def default_executor(platform: str | None = None) -> str:
    """What ``executor="auto"`` runs on ``platform`` (default: current): ``"eager"`` on NPU, where
    Inductor's code runs diffusion models slower (docs/npu-notes.md), ``"inductor"`` elsewhere.

    >>> default_executor("npu"), default_executor("cuda")
    ('eager', 'inductor')
    """
    return "eager" if _check(platform or current_platform()) == "npu" else "inductor"


def graph_capture_supported(platform: str | None = None) -> bool:
    """Whether device graphs (NPUGraph / CUDAGraph) exist on ``platform`` (default: current).

    >>> graph_capture_supported("cpu")
    False
    """
    return _check(platform or current_platform()) in ("npu", "cuda")


def graph_class(platform: str | None = None):
    """The device-graph class of ``platform``: ``torch.npu.NPUGraph``, ``torch.cuda.CUDAGraph`` or None.

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


# torch.npu.graph's default, "global", fails a capture when any other thread of the process makes
# an unsafe call meanwhile (an npuMalloc: every capture empties the cache first, so any allocation
# is one): a service decoding or preparing another request on another thread would lose its
# captures. "thread_local" still fails this thread's own unsafe calls inside a capture (what
# "global" protects us from); "relaxed" would capture them silently.
NPU_CAPTURE_ERROR_MODE = "thread_local"


@dataclass(frozen=True)
class GraphAPI:
    """What graph capture needs from a platform's device-graph API; `graph_api` builds it.

    Attributes:
        device_type: ``"cuda"`` or ``"npu"``: every tensor a captured graph reads must be there.
        graph_class: ``torch.cuda.CUDAGraph`` / ``torch.npu.NPUGraph``.
        capture: ``(graph, pool, stream) -> context manager`` capturing the work run inside it.
        pool_handle: a new memory-pool token, shared by one backend's graphs.
        new_stream: a side stream for warm-up and capture.
        use_stream: ``stream -> context manager`` making it current.
        current_stream: the current stream (``wait_stream`` joins the side stream to it).
    """

    device_type: str
    graph_class: type
    capture: Callable[[Any, Any, Any], ContextManager]
    pool_handle: Callable[[], Any]
    new_stream: Callable[[], Any]
    use_stream: Callable[[Any], ContextManager]
    current_stream: Callable[[], Any]


def graph_api(platform: str | None = None) -> GraphAPI | None:
    """The device-graph API of ``platform`` (default: current), or None where there is none (CPU).

    Nothing is initialised until a capture starts.

    >>> graph_api("cpu") is None
    True
    """
    import torch

    platform = _check(platform or current_platform())
    if platform == "cuda":
        return GraphAPI(
            device_type="cuda",
            graph_class=torch.cuda.CUDAGraph,
            capture=lambda g, pool, stream: torch.cuda.graph(g, pool=pool, stream=stream),
            pool_handle=torch.cuda.graph_pool_handle,
            new_stream=torch.cuda.Stream,
            use_stream=torch.cuda.stream,
            current_stream=torch.cuda.current_stream,
        )
    if platform == "npu":
        npu = getattr(torch, "npu", None)
        if npu is None or not hasattr(npu, "NPUGraph"):
            return None  # a torch_npu without NPUGraph
        return GraphAPI(
            device_type="npu",
            graph_class=npu.NPUGraph,
            capture=lambda g, pool, stream: npu.graph(
                npu_graph=g, pool=pool, stream=stream, capture_error_mode=NPU_CAPTURE_ERROR_MODE
            ),
            pool_handle=npu.graph_pool_handle,
            new_stream=npu.Stream,
            use_stream=npu.stream,
            current_stream=npu.current_stream,
        )
    return None


def device_capability(platform: str | None = None) -> str:
    """What compiled code is specific to beyond the architecture, for warm-start cache keys.

    Inductor builds CPU code with ``-march=native``, so the CPU's features count as well as the
    accelerator's generation.

    >>> device_capability("cpu").startswith("cpu:")
    True
    """
    import torch

    platform = _check(platform or current_platform())
    parts = [f"cpu:{torch.backends.cpu.get_cpu_capability()}:{_cpu_features()}"]
    if platform == "cuda" and torch.cuda.is_available():
        parts.append("cuda:sm_{}{}".format(*torch.cuda.get_device_capability()))
    elif platform == "npu":
        npu = getattr(torch, "npu", None)
        parts.append(
            f"npu:{npu.get_device_name() if npu is not None and hasattr(npu, 'get_device_name') else 'unknown'}"
        )
    return ";".join(parts)


def _cpu_features() -> str:
    """A short hash of the CPU's feature flags (``flags`` on x86, ``Features`` on Arm)."""
    import hashlib
    import platform as host

    text = host.processor() or host.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    text = " ".join(sorted(value.split()))
                    break
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:16]
