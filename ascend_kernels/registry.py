"""Providers of each ``ascend_kernels`` op and the choice among them at call time: the explicit
`use_providers` choice (context-local), else the first supported one in priority order
``npu > triton > native`` (``native``, the PyTorch reference, runs anywhere).

The table is `_REGISTRY`, filled by `register_provider` calls: every public module of
``ascend_kernels/ops/`` is imported and registers its op's native provider, which defines the op
(a new op is a new file; diffusers_ascend's model adapters are found the same way); the device
packages register theirs from literal lists (``npu/__init__.py``, ``triton.KERNELS``)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

__all__ = [  # noqa: F822  (OPS is served by the module __getattr__, built on first use)
    "OPS",
    "Provider",
    "auto_provider",
    "available_providers",
    "capturing",
    "explain",
    "providers",
    "register_provider",
    "select_provider",
    "use_providers",
]

# Lower rank = preferred. Providers not listed here rank after these, before ``native``.
_PRIORITY = {"npu": 0, "triton": 1, "native": 100}


def _always(*args: Any) -> bool:
    return True


def any_device(device_type: str) -> bool:
    """`Provider.runs_on` of providers written in plain PyTorch ops (run on every device)."""
    return True


@dataclasses.dataclass(frozen=True)
class Provider:
    """One implementation of an op.

    Args:
        op: the op name (one of `OPS`).
        name: the provider name (``"native"``, ``"npu"``, ``"triton"``).
        impl: callable with the op's exact signature; must return a new tensor (no aliasing).
        runs_on: ``(device_type) -> bool``, the device types it runs on.
        available: ``() -> bool`` platform check, evaluated at call time so that importing
            `ascend_kernels` never imports the backing package.
        supports_args: ``(*op_args) -> bool``, the kernel's documented shape/dtype limits.
        faster_than_unfused: it beats the unfused aten ops it replaces (``fusions="auto"`` needs
            this); a ``() -> bool`` when that depends on the installed stack (checked only where
            available). The ``native`` provider never counts.
        extras: packages it needs besides its device runtime (e.g. ``("mindiesd",)``).
        describe: ``() -> str``: the kernel it calls, shown by ``diffusers-ascend env``.
        compiler_op: ``(device_type) -> OpOverload | None``: its kernel as an op Inductor traces into
            and launches from its own code (a ``torch.library.triton_op``).
        capturable: ``(*op_args) -> bool``: the call's kernel can be captured in a device graph (NPU
            graphs capture aclnn kernels only); inside `capturing` one that says False is skipped.
        opt_in: ``(device_type) -> str | None``: why a provider that could run there is picked only
            through `use_providers` (a policy); `explain` shows it.
    """

    op: str
    name: str
    impl: Callable[..., torch.Tensor]
    runs_on: Callable[[str], bool] = any_device
    available: Callable[[], bool] = _always
    supports_args: Callable[..., bool] = _always
    faster_than_unfused: bool | Callable[[], bool] = True
    extras: tuple[str, ...] = ()
    describe: Callable[[], str] | None = None
    compiler_op: Callable[[str], Any] | None = None
    opt_in: Callable[[str], str | None] | None = None
    capturable: Callable[..., bool] = _always

    def supported(self, device_type: str) -> bool:
        """Whether this provider can run on ``device_type`` on this machine."""
        return bool(self.runs_on(device_type)) and bool(self.available())

    def is_faster(self) -> bool:
        """`faster_than_unfused`, evaluated here when it depends on the installed stack."""
        fast = self.faster_than_unfused
        return bool(fast() if callable(fast) and self.available() else fast)


# op -> provider name -> provider; an op's entry is made by its native provider (its op file).
_REGISTRY: dict[str, dict[str, Provider]] = {}


def __getattr__(name: str):
    # `OPS` is read when asked: the op files register as ``ops/`` is imported.
    if name == "OPS":
        return tuple(_REGISTRY)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Set while a device graph is warmed up and captured (`capturing`).
_CAPTURING: contextvars.ContextVar[bool] = contextvars.ContextVar("ascend_kernels_capturing", default=False)

# op -> provider name chosen explicitly by `use_providers` in the current context.
_CHOICE: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "ascend_kernels_provider_choice",
    default={},  # noqa: B039  (never mutated: set() replaces it)
)


def register_provider(provider: Provider) -> Provider:
    """Adds ``provider`` to the table; a ``native`` provider defines its op.

    Raises:
        ValueError: unknown op, or a provider of that name already registered for the op.
    """
    if provider.name == "native":
        _REGISTRY.setdefault(provider.op, {})
    _check_op(provider.op)
    if provider.name in _REGISTRY[provider.op]:
        raise ValueError(f"provider {provider.name!r} is already registered for op {provider.op!r}")
    _REGISTRY[provider.op][provider.name] = provider
    return provider


def _check_op(op: str) -> None:
    if op not in _REGISTRY:
        raise ValueError(f"unknown ascend_kernels op {op!r}; valid ops: {', '.join(_REGISTRY)}")


def providers(op: str) -> list[Provider]:
    """All registered providers of ``op``, best first (whether or not they run here)."""
    _check_op(op)
    return sorted(_REGISTRY[op].values(), key=lambda p: (_PRIORITY.get(p.name, 50), p.name))


def available_providers(op: str, device_type: str) -> list[str]:
    """Names of the providers of ``op`` that run on ``device_type`` here, best first.

    Args:
        op: an op name of `OPS`, e.g. ``"rms_norm"``.
        device_type: ``"cpu"``, ``"cuda"``, ``"npu"``, ...

    Returns:
        list of provider names; always ends with ``"native"``.

    Example:
        >>> available_providers("rms_norm", "cpu")
        ['native']
    """
    return [p.name for p in providers(op) if p.supported(device_type)]


def _extras_installed(p: Provider) -> bool:
    # Installed means importable: MindIE SD's plugin raises at import on torch releases it was not built for.
    return all(sys.modules.get(name) is not None or _imports(name) for name in p.extras)


@functools.cache
def _imports(name: str) -> bool:
    if importlib.util.find_spec(name) is None:
        return False
    try:
        importlib.import_module(name)
    except Exception:  # a broken install is "not installed" here, never an error
        return False
    return True


def auto_provider(op: str, platform: str) -> Provider | None:
    """The provider that makes ``fusions="auto"`` turn on the fusion of ``op`` on ``platform``.

    The best non-native, `Provider.faster_than_unfused` provider that runs on ``platform`` and is
    available here, or (for another platform) is that platform's own with its extras installed.

    Args:
        op: an op name of `OPS`.
        platform: ``"npu"``, ``"cuda"`` or ``"cpu"``.

    Example:
        >>> auto_provider("rms_norm", "cpu") is None
        True
    """
    for p in providers(op):
        if p.name == "native" or not p.runs_on(platform):
            continue
        if (p.available() or (p.name == platform and _extras_installed(p))) and p.is_faster():
            return p
    return None


def explain(op: str, device_type: str) -> tuple[str, str]:
    """``(provider name, why)``: the provider a typical call of ``op`` on ``device_type`` uses here.

    "Typical": arguments inside every provider's `Provider.supports_args`.

    Example:
        >>> explain("rms_norm", "cpu")[0]
        'native'
    """
    chosen = providers(op)[-1]
    for p in providers(op):
        if p.supported(device_type):
            chosen = p
            break
    if chosen.name == "native":
        reasons = []
        for p in providers(op):
            if p.name == "native":
                continue
            if p.runs_on(device_type):  # runs there, but not on this machine
                reasons.append(f"{p.name}: {p.describe() if p.describe else 'not available'}")
            elif p.opt_in and p.available() and (why := p.opt_in(device_type)):
                reasons.append(f"{p.name}: {why}")
        return "native", "; ".join(reasons) or (
            f"the PyTorch reference composite (no kernel provider runs on {device_type!r})"
        )
    why = chosen.describe() if chosen.describe else f"{chosen.name} kernel"
    if not chosen.is_faster():
        why += " (not in fusions='auto': no faster than the unfused ops here)"
    return chosen.name, why


@contextlib.contextmanager
def use_providers(**choice: str) -> Iterator[None]:
    """Chooses providers explicitly for the calls made inside the ``with`` block.

    Context-local (nested blocks extend the outer choice). A chosen provider that cannot run a
    call raises instead of falling back.

    Args:
        **choice: ``op_name=provider_name``, e.g. ``rms_norm="native"``.

    Raises:
        ValueError: unknown op or provider name (the message lists the valid ones).

    Example:
        >>> import ascend_kernels
        >>> with use_providers(rms_norm="native"):
        ...     y = torch.ops.ascend_kernels.rms_norm(torch.randn(2, 8), None, 1e-6)
    """
    for op, name in choice.items():
        _check_op(op)
        if name not in _REGISTRY[op]:
            valid = ", ".join(p.name for p in providers(op))
            raise ValueError(f"unknown provider {name!r} for op {op!r}; valid providers: {valid}")
    token = _CHOICE.set({**_CHOICE.get(), **choice})
    try:
        yield
    finally:
        _CHOICE.reset(token)


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Marks the calls inside the ``with`` block as under device-graph capture (context-local): each
    op then picks a provider whose `Provider.capturable` accepts the call.

    Example:
        >>> import ascend_kernels
        >>> with capturing():
        ...     y = torch.ops.ascend_kernels.rms_norm(torch.randn(2, 8), None, 1e-6)
    """
    token = _CAPTURING.set(True)
    try:
        yield
    finally:
        _CAPTURING.reset(token)


