"""Krea 2 (`Krea2TransformerModel`): its zero-centred RMSNorm (scale ``1 + weight``, fp32) is
swapped for the fused op, so the norms outside the compiled blocks are fused too.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_krea2 import Krea2RMSNorm

from ..layers import Swap, _ops
from .registry import Adapter, register_adapter

__all__ = ["KREA2", "FusedKrea2RMSNorm"]


class FusedKrea2RMSNorm(Krea2RMSNorm):
    """`Krea2RMSNorm` computed by ``ascend_kernels.rms_norm`` with the weight ``1 + weight``.

    >>> norm = Krea2RMSNorm(8)
    >>> norm.__class__ = FusedKrea2RMSNorm
    >>> norm(torch.ones(2, 8)).shape
    torch.Size([2, 8])
    """

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _ops().rms_norm(hidden_states, self.weight + 1.0, self.eps, hidden_states.dtype)


KREA2 = Adapter(
    name="krea2",
    blocks=("Krea2TransformerBlock",),
    swaps=(
        Swap(
            "rms_norm",
            "Krea2RMSNorm",
            lambda: FusedKrea2RMSNorm,
            applies=lambda m: type(m).__module__ == "diffusers.models.transformers.transformer_krea2",
        ),
    ),
    pattern_forms={"rms_norm": ("torch",)},
)
register_adapter("Krea2Transformer2DModel", KREA2)
