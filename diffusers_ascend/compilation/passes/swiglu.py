"""SwiGLU ``silu(gate) * up`` -> ``ascend_kernels.swiglu``.

Forms matched (all but the upcast one have no casts: one fp32 registration serves every dtype):

- packed, gate first (``Flux2SwiGLU``): ``silu(h[..., :half]) * h[..., half:]`` or by ``chunk``:
  ``swiglu(h)``, one ``npu_swiglu`` call.
- two tensors: ``silu(w1(x)) * w3(x)`` (HiDream, Qwen-Image 2.1, Z-Image...) and diffusers'
  ``SwiGLU``, which gates the SECOND half and so is passed as its two halves: ``swiglu(gate, up)``;
- two tensors with the gate's SiLU upcast (diffusers' ``FP32SiLU`` in ``LuminaFeedForward``:
  Lumina 2, Lumina-Next): ``silu(gate.float()).to(gate.dtype) * up``. In fp32 the casts vanish
  and it is the form above; in bf16/fp16 they stay in the graph, so it is registered in bf16 (the
  kernel computes in fp32 and rounds once, as the upcast SiLU does before its product).

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
            (``h.chunk(2, -1)``, gate first), ``"two_tensors"`` (``silu(gate) * up``) or
            ``"two_tensors_upcast"`` (``silu(gate.float()).to(gate.dtype) * up``).
        order: ``"silu_first"`` (``silu(gate) * up``) or ``"silu_last"`` (``up * silu(gate)``).
        dtype: example dtype.
    """

    FORMS = ("halves_slice", "halves_chunk", "two_tensors", "two_tensors_upcast")
    TWO = ("two_tensors", "two_tensors_upcast")
    ORDERS = ("silu_first", "silu_last")

    def __init__(self, form: str, order: str, dtype: torch.dtype = torch.float32):
        super().__init__(form, dtype)
        if order not in self.ORDERS:
            raise ValueError(f"unknown SwiGLUPattern order {order!r}; valid: {self.ORDERS}")
        self.order = order

    def variant(self) -> str:
        return f"{self.form},{self.order}"

    def _gated(self, gate, up):
        silu = F.silu(gate.float()).to(gate.dtype) if self.form == "two_tensors_upcast" else F.silu(gate)
        return silu * up if self.order == "silu_first" else up * silu

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
        return self._search_two if self.form in self.TWO else self._search_packed

    @property
    def replace(self):
        return self._replace_two if self.form in self.TWO else self._replace_packed

    def example_inputs(self):
        if self.form in self.TWO:
            return [torch.randn(2, 3, 8, dtype=self.dtype), torch.randn(2, 3, 8, dtype=self.dtype)]
        return [torch.randn(2, 3, 16, dtype=self.dtype)]

    def check(self, match) -> bool:
        if self.form not in self.TWO:
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
        # Packed forms first: the two-tensor form matches their halves too. Without casts, fp32
        # example inputs serve every dtype (each match is re-traced with its real dtype); the
        # upcast form has casts only below fp32, and bf16 covers fp16 (dtypes are checked per match).
        for form in SwiGLUPattern.FORMS:
            dtype = torch.bfloat16 if form == "two_tensors_upcast" else torch.float32
            for order in SwiGLUPattern.ORDERS:
                yield SwiGLUPattern(form, order, dtype)
