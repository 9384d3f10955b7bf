"""The ``npu_fia`` attention backend: diffusers' dispatcher calls through FIA
(``torch_npu.npu_fused_infer_attention_score``), which NPU graphs can capture and which returns the
log-sum-exp ring attention needs.

diffusers' backend registry is keyed by ``AttentionBackendName`` members and the enum cannot be
extended, so the backend is one extra instance of it (``"npu_fia"``), registered as diffusers
registers its own and set on processors by `enable_ascend_compile`; nothing of diffusers is
patched. A call outside FIA's limits runs ``_native_npu`` and its reason is counted in `fallbacks`.
"""

from __future__ import annotations

import collections
import enum
import threading
from typing import Any, Optional

import torch

__all__ = ["NAME", "backend_name", "fallbacks", "npu_fia_attention", "register"]

NAME = "npu_fia"
_LOCK = threading.Lock()
_MEMBER: list = []  # the AttentionBackendName instance, built once
# Reasons calls fell back to _native_npu, with counts: a bounded diagnostic for the report and CLI.
_MAX_REASONS = 32
_FALLBACKS: "collections.OrderedDict[str, int]" = collections.OrderedDict()


def _record(reason: str) -> None:
    count = _FALLBACKS.pop(reason, 0) + 1
    _FALLBACKS[reason] = count
    while len(_FALLBACKS) > _MAX_REASONS:
        _FALLBACKS.popitem(last=False)


def fallbacks() -> dict[str, int]:
    """``{reason: calls}`` of the ``npu_fia`` calls of this process that ran ``_native_npu`` instead.

    Calls replayed from a captured graph are not counted; a graph holding a fallback is never captured.

    >>> from diffusers_ascend.attention.npu_fia import fallbacks
    >>> isinstance(fallbacks(), dict)
    True
    """
    return dict(_FALLBACKS)


def _native_npu(**kwargs):
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    return _AttentionBackendRegistry._backends[AttentionBackendName._NATIVE_NPU](**kwargs)


def _forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
    """diffusers' templated context-parallel ``forward_op`` signature (Ulysses / Ring), on FIA."""
    from ascend_kernels.npu.attention import fia, fia_unsupported

    reason = fia_unsupported(query, key, value, attn_mask, dropout_p, bool(is_causal), bool(enable_gqa))
    if reason is None:
        return fia(query, key, value, attn_mask, scale, return_lse=return_lse)
    _record(reason)
    if return_lse:
        raise ValueError(
            f"npu_fia attention under context parallelism needs FIA's log-sum-exp, but FIA cannot run this call: "
            f"{reason}. Ring attention on NPU needs float16/bfloat16 inputs within FIA's limits "
            "(see docs/multi-card.md), or use Ulysses only (ring_degree=1)."
        )
    from diffusers.models.attention_dispatch import _npu_attention_forward_op

    return _npu_attention_forward_op(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                     False, _save_ctx=_save_ctx, _parallel_config=_parallel_config)


def _backward_op(ctx, grad_out, *args, **kwargs):
    raise NotImplementedError("npu_fia attention is inference only: FIA has no backward.")


def npu_fia_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    _parallel_config: Any = None,
):
    """The ``npu_fia`` backend, with the signature of diffusers' backends (``BSND`` tensors).

    Args:
        query, key, value: ``[B, S, N, D]`` (key/value may have fewer heads with ``enable_gqa``).
        attn_mask: SDPA convention (bool True = attend, or additive), broadcastable to ``[B, N, S, S_kv]``.
        dropout_p, is_causal, scale, enable_gqa: as SDPA's (dropout and causal run ``_native_npu``).
        return_lse: also return the fp32 log-sum-exp ``[B, S, N]``.
        _parallel_config: diffusers' context-parallel config.
    >>> from diffusers_ascend.attention.npu_fia import npu_fia_attention
    >>> callable(npu_fia_attention)
    True
    """
    if _parallel_config is not None and _parallel_config.context_parallel_config is not None:
        from diffusers.models.attention_dispatch import _templated_context_parallel_attention

        return _templated_context_parallel_attention(
            query, key, value, attn_mask, dropout_p, False, scale, False, return_lse,
            forward_op=_forward_op, backward_op=_backward_op, _parallel_config=_parallel_config,
        )
    from ascend_kernels.npu.attention import fia, fia_unsupported

    reason = fia_unsupported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if reason is None:
        return fia(query, key, value, attn_mask, scale, return_lse=return_lse)
    _record(reason)
    if return_lse:
        raise ValueError(f"npu_fia: return_lse=True needs FIA, which cannot run this call: {reason}")
    return _native_npu(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)


def backend_name():
    """The ``AttentionBackendName`` instance of ``npu_fia``, registered on first use.

    >>> from diffusers_ascend.attention.npu_fia import backend_name
    >>> backend_name().value
    'npu_fia'
    """
    if _MEMBER:
        return _MEMBER[0]
    with _LOCK:
        if not _MEMBER:
            _MEMBER.append(register())
    return _MEMBER[0]


def register():
    """Builds the ``npu_fia`` enum instance and registers `npu_fia_attention` (via `backend_name`)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, _check_shape

    member = str.__new__(AttentionBackendName, NAME)  # a str-valued enum, as diffusers defines it
    member._name_, member._value_ = "NPU_FIA", NAME
    member._sort_order_ = len(AttentionBackendName.__members__)
    # Enums pickle as EnumClass(value), which refuses this value: pickle as a call of `backend_name`.
    member.__reduce_ex__ = lambda protocol: (backend_name, ())
    if not isinstance(member, enum.Enum):  # pragma: no cover  (diffusers changed the registry's key type)
        raise TypeError("diffusers' AttentionBackendName is no longer an Enum; npu_fia cannot register")
    _AttentionBackendRegistry.register(member, constraints=[_check_shape], supports_context_parallel=True)(npu_fia_attention)
    return member
