"""torchao's int8 weight-only linear (W8A16) -> ``ascend_kernels.int8_weight_only_linear``.

A linear whose weight is torchao's ``Int8Tensor`` without activation quantization
(``Int8WeightOnlyConfig``, per-row: torchao 0.18's default) reaches the backend as
``mm(x, qdata.t().to(x.dtype)) * scale.to(x.dtype)`` (+ bias), with the weight flattened into
``qdata`` (int8) and ``scale`` (``(N, 1)``). The search is torchao 0.18's code written out, in plain
torch. With and without bias, in fp32 and bf16 (bf16 also covers fp16). Left alone: per-group
weights (torchao dequantizes them first: another graph) and ``act_pre_scale``.
"""

from __future__ import annotations

import torch

from .base import FusionPass, FusionPattern, tensor_arg

__all__ = ["Int8WeightOnlyLinearFusionPass", "Int8WeightOnlyLinearPattern"]


class Int8WeightOnlyLinearPattern(FusionPattern):
    """torchao's W8A16 linear, with or without bias.

    Args:
        bias: the linear has a bias.
        dtype: example dtype (fp32, or bf16 for the casts half-precision graphs keep).
    """

    def __init__(self, bias: bool, dtype: torch.dtype = torch.float32):
        super().__init__(None, dtype)
        self.bias = bias

    def variant(self) -> str:
        return "bias" if self.bias else "nobias"

    @staticmethod
    def _linear(x, qdata, scale, bias):
        m = torch.mm(x.reshape(-1, x.shape[-1]), qdata.t().to(x.dtype))
        y = (m * scale.to(m.dtype).flatten()).reshape(*x.shape[:-1], qdata.shape[0])
        if bias is not None:
            y += bias
        return y.to(x.dtype)

    def _search_bias(self, x, qdata, scale, bias):
        return self._linear(x, qdata, scale, bias)

    def _search_nobias(self, x, qdata, scale):
        return self._linear(x, qdata, scale, None)

    def _replace_bias(self, x, qdata, scale, bias):
        return torch.ops.ascend_kernels.int8_weight_only_linear(x, qdata, scale, bias)

    def _replace_nobias(self, x, qdata, scale):
        return torch.ops.ascend_kernels.int8_weight_only_linear(x, qdata, scale, None)

    @property
    def search(self):
        return self._search_bias if self.bias else self._search_nobias

    @property
    def replace(self):
        return self._replace_bias if self.bias else self._replace_nobias

    def example_inputs(self):
        x = torch.randn(2, 3, 8, dtype=self.dtype)
        qdata = torch.randint(-128, 128, (6, 8), dtype=torch.int8)
        scale = torch.rand(6, 1) + 0.5
        return [x, qdata, scale, torch.randn(6, dtype=self.dtype)] if self.bias else [x, qdata, scale]

    def check(self, match) -> bool:
        qdata, scale = tensor_arg(match, "qdata"), tensor_arg(match, "scale")
        return (
            qdata is not None
            and scale is not None
            and qdata.dtype == torch.int8
            and qdata.dim() == 2
            and tuple(scale.shape) == (qdata.shape[0], 1)
        )


class Int8WeightOnlyLinearFusionPass(FusionPass):
    """Replaces torchao's int8 weight-only linears by ``ascend_kernels.int8_weight_only_linear``."""

    fusion = "int8_weight_only_linear"

    @classmethod
    def patterns(cls):
        for bias in (True, False):  # bias first: the no-bias search is the biased one's prefix
            for dtype in (torch.float32, torch.bfloat16):
                yield Int8WeightOnlyLinearPattern(bias, dtype)
