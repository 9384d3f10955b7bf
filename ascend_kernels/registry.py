"""Providers of each ``ascend_kernels`` op and the choice among them at call time.

Every op has a ``native`` provider (its PyTorch reference, runs anywhere). Faster providers declare
where they run (`Provider.supported`, the platform) and which arguments they accept
(`Provider.supports_args`, the documented shape/dtype limits of the kernel behind them). At each
call the op asks `select_provider` for the best provider for the input's device and arguments:
an explicit choice made with `use_providers` (a ``contextvars`` context, so two threads or two
pipelines never affect each other) or else the first supported one in priority order
``npu > triton > native``.

The table of providers is static (filled at import from this package's own modules: an op exists
once its op file registers its ``native`` provider); what varies per call is only the context-local
choice. `auto_provider` reads the table for
``fusions="auto"`` (providers flagged `Provider.faster_than_unfused`), `explain` for
``diffusers-ascend env``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import importlib
import importlib.util
import sys
from typing import Any, Callable, Iterator, Mapping

import torch

__all__ = [
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
        runs_on: ``(device_type) -> bool``, the device types (``tensor.device.type``) it runs on.
        available: platform check with no arguments (e.g. "torch_npu importable"); evaluated at
            call time, so importing `ascend_kernels` never imports the backing package.
        supports_args: ``(*op_args) -> bool``, the kernel's documented shape/dtype limits.
        faster_than_unfused: whether a call through this provider beats the unfused aten ops it
            replaces on its devices (fewer kernels launched, less memory traffic): what
            ``fusions="auto"`` needs before it turns the fusion on. False for a provider that
            removes nothing, e.g. ``npu_gelu`` for ``gelu_tanh`` (the unfused
            ``aten.gelu(approximate="tanh")`` is already one kernel on NPU). A ``() -> bool``
            when it depends on the installed stack (e.g. the torch_npu build runs the layout
            Flux/Wan use); evaluated only where the provider is available, else taken as True
            (the platform's documented default). The ``native`` provider never counts.
        extras: optional packages the provider needs besides its device runtime (e.g.
            ``("mindiesd",)``); ``fusions="auto"`` resolved for a platform this process does not
            run on still requires them to be installed here.
        describe: optional ``() -> str``: which kernel the provider calls and what the installed
            stack offers (torch_npu schema, SoC, compile mode), shown by ``diffusers-ascend env``.
        compiler_op: optional ``(device_type) -> OpOverload | None``: the provider's kernel as an op
            that a compiler traces into (a ``torch.library.triton_op``, same schema as the op), or
            None on a device type where there is none. The inductor executor binds a node whose
            provider has one to it, so that Inductor launches the kernel from its own generated
            code instead of calling the op through the dispatcher and this registry.
        capturable: ``(*op_args) -> bool``: whether the kernel this call would launch can be
            captured in a device graph (NPU graphs capture aclnn kernels only, not the ``acl_op``
            fallbacks some torch_npu ops take). Inside `capturing` a provider that says False is
            skipped for the next one (``native``: plain aten ops).
        opt_in: optional ``(device_type) -> str | None``: for a provider that can run on
            ``device_type`` but whose ``runs_on`` declines it unless chosen with `use_providers`
            (a policy, not an inability), why it is not picked by default there; None where it
            cannot run. `explain` shows it, so a host is not told that no kernel runs on it.
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
    # `OPS`: the ops the op files registered, read when asked (they register as ``ops/`` is imported).
    if name == "OPS":
        return tuple(_REGISTRY)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Set while a device graph is warmed up and captured (`capturing`): providers whose kernel cannot
# be captured are skipped.
_CAPTURING: contextvars.ContextVar[bool] = contextvars.ContextVar("ascend_kernels_capturing", default=False)

# op -> provider name chosen explicitly by `use_providers` in the current context.
_CHOICE: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "ascend_kernels_provider_choice", default={}
)


def register_provider(provider: Provider) -> Provider:
    """Adds ``provider`` to the table (used by this package's op and provider modules); a
    ``native`` provider defines its op.

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
        >>> from ascend_kernels.registry import available_providers
        >>> available_providers("rms_norm", "cpu")
        ['native']
    """
    return [p.name for p in providers(op) if p.supported(device_type)]


def _extras_installed(p: Provider) -> bool:
    # Installed means importable: MindIE SD's op plugin is built for some torch releases only and
    # raises at import on the others, which must not turn its fusion on for "auto".
    return all(sys.modules.get(name) is not None or _imports(name) for name in p.extras)


@functools.lru_cache(maxsize=None)
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

    That is the best non-native provider that runs on ``platform``, is `Provider.faster_than_unfused`
    and is available: on this machine when it runs here, else (resolving ``"auto"`` for another
    platform, e.g. ``override_platform("npu")`` on a CPU machine) the platform's own provider
    (``npu`` on ``"npu"``: it exists wherever the platform does) with its `Provider.extras`
    installed here. None when there is none: ``"auto"`` leaves the fusion out.

    Args:
        op: an op name of `OPS`.
        platform: ``"npu"``, ``"cuda"`` or ``"cpu"``.

    Example:
        >>> from ascend_kernels.registry import auto_provider
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

    "Typical" means arguments inside every provider's `Provider.supports_args`; a call outside
    them falls back to the next provider. The reason names the kernel (from `Provider.describe`)
    and says when the provider is not one ``fusions="auto"`` relies on.

    Example:
        >>> from ascend_kernels.registry import explain
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
            f"the PyTorch reference composite (no kernel provider runs on {device_type!r})")
    why = chosen.describe() if chosen.describe else f"{chosen.name} kernel"
    if not chosen.is_faster():
        why += " (not in fusions='auto': no faster than the unfused ops here)"
    return chosen.name, why


@contextlib.contextmanager
def use_providers(**choice: str) -> Iterator[None]:
    """Chooses providers explicitly for the calls made inside the ``with`` block.

    The choice is context-local (``contextvars``): it does not leak to other threads or to code
    outside the block, and nested blocks extend the outer choice. A chosen provider that cannot
    run the call (wrong device, unsupported arguments) raises instead of silently falling back.

    Args:
        **choice: ``op_name=provider_name``, e.g. ``rms_norm="native"``.

    Raises:
        ValueError: unknown op or provider name (the message lists the valid ones).

    Example:
        >>> import torch, ascend_kernels
        >>> from ascend_kernels.registry import use_providers
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
    """Marks the calls inside the ``with`` block as running under device-graph capture (context-local):
    each op then picks a provider whose `Provider.capturable` accepts the call.

    Example:
        >>> import torch, ascend_kernels
        >>> from ascend_kernels.registry import capturing
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
    """The provider that runs ``op(*args)``: the explicit `use_providers` choice, else the best
    supported one for the device of the first tensor argument and these arguments.

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
