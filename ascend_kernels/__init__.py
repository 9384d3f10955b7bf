"""Fused operators for diffusion transformers as ``torch.library`` custom ops (namespace ``ascend_kernels``)."""