def _device_type(args: tuple) -> str:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type
    return "cpu"


def select_provider(op: str, *args: Any) -> Provider:
    """The provider that runs ``op(*args)``: the `use_providers` choice, else the best supported
    one for the first tensor's device and these arguments.

    Raises:
        RuntimeError: the explicitly chosen provider cannot run this call.
    """
    _check_op(op)
    device_type = _device_type(args)
    chosen = _CHOICE.get().get(op)
    if chosen is not None:
        p = _REGISTRY[op][chosen]
        if not p.supported(device_type):
            raise RuntimeError(
                f"provider {chosen!r} chosen for ascend_kernels.{op} does not run on device type "
                f"{device_type!r} here; available: {', '.join(available_providers(op, device_type))}"
            )
        if not p.supports_args(*args):
            raise RuntimeError(
                f"provider {chosen!r} chosen for ascend_kernels.{op} does not support these arguments "
                f"({_describe(args)}); see its supports_args limits or choose 'native'"
            )
        if _CAPTURING.get() and not p.capturable(*args):
            raise RuntimeError(
                f"provider {chosen!r} chosen for ascend_kernels.{op} runs a kernel that cannot be captured in a "
                f"device graph here ({_describe(args)}); choose 'native' or run without graph capture"
            )
        return p
    capture = _CAPTURING.get()
    for p in providers(op):
        if p.supported(device_type) and p.supports_args(*args) and (not capture or p.capturable(*args)):
            return p
    raise RuntimeError(f"no provider of ascend_kernels.{op} supports {_describe(args)}")  # pragma: no cover


def _describe(args: tuple) -> str:
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(f"Tensor{tuple(a.shape)}:{str(a.dtype).replace('torch.', '')}@{a.device.type}")
        else:
            parts.append(repr(a))
    return ", ".join(parts)


def dispatch(op: str, *args: Any) -> torch.Tensor:
    """Runs ``op(*args)`` with the provider `select_provider` picks (called by the op bodies)."""
    return select_provider(op, *args).impl(*args)
