"""``ascend_kernels::rms_norm``: ``x * rsqrt(mean(x**2, -1) + eps) [* weight]``.

Computed in fp32, returned in ``out_dtype`` or ``x.dtype``. Replaces ``torch.nn.RMSNorm`` /
``F.rms_norm`` and diffusers' ``RMSNorm`` (Flux/Wan ``norm_q``/``norm_k``).
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..registry import Provider, dispatch, register_provider
from ._autograd import fake_grads, register_vjp_autograd, vjp_grads

__all__ = ["rms_norm", "rms_norm_native"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm_native(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, out_dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """Reference implementation (defines the semantics; the fake impl and the CPU path)."""
    cdt = _compute_dtype(x.dtype)
    xf = x.to(cdt)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(cdt)
    return y.to(out_dtype or x.dtype)


@torch.library.custom_op("ascend_kernels::rms_norm", mutates_args=())
def rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, out_dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in fp32.

    Args:
        x: input of shape ``(..., D)``.
        weight: optional ``(D,)`` scale (any float dtype; applied in fp32).
        eps: added to the mean square before ``rsqrt``.
        out_dtype: dtype of the result; ``None`` means ``x.dtype``.

    Returns:
        tensor of ``x``'s shape in ``out_dtype or x.dtype``.

    Example:
        >>> import torch, ascend_kernels
        >>> x = torch.randn(2, 5, 8)
        >>> torch.ops.ascend_kernels.rms_norm(x, torch.ones(8), 1e-6).shape
        torch.Size([2, 5, 8])
    """
    return dispatch("rms_norm", x, weight, eps, out_dtype)


@rms_norm.register_fake
def _(x, weight, eps, out_dtype=None):
    return rms_norm_native(x, weight, eps, out_dtype)


@torch.library.custom_op("ascend_kernels::rms_norm_backward", mutates_args=())
def rms_norm_backward(
    grad: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, out_dtype: Optional[torch.dtype]
) -> List[torch.Tensor]:
    """Gradients ``[dx, dweight?]`` of `rms_norm` (dweight only when weight is given)."""
    return vjp_grads(rms_norm_native, (x, weight, eps, out_dtype), grad)


@rms_norm_backward.register_fake
def _(grad, x, weight, eps, out_dtype):
    return fake_grads((x, weight))


register_vjp_autograd(rms_norm, rms_norm_backward)
register_provider(Provider("rms_norm", "native", rms_norm_native))
