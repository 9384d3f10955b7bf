"""``triton`` providers: Triton kernels for CUDA GPUs, and for Ascend NPUs through triton-ascend.

Kernels (forward only; the backward of every op stays the native composite, see
`ascend_kernels.ops._autograd`): ``rms_norm``, ``rope`` (both layouts), ``adaln_modulate`` and
``mul_add``, one module each in this package. Importing this package imports neither ``triton``
nor a kernel module: a kernel module is imported on the first call that runs it, and
`triton_available` / `triton_ascend_available` only look for the installed packages.

Where the provider runs (`Provider.supported`):

- ``npu``: when triton-ascend is installed. The alternative there is the native composite
  dispatched op by op (torch_npu has no adaLN or multiply-add kernel), which a single kernel
  replaces.
- ``cuda``: for an op measured faster than Inductor's own code for the same composite at the
  model sizes (`ascend_kernels.triton.measurements`; nothing is recorded yet, so today the
  provider runs on CUDA only when chosen explicitly, ``use_providers(rms_norm="triton")``). On
  CUDA the alternative to a fused op is not eager but Inductor's fused code, and an opaque op
  also keeps Inductor from fusing neighbouring pointwise ops into it, so a kernel must be
  measured before ``fusions="auto"`` (which asks the registry) picks its fusion.

Each provider's ``supports_args`` (`ascend_kernels.triton.limits`) accepts the fp16/bf16/fp32
calls its kernel handles (row lengths that fit one tile, at most 4 dims, row-major strides);
others fall back to the native provider.

>>> from ascend_kernels.registry import available_providers
>>> available_providers("adaln_modulate", "cpu")
['native']
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Callable

import torch

from .. import registry
from ..registry import Provider, register_provider
from . import limits, measurements

__all__ = ["DEVICE_TYPES", "KERNELS", "kernel", "triton_ascend_available", "triton_available"]

# Device types the kernels can take tensors of. The interpreter tests (tests/triton) widen it to
# "cpu" under TRITON_INTERPRET=1, as the npu contract tests widen the npu providers' list; nothing
# else should change it.
DEVICE_TYPES: tuple[str, ...] = ("cuda", "npu")

# op -> (kernel module of this package, its launcher with the op's signature, supports_args).
KERNELS: dict[str, tuple[str, str, Callable[..., bool]]] = {
    "rms_norm": ("rms_norm", "rms_norm", limits.rms_norm_supports),
    "rope": ("rope", "rope", limits.rope_supports),
    "adaln_modulate": ("adaln", "adaln_modulate", limits.adaln_modulate_supports),
    "mul_add": ("mul_add", "mul_add", limits.mul_add_supports),
}


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether ``triton`` (or triton-ascend, which installs as ``triton``) is installed (not imported).

    >>> isinstance(triton_available(), bool)
    True
    """
    return importlib.util.find_spec("triton") is not None


@functools.lru_cache(maxsize=None)
def triton_ascend_available() -> bool:
    """Whether triton-ascend (the Triton compiler for Ascend NPUs) is installed (not imported).

    Community ``triton`` and triton-ascend both install the ``triton`` module; only the
    distribution's name tells them apart (from 3.2.1, triton-ascend even depends on community
    triton and overwrites its directory).

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
    # An explicit `use_providers(op="triton")` (context-local) opts in where no measurement does.
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


@functools.lru_cache(maxsize=None)
def kernel(op: str) -> Callable[..., torch.Tensor]:
    """The Triton launcher of ``op``, with the op's signature (imports triton and the kernel module).

    Calls it directly, bypassing the registry (benchmarks, tests); it accepts only the arguments
    its provider's ``supports_args`` accepts.

    Args:
        op: one of `KERNELS`.

    Raises:
        KeyError: an op without a Triton kernel (the message lists those with one).

    >>> rope = kernel("rope")  # doctest: +SKIP
    >>> out = rope(x, cos, sin, "interleaved")  # doctest: +SKIP
    """
    if op not in KERNELS:
        raise KeyError(f"no Triton kernel for op {op!r}; ops with one: {', '.join(KERNELS)}")
    module, name, _ = KERNELS[op]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def _provider(op: str) -> Provider:
    def impl(*args):
        return kernel(op)(*args)

    impl.__name__ = impl.__qualname__ = f"triton_{op}"
    # Module globals looked up at call time (tests monkeypatch them), never bound here.
    return Provider(op, "triton", impl, runs_on=_runs_on(op), available=lambda: triton_available(),
                    supports_args=KERNELS[op][2])


# No kernel for gelu_tanh / fast_gelu: one pointwise op, which torch and Inductor already run at
# about memory bandwidth (FINDINGS section 8: eager gelu_tanh at 92% of copy bandwidth on an H100).
for _op in KERNELS:
    register_provider(_provider(_op))
