"""``ascend_kernels::gelu_tanh`` and ``ascend_kernels::fast_gelu``: two different activations.

Schemas::

    gelu_tanh(Tensor x) -> Tensor   # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), exactly
                                    # F.gelu(x, approximate="tanh") / nn.GELU(approximate="tanh")
    fast_gelu(Tensor x) -> Tensor   # x * sigmoid(1.702 x), computed in fp32, returned in x.dtype

``fast_gelu`` is a separate op because it is NOT equal to ``gelu_tanh`` (max abs difference
about 0.02 near |x| = 2): replacing one by the other changes a model's numerics and is opt-in.
"""

from __future__ import annotations

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


@torch.library.custom_op("ascend_kernels::gelu_tanh", mutates_args=())
def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh-approximate GELU, exactly ``F.gelu(x, approximate="tanh")``.

    Args:
        x: any floating tensor.

    Returns:
        tensor of x's shape and dtype.

    Example:
        >>> import torch, ascend_kernels
        >>> torch.ops.ascend_kernels.gelu_tanh(torch.zeros(3))
        tensor([0., 0., 0.])
    """
    return dispatch("gelu_tanh", x)


@gelu_tanh.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("ascend_kernels::gelu_tanh_backward", mutates_args=())
def gelu_tanh_backward(grad: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
    """Gradient ``[dx]`` of `gelu_tanh`."""
    return vjp_grads(gelu_tanh_native, (x,), grad)


@gelu_tanh_backward.register_fake
def _(grad, x):
    return fake_grads((x,))


@torch.library.custom_op("ascend_kernels::fast_gelu", mutates_args=())
def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    """Sigmoid-approximate GELU ``x * sigmoid(1.702 x)`` (not equal to `gelu_tanh`).

    Args:
        x: any floating tensor.

    Returns:
        tensor of x's shape and dtype.

    Example:
        >>> import torch, ascend_kernels
        >>> torch.ops.ascend_kernels.fast_gelu(torch.zeros(3))
        tensor([0., 0., 0.])
    """
    return dispatch("fast_gelu", x)


@fast_gelu.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("ascend_kernels::fast_gelu_backward", mutates_args=())
def fast_gelu_backward(grad: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
    """Gradient ``[dx]`` of `fast_gelu`."""
    return vjp_grads(fast_gelu_native, (x,), grad)


@fast_gelu_backward.register_fake
def _(grad, x):
    return fake_grads((x,))


register_vjp_autograd(gelu_tanh, gelu_tanh_backward)
register_vjp_autograd(fast_gelu, fast_gelu_backward)
register_provider(Provider("gelu_tanh", "native", gelu_tanh_native))
register_provider(Provider("fast_gelu", "native", fast_gelu_native))
