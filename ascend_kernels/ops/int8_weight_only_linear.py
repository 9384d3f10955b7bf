"""``ascend_kernels::int8_weight_only_linear``: ``F.linear`` with an int8 per-channel weight and
float activations (W8A16), torchao's ``Int8WeightOnlyConfig`` (``Int8Tensor`` without activation
quantization).

The native provider is torchao 0.18's math: ``x @ weight.t().to(x.dtype)`` in x's dtype, times the
scale cast to x's dtype (a second rounding), plus bias, in x's dtype. Per-group scales are another
scheme (torchao dequantizes the weight first) and are refused. The backward is the native math's
gradient (none for the int8 weight).
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..registry import Provider, dispatch, register_provider
from ._autograd import register_vjp_autograd
from .int8_dynamic_linear import check_int8_linear_args, fake_int8_linear_grads, int8_linear_grads

__all__ = ["int8_weight_only_linear", "int8_weight_only_linear_native"]


def int8_weight_only_linear_native(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Reference implementation: torchao 0.18's per-channel weight-only ``Int8Tensor`` linear."""
    check_int8_linear_args("int8_weight_only_linear", x, weight, weight_scale, bias)
    m = torch.mm(x.reshape(-1, x.shape[-1]), weight.t().to(x.dtype))
    y = (m * weight_scale.to(m.dtype).flatten()).reshape(*x.shape[:-1], weight.shape[0])
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


@torch.library.custom_op("ascend_kernels::int8_weight_only_linear", mutates_args=())
def int8_weight_only_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """W8A16 linear: float ``x`` times an int8 per-channel weight.

    Args:
        x: activations ``(..., K)``, float16 / bfloat16 / float32.
        weight: int8 ``(N, K)`` (torchao's ``Int8Tensor.qdata``).
        weight_scale: per-output-channel scale ``(N, 1)`` or ``(N,)``.
        bias: optional ``(N,)``.

    Returns:
        ``(..., N)`` in x's dtype.

    Raises:
        ValueError: arguments that are not this scheme (named in the message).

    Example:
        >>> import torch, ascend_kernels
        >>> w = torch.randint(-128, 128, (6, 8), dtype=torch.int8)
        >>> torch.ops.ascend_kernels.int8_weight_only_linear(torch.randn(2, 3, 8), w, torch.rand(6, 1), None).shape
        torch.Size([2, 3, 6])
    """
    return dispatch("int8_weight_only_linear", x, weight, weight_scale, bias)


@int8_weight_only_linear.register_fake
def _(x, weight, weight_scale, bias=None):
    check_int8_linear_args("int8_weight_only_linear", x, weight, weight_scale, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("ascend_kernels::int8_weight_only_linear_backward", mutates_args=())
def int8_weight_only_linear_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
) -> List[torch.Tensor]:
    """Gradients ``[dx, dweight (zeros), dweight_scale, dbias?]`` of `int8_weight_only_linear`."""
    return int8_linear_grads(int8_weight_only_linear_native, grad, x, weight, weight_scale, bias)


@int8_weight_only_linear_backward.register_fake
def _(grad, x, weight, weight_scale, bias):
    return fake_int8_linear_grads(x, weight, weight_scale, bias)


register_vjp_autograd(int8_weight_only_linear, int8_weight_only_linear_backward)
register_provider(Provider("int8_weight_only_linear", "native", int8_weight_only_linear_native))
