"""Rotary position embedding -> ``ascend_kernels.rope``.

Forms matched (aot graphs):

- Flux: ``diffusers.models.embeddings.apply_rotary_emb(x, (cos, sin), use_real=True,
  use_real_unbind_dim=-1)``: ``view(x, [..., -1, 2]) -> unbind(-1) -> stack([-im, re], -1) -> view``,
  ``(x.float() * cos + rot.float() * sin).to(x.dtype)``  -> layout ``"interleaved"``.
  The broadcasting ``cos[None, :, None, :]`` stays outside the pattern, so either
  ``sequence_dim`` matches.
- Wan: the ``apply_rotary_emb`` closure of ``WanAttnProcessor`` (writes into ``empty_like`` by
  even/odd slices, functionalized to ``slice_scatter``) -> layout ``"interleaved"``.
  Precondition: Wan's code reads only ``cos[..., 0::2]`` and ``sin[..., 1::2]``; the interleaved op
  reads all of ``cos``/``sin``, so the two agree when ``cos[2i] == cos[2i+1]`` and
  ``sin[2i] == sin[2i+1]``. ``WanRotaryPosEmbed`` builds them with ``repeat_interleave(2)``, so
  it holds for every Wan model; the values are not known at compile time, so the pass cannot check
  it: disable the ``rope`` fusion for a model that feeds Wan's processor other tables.
- rotate-half (``x * cos + cat(-x2, x1) * sin``, in the input dtype or upcast) -> layout ``"half"``.

The fused op computes in fp32 and returns ``x.dtype``; a match whose result would have another
dtype or shape (``cos`` broadcasting ``x`` to a larger shape) is rejected.
"""

from __future__ import annotations

import torch

from .base import FusionPass, FusionPattern, matched_nodes, normalized_dim, tensor_arg

__all__ = ["RopePattern", "RopeFusionPass"]


def _rope(x, cos, sin, layout):
    return torch.ops.ascend_kernels.rope(x, cos, sin, layout)


class RopePattern(FusionPattern):
    """One written form of rotary embedding.

    Args:
        form: ``"flux"`` (diffusers ``apply_rotary_emb``, use_real, unbind dim -1), ``"wan"``
            (``WanAttnProcessor``'s closure), ``"half"`` (rotate-half in the input dtype) or
            ``"half_upcast"`` (rotate-half on ``x.float()``, cast back).
        dtype: example dtype of ``x`` (``cos``/``sin`` are fp32 as diffusers builds them).
    """

    FORMS = ("flux", "wan", "half", "half_upcast")

    @property
    def retrace(self) -> bool:
        # Flux's `x.reshape(*x.shape[:-1], -1, 2)` sizes are symbolic expressions in dynamic graphs.
        return self.form != "flux"

    def check(self, match) -> bool:
        if self.form != "flux":
            return True
        # Generic match (ints, lists, dtypes wildcarded): check what makes it Flux's rope.
        aten = torch.ops.aten
        x = tensor_arg(match, "x")
        if x is None:
            return False
        unbinds, stacks = matched_nodes(match, aten.unbind.int), matched_nodes(match, aten.stack.default)
        if len(unbinds) != 1 or len(stacks) != 1:
            return False
        unbind, stack = unbinds[0], stacks[0]
        pairs = unbind.args[0].meta["val"]
        if pairs.shape[-1] != 2 or normalized_dim(unbind.args[1], pairs.dim()) != pairs.dim() - 1:
            return False
        stacked = stack.meta["val"]
        if normalized_dim(stack.args[1] if len(stack.args) > 1 else 0, stacked.dim()) != stacked.dim() - 1:
            return False
        # the rotated tensor (stack flattened back) has x's shape
        if not any(u.meta["val"].shape == x.shape for u in stack.users):
            return False
        # casts inside the pattern are upcasts to fp32; the output dtype is checked for every match
        root = match.output_nodes()[0]
        return all(n.meta["val"].dtype == torch.float32 for n in matched_nodes(match, aten._to_copy.default) if n is not root)

    def example_inputs(self):
        x = torch.randn(2, 6, 3, 8, dtype=self.dtype)  # (B, S, H, D)
        cdt = self.dtype if self.form == "half" else torch.float32
        cos = torch.randn(1, 6, 1, 8, dtype=cdt)
        sin = torch.randn(1, 6, 1, 8, dtype=cdt)
        return [x, cos, sin]

    def search(self, x, cos, sin):
        if self.form == "flux":
            x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
            x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
            return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)
        if self.form == "wan":
            x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
            c = cos[..., 0::2]
            s = sin[..., 1::2]
            out = torch.empty_like(x)
            out[..., 0::2] = x1 * c - x2 * s
            out[..., 1::2] = x1 * s + x2 * c
            return out.type_as(x)
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
        if self.form == "half":
            return x * cos + rotated * sin
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)

    def replace(self, x, cos, sin):
        return _rope(x, cos, sin, "half" if self.form.startswith("half") else "interleaved")


class RopeFusionPass(FusionPass):
    """Replaces the rotary forms of `RopePattern` by ``ascend_kernels.rope``."""

    fusion = "rope"

    @classmethod
    def patterns(cls):
        for form in RopePattern.FORMS:
            for dtype in (torch.float32, torch.bfloat16):
                yield RopePattern(form, dtype)
