"""``ascend_kernels::mul_add``: ``x * y + z`` (residual gate ``residual + gate * y``).

Broadcasting and output dtype as eager (Wan's bf16 ``y`` * fp32 gate + fp32 residual is fp32);
computed in fp32 (fp64 stays fp64).
"""

from __future__ import annotations

from typing import List

import torch

from ..registry import Provider, dispatch, register_provider
from ._autograd import fake_grads, register_vjp_autograd, vjp_grads

__all__ = ["mul_add", "mul_add_native", "result_dtype"]


def result_dtype(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.dtype:
    """The dtype of eager ``x * y + z``."""
    xy = torch.result_type(x, y)
    # Promotion reads only dtype and zero-dim-ness: a tiny CPU stand-in for x * y (meta has no data_ptr).
    xy_rep = torch.empty((1,) if max(x.dim(), y.dim()) > 0 else (), dtype=xy)
    return torch.result_type(xy_rep, z)


def mul_add_native(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Reference implementation (defines the semantics; the fake impl and the CPU path)."""
    dt = result_dtype(x, y, z)
    cdt = torch.promote_types(dt, torch.float32) if dt.is_floating_point else dt
    return (x.to(cdt) * y.to(cdt) + z.to(cdt)).to(dt)


@torch.library.custom_op("ascend_kernels::mul_add", mutates_args=())
def mul_add(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Fused multiply-add ``x * y + z``, computed in fp32.

    Args:
        x: first factor (e.g. the gate ``(B, 1, D)``).
        y: second factor (e.g. the attention/FFN output ``(B, S, D)``).
        z: addend (e.g. the residual ``(B, S, D)``).

    Returns:
        tensor of the broadcast shape, in eager's promoted dtype of ``x * y + z``.

    Example:
        >>> import torch, ascend_kernels
        >>> torch.ops.ascend_kernels.mul_add(torch.full((2,), 2.0), torch.full((2,), 3.0), torch.ones(2))
        tensor([7., 7.])
    """
    return dispatch("mul_add", x, y, z)


@mul_add.register_fake
def _(x, y, z):
    return mul_add_native(x, y, z)


@torch.library.custom_op("ascend_kernels::mul_add_backward", mutates_args=())
def mul_add_backward(grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> List[torch.Tensor]:
    """Gradients ``[dx, dy, dz]`` of `mul_add` (reduced to each input's shape)."""
    return vjp_grads(mul_add_native, (x, y, z), grad)


@mul_add_backward.register_fake
def _(grad, x, y, z):
    return fake_grads((x, y, z))


register_vjp_autograd(mul_add, mul_add_backward)
register_provider(Provider("mul_add", "native", mul_add_native))
