"""``ascend_kernels::adaln_modulate``: ``layer_norm(x) * (1 + scale) + shift``.

Computed in fp32, returned in ``out_dtype`` or ``x.dtype``. ``scale``/``shift`` with one dim fewer
than ``x`` (Flux's ``(B, D)`` chunks) are read as ``(B, 1, D)``; others broadcast against ``x``.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F

from ..registry import Provider, dispatch, register_provider
from ._autograd import fake_grads, register_vjp_autograd, vjp_grads

__all__ = ["adaln_modulate", "adaln_modulate_native"]


def _as_modulation(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(-2) if t.dim() == x.dim() - 1 and x.dim() >= 2 else t


def adaln_modulate_native(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """Reference implementation (defines the semantics; the fake impl and the CPU path)."""
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    w = weight.to(cdt) if weight is not None else None
    b = bias.to(cdt) if bias is not None else None
    y = F.layer_norm(x.to(cdt), (x.shape[-1],), w, b, eps)
    out = y * (1 + _as_modulation(scale, x).to(cdt)) + _as_modulation(shift, x).to(cdt)
    if out.shape != x.shape:
        raise ValueError(
            f"adaln_modulate: scale {tuple(scale.shape)} / shift {tuple(shift.shape)} must broadcast "
            f"to x {tuple(x.shape)} without enlarging it"
        )
    return out.to(out_dtype or x.dtype)


@torch.library.custom_op("ascend_kernels::adaln_modulate", mutates_args=())
def adaln_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """``layer_norm(x) * (1 + scale) + shift`` in one op, computed in fp32.

    Args:
        x: ``(B, S, D)`` (any rank >= 1).
        scale: ``(B, D)`` (read as ``(B, 1, D)``) or broadcastable to x, e.g. ``(B, 1, D)``.
        shift: like ``scale``.
        eps: LayerNorm epsilon.
        weight: optional LayerNorm ``(D,)`` weight (``elementwise_affine``); Flux/Wan have none.
        bias: optional LayerNorm ``(D,)`` bias.
        out_dtype: dtype of the result; ``None`` means ``x.dtype``.

    Returns:
        tensor of x's shape in ``out_dtype or x.dtype``.

    Example:
        >>> import torch, ascend_kernels
        >>> x, scale, shift = torch.randn(2, 5, 8), torch.randn(2, 8), torch.randn(2, 8)
        >>> torch.ops.ascend_kernels.adaln_modulate(x, scale, shift, 1e-6).shape
        torch.Size([2, 5, 8])
    """
    return dispatch("adaln_modulate", x, scale, shift, eps, weight, bias, out_dtype)


@adaln_modulate.register_fake
def _(x, scale, shift, eps, weight=None, bias=None, out_dtype=None):
    return adaln_modulate_native(x, scale, shift, eps, weight, bias, out_dtype)


@torch.library.custom_op("ascend_kernels::adaln_modulate_backward", mutates_args=())
def adaln_modulate_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    out_dtype: Optional[torch.dtype],
) -> List[torch.Tensor]:
    """Gradients ``[dx, dscale, dshift, dweight?, dbias?]`` of `adaln_modulate`."""
    return vjp_grads(adaln_modulate_native, (x, scale, shift, eps, weight, bias, out_dtype), grad)


@adaln_modulate_backward.register_fake
def _(grad, x, scale, shift, eps, weight, bias, out_dtype):
    return fake_grads((x, scale, shift, weight, bias))


register_vjp_autograd(adaln_modulate, adaln_modulate_backward)
register_provider(Provider("adaln_modulate", "native", adaln_modulate_native))
