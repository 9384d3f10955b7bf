"""``ascend_kernels::int8_dynamic_linear``: ``F.linear`` with per-token dynamic int8 activations and a
per-channel int8 weight (W8A8), torchao's ``Int8DynamicActivationInt8WeightConfig`` (``Int8Tensor``).

The native provider is torchao 0.18's math, op for op (so a fused graph returns torchao's numbers):
symmetric per-token activation scale ``max(|x|) / 127.5`` computed in x's dtype, clamped to fp32's
eps and stored in fp32; ``q = clamp(round(x * (1 / scale)), -128, 127)``; an exact int32 matmul;
``(acc * x_scale)`` in fp32 rounded to x's dtype, then ``* weight_scale (+ bias)`` promoted and
rounded to x's dtype. The backward (`int8_linear_grads`) is the native math's own gradient: the
int8 weight gets none (zeros), x only through its per-token scale (``round`` has no gradient).
"""

from __future__ import annotations

from typing import Callable, List, Optional

import torch

from ..registry import Provider, dispatch, register_provider
from ._autograd import register_vjp_autograd

__all__ = [
    "check_int8_linear_args",
    "fake_int8_linear_grads",
    "int8_linear_grads",
    "int_mm",
    "int_mm_blocked",
    "int8_dynamic_linear",
    "int8_dynamic_linear_native",
    "quantize_per_token",
]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# Exact in fp32: |int8 * int8| * 1024 = 16_646_144 < 2**24, so a K block of 1024 sums exactly.
_EXACT_K = 1024


def check_int8_linear_args(
    op: str, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor]
) -> None:
    """Raises ValueError naming the problem when the arguments are not an int8 per-channel linear."""
    if x.dtype not in _FLOATS:
        raise ValueError(f"{op}: x must be float16, bfloat16 or float32, got {x.dtype}")
    if weight.dtype != torch.int8 or weight.dim() != 2:
        raise ValueError(
            f"{op}: weight must be a 2-D int8 (out_features, in_features) tensor, got {weight.dtype} "
            f"{tuple(weight.shape)}"
        )
    n, k = weight.shape
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{op}: x {tuple(x.shape)} must end in in_features={k} (weight {tuple(weight.shape)})")
    if not weight_scale.is_floating_point() or tuple(weight_scale.shape) not in ((n, 1), (n,)):
        raise ValueError(
            f"{op}: weight_scale must be a float per-output-channel scale of shape ({n}, 1) or ({n},), got "
            f"{weight_scale.dtype} {tuple(weight_scale.shape)} (per-group and per-tensor scales are other schemes)"
        )
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: bias must have shape ({n},), got {tuple(bias.shape)}")


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao 0.18's symmetric per-token int8 quantization (``Int8Tensor.from_hp(x, PerRow())``).

    Returns:
        ``(q, scale)``: int8 values of x's shape and the fp32 scale of shape ``(..., 1)``.
    """
    amin, amax = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    min_neg = torch.minimum(amin, torch.zeros_like(amin))
    max_pos = torch.maximum(amax, torch.zeros_like(amax))
    # (quant_max - quant_min) / 2 = 127.5, in x's dtype, as choose_qparams_affine computes it.
    scale = (torch.maximum(-min_neg, max_pos) / 127.5).clamp(min=torch.finfo(torch.float32).eps)
    scale = scale.to(torch.float32)
    q = torch.clamp(torch.round(x * scale.reciprocal()), -128, 127).to(torch.int8)
    return q, scale


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int32 ``a @ b`` of int8 matrices on any device: ``torch._int_mm`` on CPU, else fp32 blocks
    of 1024 along K (each exact) summed in int32."""
    return torch._int_mm(a, b) if a.device.type == "cpu" else int_mm_blocked(a, b)


