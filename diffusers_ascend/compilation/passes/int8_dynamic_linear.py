"""torchao's int8 dynamic-activation linear (W8A8) -> ``ascend_kernels.int8_dynamic_linear``.

A linear whose weight is torchao's ``Int8Tensor`` with activation quantization
(``Int8DynamicActivationInt8WeightConfig``, per-row weight and per-token activations, symmetric: torchao
0.18's defaults) reaches the backend as aten ops: dynamo inlines the subclass's ``F.linear`` and
aot_autograd flattens the weight into ``qdata`` (int8) and ``scale`` (fp32, ``(N, 1)``). The search
functions below are torchao 0.18's code written out (``Int8Tensor.from_hp`` with ``PerRow()``, then
``int_scaled_matmul``), in plain torch so that the pass imports no torchao. Forms:

- ``s8s8``: ``torch._int_mm`` on the int8 activations (CPU with AMX, or without VNNI);
- ``u8s8``: the activations shifted to uint8 and the weight's column sums subtracted (CPU with
  AVX512-VNNI and without AMX, torch >= 2.12): torchao picks it by the CPU's features, the result is
  the same integer product;
- ``device``: any other device (NPU, CUDA): the scale expanded to ``(M, N)`` and the product as
  ``out_dtype(aten.mm, int32, a, w)`` (a higher-order op), then ``int32 * fp32``: the same numbers.

Each with and without bias, for x of rank 2 (no reshapes) and more, in fp32 and bf16 (casts vanish in
fp32; bf16 also covers fp16). Left
alone, with torchao's own path: per-group / per-tensor scales (other graphs), asymmetric activations
(a zero-point correction), ``act_pre_scale`` (SmoothQuant/AWQ) and static activation scales.
"""

from __future__ import annotations

import torch

from .. import _compat
from .base import FusionPass, FusionPattern, tensor_arg

__all__ = ["Int8DynamicLinearFusionPass", "Int8DynamicLinearPattern", "Int8LinearPattern", "torchao_per_token_quant"]


