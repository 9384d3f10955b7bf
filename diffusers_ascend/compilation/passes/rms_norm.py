"""RMSNorm -> ``ascend_kernels.rms_norm``.

Forms matched (aot graphs, fp32 and low precision):

- ``torch.nn.RMSNorm`` / ``F.rms_norm`` (Flux and Wan ``norm_q``/``norm_k``): decomposes to
  ``pow -> mean(-1, keepdim) -> add.Scalar(eps) -> rsqrt -> mul -> mul(w)``, with an fp32 upcast
  and a cast back in bf16/fp16 (CPU, NPU).
- the same on CUDA from torch 2.9: one ``aten._fused_rms_norm(x, [D], w, eps)[0]`` node, no
  decomposition (form ``"fused"``; `_compat.fused_rms_norm` says where it exists).
- diffusers' ``diffusers.models.normalization.RMSNorm`` class: ``x * rsqrt(x.float().pow(2)
  .mean(-1, keepdim) + eps)``, cast to the weight's dtype, times the weight.
- hand-written ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w``, in the input dtype
  or with an fp32 upcast, with or without weight.
- the LLaMA form (upcast, normalize, cast back, weight multiplied FIRST: ``w * y.to(dtype)``; the
  matcher does not commute ``mul``), as Hugging Face ``LlamaRMSNorm`` and the text encoders /
  refiners of several DiTs write it.

The fused op computes in fp32 (never less precise than the code it replaces).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _compat
from .base import FusionPass, FusionPattern, example_inputs_of, matched_nodes, tensor_arg

__all__ = ["RMSNormPattern", "RMSNormFusionPass"]


def _rms_norm(x, weight, eps, out_dtype=None):
    return torch.ops.ascend_kernels.rms_norm(x, weight, eps, out_dtype)


class RMSNormPattern(FusionPattern):
    """One written form of RMSNorm.

    Args:
        form: ``"torch"`` (F.rms_norm / nn.RMSNorm), ``"fused"`` (F.rms_norm as CUDA runs it:
            ``aten._fused_rms_norm``, torch >= 2.9), ``"diffusers"`` (diffusers' RMSNorm class),
            ``"manual"`` (hand-written, input dtype), ``"manual_upcast"`` (hand-written on
            ``x.float()``, cast back, then weight), ``"llama"`` (as ``manual_upcast`` with the weight
            as the left operand; with weight only).
        weight: whether a weight multiplies the normalized value.
        dtype: example dtype (fp32 graphs have no casts).
    """

    FORMS = ("torch", "fused", "diffusers", "manual", "manual_upcast", "llama")
    scalars = ("eps",)

    def __init__(self, form: str, weight: bool, dtype: torch.dtype = torch.float32):
        super().__init__(form, dtype)
        self.weight = weight

    def variant(self) -> str:
        return f"{self.form},{'weight' if self.weight else 'no_weight'}"

    def check(self, match) -> bool:
        if self.form == "fused":
            return self._check_fused(match)
        # An RMSNorm weight is one scale per channel: a multiplier of another shape (broadcasting
        # x larger, or per token) is a look-alike the op (weight of shape (D,)) must not take.
        if not self.weight:
            return True
        x, w = tensor_arg(match, "x"), tensor_arg(match, "w")
        return x is not None and w is not None and w.dim() == 1 and w.shape[0] == x.shape[-1]

    def _check_fused(self, match) -> bool:
        # The hand-built pattern ignores the normalized shape and binds eps and w as they stand:
        # only a last-dim norm with a float eps (None means a dtype-dependent default) and a
        # (D,) weight or none is the op.
        (node,) = matched_nodes(match, _compat.fused_rms_norm())
        x, eps = tensor_arg(match, "x"), match.kwargs.get("eps")
        if x is None or not isinstance(eps, float) or len(node.args[1]) != 1 or node.args[1][0] != x.shape[-1]:
            return False
        if match.kwargs.get("w") is None:
            return True
        w = tensor_arg(match, "w")
        return w is not None and w.dim() == 1 and w.shape[0] == x.shape[-1]

    def search_pattern(self):
        return _compat.fused_rms_norm_pattern() if self.form == "fused" else None

    def probe_graph(self) -> torch.fx.Graph:
        if self.form != "fused":
            return super().probe_graph()
        x, w, _ = example_inputs_of(self)
        return _compat.one_op_graph(_compat.fused_rms_norm(), [x, [x.shape[-1]], w, 1e-6], index=0)

    def example_inputs(self):
        x = torch.randn(2, 3, 4, 8, dtype=self.dtype)
        w = torch.randn(8, dtype=self.dtype)
        return [x, w, 1.0] if self.weight else [x, 1.0]

    def _normalize(self, x, eps):
        if self.form == "diffusers":
            variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(variance + eps)
        if self.form == "manual":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        xf = x.float()  # manual_upcast, llama
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def _search(self, x, w, eps):
        if self.form in ("torch", "fused") and w is not None and not isinstance(w, torch.Tensor):
            # Inductor re-traces this function on a match's own arguments before `check` runs: a
            # weightless RMSNorm times a Python number (``rms_norm(x) * 2``, which decomposes the
            # same way on CPU) binds ``w`` to that number, which F.rms_norm would reject with a
            # TypeError that aborts the whole pass. Traced as written instead; `check` refuses it.
            return self._search(x, None, eps) * w
        if self.form == "torch":
            return F.rms_norm(x, (x.shape[-1],), w, eps)
        if self.form == "fused":
            return _compat.fused_rms_norm()(x, [x.shape[-1]], w, eps)[0]
        y = self._normalize(x, eps)
        if self.form == "diffusers":
            if w is None:
                return y.to(x.dtype)
            if w.dtype in (torch.float16, torch.bfloat16):
                y = y.to(w.dtype)
            return y * w
        if self.form == "llama":
            return w * y
        return y if w is None else y * w

    def _replace(self, x, w, eps):
        return _rms_norm(x, w, eps, self._out_dtype(x, w))

    def _out_dtype(self, x, w):
        # The dtype the searched form returns (verified again on every match under fake tensors).
        if w is None or self.form in ("torch", "fused"):
            return x.dtype
        if self.form == "diffusers":
            return (
                w.dtype if w.dtype in (torch.float16, torch.bfloat16) else torch.promote_types(torch.float32, w.dtype)
            )
        return torch.promote_types(x.dtype, w.dtype)

    # The matcher binds the parameter names of these functions.
    def _search_w(self, x, w, eps):
        return self._search(x, w, eps)

    def _search_nw(self, x, eps):
        return self._search(x, None, eps)

    def _replace_w(self, x, w, eps):
        return self._replace(x, w, eps)

    def _replace_nw(self, x, eps):
        return self._replace(x, None, eps)

    @property
    def search(self):
        return self._search_w if self.weight else self._search_nw

    @property
    def replace(self):
        return self._replace_w if self.weight else self._replace_nw


class RMSNormFusionPass(FusionPass):
    """Replaces every RMSNorm form of `RMSNormPattern` by ``ascend_kernels.rms_norm``."""

    fusion = "rms_norm"

    @classmethod
    def patterns(cls):
        # With-weight forms first: a weightless form matches inside them.
        for weight in (True, False):
            for form in RMSNormPattern.FORMS:
                if form == "llama" and not weight:  # without weight it is the manual_upcast form
                    continue
                if form == "fused":
                    # One hand-built pattern (weight or None bound as it stands, any dtype); torch
                    # < 2.9 has no such op.
                    if weight and _compat.fused_rms_norm() is not None:
                        yield RMSNormPattern(form, weight, torch.float32)
                    continue
                for dtype in (torch.float32, torch.bfloat16):
                    yield RMSNormPattern(form, weight, dtype)
