"""Rotary position embedding -> ``ascend_kernels.rope``.

Forms matched (aot graphs):

- Flux: ``diffusers.models.embeddings.apply_rotary_emb(x, (cos, sin), use_real=True,
  use_real_unbind_dim=-1)``: ``view(x, [..., -1, 2]) -> unbind(-1) -> stack([-im, re], -1) -> view``,
  ``(x.float() * cos + rot.float() * sin).to(x.dtype)``  -> layout ``"interleaved"``.
  The broadcasting ``cos[None, :, None, :]`` stays outside the pattern, so either
  ``sequence_dim`` matches.
- Wan: the ``apply_rotary_emb`` closure of ``WanAttnProcessor`` (writes into ``empty_like`` by
  even/odd slices, functionalized to ``slice_scatter``) -> layout ``"interleaved"``.
  Precondition, uncheckable at compile time: ``cos[2i] == cos[2i+1]`` and ``sin[2i] == sin[2i+1]``
  (Wan reads only even cos / odd sin; ``WanRotaryPosEmbed`` uses ``repeat_interleave(2)``).
- Helios (``apply_rotary_emb_transposed``): Wan's even/odd writes with ``cos``/``sin`` taken by
  ``freqs.chunk(2, dim=-1)`` of one table and sliced inline (``x_2 * cos[..., 0::2]``) -> layout
  ``"interleaved"`` on the two halves of ``freqs``. Same precondition as Wan: ``HeliosRotaryPosEmbed``
  builds both halves with ``repeat_interleave(2)``.
- 2x2 rotation matrices (Kandinsky 5's ``apply_rotary``): ``(rope * x.reshape(..., -1, 1, 2).float())
  .sum(-1).reshape(x.shape).to(torch.bfloat16)`` with ``rope[..., i, :, :]`` the matrix of pair i
  -> layout ``"interleaved"`` with ``cos = (r00, r11)``, ``sin = (-r01, r10)``: exact, no
  precondition. Kandinsky 6 casts back to ``x.dtype`` instead of bf16: ``rotation_matrix_typed``.
- rotate-half (``x * cos + cat(-x2, x1) * sin``, in the input dtype or upcast) -> layout ``"half"``;
  also with the halves taken by slices (``x[..., :d // 2]``) instead of ``chunk``.
- LTX-2's ``apply_split_rotary_emb`` (``rope_type="split"``): ``x`` viewed as ``(..., 2, D/2)`` on
  ``x.float()``, times half-size ``cos``, then ``addcmul_`` of ``-sin * x2`` into the first half and
  ``sin * x1`` into the second (functionalized to slice_scatter), cast back -> layout ``"half"``
  with ``cos``/``sin`` repeated over both halves (form ``split``).
- ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-2)`` (Stable Audio, CogView4, Cosmos):
  ``reshape(x, [..., 2, -1]).unbind(-2)`` then ``cat([-im, re], -1)``: rotate-half -> layout ``"half"``.
- complex multiplication (Qwen-Image ``use_real=False``, Z-Image, Lumina):
  ``view_as_real(view_as_complex(x.float().reshape(..., -1, 2)) * freqs).flatten(3).type_as(x)``
  with complex64 ``freqs`` -> layout ``"interleaved"`` with ``cos``/``sin`` the real/imaginary parts
  of ``freqs``, each repeated twice (``(a + ib)(c + id)`` is the interleaved rotation of ``(a, b)``).
  Form ``complex_conj``: ``freqs.conj()`` reaching the graph as a bare ``_conj`` view
  (`_compat.conj_views_reach_graphs`), which ``view_as_real`` refuses: it negates ``sin`` instead.

The fused op computes in fp32 and returns ``x.dtype``; a match whose result would have another
dtype or shape (``cos`` broadcasting ``x`` to a larger shape) is rejected.
"""

from __future__ import annotations

import torch

from .. import _compat
from .base import FusionPass, FusionPattern, matched_nodes, normalized_dim, tensor_arg

