"""``npu`` providers: the ``ascend_kernels`` ops on Ascend NPUs through torch_npu's fused kernels.

torch_npu is imported lazily, only when an op runs on a tensor whose device type is in
`DEVICE_TYPES` (an NPU tensor means torch_npu is already loaded): importing ``ascend_kernels``
never imports it. Each provider's ``supports_args`` encodes the documented limits of the kernel
(shapes, dtypes, layouts); arguments outside them fall back to the next provider.

Coverage: ``rms_norm`` (``npu_rms_norm``), ``rope`` (``npu_rotary_mul``), ``gelu_tanh``
(``npu_gelu(approximate="tanh")``), ``fast_gelu`` (``npu_fast_gelu``). torch_npu has no adaLN or
multiply-add op: on NPU, ``adaln_modulate`` and ``mul_add`` use the ``triton`` provider when
triton-ascend and a kernel exist (see `ascend_kernels.triton`), else the native composite (plain
aten ops, which torch_npu runs as separate NPU kernels).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from types import ModuleType

from ..registry import Provider, register_provider
from . import kernels

__all__ = ["DEVICE_TYPES", "runs_on", "torch_npu_available"]

# Device types the torch_npu kernels run on. (The contract tests widen it to "cpu" together with a
# stand-in torch_npu module; nothing else should change it.)
DEVICE_TYPES: tuple[str, ...] = ("npu",)


def runs_on(device_type: str) -> bool:
    """Whether the torch_npu providers can take tensors of ``device_type``."""
    return device_type in DEVICE_TYPES


@functools.lru_cache(maxsize=None)
def _importable() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        importlib.import_module("torch_npu")
    except Exception:  # a broken install is "not available", never an import-time error
        return False
    return True


def torch_npu_available() -> bool:
    """Whether torch_npu is (or can be) imported; imports it on first call if installed."""
    return sys.modules.get("torch_npu") is not None or _importable()


def torch_npu() -> ModuleType:
    """The torch_npu module (imported on first use)."""
    return importlib.import_module("torch_npu")


for _op, _impl, _supports in (
    ("rms_norm", kernels.rms_norm, kernels.rms_norm_supports),
    ("rope", kernels.rope, kernels.rope_supports),
    ("gelu_tanh", kernels.gelu_tanh, kernels.gelu_supports),
    ("fast_gelu", kernels.fast_gelu, kernels.gelu_supports),
):
    register_provider(
        Provider(_op, "npu", _impl, runs_on=runs_on, available=torch_npu_available, supports_args=_supports)
    )
