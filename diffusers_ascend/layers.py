"""Fused layers swapped into diffusers models (RMSNorm, GELU-tanh) and the swap mechanism: a swap
changes only an object's class, so parameters, hooks and state-dict keys stay as they were
(docs/how-fusion-works.md#layer-swaps-vs-graph-passes)."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from diffusers.models import activations, normalization

__all__ = [
    "FastGELU",
    "FastTorchGELU",
    "FusedGELU",
    "FusedDiffusersRMSNorm",
    "FusedRMSNorm",
    "FusedTorchGELU",
    "SWAPS",
    "Swap",
    "apply_swaps",
    "restore_swaps",
    "upstream_fused",
]


def _ops():
    import ascend_kernels  # noqa: F401  (registers torch.ops.ascend_kernels on first use)

    return torch.ops.ascend_kernels


class FusedRMSNorm(torch.nn.RMSNorm):
    """`torch.nn.RMSNorm` computed by ``ascend_kernels.rms_norm`` (fp32 inside, output in x's dtype).

    >>> import torch
    >>> norm = torch.nn.RMSNorm(8, eps=1e-6)
    >>> norm.__class__ = FusedRMSNorm
    >>> norm(torch.ones(2, 8)).shape
    torch.Size([2, 8])
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:  # the op normalizes the last dimension only
            return super().forward(x)
        # nn.RMSNorm's eps=None means finfo(x.dtype).eps.
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return _ops().rms_norm(x, self.weight, eps, None)


class FusedTorchGELU(torch.nn.GELU):
    """`torch.nn.GELU(approximate="tanh")` computed by ``ascend_kernels.gelu_tanh`` (or ``fast_gelu``)."""

    _ascend_op = "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(_ops(), self._ascend_op)(x)


class FastTorchGELU(FusedTorchGELU):
    """`FusedTorchGELU` with the NPU approximation ``x * sigmoid(1.702 x)`` (changes numerics)."""

    _ascend_op = "fast_gelu"


class FusedGELU(activations.GELU):
    """diffusers' `GELU` (Linear then tanh-GELU) with the activation as ``ascend_kernels.gelu_tanh``."""

    _ascend_op = "gelu_tanh"

    def gelu(self, gate: torch.Tensor) -> torch.Tensor:
        return getattr(_ops(), self._ascend_op)(gate)


class FastGELU(FusedGELU):
    """`FusedGELU` with ``ascend_kernels.fast_gelu`` (changes numerics)."""

    _ascend_op = "fast_gelu"


class FusedDiffusersRMSNorm(normalization.RMSNorm):
    """diffusers' `RMSNorm` computed by ``ascend_kernels.rms_norm`` with the stock output dtype
    (the weight multiplies before the single cast: never less precise). Modules with a bias,
    or normalizing more than the last dimension, run the stock code."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.bias is not None or len(self.dim) != 1:
            return super().forward(hidden_states)
        w = self.weight
        if w is None:
            out_dtype = hidden_states.dtype
        elif w.dtype in (torch.float16, torch.bfloat16):
            out_dtype = w.dtype
        else:
            out_dtype = torch.promote_types(torch.float32, w.dtype)
        return _ops().rms_norm(hidden_states, w, self.eps, out_dtype)


@dataclass(frozen=True)
class Swap:
    """One swap: objects whose class is named `source` (exactly, not subclasses) get `target()`.

    Args:
        fusion: the fusion that enables it (``"gelu_tanh"`` swaps also serve ``"fast_gelu"``).
        source: class name of the object replaced (exact type match: a user's subclass is left alone).
        target: returns the fused class (called at swap time).
        applies: extra condition on the object (e.g. ``approximate == "tanh"``).
        fast_target: the class used instead when ``fast_gelu`` is enabled.
    """

    fusion: str
    source: str
    target: Callable[[], type]
    applies: Callable[[object], bool] = lambda obj: True
    fast_target: Callable[[], type] | None = None


def _is_tanh(obj) -> bool:
    return getattr(obj, "approximate", None) == "tanh"


# The model-independent swaps, tried in this order (family swaps are declared by their adapters).
SWAPS: tuple[Swap, ...] = (
    Swap("rms_norm", "RMSNorm", lambda: FusedRMSNorm, applies=lambda m: isinstance(m, torch.nn.RMSNorm)),
    Swap(
        "gelu_tanh",
        "GELU",
        lambda: FusedTorchGELU,
        applies=lambda m: isinstance(m, torch.nn.GELU) and _is_tanh(m),
        fast_target=lambda: FastTorchGELU,
    ),
    Swap(
        "gelu_tanh",
        "GELU",
        lambda: FusedGELU,
        applies=lambda m: type(m).__module__ == "diffusers.models.activations" and _is_tanh(m),
        fast_target=lambda: FastGELU,
    ),
    Swap(
        "rms_norm",
        "RMSNorm",
        lambda: FusedDiffusersRMSNorm,
        applies=lambda m: type(m).__module__ == "diffusers.models.normalization",
    ),
)


def _targets(model: torch.nn.Module) -> Iterable[object]:
    for module in model.modules():
        yield module
        processor = getattr(module, "processor", None)
        if processor is not None and not isinstance(processor, torch.nn.Module):
            yield processor


def apply_swaps(
    model: torch.nn.Module,
    fusions: Iterable[str],
    skipped: list[tuple[str, str, str]] | None = None,
    extra: Iterable[Swap] = (),
) -> tuple[list[tuple[object, type]], dict[str, int]]:
    """Swaps the fused classes into `model` for every enabled fusion that has a swap: `SWAPS`,
    then `extra`, matched by exact class name.

    Args:
        model: a diffusers model or block (every submodule and attention processor is considered).
        fusions: the resolved fusion names (``AscendConfig.resolved_fusions()``).
        skipped: if a list, gets ``(fusion, name, class name, patch)`` for each object whose swap
            would never run: it has an instance ``forward`` (``patch`` None; e.g. group offloading)
            or a method patched in from another file (``patch`` says which).
        extra: family-specific swaps, given by the caller that knows the adapters
            (`diffusers_ascend.adapters.registry.adapter_swaps`).

    Returns:
        ``(undo, counts)``: the ``(object, original class)`` list `restore_swaps` takes, and swaps
        per fusion. On an exception every swap made so far is undone first.

    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> undo, counts = apply_swaps(tiny_flux_transformer(), ["rms_norm", "gelu_tanh"])
    >>> counts == {"rms_norm": 6, "gelu_tanh": 3}  # tiny Flux: 1 double + 1 single block
    True
    """
    from ._diffusers_compat import rebind_hooked_forward

    swaps = SWAPS + tuple(extra)
    enabled = set(fusions)
    fast = "fast_gelu" in enabled
    if fast:
        enabled.add("gelu_tanh")
    undo: list[tuple[object, type]] = []
    counts: dict[str, int] = {}
    seen: set[int] = set()
    names = {id(m): n for n, m in model.named_modules()}
    names.update((id(m.processor), f"{n}.processor") for n, m in model.named_modules() if "processor" in m.__dict__)
    try:
        for obj in _targets(model):
            if id(obj) in seen:  # processors can be shared between attention modules
                continue
            seen.add(id(obj))
            for swap in swaps:
                if swap.fusion not in enabled or type(obj).__name__ != swap.source or not swap.applies(obj):
                    continue
                factory = swap.fast_target if fast and swap.fast_target is not None else swap.target
                target = factory()
                original = type(obj)
                # An instance `forward` (a hook) bypasses the class: swap under it only where it is
                # diffusers' hook dispatcher, whose call of the class's forward can be re-pointed.
                hooked = isinstance(obj, torch.nn.Module) and "forward" in obj.__dict__
                patch = None if hooked else _patched(original, target)
                kept = patch is not None
                if not kept:
                    obj.__class__ = target
                    undo.append((obj, original))
                    if hooked and rebind_hooked_forward(obj, original, target) == 0:
                        undo.pop()  # another hook (not diffusers'): the swap would never run
                        obj.__class__ = original
                        kept = True
                if kept:
                    if skipped is not None:
                        skipped.append((swap.fusion, names.get(id(obj), ""), original.__name__, patch))
                    break
                name = "fast_gelu" if fast and swap.fusion == "gelu_tanh" else swap.fusion
                counts[name] = counts.get(name, 0) + 1
                break
    except BaseException:
        # All or nothing: the caller has no undo list for a half-swapped model.
        restore_swaps(undo)
        raise
    return undo, counts


def _patched(cls: type, target: type) -> str | None:
    """The first method `target` overrides whose code on `cls` is not in the file of the class
    that defines it there (a patch from another package), as ``"Class.method from FILE"``; else None."""
    for attr, value in vars(target).items():
        if not inspect.isfunction(value):
            continue
        owner = next((c for c in cls.__mro__ if attr in vars(c)), None)
        fn = vars(owner).get(attr) if owner is not None else None
        code = getattr(fn, "__code__", None)
        home = getattr(sys.modules.get(owner.__module__), "__file__", None) if owner is not None else None
        if fn is None or home is None:
            continue
        if code is None or os.path.realpath(code.co_filename) != os.path.realpath(home):
            where = code.co_filename if code is not None else type(fn).__name__
            return f"{owner.__name__}.{attr} from {where}"
    return None


def restore_swaps(undo: list[tuple[object, type]]) -> None:
    """Puts back the original classes recorded by `apply_swaps` (the objects never changed), and
    the hooks' references to their forward."""
    from ._diffusers_compat import rebind_hooked_forward

    for obj, cls in reversed(undo):
        if isinstance(obj, torch.nn.Module) and "forward" in obj.__dict__:
            rebind_hooked_forward(obj, type(obj), cls)
        obj.__class__ = cls


def _upstream_branches() -> tuple[tuple[type, str, Callable[[object], bool]], ...]:
    """diffusers' modules whose stock forward calls a torch_npu kernel itself where the torch_npu
    distribution is installed (diffusers 0.42: ``models/normalization.py``, ``models/activations.py``):
    ``(class, kernel, condition on the module)``."""
    from diffusers.models.activations import GEGLU
    from diffusers.models.normalization import RMSNorm

    return (
        (RMSNorm, "npu_rms_norm", lambda m: m.weight is not None),  # weight None: the stock math
        (GEGLU, "npu_geglu", lambda m: True),  # npu_geglu(..., approximate=1): tanh, not the erf GELU
    )


def upstream_fused(model: torch.nn.Module) -> dict[str, int]:
    """The modules of `model` that diffusers fuses itself: torch_npu kernel -> modules whose
    forward (diffusers' own, not a swapped-in class) calls it.

    diffusers takes these branches when it found the torch_npu distribution at its import
    (``diffusers.utils.is_torch_npu_available``), whatever the tensors' device; elsewhere the
    result is empty. A module swapped for one of our fused classes runs our forward instead (its
    kernel is picked by our provider registry, capture rules included), so it is counted in
    `apply_swaps`' counts, never here: one fusion per site.

    Args:
        model: a diffusers model or block.

    Returns:
        ``{kernel: number of modules}``, nonzero entries only.

    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> upstream_fused(tiny_flux_transformer())  # {} where torch_npu is not installed
    {}
    """
    from ._diffusers_compat import diffusers_found_torch_npu

    if not diffusers_found_torch_npu():
        return {}
    counts: dict[str, int] = {}
    branches = _upstream_branches()
    for module in model.modules():
        for cls, kernel, applies in branches:
            if isinstance(module, cls) and type(module).forward is cls.forward and applies(module):
                counts[kernel] = counts.get(kernel, 0) + 1
                break
    return counts
