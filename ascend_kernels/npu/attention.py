"""``torch_npu.npu_fused_infer_attention_score`` (FIA): its documented limits as one check, and the
call; and the exact fallback for calls FIA cannot take (`fallback`).

The contract (v1/v2 schemas, BSND layout, mask polarity True = masked out, additive masks as
``pse_shift``, limits, graph capture) is written out in docs/npu-notes.md, with the text of the
installed wheel's doc (``torch_npu/_op_plugin_docs.py``) it is taken from. No sequence lengths are
passed: the kernel reads them from the shapes, so a captured graph never needs an update.

Masks: each op gets only the mask shapes its doc lists; a query row the mask leaves no key gets
SDPA's value (what the running torch's SDPA returns there: 0 on torch 2.13), never the kernel's
(undocumented); masks whose meaning depends on the SDPA kernel (fewer than 2 dims) or that SDPA
refuses go to SDPA itself. So every path gives SDPA's numbers or SDPA's error.
"""

from __future__ import annotations

import math

import torch

from . import probe

__all__ = [
    "FIA_OPS",
    "MAX_BATCH",
    "MAX_GQA_RATIO",
    "MAX_HEAD_DIM",
    "MAX_HEADS",
    "MAX_HEADS_X_DIM",
    "MAX_PSE_BYTES",
    "MAX_SEQ",
    "LIMITS",
    "describe",
    "fallback",
    "fia",
    "fia_op",
    "fia_unsupported",
]

FIA_OPS = ("npu_fused_infer_attention_score_v2", "npu_fused_infer_attention_score")  # preferred first
# The Q_S > 1 limits of the wheel's doc: "B <= 65536 ... N <= 256, D <= 512; input_layout BSH or
# BSND: N*D < 65535 ... S <= 20971520 (20M) ... float16/bfloat16 inputs: D 16-aligned".
MAX_BATCH, MAX_HEADS, MAX_HEAD_DIM, MAX_SEQ, MAX_GQA_RATIO = 65536, 256, 512, 20971520, 64
MAX_HEADS_X_DIM = 65535  # N*D must stay below it in BSND
# An additive mask becomes a per-head pse_shift of B*N*S*S_kv elements; above this, native is better.
MAX_PSE_BYTES = 256 * 1024 * 1024
_DTYPES = (torch.float16, torch.bfloat16)
LIMITS = (
    "Atlas A2/A3",
    "float16/bfloat16",
    "query length > 1",
    "D a multiple of 16, <= 512",
    "N <= 256, N*D < 65535, B <= 65536, S <= 20M",
    "GQA ratio <= 64",
    "bool mask with one head, or additive (pse_shift)",
    "no dropout, no is_causal, no gradients",
)
# What each schema calls the arguments this call sets (v1 name -> v2 name).
_V2_NAMES = {"num_heads": "num_query_heads", "scale": "softmax_scale", "softmax_lse_flag": "return_softmax_lse"}


def fia_op() -> str | None:
    """The FIA op of the installed torch_npu (``_v2`` where it exists), or None without one.

    >>> fia_op()  # doctest: +SKIP
    'npu_fused_infer_attention_score_v2'
    """
    return _stack()[0] or None


@torch.compiler.assume_constant_result
def _stack() -> tuple[str, bool, str, str]:
    """(FIA op name or "", SoC is Atlas A2/A3, SoC name, why there is no FIA op), constants to a compiled graph."""
    from . import torch_npu_available

    if not torch_npu_available():
        return "", False, "unknown", "torch_npu is not installed"
    op = _find_op()
    return op, probe.is_a2_a3(), probe.soc_name(), "" if op else "torch_npu has no npu_fused_infer_attention_score"


@torch.compiler.assume_constant_result
def _has_fusion_attention() -> bool:
    from . import torch_npu_available

    return torch_npu_available() and probe.has_op("npu_fusion_attention")


def _find_op() -> str:
    for name in FIA_OPS:
        args = probe.op_arguments(name)
        needed = [
            _V2_NAMES.get(a, a) if name.endswith("_v2") else a
            for a in (
                "atten_mask",
                "pse_shift",
                "num_heads",
                "num_key_value_heads",
                "scale",
                "input_layout",
                "softmax_lse_flag",
            )
        ]
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
        return (
            "torch_npu has no npu_fused_infer_attention_score: npu_fia calls fall back (npu_fusion_attention or SDPA)"
        )
    return (
        f"torch_npu.{name} (SoC {probe.soc_name()}); calls outside {'; '.join(LIMITS)} fall back to "
        "npu_fusion_attention where it computes SDPA's result exactly, else to torch SDPA"
    )


