"""Residual add + RMSNorm -> ``ascend_kernels.add_rms_norm`` (two outputs: normed, residual sum).

The shape it fuses: ``x = x + h; y = norm(x)`` where ``x`` lives on as the next residual (Z-Image and
Lumina 2 blocks: ``x = x + gate * attention_norm2(attn_out)`` then ``ffn_norm1(x)``; LLM-style
pre-norm stacks). Both values leave the match, so the replacement is one call returning two
tensors: the matcher replaces the norm's result and the sum's users alike.

Forms matched: the sum followed by every decomposed RMSNorm form of `RMSNormPattern` (torch,
diffusers, manual, manual_upcast, llama; fp32 and bf16 graphs), and the sum followed by the
``ascend_kernels.rms_norm`` op (forms ``"op"``, ``"op_default_dtype"``: where the ``rms_norm`` layer swap or pass made the
norm one op first). The pass runs before ``rms_norm``'s. Opt-in (`diffusers_ascend.fusions.Fusion.opt_in`):
it takes the ``add`` that ``mul_add`` would otherwise fuse with its gate.
"""

from __future__ import annotations

import types

import torch

from .. import _compat
from .base import FusionPass, FusionPattern, tensor_arg
from .rms_norm import RMSNormPattern

__all__ = ["AddRMSNormPattern", "AddRMSNormFusionPass"]


class AddRMSNormPattern(FusionPattern):
    """``s = x1 + x2`` followed by one written form of RMSNorm of ``s``; matches return ``(normed, s)``.

    Args:
        form: a decomposed form of `RMSNormPattern` (``"torch"``, ``"diffusers"``, ``"manual"``,
            ``"manual_upcast"``, ``"llama"``), or ``"op"`` (``ascend_kernels.rms_norm`` of the sum,
            weight or None and an out_dtype, hand-built), ``"op_default_dtype"`` (the same call without
            out_dtype: graphs leave a None argument out).
        weight: whether a weight multiplies the normalized value (op forms: both, bound as they stand).
        dtype: example dtype (fp32 graphs have no casts).
    """

    FORMS = ("torch", "diffusers", "manual", "manual_upcast", "llama", "op", "op_default_dtype")
    OP_FORMS = ("op", "op_default_dtype")
    scalars = ("eps",)

    def __init__(self, form: str, weight: bool, dtype: torch.dtype = torch.float32):
        super().__init__(form, dtype)
        self.weight = weight
        self.norm = None if form in self.OP_FORMS else RMSNormPattern(form, weight, dtype)

    def variant(self) -> str:
        return f"{self.form},{'weight' if self.weight else 'no_weight'}"

    def example_inputs(self):
        x1, x2 = torch.randn(2, 3, 8, dtype=self.dtype), torch.randn(2, 3, 8, dtype=self.dtype)
        if self.form == "op":
            return [x1, x2, torch.randn(8, dtype=self.dtype), 1.0, self.dtype]
        return [x1, x2, torch.randn(8, dtype=self.dtype), 1.0] if self.weight else [x1, x2, 1.0]

    def check(self, match) -> bool:
        # As RMSNormPattern: a weight is one scale per channel of the sum.
        x1, x2 = tensor_arg(match, "x1"), tensor_arg(match, "x2")
        if x1 is None or x2 is None or match.kwargs.get("w") is None:
            return x1 is not None and x2 is not None
        w = tensor_arg(match, "w")
        return w is not None and w.dim() == 1 and w.shape[0] == torch.broadcast_shapes(x1.shape, x2.shape)[-1]

    def search_pattern(self):
        if self.form not in self.OP_FORMS:
            return None
        pm = _compat._pm()
        total = pm.CallFunction(torch.ops.aten.add.Tensor, pm.KeywordArg("x1"), pm.KeywordArg("x2"))
        args = [pm.KeywordArg("w"), pm.KeywordArg("eps")] + ([pm.KeywordArg("out_dtype")] if self.form == "op" else [])
        normed = pm.CallFunction(torch.ops.ascend_kernels.rms_norm.default, total, *args)
        return pm.MultiOutputPattern([normed, total])

    # The matcher binds the parameter names of these functions.
    def _search_w(self, x1, x2, w, eps):
        s = x1 + x2
        return self.norm.search(s, w, eps), s

    def _search_nw(self, x1, x2, eps):
        s = x1 + x2
        return self.norm.search(s, eps), s

    def _search_op(self, x1, x2, w, eps, out_dtype):
        s = x1 + x2
        return torch.ops.ascend_kernels.rms_norm(s, w, eps, out_dtype), s

    def _search_op_default(self, x1, x2, w, eps):
        s = x1 + x2
        return torch.ops.ascend_kernels.rms_norm(s, w, eps), s

    def _replace_op_default(self, x1, x2, w, eps):
        return self._replace(x1, x2, w, eps, None)

    def _replace(self, x1, x2, w, eps, out_dtype):
        y, s = torch.ops.ascend_kernels.add_rms_norm(x1, x2, w, eps, out_dtype)
        return y, s

    def _replace_w(self, x1, x2, w, eps):
        # The dtype the searched norm returns for the sum (verified on every match under fake tensors).
        total = types.SimpleNamespace(dtype=torch.result_type(x1, x2))
        return self._replace(x1, x2, w, eps, self.norm._out_dtype(total, w))

    def _replace_nw(self, x1, x2, eps):
        total = types.SimpleNamespace(dtype=torch.result_type(x1, x2))
        return self._replace(x1, x2, None, eps, self.norm._out_dtype(total, None))

    @property
    def search(self):
        if self.form in self.OP_FORMS:
            return self._search_op if self.form == "op" else self._search_op_default
        return self._search_w if self.weight else self._search_nw

    @property
    def replace(self):
        if self.form in self.OP_FORMS:
            return self._replace if self.form == "op" else self._replace_op_default
        return self._replace_w if self.weight else self._replace_nw


class AddRMSNormFusionPass(FusionPass):
    """Replaces a residual add feeding an RMSNorm (`AddRMSNormPattern`) by ``ascend_kernels.add_rms_norm``."""

    fusion = "add_rms_norm"

    @classmethod
    def patterns(cls):
        # With-weight forms first (a weightless form matches inside them), as in RMSNormFusionPass.
        for form in AddRMSNormPattern.OP_FORMS:  # no casts, weight bound as it stands: one each
            yield AddRMSNormPattern(form, True)
        for weight in (True, False):
            for form in AddRMSNormPattern.FORMS:
                if form in AddRMSNormPattern.OP_FORMS or (form == "llama" and not weight):
                    continue
                for dtype in (torch.float32, torch.bfloat16):
                    yield AddRMSNormPattern(form, weight, dtype)
