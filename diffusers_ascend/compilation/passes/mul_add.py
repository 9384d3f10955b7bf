"""Residual gate / multiply-add ``x * y + z`` (and ``z + x * y``) -> ``ascend_kernels.mul_add``.

The generic pattern is greedy, so it runs last (after every other fusion has taken its adds) and
rejects non-tensor operands: ``mul(x, 0.044715)`` inside a decomposed GELU or ``x * 2 + 1`` stay as
they are. Mixed dtypes are allowed (Wan's ``add(h.float(), y_bf16 * gate_f32)``): the op returns
the dtype eager type promotion gives, which every match re-checks.
"""

from __future__ import annotations

import torch

from .base import FusionPass, FusionPattern, tensor_arg

__all__ = ["MulAddPattern", "MulAddFusionPass"]


class MulAddPattern(FusionPattern):
    """``x * y + z`` (``form="mul_first"``) or ``z + x * y`` (``form="add_first"``)."""

    FORMS = ("mul_first", "add_first")

    def example_inputs(self):
        return [
            torch.randn(2, 1, 8, dtype=self.dtype),
            torch.randn(2, 5, 8, dtype=self.dtype),
            torch.randn(2, 5, 8, dtype=self.dtype),
        ]

    def search(self, x, y, z):
        return x * y + z if self.form == "mul_first" else z + x * y

    def replace(self, x, y, z):
        return torch.ops.ascend_kernels.mul_add(x, y, z)

    def check(self, match) -> bool:
        # Scalars (python numbers or 0-dim tensors) are polynomial coefficients, not gates.
        vals = [tensor_arg(match, n) for n in ("x", "y", "z")]
        return all(v is not None and v.dim() > 0 for v in vals)


class MulAddFusionPass(FusionPass):
    fusion = "mul_add"

    @classmethod
    def patterns(cls):
        for order in MulAddPattern.FORMS:
            yield MulAddPattern(order, torch.float32)
