"""``ascend_kernels::rope``: rotary position embedding with precomputed cos/sin.

``out = x * cos + rot(x) * sin`` over the last dim (even), computed in fp32, returned in
``x.dtype``; ``cos``/``sin`` broadcast to ``x``. ``"interleaved"``: pairs ``(x[2i], x[2i+1])``
rotate (Flux's ``apply_rotary_emb``; Wan's closure when ``cos[2i] == cos[2i+1]``, as
``WanRotaryPosEmbed`` builds it). ``"half"``: rotate-half, ``rot(x) = cat(-x[D/2:], x[:D/2])``.
"""

from __future__ import annotations

from typing import List

import torch

from ..registry import Provider, dispatch, register_provider
from ._autograd import fake_grads, register_vjp_autograd, vjp_grads

__all__ = ["LAYOUTS", "rope", "rope_native"]

LAYOUTS = ("interleaved", "half")


def _check(x: torch.Tensor, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown rope layout {layout!r}; valid layouts: {', '.join(LAYOUTS)}")
    if x.shape[-1] % 2 != 0:
        raise ValueError(f"rope needs an even last dimension, got x of shape {tuple(x.shape)}")


def rope_native(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Reference implementation (defines the semantics; the fake impl and the CPU path)."""
    _check(x, layout)
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(cdt)
    if layout == "interleaved":
        x_even, x_odd = xf.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack([-x_odd, x_even], dim=-1).flatten(-2)
    else:
        x1, x2 = xf.chunk(2, dim=-1)
        rot = torch.cat([-x2, x1], dim=-1)
    out = xf * cos.to(cdt) + rot * sin.to(cdt)
    if out.shape != x.shape:
        raise ValueError(
            f"rope: cos {tuple(cos.shape)} / sin {tuple(sin.shape)} must broadcast to x {tuple(x.shape)} "
            f"without enlarging it"
        )
    return out.to(x.dtype)


@torch.library.custom_op("ascend_kernels::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotary position embedding ``x * cos + rot(x) * sin``, computed in fp32.

    Args:
        x: query or key, ``(..., D)`` with D even (e.g. Flux/Wan ``(B, S, H, D)``).
        cos: cosines broadcastable to ``x`` (e.g. ``(1, S, 1, D)``).
        sin: sines, same shape as ``cos``.
        layout: ``"interleaved"`` (Flux, Wan) or ``"half"`` (rotate-half).

    Returns:
        tensor of ``x``'s shape and dtype.

    Example:
        >>> import torch, ascend_kernels
        >>> x, cos, sin = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8)
        >>> torch.ops.ascend_kernels.rope(x, cos, sin, "interleaved").shape
        torch.Size([1, 4, 2, 8])
    """
    return dispatch("rope", x, cos, sin, layout)


@rope.register_fake
def _(x, cos, sin, layout):
    return rope_native(x, cos, sin, layout)


@torch.library.custom_op("ascend_kernels::rope_backward", mutates_args=())
def rope_backward(
    grad: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str
) -> List[torch.Tensor]:
    """Gradients ``[dx, dcos, dsin]`` of `rope`."""
    return vjp_grads(rope_native, (x, cos, sin, layout), grad)


@rope_backward.register_fake
def _(grad, x, cos, sin, layout):
    return fake_grads((x, cos, sin))


register_vjp_autograd(rope, rope_backward)
register_provider(Provider("rope", "native", rope_native))