__all__ = ["RopePattern", "RopeFusionPass"]


def _rope(x, cos, sin, layout):
    return torch.ops.ascend_kernels.rope(x, cos, sin, layout)


class RopePattern(FusionPattern):
    """One written form of rotary embedding.

    Args:
        form: ``"flux"`` (diffusers ``apply_rotary_emb``, use_real, unbind dim -1), ``"wan"``
            (``WanAttnProcessor``'s closure), ``"wan_chunk"`` (Helios: Wan's writes, ``cos``/``sin``
            chunked from one table), ``"half"`` (rotate-half in the input dtype) or
            ``"half_upcast"`` (rotate-half on ``x.float()``, cast back); the other `FORMS` are
            described in the module docstring.
        dtype: example dtype of ``x`` (``cos``/``sin`` are fp32 as diffusers builds them).
    """

    FORMS = (
        "flux",
        "wan",
        "wan_chunk",
        "half",
        "half_upcast",
        "half_slice",
        "half_unbind",
        "complex",
        "complex_conj",
        "rotation_matrix",
        "rotation_matrix_typed",
        "split",
    )

    @property
    def retrace(self) -> bool:
        # `x.reshape(*x.shape[:-1], -1, 2)` sizes are symbolic expressions in dynamic graphs.
        return self.form not in (
            "flux",
            "half_unbind",
            "complex",
            "complex_conj",
            "rotation_matrix",
            "rotation_matrix_typed",
        )

    def check(self, match) -> bool:
        if self.form in ("complex", "complex_conj"):
            return self._check_complex(match)
        if self.form == "half_unbind":
            return self._check_half_unbind(match)
        if self.form == "wan_chunk":
            return self._check_wan_chunk(match)
        if self.form in ("rotation_matrix", "rotation_matrix_typed"):
            return self._check_rotation_matrix(match)
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
        return all(
            n.meta["val"].dtype == torch.float32 for n in matched_nodes(match, aten._to_copy.default) if n is not root
        )

    def _check_complex(self, match) -> bool:
        # Generic match: the pairs viewed as complex are the last dim split in 2 (view_as_complex
        # demands it), freqs is complex64 (complex128 would compute in fp64), the result has x's
        # shape (checked for every match) and its pairs are flattened back over the last dim.
        x, freqs = tensor_arg(match, "x"), tensor_arg(match, "freqs")
        if x is None or freqs is None or freqs.dtype != torch.complex64 or x.dim() < 2:
            return False
        aten = torch.ops.aten
        views = matched_nodes(match, aten.view_as_complex.default)
        if len(views) != 1 or tuple(views[0].args[0].meta["val"].shape) != (*x.shape[:-1], x.shape[-1] // 2, 2):
            return False
        return freqs.shape[-1] in (1, x.shape[-1] // 2)

    def _check_half_unbind(self, match) -> bool:
        x = tensor_arg(match, "x")
        aten = torch.ops.aten
        unbinds = matched_nodes(match, aten.unbind.int)
        if x is None or len(unbinds) != 1:
            return False
        pairs = unbinds[0].args[0].meta["val"]
        # [..., 2, D/2] unbound over dim -2: the two halves of the last dim
        return (
            tuple(pairs.shape) == (*x.shape[:-1], 2, x.shape[-1] // 2)
            and normalized_dim(unbinds[0].args[1], pairs.dim()) == pairs.dim() - 2
        )

    def _check_wan_chunk(self, match) -> bool:
        # The halves of `freqs` are x-sized tables, read in full (equal by the Wan precondition).
        x, freqs = tensor_arg(match, "x"), tensor_arg(match, "freqs")
        return x is not None and freqs is not None and freqs.shape[-1] == 2 * x.shape[-1]

    def _check_rotation_matrix(self, match) -> bool:
        # Generic match: x's pairs as rows (..., D/2, 1, 2) times (..., D/2, 2, 2) matrices, summed
        # over the last dim; x upcast to fp32 (the op computes in fp32), result cast to bf16
        # (Kandinsky 5) or back to x's dtype (Kandinsky 6).
        x, rope = tensor_arg(match, "x"), tensor_arg(match, "rope")
        if (
            x is None
            or rope is None
            or x.dim() < 2
            or rope.dim() < 3
            or tuple(rope.shape[-3:]) != (x.shape[-1] // 2, 2, 2)
        ):
            return False
        aten = torch.ops.aten
        sums = matched_nodes(match, aten.sum.dim_IntList)
        if len(sums) != 1:
            return False
        prod = sums[0].args[0].meta["val"]
        if [normalized_dim(d, prod.dim()) for d in sums[0].args[1]] != [prod.dim() - 1] or prod.dtype != torch.float32:
            return False
        rows = [
            n
            for n in matched_nodes(match, aten.view) + matched_nodes(match, aten.reshape)
            if tuple(n.meta["val"].shape) == (*x.shape[:-1], x.shape[-1] // 2, 1, 2)
        ]
        out_dtype = torch.bfloat16 if self.form == "rotation_matrix" else x.dtype
        return len(rows) == 1 and match.output_nodes()[0].meta["val"].dtype == out_dtype

    def example_inputs(self):
        x = torch.randn(2, 6, 3, 8, dtype=self.dtype)  # (B, S, H, D)
        if self.form in ("rotation_matrix", "rotation_matrix_typed"):
            return [x, torch.randn(1, 6, 1, 4, 2, 2)]  # (1, S, 1, D/2, 2, 2), fp32
        if self.form == "wan_chunk":
            return [x, torch.randn(1, 6, 1, 16)]  # (1, S, 1, 2D): cos then sin, fp32
        if self.form in ("complex", "complex_conj"):
            freqs = torch.polar(torch.ones(6, 1, 4), torch.randn(6, 1, 4))  # (S, 1, D/2), as unsqueezed
            return [x, freqs]
        if self.form == "split":  # LTX-2: (B, H, T, D) with half-size (B, H, T, D/2) fp32 tables
            x = torch.randn(2, 3, 6, 8, dtype=self.dtype)
            return [x, torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)]
        cdt = self.dtype if self.form in ("half", "half_slice") else torch.float32
        cos = torch.randn(1, 6, 1, 8, dtype=cdt)
        sin = torch.randn(1, 6, 1, 8, dtype=cdt)
        return [x, cos, sin]

    # The matcher binds the parameter names of `search`: the complex and wan_chunk forms take
    # `freqs`, rotation_matrix takes `rope`.
    @property
    def search(self):
        return {
            "complex": self._search_complex,
            "complex_conj": self._search_complex_conj,
            "wan_chunk": self._search_wan_chunk,
            "rotation_matrix": self._search_rotation_matrix,
            "rotation_matrix_typed": self._search_rotation_matrix_typed,
        }.get(self.form, self._search)

    @property
    def replace(self):
        return {
            "complex": self._replace_complex,
            "complex_conj": self._replace_complex_conj,
            "wan_chunk": self._replace_wan_chunk,
            "rotation_matrix": self._replace_rotation_matrix,
            "rotation_matrix_typed": self._replace_rotation_matrix_typed,
        }.get(self.form, self._replace)

    def _search_rotation_matrix(self, x, rope):
        x_ = x.reshape(*x.shape[:-1], -1, 1, 2).to(torch.float32)
        x_out = (rope * x_).sum(dim=-1)
        return x_out.reshape(*x.shape).to(torch.bfloat16)

    @staticmethod
    def _matrix_rope(x, rope):
        # out[2i] = r00 x[2i] + r01 x[2i+1], out[2i+1] = r10 x[2i] + r11 x[2i+1]: the interleaved
        # rotation x * cos + rot(x) * sin with rot(x) = (-x[2i+1], x[2i]), in x's dtype.
        cos = torch.stack([rope[..., 0, 0], rope[..., 1, 1]], dim=-1).flatten(-2)
        sin = torch.stack([-rope[..., 0, 1], rope[..., 1, 0]], dim=-1).flatten(-2)
        return _rope(x, cos, sin, "interleaved")

    def _replace_rotation_matrix(self, x, rope):
        return self._matrix_rope(x, rope).to(torch.bfloat16)

    def _search_rotation_matrix_typed(self, x, rope):
        x_ = x.reshape(*x.shape[:-1], -1, 1, 2).float()
        return (rope.float() * x_).sum(dim=-1).reshape(*x.shape).to(dtype=x.dtype)

    def _replace_rotation_matrix_typed(self, x, rope):
        return self._matrix_rope(x, rope)

    def _search_wan_chunk(self, x, freqs):
        # as Helios writes it: the slices of cos/sin repeated inline in both writes
        x_1, x_2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        cos, sin = freqs.chunk(2, dim=-1)
        out = torch.empty_like(x)
        out[..., 0::2] = x_1 * cos[..., 0::2] - x_2 * sin[..., 1::2]
        out[..., 1::2] = x_1 * sin[..., 1::2] + x_2 * cos[..., 0::2]
        return out.type_as(x)

    def _replace_wan_chunk(self, x, freqs):
        cos, sin = freqs.chunk(2, dim=-1)
        return _rope(x, cos, sin, "interleaved")

    def _search_complex(self, x, freqs):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(-2).type_as(x)

    @staticmethod
    def _replace_complex(x, freqs, conj=False):
        parts = torch.view_as_real(freqs)
        cos = parts[..., 0].repeat_interleave(2, dim=-1)
        sin = parts[..., 1].repeat_interleave(2, dim=-1)
        return _rope(x, cos, -sin if conj else sin, "interleaved")

    def _search_complex_conj(self, x, freqs):
        return self._search_complex(x, freqs.conj())

    def _replace_complex_conj(self, x, freqs):
        return self._replace_complex(x, freqs, conj=True)

    def _search(self, x, cos, sin):
        if self.form == "split":  # diffusers.models.transformers.transformer_ltx2.apply_split_rotary_emb
            last = x.shape[-1]
            split_x = x.reshape(*x.shape[:-1], 2, last // 2).float()
            first_x, second_x = split_x[..., :1, :], split_x[..., 1:, :]
            cos_u, sin_u = cos.unsqueeze(-2), sin.unsqueeze(-2)
            out = split_x * cos_u
            out[..., :1, :].addcmul_(-sin_u, second_x)
            out[..., 1:, :].addcmul_(sin_u, first_x)
            return out.reshape(*out.shape[:-2], last).to(dtype=x.dtype)
        if self.form == "half_unbind":
            x_real, x_imag = x.reshape(*x.shape[:-1], 2, -1).unbind(-2)
            x_rotated = torch.cat([-x_imag, x_real], dim=-1)
            return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)
        if self.form == "half_slice":
            half = x.shape[-1] // 2
            rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
            return x * cos + rotated * sin
        if self.form == "flux":
            x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
            x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(-2)  # any rank (LTX: 3-D x)
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

    def _replace(self, x, cos, sin):
        if self.form == "split":  # one half-size table for both halves
            return _rope(x, torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1), "half")
        return _rope(x, cos, sin, "half" if self.form.startswith("half") else "interleaved")


class RopeFusionPass(FusionPass):
    """Replaces the rotary forms of `RopePattern` by ``ascend_kernels.rope``."""

    fusion = "rope"

    @classmethod
    def patterns(cls):
        for form in RopePattern.FORMS:
            if form == "complex_conj" and not _compat.conj_views_reach_graphs():
                continue  # this torch materializes the conjugate: the "complex" form takes it
            for dtype in (torch.float32, torch.bfloat16):
                yield RopePattern(form, dtype)
