"""``ascend_kernels::add_rms_norm``: a residual add, then RMSNorm of the sum; returns both.

``s = x1 + x2`` (torch's promotion), ``y = rms_norm(s, weight, eps, out_dtype)``: the sum is
rounded to its dtype before it is normalized, as the unfused code does. Replaces
``x = x + attn; h = norm(x)`` where the block keeps ``x`` as its next residual (Z-Image and
Lumina 2 blocks: ``x = x + gate * norm2(attn); ffn_norm1(x)``). A two-output op: its pass
replaces two graph values with one call.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..registry import Provider, dispatch, register_provider
from ._autograd import fake_grads, register_vjp_autograd, vjp_grads
from .rms_norm import rms_norm_native

__all__ = ["add_rms_norm", "add_rms_norm_native"]


def add_rms_norm_native(
    x1: torch.Tensor,
    x2: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference implementation (defines the semantics; the fake impl and the CPU path)."""
    s = x1 + x2
    return rms_norm_native(s, weight, eps, out_dtype), s


@torch.library.custom_op("ascend_kernels::add_rms_norm", mutates_args=())
def add_rms_norm(
    x1: torch.Tensor,
    x2: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm over the last dimension (computed in fp32), returning both.

    Args:
        x1: residual, shape ``(..., D)``.
        x2: added to it (broadcast to ``x1 + x2``'s shape).
        weight: optional ``(D,)`` scale (any float dtype; applied in fp32).
        eps: added to the mean square before ``rsqrt``.
        out_dtype: dtype of the normalized result; ``None`` means the sum's dtype.

    Returns:
        ``(normed, residual_sum)``: ``rms_norm(x1 + x2)`` in ``out_dtype`` and ``x1 + x2``.

    Example:
        >>> import torch, ascend_kernels
        >>> x, h = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
        >>> y, s = torch.ops.ascend_kernels.add_rms_norm(x, h, torch.ones(8), 1e-6)
        >>> y.shape, torch.equal(s, x + h)
        (torch.Size([2, 5, 8]), True)
    """
    return dispatch("add_rms_norm", x1, x2, weight, eps, out_dtype)


@add_rms_norm.register_fake
def _(x1, x2, weight, eps, out_dtype=None):
    return add_rms_norm_native(x1, x2, weight, eps, out_dtype)


@torch.library.custom_op("ascend_kernels::add_rms_norm_backward", mutates_args=())
def add_rms_norm_backward(
    grad_y: torch.Tensor,
    grad_s: torch.Tensor,
    x1: torch.Tensor,
    x2: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    out_dtype: Optional[torch.dtype],
) -> List[torch.Tensor]:
    """Gradients ``[dx1, dx2, dweight?]`` of `add_rms_norm` (dweight only when weight is given)."""
    return vjp_grads(add_rms_norm_native, (x1, x2, weight, eps, out_dtype), (grad_y, grad_s))


@add_rms_norm_backward.register_fake
def _(grad_y, grad_s, x1, x2, weight, eps, out_dtype):
    return fake_grads((x1, x2, weight))


register_vjp_autograd(add_rms_norm, add_rms_norm_backward)
register_provider(Provider("add_rms_norm", "native", add_rms_norm_native))