def int_mm_blocked(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int32 ``a @ b`` of int8 matrices from fp32 matmuls over K blocks of 1024 (any device)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.int32, device=a.device)
    for k in range(0, a.shape[1], _EXACT_K):
        acc += (a[:, k : k + _EXACT_K].float() @ b[k : k + _EXACT_K].float()).to(torch.int32)
    return acc


def int8_dynamic_linear_native(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Reference implementation: torchao 0.18's ``Int8Tensor`` linear with dynamic activations."""
    check_int8_linear_args("int8_dynamic_linear", x, weight, weight_scale, bias)
    q, x_scale = quantize_per_token(x)
    acc = int_mm(q.reshape(-1, q.shape[-1]), weight.t())
    y = (acc.to(torch.float32) * x_scale.reshape(-1, 1)).to(x.dtype)
    y = (y * weight_scale.flatten()).reshape(*x.shape[:-1], weight.shape[0])
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


@torch.library.custom_op("ascend_kernels::int8_dynamic_linear", mutates_args=())
def int8_dynamic_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """W8A8 linear: ``x`` quantized per token to int8 on the fly, times an int8 per-channel weight.

    Args:
        x: activations ``(..., K)``, float16 / bfloat16 / float32.
        weight: int8 ``(N, K)`` (torchao's ``Int8Tensor.qdata``).
        weight_scale: per-output-channel scale ``(N, 1)`` or ``(N,)`` (torchao's ``Int8Tensor.scale``, fp32).
        bias: optional ``(N,)``.

    Returns:
        ``(..., N)`` in x's dtype: torchao's numbers (see the module docstring for the rounding steps).

    Raises:
        ValueError: arguments that are not this scheme (named in the message).

    Example:
        >>> import torch, ascend_kernels
        >>> w = torch.randint(-128, 128, (6, 8), dtype=torch.int8)
        >>> torch.ops.ascend_kernels.int8_dynamic_linear(torch.randn(2, 3, 8), w, torch.rand(6, 1), None).shape
        torch.Size([2, 3, 6])
    """
    return dispatch("int8_dynamic_linear", x, weight, weight_scale, bias)


@int8_dynamic_linear.register_fake
def _(x, weight, weight_scale, bias=None):
    check_int8_linear_args("int8_dynamic_linear", x, weight, weight_scale, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def int8_linear_grads(
    native: Callable[..., torch.Tensor],
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
) -> List[torch.Tensor]:
    """``[dx, dweight (zeros: int8), dweight_scale, dbias?]``: `torch.func.vjp` of ``native`` over its
    float arguments (an int8 tensor has no gradient)."""

    def f(x, weight_scale, *b):
        return native(x, weight, weight_scale, b[0] if b else None)

    floats = (x, weight_scale) + ((bias,) if bias is not None else ())
    _, vjp_fn = torch.func.vjp(f, *floats)
    grads = [torch.empty_like(t).copy_(g) for t, g in zip(floats, vjp_fn(grad))]
    return [grads[0], torch.zeros_like(weight), *grads[1:]]


def fake_int8_linear_grads(x, weight, weight_scale, bias) -> List[torch.Tensor]:
    return [torch.empty_like(t) for t in (x, weight, weight_scale, bias) if t is not None]


@torch.library.custom_op("ascend_kernels::int8_dynamic_linear_backward", mutates_args=())
def int8_dynamic_linear_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
) -> List[torch.Tensor]:
    """Gradients ``[dx, dweight (zeros), dweight_scale, dbias?]`` of `int8_dynamic_linear`."""
    return int8_linear_grads(int8_dynamic_linear_native, grad, x, weight, weight_scale, bias)


@int8_dynamic_linear_backward.register_fake
def _(grad, x, weight, weight_scale, bias):
    return fake_int8_linear_grads(x, weight, weight_scale, bias)


register_vjp_autograd(int8_dynamic_linear, int8_dynamic_linear_backward)
register_provider(Provider("int8_dynamic_linear", "native", int8_dynamic_linear_native))