def _mask_batch(mask: torch.Tensor, batch: int, heads: int, sq: int, skv: int) -> str | None:
    """Why ``mask`` (SDPA broadcasting against ``[B, N, S, S_kv]``) has no FIA form, or None."""
    if mask.dtype == torch.bool and _mask_batch_shape(mask, batch, heads, sq, skv)[1] != 1:
        return f"per-head attn_mask {tuple(mask.shape)}: FIA's atten_mask has no head dimension"
    return None


def _mask_for_sdpa(mask: torch.Tensor, query: torch.Tensor, batch: int, heads: int, sq: int, skv: int) -> str | None:
    """Why only SDPA itself can answer for ``mask`` (it decides what the mask means, or raises), or None.

    SDPA takes a bool mask, or a float mask in float32 or the query's dtype, broadcasting against
    ``[B, N, S, S_kv]``; whether a mask of fewer than 2 dims works depends on the SDPA kernel that
    runs (torch 2.13's CPU flash kernel raises IndexError for ``(S_kv,)``, its math kernel takes it):
    it stays SDPA's. A mask that leaves a query row no key is answered as SDPA answers it on this
    torch (`_dead_row_value`); where that is not a constant, SDPA runs.
    """
    if mask.dtype != torch.bool and mask.dtype not in (torch.float32, query.dtype):
        return f"attn_mask dtype {mask.dtype} for query {query.dtype} (SDPA takes bool, float32 or the query's dtype)"
    if mask.dim() < 2:
        return f"attn_mask {tuple(mask.shape)} of {mask.dim()} dim(s) (SDPA's kernels decide: some refuse it)"
    if _mask_batch_shape(mask, batch, heads, sq, skv) is None:
        return f"attn_mask {tuple(mask.shape)} does not broadcast to [B, N, S, S_kv] = {(batch, heads, sq, skv)}"
    if _dead_row_value(query.dtype, mask.dtype == torch.bool) is None:
        return f"SDPA's output for a fully masked row ({query.dtype}) is neither 0 nor NaN on this torch"
    return None


@torch.compiler.assume_constant_result
def _dead_row_value(dtype: torch.dtype, bool_mask: bool) -> float | None:
    """What SDPA returns in a query row its mask leaves no key (0.0 on torch 2.13, NaN where its
    softmax is not the safe one), asked once per (dtype, mask kind) of torch's own SDPA on a tiny
    CPU call; None when that is not one constant. A constant to a compiled graph."""
    key = (dtype, bool_mask)
    if key not in _DEAD_ROW:
        _DEAD_ROW[key] = _ask_sdpa_dead_row(dtype, bool_mask)
    return _DEAD_ROW[key]


_DEAD_ROW: dict = {}  # (dtype, bool mask) -> SDPA's value in a fully masked row


def _ask_sdpa_dead_row(dtype: torch.dtype, bool_mask: bool) -> float | None:
    with torch.no_grad():
        q = torch.linspace(-1.0, 1.0, 2 * 2 * 16).reshape(1, 2, 2, 16).to(dtype)
        v = torch.linspace(0.5, 2.0, 2 * 3 * 16).reshape(1, 2, 3, 16).to(dtype)
        keep = torch.tensor([[True, False, True], [False, False, False]])  # query row 1 sees no key
        mask = keep if bool_mask else torch.zeros(2, 3, dtype=dtype).masked_fill(~keep, float("-inf"))
        try:
            row = torch.nn.functional.scaled_dot_product_attention(q, v, v, attn_mask=mask)[:, :, 1].float()
        except Exception:  # noqa: BLE001  (a torch whose SDPA refuses this: its SDPA answers every such call)
            return None
    if bool((row == 0).all()):
        return 0.0
    return math.nan if bool(row.isnan().all()) else None


def _dead_rows(mask: torch.Tensor) -> torch.Tensor:
    """Bool ``[B|1, S|1, N|1, 1]`` (BSND order): True where SDPA-convention ``mask`` leaves the query row no key."""
    full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    dead = ~full.any(-1, keepdim=True) if mask.dtype == torch.bool else (full == -math.inf).all(-1, keepdim=True)
    return dead.transpose(1, 2)


def _as_sdpa_in_dead_rows(out: torch.Tensor, mask: torch.Tensor | None, lse: torch.Tensor | None = None):
    """``out`` (BSND) with SDPA's value in the rows ``mask`` leaves no key (the kernels' value there
    is not documented), and ``lse`` ``[B, S, N]`` -inf there (the log of an empty sum)."""
    if mask is None:
        return out if lse is None else (out, lse)
    value = _dead_row_value(out.dtype, mask.dtype == torch.bool)
    if value is None:
        raise ValueError("SDPA's fully masked rows are not one constant on this torch: call SDPA (see fia_unsupported)")
    dead = _dead_rows(mask)
    out = out.masked_fill(dead, value)
    return out if lse is None else (out, lse.masked_fill(dead.squeeze(-1), -math.inf))


