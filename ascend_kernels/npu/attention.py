"""``torch_npu.npu_fused_infer_attention_score`` (FIA): its documented limits as one check, and the call.

The contract (v1/v2 schemas, BSND layout, mask polarity True = masked out, additive masks as
``pse_shift``, limits, graph capture) is written out in docs/npu-notes.md. No sequence lengths are
passed: the kernel reads them from the shapes, so a captured graph never needs an update.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import probe

__all__ = [
    "FIA_OPS",
    "MAX_BATCH",
    "MAX_GQA_RATIO",
    "MAX_HEAD_DIM",
    "MAX_HEADS",
    "MAX_PSE_BYTES",
    "MAX_SEQ",
    "LIMITS",
    "describe",
    "fia",
    "fia_op",
    "fia_unsupported",
]

FIA_OPS = ("npu_fused_infer_attention_score_v2", "npu_fused_infer_attention_score")  # preferred first
MAX_BATCH, MAX_HEADS, MAX_HEAD_DIM, MAX_SEQ, MAX_GQA_RATIO = 65536, 256, 512, 20 * 1024 * 1024, 64
# An additive mask becomes a per-head pse_shift of B*N*S*S_kv elements; above this, native is better.
MAX_PSE_BYTES = 256 * 1024 * 1024
_DTYPES = (torch.float16, torch.bfloat16)
LIMITS = ("float16/bfloat16 (bfloat16 on Atlas A2/A3)", "query length > 1", "D a multiple of 16, <= 512",
          "N <= 256, B <= 65536, S <= 20M", "GQA ratio <= 64", "bool mask with one head, or additive (pse_shift)",
          "no dropout, no is_causal, no gradients")
# What each schema calls the arguments this call sets (v1 name -> v2 name).
_V2_NAMES = {"num_heads": "num_query_heads", "scale": "softmax_scale", "softmax_lse_flag": "return_softmax_lse"}


def fia_op() -> Optional[str]:
    """The FIA op of the installed torch_npu (``_v2`` where it exists), or None without one.

    >>> fia_op()  # doctest: +SKIP
    'npu_fused_infer_attention_score_v2'
    """
    return _stack()[0] or None


@torch.compiler.assume_constant_result
def _stack() -> tuple[str, bool, str]:
    """(FIA op name or "", SoC is Atlas A2/A3, SoC name), constants to a compiled graph."""
    return _find_op(), probe.is_a2_a3(), probe.soc_name()


def _find_op() -> str:
    for name in FIA_OPS:
        args = probe.op_arguments(name)
        needed = [_V2_NAMES.get(a, a) if name.endswith("_v2") else a
                  for a in ("atten_mask", "pse_shift", "num_heads", "num_key_value_heads", "scale",
                            "input_layout", "softmax_lse_flag")]
        if args is not None and all(a in args for a in needed):
            return name
    return ""


def describe() -> str:
    """One line for ``diffusers-ascend env``: the FIA op this install offers and its limits.

    >>> describe()  # doctest: +SKIP
    'torch_npu.npu_fused_infer_attention_score_v2 (SoC Ascend910B2); ...'
    """
    from . import torch_npu_available

    if not torch_npu_available():
        return "torch_npu not installed"
    name = fia_op()
    if name is None:
        return "torch_npu has no npu_fused_infer_attention_score: npu_fia calls run _native_npu"
    return f"torch_npu.{name} (SoC {probe.soc_name()}); calls outside {'; '.join(LIMITS)} run _native_npu"


def _mask_batch(mask: torch.Tensor, batch: int, heads: int, sq: int, skv: int) -> Optional[str]:
    """Why ``mask`` (SDPA broadcasting against ``[B, N, S, S_kv]``) has no FIA form, or None."""
    if mask.dim() > 4:
        return f"attn_mask has {mask.dim()} dims (at most 4)"
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    for have, full, name in zip(shape, (batch, heads, sq, skv), ("batch", "head", "query", "key")):
        if have not in (1, full):
            return f"attn_mask {tuple(mask.shape)} does not broadcast to [B, N, S, S_kv] = {(batch, heads, sq, skv)} ({name} dim)"
    if shape[1] != 1 and mask.dtype == torch.bool:
        return f"per-head attn_mask {tuple(mask.shape)}: FIA's atten_mask has no head dimension"
    return None


def fia_unsupported(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, is_causal: bool = False,
                    enable_gqa: bool = False, layout: str = "BSND") -> Optional[str]:
    """Why FIA cannot run this attention call within its documented limits, or None when it can.

    Reads the install (op schema, SoC) through `probe`, never tensor values (it runs inside traces).

    Returns:
        A short reason (shown in reports and ``diffusers-ascend env``), or None.

    >>> import torch
    >>> q = torch.randn(1, 64, 2, 16)
    >>> fia_unsupported(q, q, q)  # doctest: +SKIP
    'dtype torch.float32 (FIA takes float16/bfloat16)'
    """
    op, a2_a3, soc = _stack()
    if not op:
        return "torch_npu has no npu_fused_infer_attention_score"
    if layout != "BSND":
        return f"layout {layout!r} (only BSND is wired)"
    if query.dtype not in _DTYPES:
        return f"dtype {query.dtype} (FIA takes float16/bfloat16)"
    if query.dtype == torch.bfloat16 and not a2_a3:
        return f"bfloat16 on SoC {soc} (FIA's limits are documented for Atlas A2/A3)"
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return f"mixed dtypes q {query.dtype}, k {key.dtype}, v {value.dtype}"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "query/key/value are not 4-D [B, S, N, D]"
    if key.shape != value.shape:
        return f"key {tuple(key.shape)} and value {tuple(value.shape)} differ"
    b, sq, n, d = query.shape
    _, skv, nkv, dk = key.shape
    if key.shape[0] != b or dk != d:
        return f"query {tuple(query.shape)} and key {tuple(key.shape)} differ in batch or head dim"
    if query.requires_grad or key.requires_grad or value.requires_grad:
        return "needs gradients (FIA is an inference op)"
    if dropout_p:
        return f"dropout_p={dropout_p} (FIA has no dropout)"
    if is_causal:
        return "is_causal (FIA's causal modes need its 2048x2048 band mask; not wired)"
    if sq <= 1:
        return "query length 1 (FIA's incremental kernel; limits differ)"
    if b > MAX_BATCH or n > MAX_HEADS or d > MAX_HEAD_DIM or d % 16 or max(sq, skv) > MAX_SEQ:
        return (f"shape B={b}, N={n}, D={d}, S={sq}, S_kv={skv} outside FIA's limits "
                f"(B <= {MAX_BATCH}, N <= {MAX_HEADS}, D <= {MAX_HEAD_DIM} and a multiple of 16, S <= 20M)")
    if nkv != n:
        if not enable_gqa:
            return f"{n} query heads and {nkv} key heads without enable_gqa"
        if n % nkv or n // nkv > MAX_GQA_RATIO:
            return f"GQA {n} query heads over {nkv} key heads (needs a divisor, ratio <= {MAX_GQA_RATIO})"
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            return f"attn_mask dtype {attn_mask.dtype} (bool or additive float)"
        reason = _mask_batch(attn_mask, b, n, sq, skv)
        if reason:
            return reason
        if attn_mask.dtype != torch.bool:
            lead = b if (attn_mask.dim() == 4 and attn_mask.shape[0] == b) else 1
            size = lead * n * sq * skv * query.element_size()
            if size > MAX_PSE_BYTES:
                return f"additive attn_mask as pse_shift would take {size >> 20} MiB (limit {MAX_PSE_BYTES >> 20} MiB)"
    return None


def _fia_mask(mask: torch.Tensor, query: torch.Tensor, skv: int) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(atten_mask, pse_shift) for an SDPA-convention mask: a bool mask (True = attend) becomes
    FIA's ``(B|1, 1, S, S_kv)`` bool mask with True = masked out; an additive mask becomes
    ``pse_shift`` ``(B|1, N, S, S_kv)`` in query's dtype. Both contiguous, as FIA requires."""
    b, sq, n, _ = query.shape
    full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    lead = full.shape[0]
    if mask.dtype == torch.bool:
        return (~full).expand(lead, 1, sq, skv).contiguous(), None
    return None, full.to(query.dtype).expand(lead, n, sq, skv).contiguous()


