"""torchao-quantized weights of an enabled model: which scheme each linear runs, which of them the
int8 fusions rewrite, and the refusal of weights whose scales do not fit their data.

Read from the tensor subclasses' attributes (torchao 0.18's ``Int8Tensor``: ``qdata``, ``scale``,
``block_size``, ``act_quant_kwargs``, ``act_pre_scale``, ``act_quant_scale``) without importing
torchao: a model that holds none costs one pass over its modules.
"""

from __future__ import annotations

import torch

__all__ = ["check_quantized_weights", "quantized_schemes", "unfused_schemes"]

# The scheme each int8 fusion rewrites (its name is the fusion's).
FUSED_SCHEMES = ("int8_dynamic_linear", "int8_weight_only_linear")


def _torchao_weights(model: torch.nn.Module):
    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if isinstance(w, torch.Tensor) and type(w).__module__.split(".")[0] == "torchao":
            yield name, w


def scheme_of(weight: torch.Tensor) -> str:
    """The scheme of a torchao weight: a fusion name of `FUSED_SCHEMES`, or a description of another
    scheme (``"torchao Int4Tensor"``, ``"torchao Int8Tensor (per-group, block_size [1, 16])"``...).

    >>> scheme_of(torch.zeros(2))  # not torchao's
    'torch Tensor'
    """
    cls = type(weight).__name__
    if type(weight).__module__.split(".")[0] != "torchao":
        return f"torch {cls}"
    if cls != "Int8Tensor":
        return f"torchao {cls}"
    qdata, block = getattr(weight, "qdata", None), list(getattr(weight, "block_size", []) or [])
    if qdata is None or qdata.dim() != 2 or block != [1, qdata.shape[-1]]:
        kind = "per-tensor" if qdata is not None and block == list(qdata.shape) else "per-group"
        return f"torchao Int8Tensor ({kind}, block_size {block})"
    if getattr(weight, "act_pre_scale", None) is not None:
        return "torchao Int8Tensor (act_pre_scale: SmoothQuant/AWQ)"
    act = getattr(weight, "act_quant_kwargs", None)
    if act is None:
        return "int8_weight_only_linear"
    if getattr(weight, "act_quant_scale", None) is not None:
        return "torchao Int8Tensor (static activation scale)"
    mapping = str(getattr(act, "mapping_type", ""))
    if not mapping.endswith("SYMMETRIC") or mapping.endswith("ASYMMETRIC"):
        return f"torchao Int8Tensor ({mapping.rsplit('.', 1)[-1].lower()} activations)"
    granularity = type(getattr(act, "granularity", None)).__name__
    if granularity != "PerRow":
        return f"torchao Int8Tensor ({granularity} activations)"
    if getattr(act, "reduce_range", False) or getattr(weight, "reduce_range", False):
        return "torchao Int8Tensor (reduce_range)"
    return "int8_dynamic_linear"


def quantized_schemes(model: torch.nn.Module) -> dict[str, int]:
    """``{scheme: number of linears}`` over the torchao weights of `model` (`scheme_of`)."""
    counts: dict[str, int] = {}
    for _, w in _torchao_weights(model):
        s = scheme_of(w)
        counts[s] = counts.get(s, 0) + 1
    return counts


def unfused_schemes(model: torch.nn.Module, fusions) -> dict[str, int]:
    """The torchao schemes of `model` that none of `fusions` rewrites: ``{scheme: linears}``; these
    linears keep torchao's own path. A fused scheme whose fusion is not enabled is named so."""
    out: dict[str, int] = {}
    for scheme, n in quantized_schemes(model).items():
        if scheme in fusions:
            continue
        key = f"{scheme} (fusion not enabled)" if scheme in FUSED_SCHEMES else scheme
        out[key] = out.get(key, 0) + n
    return out


def check_quantized_weights(model: torch.nn.Module, label: str) -> None:
    """Refuses torchao ``Int8Tensor`` weights whose scale is missing or does not fit their data.

    Raises:
        ValueError: naming the module, the shapes found and the shape ``block_size`` implies.
    """
    for name, w in _torchao_weights(model):
        if type(w).__name__ != "Int8Tensor":
            continue
        qdata, scale = getattr(w, "qdata", None), getattr(w, "scale", None)
        block = list(getattr(w, "block_size", []) or [])
        where = f"{label}.{name}" if label else name
        if qdata is None or scale is None:
            raise ValueError(
                f"{where}.weight: torchao Int8Tensor without {'qdata' if qdata is None else 'scale'}: a damaged or "
                "incomplete quantized checkpoint; re-quantize the model or re-save it"
            )
        if qdata.dtype != torch.int8 or len(block) != qdata.dim() or any(b <= 0 for b in block):
            raise ValueError(
                f"{where}.weight: torchao Int8Tensor with qdata {qdata.dtype} {tuple(qdata.shape)} and block_size "
                f"{block}: not an int8 tensor of that block layout"
            )
        expected = tuple(s // b for s, b in zip(qdata.shape, block))
        if tuple(scale.shape) != expected or not scale.is_floating_point():
            raise ValueError(
                f"{where}.weight: torchao Int8Tensor scale {scale.dtype} {tuple(scale.shape)} does not fit qdata "
                f"{tuple(qdata.shape)} with block_size {block} (expected a float scale of shape {expected}): a damaged "
                "or mismatched quantized checkpoint; re-quantize the model or re-save it"
            )
