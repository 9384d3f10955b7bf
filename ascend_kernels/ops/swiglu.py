"""``ascend_kernels::swiglu``: the SwiGLU gate ``silu(gate) * up``.

Packed (``up`` None): ``x`` holds ``[gate, up]`` as halves along ``dim`` (``npu_swiglu``'s
layout, Flux 2). Two tensors: ``silu(x) * up``; diffusers' ``SwiGLU`` gates its SECOND half, so it
is passed as ``swiglu(gate, a)`` on the two views. Computed in fp32 (one rounding, where eager bf16
rounds twice), returned in ``x.dtype``.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F

from ..registry import Provider, dispatch, register_provider
from ._autograd import fake_grads, register_vjp_autograd, vjp_grads

__all__ = ["swiglu", "swiglu_native"]


def _gate_and_up(x: torch.Tensor, up: Optional[torch.Tensor], dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if up is not None:
        if dim != -1:
            raise ValueError(f"swiglu: dim={dim} applies to the packed layout (up=None) only; leave it at -1 with up")
        if up.shape != x.shape or up.dtype != x.dtype:
            raise ValueError(
                f"swiglu: up {tuple(up.shape)}:{up.dtype} must have the gate's shape and dtype "
                f"{tuple(x.shape)}:{x.dtype}"
            )
        return x, up
    if x.dim() == 0 or not -x.dim() <= dim < x.dim():
        raise ValueError(f"swiglu: dim={dim} is not a dimension of x {tuple(x.shape)}")
    if x.shape[dim] % 2:
        raise ValueError(f"swiglu: the packed x {tuple(x.shape)} must have an even size along dim={dim}")
    gate, up = x.chunk(2, dim)
    return gate, up


def swiglu_native(x: torch.Tensor, up: Optional[torch.Tensor] = None, dim: int = -1) -> torch.Tensor:
    """Reference implementation (defines the semantics; the fake impl and the CPU path)."""
    gate, up = _gate_and_up(x, up, dim)
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (F.silu(gate.to(cdt)) * up.to(cdt)).to(x.dtype)


@torch.library.custom_op("ascend_kernels::swiglu", mutates_args=())
def swiglu(x: torch.Tensor, up: Optional[torch.Tensor] = None, dim: int = -1) -> torch.Tensor:
    """SwiGLU gate ``silu(gate) * up`` in one op, computed in fp32.

    Args:
        x: with ``up``: the gate. Without: the packed ``[gate, up]`` halves along ``dim``.
        up: optional, the tensor the gate multiplies (x's shape and dtype).
        dim: the dimension the packed layout splits in two (even size); -1 with ``up``.

    Returns:
        tensor in x's dtype: x's shape with ``up``, else x's shape with ``dim`` halved.

    Example:
        >>> import torch, ascend_kernels
        >>> h = torch.randn(2, 5, 8)
        >>> torch.ops.ascend_kernels.swiglu(h).shape
        torch.Size([2, 5, 4])
        >>> torch.ops.ascend_kernels.swiglu(h[..., :4], h[..., 4:]).shape
        torch.Size([2, 5, 4])
    """
    return dispatch("swiglu", x, up, dim)


@swiglu.register_fake
def _(x, up=None, dim=-1):
    return swiglu_native(x, up, dim)


@torch.library.custom_op("ascend_kernels::swiglu_backward", mutates_args=())
def swiglu_backward(grad: torch.Tensor, x: torch.Tensor, up: Optional[torch.Tensor], dim: int) -> List[torch.Tensor]:
    """Gradients ``[dx, dup?]`` of `swiglu`."""
    return vjp_grads(swiglu_native, (x, up, dim), grad)


@swiglu_backward.register_fake
def _(grad, x, up, dim):
    return fake_grads((x, up))


register_vjp_autograd(swiglu, swiglu_backward)
register_provider(Provider("swiglu", "native", swiglu_native))
