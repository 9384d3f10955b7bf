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
- scale first (Flux 2 and newer): ``(1 + scale) * norm(x) + shift``, ``scale``/``shift`` of
  ``x``'s rank (the matcher does not commute ``mul``: a form of its own).
- per frame (Sana-WM's ``SanaVideoMSCamCtrlBlock`` and ``T2IFinalLayer``): ``(norm(x).reshape(B, F, -1, D)
  * (1 + scale) + shift).reshape(B, N, D)`` with ``scale``/``shift`` of shape (B, F, 1, D): tokens
  grouped by frame, one modulation per frame. The op runs on ``x`` viewed (B, F, N/F, D) (the norm is
  over D only, so the view commutes with it).
- scale only (no shift): ``norm(x) * (1 + scale)`` and ``(1 + scale) * norm(x)``; the op gets
  a zero shift. These run after every form with a shift, which they would otherwise cut short.

The fused op computes in fp32; ``out_dtype`` reproduces the dtype the replaced code returns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import FusionPass, FusionPattern, matched_nodes, tensor_arg

__all__ = ["AdaLNPattern", "AdaLNFusionPass"]


def _promote(*tensors) -> torch.dtype:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


class AdaLNPattern(FusionPattern):
    """One written form of adaLN modulation.

    Args:
        form: ``"flux"``, ``"continuous"``, ``"broadcast"``, ``"upcast"`` (Wan, cast back to ``x.dtype``),
            ``"upcast_fp32_out"`` (Wan without the cast back), ``"scale_first"`` (``(1 + scale) * norm(x) +
            shift``), ``"scale_only"`` (``norm(x) * (1 + scale)``) or ``"scale_only_first"``
            (``(1 + scale) * norm(x)``) or ``"per_frame"`` (``(norm(x).reshape(B, F, -1, D) * (1 + scale)
            + shift).reshape(B, N, D)``).
        dtype: example dtype of ``x``.
    """

    FORMS = (
        "flux",
        "continuous",
        "broadcast",
        "upcast",
        "upcast_fp32_out",
        "scale_first",
        "scale_only",
        "scale_only_first",
        "per_frame",
    )
    scalars = ("eps",)

    @property
    def retrace(self) -> bool:
        # the frame split's sizes are computed from shapes: symbolic expressions in dynamic graphs
        return self.form != "per_frame"

    @property
    def has_shift(self) -> bool:
        return not self.form.startswith("scale_only")

    def example_inputs(self):
        x = torch.randn(2, 5, 8, dtype=self.dtype)
        if self.form in ("flux", "continuous"):
            scale, shift = torch.randn(2, 8, dtype=self.dtype), torch.randn(2, 8, dtype=self.dtype)
        elif self.form == "per_frame":  # 6 tokens in 3 frames
            x = torch.randn(2, 6, 8, dtype=self.dtype)
            scale, shift = torch.randn(2, 3, 1, 8, dtype=self.dtype), torch.randn(2, 3, 1, 8, dtype=self.dtype)
        else:
            mdt = torch.float32 if self.form.startswith("upcast") else self.dtype
            scale, shift = torch.randn(2, 1, 8, dtype=mdt), torch.randn(2, 1, 8, dtype=mdt)
        return [x, scale, shift, 1.0] if self.has_shift else [x, scale, 1.0]

    # The matcher binds the parameter names of `search`: the shift-less forms have no `shift`.
    @property
    def search(self):
        return self._search if self.has_shift else self._search_no_shift

    @property
    def replace(self):
        return self._replace if self.has_shift else self._replace_no_shift

    def _search_no_shift(self, x, scale, eps):
        y = F.layer_norm(x, (x.shape[-1],), eps=eps)
        return y * (1 + scale) if self.form == "scale_only" else (1 + scale) * y

    def _replace_no_shift(self, x, scale, eps):
        out_dtype = _promote(x, scale)
        return torch.ops.ascend_kernels.adaln_modulate(x, scale, torch.zeros_like(scale), eps, None, None, out_dtype)

    def _search(self, x, scale, shift, eps):
        d = (x.shape[-1],)
        if self.form == "scale_first":
            return (1 + scale) * F.layer_norm(x, d, eps=eps) + shift
        if self.form == "flux":
            return F.layer_norm(x, d, eps=eps) * (1 + scale[:, None]) + shift[:, None]
        if self.form == "continuous":
            return F.layer_norm(x, d, eps=eps) * (1 + scale)[:, None, :] + shift[:, None, :]
        if self.form == "broadcast":
            return F.layer_norm(x, d, eps=eps) * (1 + scale) + shift
        if self.form == "per_frame":
            y = F.layer_norm(x, d, eps=eps).reshape(x.shape[0], scale.shape[1], -1, x.shape[-1])
            return (y * (1 + scale) + shift).reshape(x.shape)
        y = F.layer_norm(x.float(), d, eps=eps) * (1 + scale) + shift
        return y.type_as(x) if self.form == "upcast" else y

    def _replace(self, x, scale, shift, eps):
        op = torch.ops.ascend_kernels.adaln_modulate
        if self.form == "per_frame":
            frames = x.reshape(x.shape[0], scale.shape[1], -1, x.shape[-1])
            return op(frames, scale, shift, eps, None, None, _promote(x, scale, shift)).reshape(x.shape)
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
        names = ("x", "scale", "shift") if self.has_shift else ("x", "scale")
        tensors = [tensor_arg(match, n) for n in names]
        if any(t is None for t in tensors):
            return False
        x, mods = tensors[0], tensors[1:]
        if self.form == "per_frame":
            return self._check_per_frame(match, x, mods)
        if self.form in ("flux", "continuous"):
            return all(t.dim() == 2 for t in mods)
        # The op reads scale/shift of rank x.dim()-1 as (B, 1, D); plain broadcasting needs x's rank.
        # Last dim: one value per channel (D) or one for all (1); anything else is no modulation of x.
        return all(t.dim() == x.dim() and t.shape[-1] in (1, x.shape[-1]) for t in mods)

    @staticmethod
    def _check_per_frame(match, x, mods) -> bool:
        # Generic match (sizes wildcarded): the norm's output is split (B, F, N/F, D) with F the
        # modulation's frame dim, and scale/shift are (B or 1, F, 1, D or 1): one row per frame.
        if x.dim() != 3:
            return False
        frames = mods[0].shape[1] if mods[0].dim() == 4 else 0
        if not frames or x.shape[1] % frames:
            return False
        split = (x.shape[0], frames, x.shape[1] // frames, x.shape[2])
        if not all(
            t.dim() == 4
            and t.shape[0] in (1, x.shape[0])
            and t.shape[1] == frames
            and t.shape[2] == 1
            and t.shape[3] in (1, x.shape[2])
            for t in mods
        ):
            return False
        layer_norms = matched_nodes(match, torch.ops.aten.native_layer_norm.default)
        if len(layer_norms) != 1:
            return False
        # native_layer_norm -> getitem(0) -> view: the view's shape is the split
        normed = [g for g in layer_norms[0].users if g.args[1] == 0]
        views = [v for g in normed for v in g.users if isinstance(v.meta.get("val"), torch.Tensor)]
        return len(views) == 1 and tuple(views[0].meta["val"].shape) == split


class AdaLNFusionPass(FusionPass):
    """Replaces the adaLN forms of `AdaLNPattern` by ``ascend_kernels.adaln_modulate``."""

    fusion = "adaln"

    @classmethod
    def patterns(cls):
        # Forms with casts first: their fp32 graphs equal the broadcast form's. Shift-less forms
        # last: they match inside every form with a shift.
        for form in (
            "upcast",
            "upcast_fp32_out",
            "flux",
            "continuous",
            "broadcast",
            "scale_first",
            "per_frame",
            "scale_only",
            "scale_only_first",
        ):
            for dtype in (torch.float32, torch.bfloat16):
                yield AdaLNPattern(form, dtype)
