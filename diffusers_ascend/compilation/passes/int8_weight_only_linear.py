"""torchao's int8 weight-only linear (W8A16) -> ``ascend_kernels.int8_weight_only_linear``.

A linear whose weight is torchao's ``Int8Tensor`` without activation quantization
(``Int8WeightOnlyConfig``, per-row: torchao 0.18's default) reaches the backend as
``mm(x, qdata.t().to(x.dtype)) * scale.to(x.dtype)`` (+ bias), with the weight flattened into
``qdata`` (int8) and ``scale`` (``(N, 1)``). The search is torchao 0.18's code written out, in plain
torch. With and without bias, x of rank 2 and more, in fp32 and bf16 (bf16 also covers fp16). Left alone: per-group
weights (torchao dequantizes them first: another graph) and ``act_pre_scale``.
"""

from __future__ import annotations

import torch

from .base import FusionPass
from .int8_dynamic_linear import Int8LinearPattern

__all__ = ["Int8WeightOnlyLinearFusionPass", "Int8WeightOnlyLinearPattern"]


class Int8WeightOnlyLinearPattern(Int8LinearPattern):
    """torchao's W8A16 linear (arguments: see `Int8LinearPattern`; no forms)."""

    op = "int8_weight_only_linear"

    def linear(self, x, qdata, scale, bias):
        m = torch.mm(x.reshape(-1, x.shape[-1]), qdata.t().to(x.dtype))
        y = (m * scale.to(m.dtype).flatten()).reshape(*x.shape[:-1], qdata.shape[0])
        if bias is not None:
            y += bias
        return y.to(x.dtype)


class Int8WeightOnlyLinearFusionPass(FusionPass):
    """Replaces torchao's int8 weight-only linears by ``ascend_kernels.int8_weight_only_linear``."""

    fusion = "int8_weight_only_linear"

    @classmethod
    def patterns(cls):
        return Int8WeightOnlyLinearPattern.variants()
