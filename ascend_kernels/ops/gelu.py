"""``ascend_kernels::gelu_tanh`` (exactly ``F.gelu(x, approximate="tanh")``) and
``ascend_kernels::fast_gelu`` (``x * sigmoid(1.702 x)``, in fp32).

They differ by up to about 0.02 near |x| = 2, so replacing one by the other is opt-in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import List

import torch
import torch.nn.functional as F

from ..registry import Provider, dispatch, register_provider
from ._autograd import fake_grads, register_vjp_autograd, vjp_grads

__all__ = ["fast_gelu", "fast_gelu_native", "gelu_tanh", "gelu_tanh_native"]


def gelu_tanh_native(x: torch.Tensor) -> torch.Tensor:
    """Reference: ATen's tanh GELU (computes in fp32 internally for bf16/fp16 inputs)."""
    return F.gelu(x, approximate="tanh")


def fast_gelu_native(x: torch.Tensor) -> torch.Tensor:
    """Reference: ``x * sigmoid(1.702 x)`` in fp32 (fp64 stays fp64), returned in x.dtype."""
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(cdt)
    return (xf * torch.sigmoid(1.702 * xf)).to(x.dtype)


_DOC = """{summary}

    Args:
        x: any floating tensor.

    Returns:
        tensor of x's shape and dtype.

    Example:
        >>> import torch, ascend_kernels
        >>> torch.ops.ascend_kernels.{name}(torch.zeros(3))
        tensor([0., 0., 0.])
    """


def _define_unary(name: str, native: Callable[[torch.Tensor], torch.Tensor], summary: str):
    """Defines ``ascend_kernels::<name>(Tensor x) -> Tensor`` with its fake, vjp backward op and native provider."""

    @torch.library.custom_op(f"ascend_kernels::{name}", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return dispatch(name, x)

    @op.register_fake
    def _(x):
        return torch.empty_like(x)

    @torch.library.custom_op(f"ascend_kernels::{name}_backward", mutates_args=())
    def backward(grad: torch.Tensor, x: torch.Tensor) -> List[torch.Tensor]:
        return vjp_grads(native, (x,), grad)

    @backward.register_fake
    def _(grad, x):
        return fake_grads((x,))

    op.__doc__ = _DOC.format(summary=summary, name=name)
    backward.__doc__ = f"Gradient ``[dx]`` of `{name}`."
    register_vjp_autograd(op, backward)
    register_provider(Provider(name, "native", native))
    return op, backward


gelu_tanh, gelu_tanh_backward = _define_unary(
    "gelu_tanh", gelu_tanh_native, """tanh-approximate GELU, exactly ``F.gelu(x, approximate="tanh")``."""
)
fast_gelu, fast_gelu_backward = _define_unary(
    "fast_gelu", fast_gelu_native, "Sigmoid-approximate GELU ``x * sigmoid(1.702 x)`` (not equal to `gelu_tanh`)."
)