def torchao_per_token_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao 0.18's ``choose_qparams_affine`` + ``quantize_affine`` (symmetric int8, per token), op for
    op as aot_autograd records them: ``(q int8, scale fp32 (..., 1))``."""
    last = x.dim() - 1  # torchao reduces over the block's dims, counted from the front
    amin = torch.amin(x, last, keepdim=True)
    amax = torch.amax(x, last, keepdim=True)
    min_neg = torch.minimum(amin, torch.zeros_like(amin))
    max_pos = torch.maximum(amax, torch.zeros_like(amax))
    scale = torch.maximum(-min_neg, max_pos) / 127.5
    zero_point = torch.full_like(scale, 0)
    scale = torch.clamp(scale, min=torch.finfo(torch.float32).eps).to(dtype=torch.float32, device=x.device)
    zero_point = zero_point.to(torch.int8)
    q = torch.round(x * (scale.reciprocal() * 1.0)) + zero_point
    return torch.clamp(q, -128, 127).to(torch.int8), scale


class Int8LinearPattern(FusionPattern):
    """What torchao's int8 linears share: the arguments ``(x, qdata, scale[, bias])``, the variants
    with and without bias, x of rank 2 (an adaLN's ``linear(silu(temb))``: no reshapes) or more, and
    the check that the weight is per-row int8. Subclasses write `linear` and name their `op`.

    Args:
        form: one of `FORMS` (when the subclass has forms).
        bias: the linear has a bias.
        rank: x's rank in the example (2, or 3 for every higher rank: the same reshapes).
        dtype: example dtype (fp32, or bf16 for the casts half-precision graphs keep).
    """

    op: str = ""

    def __init__(self, form: str | None, bias: bool, rank: int, dtype: torch.dtype = torch.float32):
        super().__init__(form, dtype)
        if rank not in (2, 3):
            raise ValueError(f"unknown {type(self).__name__} rank {rank!r}; valid: (2, 3)")
        self.bias, self.rank = bias, rank

    def variant(self) -> str:
        return ",".join(filter(None, (self.form, "bias" if self.bias else "nobias", f"rank{self.rank}")))

    def linear(self, x, qdata, scale, bias):  # pragma: no cover - abstract
        raise NotImplementedError

    def _search_bias(self, x, qdata, scale, bias):
        return self.linear(x, qdata, scale, bias)

    def _search_nobias(self, x, qdata, scale):
        return self.linear(x, qdata, scale, None)

    def _replace_bias(self, x, qdata, scale, bias):
        return getattr(torch.ops.ascend_kernels, self.op)(x, qdata, scale, bias)

    def _replace_nobias(self, x, qdata, scale):
        return getattr(torch.ops.ascend_kernels, self.op)(x, qdata, scale, None)

    # The matcher binds the parameter names of these functions.
    @property
    def search(self):
        return self._search_bias if self.bias else self._search_nobias

    @property
    def replace(self):
        return self._replace_bias if self.bias else self._replace_nobias

    def example_inputs(self):
        x = torch.randn(*((2, 3) if self.rank == 3 else (6,)), 8, dtype=self.dtype)
        qdata = torch.randint(-128, 128, (6, 8), dtype=torch.int8)
        scale = torch.rand(6, 1) + 0.5
        return [x, qdata, scale, torch.randn(6, dtype=self.dtype)] if self.bias else [x, qdata, scale]

    def check(self, match) -> bool:
        qdata, scale = tensor_arg(match, "qdata"), tensor_arg(match, "scale")
        # Per-row weights only: a per-tensor scale (1, 1) broadcasts through the same ops.
        return (
            qdata is not None
            and scale is not None
            and qdata.dtype == torch.int8
            and qdata.dim() == 2
            and tuple(scale.shape) == (qdata.shape[0], 1)
        )

    @classmethod
    def variants(cls, forms=(None,)):
        """Every registration, biased ones first (the no-bias search is the biased one's prefix)."""
        for bias in (True, False):
            for form in forms:
                for rank in (3, 2):
                    for dtype in (torch.float32, torch.bfloat16):
                        yield cls(form, bias, rank, dtype)


class Int8DynamicLinearPattern(Int8LinearPattern):
    """torchao's W8A8 linear in one written form: `FORMS` ``"s8s8"`` or ``"u8s8"`` (torchao's two CPU
    matmul branches) or ``"device"`` (any other device); see `Int8LinearPattern` for the other arguments."""

    FORMS = ("s8s8", "u8s8", "device")
    op = "int8_dynamic_linear"

    def linear(self, x, qdata, scale, bias):
        q, x_scale = torchao_per_token_quant(x)
        a = q.reshape(-1, q.shape[-1])
        xs = x_scale.reshape(-1, 1)
        w_t = qdata.t()
        if self.form == "device":  # int_scaled_matmul off the CPU, under dynamo: safe_int_mm's out_dtype
            scales = xs.expand((a.shape[0], w_t.shape[1]))
            y = (_compat.out_dtype_op()(torch.ops.aten.mm.default, torch.int32, a, w_t) * scales).to(x.dtype)
        else:
            if self.form == "u8s8":
                a = (a.to(torch.int32) + 128).to(torch.uint8)
                acc = torch._int_mm(a, w_t)
                acc = acc - w_t.sum(dim=0, keepdim=True, dtype=torch.int32) * 128
            else:
                acc = torch._int_mm(a, w_t)
            y = (acc.to(xs.dtype) * xs).to(x.dtype)
        y = (y * scale.flatten()).reshape(*q.shape[:-1], y.shape[-1])
        if bias is not None:
            y += bias
        return y.to(x.dtype)


class Int8DynamicLinearFusionPass(FusionPass):
    """Replaces torchao's int8 dynamic-activation linears by ``ascend_kernels.int8_dynamic_linear``."""

    fusion = "int8_dynamic_linear"

    @classmethod
    def patterns(cls):
        # u8s8 only where torch's CPU _int_mm takes uint8 (2.12+: torchao's branch needs it too).
        forms = [f for f in Int8DynamicLinearPattern.FORMS if f != "u8s8" or _compat.int_mm_takes_uint8()]
        return Int8DynamicLinearPattern.variants(forms)
