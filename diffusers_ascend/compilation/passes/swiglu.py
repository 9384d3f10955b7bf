"""SwiGLU ``silu(gate) * up`` -> ``ascend_kernels.swiglu``.

Forms matched (no casts, so one registration serves every dtype):

- packed, gate first (``Flux2SwiGLU``): ``silu(h[..., :half]) * h[..., half:]`` or by ``chunk``:
  ``swiglu(h)``, one ``npu_swiglu`` call.
- two tensors: ``silu(w1(x)) * w3(x)`` (HiDream, Qwen-Image 2.1, Z-Image...) and diffusers'
  ``SwiGLU``, which gates the SECOND half and so is passed as its two halves: ``swiglu(gate, up)``.

Both operand orders are registered (the matcher does not commute ``mul``); packed forms run
first, since the two-tensor form matches their halves. Left alone: a ``b`` that only broadcasts
against ``a`` (a per-channel scale), Python numbers, and ``x * silu(x)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import FusionPass, FusionPattern, tensor_arg

__all__ = ["SwiGLUPattern", "SwiGLUFusionPass"]


class SwiGLUPattern(FusionPattern):
    """One written form of SwiGLU.

    Args:
        form: ``"halves_slice"`` (``silu(h[..., :half]) * h[..., half:]``), ``"halves_chunk"``
            (``h.chunk(2, -1)``, gate first) or ``"two_tensors"`` (``silu(gate) * up``).
        order: ``"silu_first"`` (``silu(gate) * up``) or ``"silu_last"`` (``up * silu(gate)``).
        dtype: example dtype.
    """

    FORMS = ("halves_slice", "halves_chunk", "two_tensors")
    ORDERS = ("silu_first", "silu_last")

    def __init__(self, form: str, order: str, dtype: torch.dtype = torch.float32):
        super().__init__(form, dtype)
        if order not in self.ORDERS:
            raise ValueError(f"unknown SwiGLUPattern order {order!r}; valid: {self.ORDERS}")
        self.order = order

    def variant(self) -> str:
        return f"{self.form},{self.order}"

    def _gated(self, gate, up):
        return F.silu(gate) * up if self.order == "silu_first" else up * F.silu(gate)

    def _search_packed(self, x):
        if self.form == "halves_slice":
            half = x.shape[-1] // 2
            gate, up = x[..., :half], x[..., half:]
        else:
            gate, up = x.chunk(2, dim=-1)
        return self._gated(gate, up)

    def _search_two(self, gate, up):
        return self._gated(gate, up)

    def _replace_packed(self, x):
        return torch.ops.ascend_kernels.swiglu(x)

    def _replace_two(self, gate, up):
        return torch.ops.ascend_kernels.swiglu(gate, up)

    # The matcher binds the parameter names of these functions.
    @property
    def search(self):
        return self._search_two if self.form == "two_tensors" else self._search_packed

    @property
    def replace(self):
        return self._replace_two if self.form == "two_tensors" else self._replace_packed

    def example_inputs(self):
        if self.form == "two_tensors":
            return [torch.randn(2, 3, 8, dtype=self.dtype), torch.randn(2, 3, 8, dtype=self.dtype)]
        return [torch.randn(2, 3, 16, dtype=self.dtype)]

    def check(self, match) -> bool:
        if self.form != "two_tensors":
            x = tensor_arg(match, "x")  # the halves are exact: the re-trace checked the slice bounds
            return x is not None and x.dim() >= 1 and x.shape[-1] % 2 == 0
        gate, up = tensor_arg(match, "gate"), tensor_arg(match, "up")
        if gate is None or up is None or match.kwargs["gate"] is match.kwargs["up"]:
            return False
        # Same shape (no broadcasting: a gate of another shape is a modulation, not a GLU) and dtype.
        return gate.dim() >= 1 and gate.shape == up.shape and gate.dtype == up.dtype


class SwiGLUFusionPass(FusionPass):
    """Replaces every SwiGLU form of `SwiGLUPattern` by ``ascend_kernels.swiglu``."""

    fusion = "swiglu"

    @classmethod
    def patterns(cls):
        # Packed forms first: the two-tensor form matches their halves too. No casts in any form,
        # so fp32 example inputs serve every dtype (each match is re-traced with its real dtype).
        for form in SwiGLUPattern.FORMS:
            for order in SwiGLUPattern.ORDERS:
                yield SwiGLUPattern(form, order, torch.float32)