def fia_unsupported(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
    layout: str = "BSND",
) -> str | None:
    """Why FIA cannot run this attention call within its documented limits, or None when it can.

    Reads the install (op schema, SoC) through `probe`, never tensor values (it runs inside traces).

    Returns:
        A short reason (shown in reports and ``diffusers-ascend env``), or None.

    >>> import torch
    >>> q = torch.randn(1, 64, 2, 16)
    >>> fia_unsupported(q, q, q)  # doctest: +SKIP
    'dtype torch.float32 (FIA takes float16/bfloat16)'
    """
    op, a2_a3, soc, no_op = _stack()
    if not op:
        return no_op
    if layout != "BSND":
        return f"layout {layout!r} (only BSND is wired)"
    if not a2_a3:
        return f"SoC {soc} (FIA is documented for Atlas A2/A3 only)"
    if query.dtype not in _DTYPES:
        return f"dtype {query.dtype} (FIA takes float16/bfloat16)"
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
        return (
            f"shape B={b}, N={n}, D={d}, S={sq}, S_kv={skv} outside FIA's limits "
            f"(B <= {MAX_BATCH}, N <= {MAX_HEADS}, D <= {MAX_HEAD_DIM} and a multiple of 16, S <= 20M)"
        )
    if n * d >= MAX_HEADS_X_DIM:
        return f"N*D = {n}*{d} = {n * d} (FIA's BSND layout needs N*D < {MAX_HEADS_X_DIM})"
    if nkv != n:
        if not enable_gqa:
            return f"{n} query heads and {nkv} key heads without enable_gqa"
        if n % nkv or n // nkv > MAX_GQA_RATIO:
            return f"GQA {n} query heads over {nkv} key heads (needs a divisor, ratio <= {MAX_GQA_RATIO})"
    if attn_mask is not None:
        reason = _mask_for_sdpa(attn_mask, query, b, n, sq, skv) or _mask_batch(attn_mask, b, n, sq, skv)
        if reason:
            return reason
        if attn_mask.dtype != torch.bool:
            lead = b if (attn_mask.dim() == 4 and attn_mask.shape[0] == b) else 1
            size = lead * n * sq * skv * query.element_size()
            if size > MAX_PSE_BYTES:
                return f"additive attn_mask as pse_shift would take {size >> 20} MiB (limit {MAX_PSE_BYTES >> 20} MiB)"
    return None


