"""``triton`` providers: forward Triton kernels for Ascend NPUs (through triton-ascend) and, where
measured faster than Inductor's code, CUDA GPUs (docs/triton.md). Importing this imports no triton.

>>> from ascend_kernels.registry import available_providers
>>> available_providers("adaln_modulate", "cpu")
['native']
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
from collections.abc import Callable
from typing import NamedTuple

import torch

from .. import registry
from ..registry import Provider, register_provider
from . import limits, measurements

__all__ = [
    "DEVICE_TYPES",
    "KERNELS",
    "TritonKernel",
    "kernel",
    "planner",
    "traceable_op",
    "triton_ascend_available",
    "triton_available",
]

# Device types the kernels take tensors of; only the interpreter tests widen it (to "cpu").
DEVICE_TYPES: tuple[str, ...] = ("cuda", "npu")


class TritonKernel(NamedTuple):
    """Where an op's Triton kernel lives (named, not imported: importing a kernel module imports triton).

    Args:
        module: its module in this package.
        launcher: the function there with the op's signature; its launch planner is ``plan_<launcher>``.
        supports_args: the kernel's argument limits (in `limits`, which imports no triton).

    >>> KERNELS["adaln_modulate"].module
    'adaln'
    """

    module: str
    launcher: str
    supports_args: Callable[..., bool]


# op -> its Triton kernel: a new kernel is its file here, its ``limits.<op>_supports`` and its entry.
# No GELU kernel: one pointwise op already runs at about memory bandwidth (docs/triton.md).
KERNELS: dict[str, TritonKernel] = {
    "adaln_modulate": TritonKernel("adaln", "adaln_modulate", limits.adaln_modulate_supports),
    "mul_add": TritonKernel("mul_add", "mul_add", limits.mul_add_supports),
    "rms_norm": TritonKernel("rms_norm", "rms_norm", limits.rms_norm_supports),
    "rope": TritonKernel("rope", "rope", limits.rope_supports),
}


@functools.cache
def triton_available() -> bool:
    """Whether ``triton`` (or triton-ascend, which installs as ``triton``) is installed (not imported).

    >>> isinstance(triton_available(), bool)
    True
    """
    return importlib.util.find_spec("triton") is not None


@functools.cache
def triton_ascend_available() -> bool:
    """Whether triton-ascend (the Triton compiler for Ascend NPUs) is installed (not imported).

    Both install the ``triton`` module; only the distribution's name tells them apart.

    >>> isinstance(triton_ascend_available(), bool)
    True
    """
    import importlib.metadata  # here, not at import: it pulls in email/zipfile/csv

    try:
        importlib.metadata.distribution("triton-ascend")
    except importlib.metadata.PackageNotFoundError:
        return False
    return triton_available()


def _chosen_explicitly(op: str) -> bool:
    return registry._CHOICE.get().get(op) == "triton"


def _runs_on(op: str) -> Callable[[str], bool]:
    def runs_on(device_type: str) -> bool:
        if device_type not in DEVICE_TYPES:
            return False
        if device_type == "npu":
            return triton_ascend_available()
        if device_type == "cuda":
            return measurements.beats_compiler(op, "cuda") or _chosen_explicitly(op)
        return True  # a device type the tests added (the interpreter on "cpu")

    return runs_on


def _opt_in(op: str) -> Callable[[str], str | None]:
    def opt_in(device_type: str) -> str | None:
        if device_type != "cuda" or measurements.beats_compiler(op, "cuda"):
            return None
        return (
            f"installed, used only when chosen (use_providers({op}='triton')): not measured faster than "
            "Inductor's code for this composite (ascend_kernels/triton/measurements.py)"
        )

    return opt_in


@functools.cache
def kernel(op: str) -> Callable[..., torch.Tensor]:
    """The Triton launcher of ``op``, with the op's signature (imports triton and the kernel module).

    It bypasses the registry (benchmarks, tests) and takes only what ``supports_args`` accepts.

    Args:
        op: one of `KERNELS`.

    Raises:
        KeyError: an op without a Triton kernel (the message lists those with one).

    >>> rope = kernel("rope")  # doctest: +SKIP
    >>> out = rope(x, cos, sin, "interleaved")  # doctest: +SKIP
    """
    module, name = _kernel_module(op)
    return getattr(module, name)


@functools.cache
def planner(op: str) -> Callable[..., tuple]:
    """The launch planner of ``op``'s kernel: returns the output (allocated, not written) and the
    ``_common.Launch`` that fills it, from tensor metadata only (meta tensors work).

    Args:
        op: one of `KERNELS`.

    Raises:
        KeyError: an op without a Triton kernel (the message lists those with one).

    >>> out, launch = planner("mul_add")(gate, y, residual)  # doctest: +SKIP
    """
    module, name = _kernel_module(op)
    return getattr(module, f"plan_{name}")


def _kernel_module(op: str):
    if op not in KERNELS:
        raise KeyError(f"no Triton kernel for op {op!r}; ops with one: {', '.join(KERNELS)}")
    entry = KERNELS[op]
    return importlib.import_module(f"{__name__}.{entry.module}"), entry.launcher


@functools.cache
def traceable_op(op: str) -> torch._ops.OpOverload:
    """``torch.ops.ascend_kernels_triton.<op>``: ``op``'s kernel as a ``torch.library.triton_op``.

    Same schema as ``torch.ops.ascend_kernels.<op>``, backed by one Triton launch: Inductor traces
    into it and launches the kernel from its own code, skipping the dispatcher, the registry and
    the Python launch planning an opaque op pays per call. Registered on first use.

    Args:
        op: one of `KERNELS`.

    Raises:
        KeyError: an op without a Triton kernel (the message lists those with one).

    >>> rms_norm = traceable_op("rms_norm")  # doctest: +SKIP
    >>> out = rms_norm(x, weight, 1e-6)  # doctest: +SKIP
    """
    launcher, plan = kernel(op), planner(op)  # KeyError for an op without a kernel

    def body(*args, **kwargs):
        out, launch = plan(*args, **kwargs)
        launch.traced()
        return out

    # The schema is inferred from the launcher's signature, its annotations resolved in its module.
    body.__signature__ = inspect.signature(launcher, eval_str=True)
    body.__name__ = body.__qualname__ = f"traced_{op}"

    torch.library.triton_op(f"ascend_kernels_triton::{op}", body, mutates_args=())
    return getattr(torch.ops.ascend_kernels_triton, op).default


def _compiler_op(op: str) -> Callable[[str], torch._ops.OpOverload | None]:
    def compiler_op(device_type: str):
        # CUDA only (torch_npu's Inductor with triton-ascend is unchecked); interpreter kernels
        # (TRITON_INTERPRET=1) are no compiler's input.
        if device_type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
            return None
        return traceable_op(op)

    return compiler_op


def _provider(op: str) -> Provider:
    def impl(*args):
        return kernel(op)(*args)

    impl.__name__ = impl.__qualname__ = f"triton_{op}"
    # Module globals looked up at call time (tests monkeypatch them), never bound here.
    return Provider(
        op,
        "triton",
        impl,
        runs_on=_runs_on(op),
        available=lambda: triton_available(),
        supports_args=KERNELS[op].supports_args,
        compiler_op=_compiler_op(op),
        opt_in=_opt_in(op),
    )


for _op in KERNELS:
    register_provider(_provider(_op))
