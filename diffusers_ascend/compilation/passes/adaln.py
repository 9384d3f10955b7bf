"""adaLN modulation ``layer_norm(x) * (1 + scale) + shift`` -> ``ascend_kernels.adaln_modulate``.

Forms matched (aot graph: ``native_layer_norm(x, [D], None, None, eps)[0] -> add(scale, 1) -> mul
-> add(shift)``):

- Flux (``AdaLayerNormZero``, ``AdaLayerNormZeroSingle``, the MLP norms of ``FluxTransformerBlock``):
  ``norm(x) * (1 + scale[:, None]) + shift[:, None]`` with ``scale``/``shift`` of shape (B, D).
- ``AdaLayerNormContinuous`` (Flux's ``norm_out``): ``norm(x) * (1 + scale)[:, None, :] +
  shift[:, None, :]``: the 1 is added before the unsqueeze.
- broadcast: ``norm(x) * (1 + scale) + shift`` with ``scale``/``shift`` of ``x``'s rank.
- Wan (``WanTransformerBlock``): ``(norm(x.float()) * (1 + scale) + shift).type_as(x)`` (fp32
  modulation), and the same without the cast back, whose fp32 result the op keeps with
  ``out_dtype=torch.float32``.

The fused op computes in fp32; ``out_dtype`` reproduces the dtype the replaced code returns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import FusionPass, FusionPattern, tensor_arg

__all__ = ["AdaLNPattern", "AdaLNFusionPass"]


def _promote(*tensors) -> torch.dtype:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


class AdaLNPattern(FusionPattern):
    """One written form of adaLN modulation.

    Args:
        form: ``"flux"``, ``"continuous"``, ``"broadcast"``, ``"upcast"`` (Wan, cast back to ``x.dtype``) or
            ``"upcast_fp32_out"`` (Wan without the cast back).
        dtype: example dtype of ``x``.
    """

    FORMS = ("flux", "continuous", "broadcast", "upcast", "upcast_fp32_out")
    scalars = ("eps",)

    def example_inputs(self):
        x = torch.randn(2, 5, 8, dtype=self.dtype)
        if self.form in ("flux", "continuous"):
            scale, shift = torch.randn(2, 8, dtype=self.dtype), torch.randn(2, 8, dtype=self.dtype)
        else:
            mdt = self.dtype if self.form == "broadcast" else torch.float32
            scale, shift = torch.randn(2, 1, 8, dtype=mdt), torch.randn(2, 1, 8, dtype=mdt)
        return [x, scale, shift, 1.0]

    def search(self, x, scale, shift, eps):
        d = (x.shape[-1],)
        if self.form == "flux":
            return F.layer_norm(x, d, eps=eps) * (1 + scale[:, None]) + shift[:, None]
        if self.form == "continuous":
            return F.layer_norm(x, d, eps=eps) * (1 + scale)[:, None, :] + shift[:, None, :]
        if self.form == "broadcast":
            return F.layer_norm(x, d, eps=eps) * (1 + scale) + shift
        y = F.layer_norm(x.float(), d, eps=eps) * (1 + scale) + shift
        return y.type_as(x) if self.form == "upcast" else y

    def replace(self, x, scale, shift, eps):
        op = torch.ops.ascend_kernels.adaln_modulate
        if self.form in ("flux", "continuous"):
            # Unsqueezed here, so the op sees scale/shift of x's rank and only broadcasts.
            scale, shift = scale[:, None], shift[:, None]
        if self.form == "upcast":
            out_dtype = x.dtype
        elif self.form == "upcast_fp32_out":
            out_dtype = _promote(x.float(), scale, shift)
        else:
            out_dtype = _promote(x, scale, shift)
        return op(x, scale, shift, eps, None, None, out_dtype)

    def check(self, match) -> bool:
        x, scale, shift = (tensor_arg(match, n) for n in ("x", "scale", "shift"))
        if x is None or scale is None or shift is None:
            return False
        if self.form in ("flux", "continuous"):
            return scale.dim() == 2 and shift.dim() == 2
        # The op reads scale/shift of rank x.dim()-1 as (B, 1, D); plain broadcasting needs x's rank.
        return scale.dim() == x.dim() and shift.dim() == x.dim()


class AdaLNFusionPass(FusionPass):
    """Replaces the adaLN forms of `AdaLNPattern` by ``ascend_kernels.adaln_modulate``."""

    fusion = "adaln"

    @classmethod
    def patterns(cls):
        # Forms with casts first: their fp32 graphs equal the broadcast form's.
        for form in ("upcast", "upcast_fp32_out", "flux", "continuous", "broadcast"):
            for dtype in (torch.float32, torch.bfloat16):
                yield AdaLNPattern(form, dtype)
