"""Fused operators for diffusion transformers as ``torch.library`` custom ops (namespace ``ascend_kernels``).

Importing this package registers every op (``torch.ops.ascend_kernels.<name>``) and its
providers; it imports neither diffusers, torch_npu, triton nor torch._inductor.

>>> import torch, ascend_kernels
>>> torch.ops.ascend_kernels.rms_norm(torch.randn(2, 8), None, 1e-6).shape
torch.Size([2, 8])
"""

from . import (  # noqa: F401  (register the accelerator providers; imports nothing heavy)
    npu,
    ops,  # noqa: F401  (registers the ops and their native providers)
    triton,
)
from .registry import OPS, available_providers, use_providers

__all__ = ["OPS", "available_providers", "use_providers"]