def fia(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
        scale: Optional[float] = None, return_lse: bool = False):
    """Attention through FIA for diffusers' ``BSND`` tensors, SDPA semantics.

    Call only where `fia_unsupported` returned None.

    Args:
        query: ``[B, S, N, D]``; key, value: ``[B, S_kv, N_kv, D]`` (GQA when N_kv < N).
        attn_mask: SDPA convention: bool True = attend, or additive float; broadcastable to
            ``[B, N, S, S_kv]`` with one head.
        scale: softmax scale, default ``1/sqrt(D)``.
        return_lse: also return the log-sum-exp, fp32 ``[B, S, N]`` (diffusers' ring attention form).

    Returns:
        ``out`` ``[B, S, N, D]`` in query's dtype, or ``(out, lse)``.

    >>> q = torch.randn(1, 64, 2, 16, dtype=torch.bfloat16, device="npu")  # doctest: +SKIP
    >>> out, lse = fia(q, q, q, return_lse=True)  # doctest: +SKIP
    >>> lse.shape  # doctest: +SKIP
    torch.Size([1, 64, 2])
    """
    name = fia_op()
    op = getattr(torch.ops.npu, name)  # what torch_npu.<name> is (torch_npu registers its ops in "npu")
    atten_mask = pse_shift = None
    if attn_mask is not None:
        atten_mask, pse_shift = _fia_mask(attn_mask, query, key.shape[1])
    kwargs = {
        "pse_shift": pse_shift,
        "atten_mask": atten_mask,  # True = masked out (FIA's polarity)
        "num_heads": query.shape[2],
        "num_key_value_heads": key.shape[2],  # 0 would mean "as query"; explicit for GQA
        "scale": 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale),
        "input_layout": "BSND",
        "softmax_lse_flag": bool(return_lse),
        # No actual_seq_lengths: lengths come from the shapes, so a captured graph never needs an update.
    }
    if name.endswith("_v2"):
        kwargs = {_V2_NAMES.get(k, k): v for k, v in kwargs.items()}
    out, lse = op(query.contiguous(), key.contiguous(), value.contiguous(), **kwargs)
    if not return_lse:
        return out
    # softmax_lse (B, N, S, 1) -> (B, S, N), the layout diffusers' templated attention merges.
    return out, lse.squeeze(-1).transpose(1, 2).contiguous()
