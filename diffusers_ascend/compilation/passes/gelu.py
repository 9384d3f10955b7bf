"""tanh-approximate GELU -> ``ascend_kernels.gelu_tanh`` (exact) or ``ascend_kernels.fast_gelu``.

The aot graph keeps ``aten.gelu(x, approximate='tanh')`` as one op (``FeedForward(activation_fn=
"gelu-approximate")``, ``nn.GELU(approximate="tanh")``). ``fast_gelu`` computes
``x * sigmoid(1.702 x)``, which is NOT equal to the tanh GELU: it runs only when the config names
``"fast_gelu"`` explicitly (the config never picks it for ``"auto"``/``"all"``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import FusionPass, FusionPattern

__all__ = ["GeluTanhPattern", "GeluTanhFusionPass", "FastGeluPattern", "FastGeluFusionPass"]


class GeluTanhPattern(FusionPattern):
    """``F.gelu(x, approximate="tanh")`` -> ``ascend_kernels.gelu_tanh(x)``."""

    def example_inputs(self):
        return [torch.randn(2, 3, 8, dtype=self.dtype)]

    def search(self, x):
        return F.gelu(x, approximate="tanh")

    def replace(self, x):
        return torch.ops.ascend_kernels.gelu_tanh(x)


class FastGeluPattern(GeluTanhPattern):
    """``F.gelu(x, approximate="tanh")`` -> ``ascend_kernels.fast_gelu(x)`` (an approximation: opt-in)."""

    def replace(self, x):
        return torch.ops.ascend_kernels.fast_gelu(x)


class GeluTanhFusionPass(FusionPass):
    fusion = "gelu_tanh"

    @classmethod
    def patterns(cls):
        # No casts in the pattern: one dtype covers all (dtypes are re-checked on every match).
        yield GeluTanhPattern(dtype=torch.float32)


class FastGeluFusionPass(FusionPass):
    fusion = "fast_gelu"

    @classmethod
    def patterns(cls):
        yield FastGeluPattern(dtype=torch.float32)
