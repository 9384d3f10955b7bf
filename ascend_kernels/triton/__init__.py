"""``triton`` providers: a slot for Triton kernels (CUDA, and Ascend NPUs through triton-ascend).

No kernel is written yet (a later, GPU-gated issue). A kernel lands by adding
``KERNELS[op] = fn`` (``fn`` with the op's exact signature) from a module of this package; the
provider of every op is already registered and becomes available on ``cuda``/``npu`` tensors
once a kernel for the op exists and ``triton`` is importable. Until then
``available_providers(op, "cuda")`` lists only ``native``.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Callable

import torch

from ..registry import OPS, Provider, register_provider

__all__ = ["DEVICE_TYPES", "KERNELS", "triton_available"]

DEVICE_TYPES: tuple[str, ...] = ("cuda", "npu")

# op name -> Triton kernel wrapper with the op's signature. Empty: no kernels yet.
KERNELS: dict[str, Callable[..., torch.Tensor]] = {}


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether ``triton`` (or triton-ascend, which installs as ``triton``) is installed."""
    return importlib.util.find_spec("triton") is not None


def _runs_on(device_type: str) -> bool:
    return device_type in DEVICE_TYPES


def _provider(op: str) -> Provider:
    def impl(*args):
        return KERNELS[op](*args)

    return Provider(op, "triton", impl, runs_on=_runs_on, available=lambda: op in KERNELS and triton_available())


for _op in OPS:
    register_provider(_provider(_op))
