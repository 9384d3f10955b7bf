"""The torch_npu calls behind the ``npu`` providers, each with the contract it relies on.

Contracts are from the Ascend op-plugin docs (``docs/context/torch_npu-<op>.md``) for Atlas A2/A3
(910B/910C) training products, the targets of this package. ``*_supports`` functions return False
for arguments outside a kernel's documented limits, so the registry falls back to the next
provider instead of calling the kernel out of contract.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["fast_gelu", "gelu_supports", "gelu_tanh", "rms_norm", "rms_norm_supports", "rope", "rope_supports"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _npu():
    from . import torch_npu  # lazy: only when a call runs on an NPU tensor

    return torch_npu()


def _not_wider(out_dtype: Optional[torch.dtype], dtype: torch.dtype) -> bool:
    # The kernels return x's dtype; a wider requested dtype (bf16 in, fp32 out) would lose the
    # fp32 precision the op promises, so such calls go to the native provider.
    return out_dtype is None or (out_dtype.is_floating_point and torch.finfo(out_dtype).bits <= torch.finfo(dtype).bits)


# ---------------------------------------------------------------------------------------------
# rms_norm


def rms_norm_supports(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, out_dtype=None) -> bool:
    return (
        x.dtype in _DTYPES
        and 2 <= x.dim() <= 8
        and (weight is None or tuple(weight.shape) == (x.shape[-1],))
        and _not_wider(out_dtype, x.dtype)
    )


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, out_dtype=None) -> torch.Tensor:
    gamma = weight.to(x.dtype) if weight is not None else torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    # torch_npu.npu_rms_norm(self, gamma, epsilon=1e-6) -> (y, rstd)
    #   y = self / sqrt(mean(self**2, -1) + epsilon) * gamma (computed in fp32 inside), dtype of self;
    #   rstd = the reciprocal RMS (fp32), for the backward. self: fp16/bf16/fp32, 2-8 dims;
    #   gamma: SAME dtype as self (hence the cast), usually self's last dim.
    y = _npu().npu_rms_norm(x, gamma, epsilon=eps)[0]
    return y if out_dtype is None or out_dtype == y.dtype else y.to(out_dtype)


# ---------------------------------------------------------------------------------------------
# rope

_ROTARY_MODE = {"interleaved": "interleave", "half": "half"}


def _rope_layout(x: torch.Tensor, cos4: tuple, layout: str) -> Optional[tuple[int, int]]:
    """(B, N) of x if cos (padded to 4-D) has a cos/sin layout npu_rotary_mul accepts, else None."""
    d0, d1, d2, d3 = x.shape
    if cos4[3] != d3:
        return None
    # (x layout, its (B, N), cos layouts accepted). interleave mode: 1S1D / 11SD / S11D only;
    # half mode also accepts the per-batch forms BS1D / B1SD / SB1D.
    forms = (
        ((d0, d2), [(1, d1, 1, d3)] + ([(d0, d1, 1, d3)] if layout == "half" else [])),  # x BSND
        ((d0, d1), [(1, 1, d2, d3)] + ([(d0, 1, d2, d3)] if layout == "half" else [])),  # x BNSD
        ((d1, d2), [(d0, 1, 1, d3)] + ([(d0, d1, 1, d3)] if layout == "half" else [])),  # x SBND
    )
    for bn, accepted in forms:
        if tuple(cos4) in [tuple(a) for a in accepted]:
            return bn
    return None


def rope_supports(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> bool:
    if layout not in _ROTARY_MODE or x.dim() != 4 or x.dtype not in _DTYPES:
        return False
    if cos.shape != sin.shape or cos.dim() > 4:
        return False
    d = x.shape[-1]
    if d % 2 != 0 or d >= 896:
        return False
    bn = _rope_layout(x, (1,) * (4 - cos.dim()) + tuple(cos.shape), layout)
    if bn is None:
        return False
    b, n = bn
    return b * n < 1000 if layout == "interleaved" else (b < 1000 and n < 1000)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    shape4 = (1,) * (4 - cos.dim()) + tuple(cos.shape)
    r1 = cos.reshape(shape4).to(x.dtype)
    r2 = sin.reshape(shape4).to(x.dtype)
    # torch_npu.npu_rotary_mul(input, r1, r2, rotary_mode='half'|'interleave') -> Tensor
    #   out = r1 * input + r2 * rotate(input); 'half': rotate = cat(-x2, x1) of chunk(2, -1);
    #   'interleave': rotate = stack(-x[..., 1::2], x[..., ::2], -1) flattened (pairs).
    #   A2/A3 limits: input 4-D fp16/bf16/fp32 in BNSD/BSND/SBND, D < 896 and even; 'half':
    #   B, N < 1000, r1/r2 11SD|B1SD|BNSD (x BNSD), 1S1D|BS1D|BSND (x BSND), S11D|SB1D|SBND (SBND);
    #   'interleave': B*N < 1000, r1/r2 11SD / 1S1D / S11D only. r1/r2 values in [-1, 1] (cos/sin).
    #   Output: shape and dtype of input.
    return _npu().npu_rotary_mul(x, r1, r2, rotary_mode=_ROTARY_MODE[layout])


# ---------------------------------------------------------------------------------------------
# gelu_tanh / fast_gelu


def gelu_supports(x: torch.Tensor) -> bool:
    return x.dtype in _DTYPES and x.dim() <= 8


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    # torch_npu.npu_gelu(input, approximate='none'|'tanh') -> Tensor
    #   'tanh' is the tanh approximation, as F.gelu(approximate="tanh"); fp16/fp32 (+bf16 on A2),
    #   ND, non-contiguous allowed, at most 8 dims; output: shape and dtype of input.
    return _npu().npu_gelu(x, approximate="tanh")


def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    # torch_npu.npu_fast_gelu(input) -> Tensor
    #   A2/A3: x / (1 + exp(-1.702 x)) = x * sigmoid(1.702 x) (older Atlas training/inference
    #   products use a different formula); fp16/fp32/bf16 on A2/A3, ND, at most 8 dims;
    #   output: shape and dtype of input.
    return _npu().npu_fast_gelu(x)