def _fia_mask(mask: torch.Tensor, query: torch.Tensor, skv: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(atten_mask, pse_shift) for an SDPA-convention mask: a bool mask (True = attend) becomes
    FIA's ``(B|1, 1, S, S_kv)`` bool mask with True = masked out; an additive mask becomes
    ``pse_shift`` ``(B|1, N, S, S_kv)`` in query's dtype. Both contiguous, as FIA requires."""
    b, sq, n, _ = query.shape
    full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    lead = full.shape[0]
    if mask.dtype == torch.bool:
        return (~full).expand(lead, 1, sq, skv).contiguous(), None
    return None, full.to(query.dtype).expand(lead, n, sq, skv).contiguous()


def fia(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    return_lse: bool = False,
):
    """Attention through FIA for diffusers' ``BSND`` tensors, SDPA semantics.

    Call only where `fia_unsupported` returned None.

    Args:
        query: ``[B, S, N, D]``; key, value: ``[B, S_kv, N_kv, D]`` (GQA when N_kv < N).
        attn_mask: SDPA convention: bool True = attend, or additive float; broadcastable to
            ``[B, N, S, S_kv]`` (bool: with one head). Rows it leaves no key hold SDPA's value
            there (and an LSE of -inf).
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
        return _as_sdpa_in_dead_rows(out, attn_mask)
    # softmax_lse (B, N, S, 1) -> (B, S, N), the layout diffusers' templated attention merges.
    return _as_sdpa_in_dead_rows(out, attn_mask, lse.squeeze(-1).transpose(1, 2).contiguous())


# -- the fallback -----------------------------------------------------------------------------------
# npu_fusion_attention's doc (the wheel's): q/k/v "float16, bfloat16, float32", "B 1~2M", "D 1~768",
# "S 1~1M", "Nq 1~256" with Nq/Nkv an integer, atten_mask bool/uint8 "True = masked out" shaped
# BNSS/B1SS/11SS/SS, keep_prob for dropout; "supported models: Atlas A2 training series".
_FA_MAX_HEAD_DIM, _FA_MAX_SEQ, _FA_MAX_HEADS = 768, 1024 * 1024, 256


def _fusion_attention_exact(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Whether ``npu_fusion_attention`` computes exactly what SDPA computes for this call.

    Only masks it takes as they are (none, or bool turned into its True = masked-out form, or the
    causal mask built here) and the dtypes diffusers' ``_native_npu`` declares (float16/bfloat16);
    everything else (additive masks: its ``pse`` is added before the scale; dropout: another RNG;
    gradients) is SDPA's.
    """
    if not _has_fusion_attention() or not _stack()[1]:
        return False
    if query.dtype not in _DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    if query.dim() != 4 or key.dim() != 4 or key.shape != value.shape or dropout_p:
        return False
    if query.requires_grad or key.requires_grad or value.requires_grad:
        return False
    b, sq, n, d = query.shape
    bk, skv, nkv, dk = key.shape
    if bk != b or dk != d or d > _FA_MAX_HEAD_DIM or max(sq, skv) > _FA_MAX_SEQ or n > _FA_MAX_HEADS:
        return False
    if nkv != n and not (enable_gqa and n % nkv == 0):
        return False
    if attn_mask is not None:
        if is_causal or attn_mask.dtype != torch.bool or _mask_for_sdpa(attn_mask, query, b, n, sq, skv):
            return False
    return True


def _mask_batch_shape(mask: torch.Tensor, batch: int, heads: int, sq: int, skv: int) -> tuple | None:
    """``mask``'s 4-D shape after SDPA's broadcasting against ``[B, N, S, S_kv]``, or None if it does not broadcast."""
    if mask.dim() > 4:
        return None
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    if any(have not in (1, full) for have, full in zip(shape, (batch, heads, sq, skv))):
        return None
    return shape


def _fusion_attention(query, key, value, attn_mask, is_causal, scale):
    """``npu_fusion_attention`` (BSND) with a bool mask in its polarity (True = masked out)."""
    b, sq, n, d = query.shape
    skv = key.shape[1]
    masked = None
    if is_causal:  # SDPA's causal mask: top-left aligned, query i sees keys j <= i
        masked = torch.ones(sq, skv, dtype=torch.bool, device=query.device).triu(1)
    elif attn_mask is not None:
        lead, heads = _mask_batch_shape(attn_mask, b, n, sq, skv)[:2]
        # Its doc's shapes are BNSS, B1SS, 11SS and SS: a per-head mask shared by the batch (1NSS)
        # is none of them, so it goes in as BNSS.
        lead = b if heads != 1 else lead
        masked = (
            (~attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)))
            .expand(lead, heads, sq, skv)
            .contiguous()
        )
    # pre/next_tockens left at their defaults (INT_MAX): with sparse_mode=0 and a mask, smaller
    # values cut a band out of the scores, which SDPA does not.
    out = torch.ops.npu.npu_fusion_attention(
        query.contiguous(),
        key.contiguous(),
        value.contiguous(),
        n,
        "BSND",
        atten_mask=masked,
        scale=1.0 / math.sqrt(d) if scale is None else float(scale),
    )[0]
    return _as_sdpa_in_dead_rows(out, attn_mask)  # no mask with is_causal: nothing to do then


def fallback(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[torch.Tensor, str]:
    """Attention for a call FIA cannot take, computing what SDPA computes on the same arguments.

    ``npu_fusion_attention`` where it computes exactly that (float16/bfloat16, no mask, a bool mask
    of 2 to 4 dims, inverted and expanded to a shape its doc lists, with SDPA's value in fully
    masked rows, or ``is_causal`` alone; see docs/npu-notes.md), else
    ``torch.nn.functional.scaled_dot_product_attention`` itself, so a call SDPA refuses (an int mask,
    heads that do not divide, a 1-D mask where its kernel refuses one) raises SDPA's error.

    Args:
        query: ``[B, S, N, D]``; key, value: ``[B, S_kv, N_kv, D]``.
        attn_mask, dropout_p, is_causal, scale, enable_gqa: as SDPA's (bool True = attend, or additive).

    Returns:
        ``(out [B, S, N, D], path)`` with path ``"npu_fusion_attention"`` or ``"sdpa"``.

    >>> q = torch.randn(1, 8, 2, 12)
    >>> out, path = fallback(q, q, q, is_causal=True)
    >>> out.shape, path
    (torch.Size([1, 8, 2, 12]), 'sdpa')
    """
    if _fusion_attention_exact(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        return _fusion_attention(query, key, value, attn_mask, is_causal, scale), "npu_fusion_attention"
    out = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
    )
    return out.transpose(1, 2), "sdpa"
