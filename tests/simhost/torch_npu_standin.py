"""The stand-in torch_npu distribution's module (tests/simhost/site/torch_npu): CONTRACT tests, not hardware.

`SimHostTorchNpu` is `tests.kernels.npu_standins.StandInTorchNpu` (A2 SoC, ``jit_compile=False``,
every aclnn kernel present) with the two ops diffusers calls itself on an NPU host turned into
``npu::`` torch.library ops, as torch_npu registers them, so ``torch.compile`` puts them in the
graph as nodes (a Python callable would be traced through and its decomposition fused by our
passes: a second fusion no NPU host ever sees):

- ``npu_rms_norm(Tensor input, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)``: the
  schema in torch_npu 2.10.0.post6's ``libtorch_npu.so``; its doc (``_op_plugin_docs.py``, 2.10.0.post6
  and 2.14.0) says gamma's dtype must equal the input's, which the CPU kernel enforces; ``rstd``
  is fp32 with the input's leading dims and 1 over gamma's (``_meta_registrations.py``).
- ``npu_geglu(Tensor input, int dim=-1, int approximate=1, bool activate_left=False) ->
  (Tensor, Tensor)``: halves along ``dim``; GELU (``approximate`` 0 = none, 1 = tanh) of the right
  half (the left with ``activate_left=True``) times the other; returns ``(out, gelu)``, both in the
  input's dtype and half the size along ``dim`` (doc and meta registration); op_api kernel
  ``aclnnGeGluV3`` (the symbol the 2.10.0.post6 library calls).

Results are computed in fp32 from the inputs and every call is recorded in ``calls``, as the other
stand-in ops do. What only an Ascend device settles (exact numerics, whether an fp32 gamma works in
spite of the doc) is not decided here: docs/npu-notes.md lists it.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from tests.kernels.npu_standins import A2_SOC, ALL_ACLNN, StandInTorchNpu

__all__ = ["SCHEMAS", "SimHostTorchNpu", "VERSION", "op_api_kernels"]

VERSION = "2.10.0.post6"
# Verbatim from torch_npu 2.10.0.post6's lib/libtorch_npu.so (the same in 2.14.0).
SCHEMAS = {
    "npu_rms_norm": "npu_rms_norm(Tensor input, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    "npu_geglu": "npu_geglu(Tensor input, int dim=-1, int approximate=1, bool activate_left=False) -> (Tensor, Tensor)",
}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LIB: list = []


def op_api_kernels() -> frozenset:
    """The aclnn kernels the stand-in host's CANN holds: the base stand-in's plus ``aclnnGeGluV3``."""
    return ALL_ACLNN | {"aclnnGeGluV3"}


def _current() -> SimHostTorchNpu | None:
    """The stand-in behind the torch_npu module in ``sys.modules`` (None when it is another one)."""
    standin = getattr(sys.modules.get("torch_npu"), "_standin", None)
    return standin if isinstance(standin, SimHostTorchNpu) else None


def _record(name: str, bound: dict) -> None:
    standin = _current()
    if standin is not None:
        standin.calls.append((name, bound))


def _check_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in _DTYPES:
        raise RuntimeError(f"{name}: dtype {t.dtype} not supported (float16, bfloat16, float32)")
    fake = _current()
    if t.dtype == torch.bfloat16 and (fake.soc if fake is not None else A2_SOC) < 220:
        raise RuntimeError(f"{name}: bfloat16 needs an Atlas A2 or newer SoC")


def _rstd_shape(x: torch.Tensor, gamma: torch.Tensor) -> list[int]:
    lead = x.dim() - gamma.dim()
    return [x.shape[i] if i < lead else 1 for i in range(x.dim())]


def _rms_norm(input, gamma, epsilon=1e-6):
    _record("npu_rms_norm", dict(input=input, gamma=gamma, epsilon=epsilon))
    _check_dtype("npu_rms_norm", input)
    if not 2 <= input.dim() <= 8 or tuple(gamma.shape) != tuple(input.shape[input.dim() - gamma.dim() :]):
        raise RuntimeError(
            f"npu_rms_norm: input {tuple(input.shape)} (2-8 dims) and gamma {tuple(gamma.shape)} "
            "(input's trailing dims) do not fit"
        )
    if gamma.dtype != input.dtype:  # _op_plugin_docs.py: "gamma: dtype must equal self's"
        raise RuntimeError(
            f"npu_rms_norm: gamma dtype {gamma.dtype} must equal the input's {input.dtype} "
            f"(torch_npu {VERSION} and 2.14.0 document it so)"
        )
    dims = tuple(range(input.dim() - gamma.dim(), input.dim()))
    xf = input.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(input.dtype), rstd


def _rms_norm_fake(input, gamma, epsilon=1e-6):
    return torch.empty_like(input), input.new_empty(_rstd_shape(input, gamma), dtype=torch.float32)


def _geglu_shape(input, dim):
    if not 1 <= input.dim() <= 8:
        raise RuntimeError(f"npu_geglu: input has {input.dim()} dims, the op takes 1 to 8")
    if not -input.dim() <= dim < input.dim():
        raise RuntimeError(f"npu_geglu: dim {dim} out of range [{-input.dim()}, {input.dim() - 1}]")
    shape = list(input.shape)
    if shape[dim] % 2:
        raise RuntimeError(f"npu_geglu: size {shape[dim]} along dim {dim} is not divisible by 2")
    shape[dim] //= 2
    return shape


def _geglu(input, dim=-1, approximate=1, activate_left=False):
    _record("npu_geglu", dict(input=input, dim=dim, approximate=approximate, activate_left=activate_left))
    _check_dtype("npu_geglu", input)
    _geglu_shape(input, dim)
    if approximate not in (0, 1):
        raise RuntimeError(f"npu_geglu: approximate must be 0 (none) or 1 (tanh), got {approximate}")
    left, right = input.float().chunk(2, dim)
    gate, other = (left, right) if activate_left else (right, left)
    gelu = F.gelu(gate, approximate="tanh" if approximate == 1 else "none")
    return (other * gelu).to(input.dtype), gelu.to(input.dtype)


def _geglu_fake(input, dim=-1, approximate=1, activate_left=False):
    shape = _geglu_shape(input, dim)
    return input.new_empty(shape), input.new_empty(shape)


def _define_ops() -> None:
    """``npu::npu_rms_norm`` and ``npu::npu_geglu`` once per process (schemas above, CPU kernels
    of the documented semantics, fake impls); an op some other stand-in defined first is kept."""
    if _LIB:
        return
    lib = torch.library.Library("npu", "FRAGMENT")  # noqa: TOR901  (test-only stand-in of torch_npu's namespace)
    for name, impl, fake in (("npu_rms_norm", _rms_norm, _rms_norm_fake), ("npu_geglu", _geglu, _geglu_fake)):
        try:
            getattr(torch.ops.npu, name).default  # noqa: B018  (raises when the op is not registered)
            continue
        except (AttributeError, RuntimeError):
            pass
        lib.define(SCHEMAS[name])
        lib.impl(name, impl, "CPU")
        torch.library.register_fake(f"npu::{name}", fake, lib=lib)
    _LIB.append(lib)


class SimHostTorchNpu(StandInTorchNpu):
    """The stand-in behind ``import torch_npu`` in the simulated-host process (see the module docstring).

    The package module itself stays a plain module holding `exports` (dynamo on torch 2.10 traces
    ``import torch_npu`` inside a forward only when the module's type is exactly ``ModuleType``);
    this object, ``torch_npu._standin``, holds the stand-in's state: ``calls``, ``soc``, ``jit``, ``aclnn``.

    Args:
        **kw: `StandInTorchNpu` arguments (default: A2, ``jit_compile=False``, `op_api_kernels`).
    """

    def __init__(self, **kw):
        kw.setdefault("aclnn", op_api_kernels())
        super().__init__(**kw)
        _define_ops()
        self.npu_rms_norm = torch.ops.npu.npu_rms_norm
        self.npu_geglu = torch.ops.npu.npu_geglu

    def exports(self) -> dict:
        """The public attributes of the torch_npu module: its ops, ``npu`` and ``__version__``."""
        names = [n for n in vars(self) if n.startswith("npu")]
        return {**{n: getattr(self, n) for n in names}, "__version__": VERSION, "_standin": self}
