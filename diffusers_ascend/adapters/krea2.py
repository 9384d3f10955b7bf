"""Krea 2 (`Krea2TransformerModel`): its own zero-centred RMSNorm class, swapped for the fused op.

Facts specific to Krea 2 (diffusers 0.42):

- blocks: ``Krea2TransformerBlock`` (the model's ``_repeated_blocks``).
- ``Krea2RMSNorm`` normalizes with the scale ``1 + weight`` (zero-centred checkpoints), in fp32,
  cast back to the input dtype: ``F.rms_norm(x.float(), (D,), weight + 1, eps).to(x.dtype)``.
  ``FusedKrea2RMSNorm`` computes exactly that with ``ascend_kernels.rms_norm`` (fp32 inside), so
  the norms outside the compiled blocks (the text refiner's) are fused too, and under
  ``compile="none"``.
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
    swaps=(Swap("rms_norm", "Krea2RMSNorm", lambda: FusedKrea2RMSNorm,
                applies=lambda m: type(m).__module__ == "diffusers.models.transformers.transformer_krea2"),),
    pattern_forms={"rms_norm": ("torch",)},
)
register_adapter("Krea2Transformer2DModel", KREA2)
