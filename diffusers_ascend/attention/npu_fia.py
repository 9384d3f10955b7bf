"""The ``npu_fia`` attention backend: diffusers' dispatcher calls through FIA
(``torch_npu.npu_fused_infer_attention_score``), which NPU graphs can capture and which returns the
log-sum-exp ring attention needs.

diffusers' backend registry is keyed by ``AttentionBackendName`` members and the enum cannot be
extended, so the backend is an extra instance of it (``"npu_fia"``), registered as diffusers
registers its own and set on processors by `enable_ascend_compile`; nothing of diffusers is
patched. A call outside FIA's limits runs `ascend_kernels.npu.attention.fallback`, which computes
what SDPA computes (or raises SDPA's error); its reason is counted in the process's log
(`fallbacks`) and in the log of the enabled model whose forward is running (`track`), so
``ascend_report(model)`` tells that model's story.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

import torch

__all__ = [
    "NAME",
    "FallbackLog",
    "backend_name",
    "fallbacks",
    "model_fallbacks",
    "npu_fia_attention",
    "register",
    "track",
]

NAME = "npu_fia"
_LOCK = threading.Lock()
_MEMBER: list = []  # the shared AttentionBackendName instance, built once
# model -> its FallbackLog; weak, so neither a pickled nor a collected model keeps one.
_OWN: weakref.WeakKeyDictionary[Any, FallbackLog] = weakref.WeakKeyDictionary()
# Per thread: the log of the tracked model whose forward runs (`_enter` / `_exit`), and the ones it interrupted.
_TLS = threading.local()


class FallbackLog:
    """``{reason: calls}`` of the ``npu_fia`` calls FIA could not take, bounded to the latest reasons.

    Only `_count` (never compiled) records into one, so its counts never enter a compiled graph.

    >>> log = FallbackLog()
    >>> log.record("dtype torch.float32 (FIA takes float16/bfloat16)", "sdpa")
    >>> log.counts()
    {'dtype torch.float32 (FIA takes float16/bfloat16) -> sdpa': 1}
    >>> log.mark()
    >>> log.counts()
    {}
    """

    MAX_REASONS = 32

    def __init__(self):
        self._counts: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._base: dict[str, int] = {}

    def record(self, reason: str, path: str) -> None:
        key = f"{reason} -> {path}"
        self._counts[key] = self._counts.pop(key, 0) + 1
        while len(self._counts) > self.MAX_REASONS:
            self._counts.popitem(last=False)

    def counts(self) -> dict[str, int]:
        """Calls per ``"reason -> path"`` since the last `mark`."""
        return {k: n - self._base.get(k, 0) for k, n in self._counts.items() if n > self._base.get(k, 0)}

    def mark(self) -> None:
        """Counts from here on (`counts` is empty now)."""
        self._base = dict(self._counts)


_PROCESS_LOG = FallbackLog()


def fallbacks() -> dict[str, int]:
    """``{"reason -> path": calls}`` of every ``npu_fia`` call of this process that FIA could not take
    (all models together; one model's: `model_fallbacks`, or its ``ascend_report()``). The path is
    ``npu_fusion_attention`` or ``sdpa``, both computing SDPA's result.

    Calls replayed from a captured graph are not counted.

    >>> from diffusers_ascend.attention.npu_fia import fallbacks
    >>> isinstance(fallbacks(), dict)
    True
    """
    return _PROCESS_LOG.counts()


def model_fallbacks(model) -> dict[str, int]:
    """``{"reason -> path": calls}`` of `model`'s own ``npu_fia`` calls FIA could not take, since it was
    last `track`ed (empty if it never was).

    >>> from diffusers_ascend.attention.npu_fia import model_fallbacks
    >>> import torch
    >>> model_fallbacks(torch.nn.Linear(2, 2))
    {}
    """
    log = _OWN.get(model)
    return log.counts() if log is not None else {}


def track(model) -> list:
    """Counts `model`'s own ``npu_fia`` fallbacks from now on (`model_fallbacks`): forward hooks make
    its log the current log of the thread while `model` runs.

    The log stays the same object across enables; `FallbackLog.mark` starts a new count.

    Returns:
        The hooks' ``RemovableHandle``s (remove them to stop tracking).

    >>> import torch
    >>> from diffusers_ascend.attention.npu_fia import model_fallbacks, track
    >>> model = torch.nn.Linear(2, 2)
    >>> handles = track(model)
    >>> model_fallbacks(model)
    {}
    >>> for h in handles:
    ...     h.remove()
    """
    with _LOCK:
        log = _OWN.get(model)
        if log is None:
            log = _OWN[model] = FallbackLog()
    log.mark()
    return [model.register_forward_pre_hook(_enter), model.register_forward_hook(_exit, always_call=True)]


def _enter(module, args) -> None:
    stack = _TLS.__dict__.setdefault("stack", [])
    stack.append(getattr(_TLS, "log", None))
    _TLS.log = _OWN.get(module)


def _exit(module, args, output) -> None:
    stack = _TLS.__dict__.get("stack")
    _TLS.log = stack.pop() if stack else None


def _run(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, where):
    from ascend_kernels.npu.attention import fallback, fia, fia_unsupported

    reason = fia_unsupported(query, key, value, attn_mask, dropout_p, bool(is_causal), bool(enable_gqa))
    if reason is None:
        return fia(query, key, value, attn_mask, scale, return_lse=return_lse)
    if return_lse:
        raise ValueError(
            f"npu_fia: {where} needs FIA's log-sum-exp, but FIA cannot run this call: {reason}. "
            "Ring attention on NPU needs float16/bfloat16 inputs within FIA's limits "
            "(see docs/multi-card.md), or use Ulysses only (ring_degree=1)."
        )
    out, path = fallback(query, key, value, attn_mask, dropout_p, bool(is_causal), scale, bool(enable_gqa))
    _count(reason, path)
    return out


@torch.compiler.disable
def _count(reason: str, path: str) -> None:
    # Outside the graph: traced, a count would be a constant that changes every call (a recompile
    # per call). Under compile this is a graph break, on fallback calls only.
    _PROCESS_LOG.record(reason, path)
    log = getattr(_TLS, "log", None)  # the running model's (`track`)
    if log is not None:
        log.record(reason, path)


def _forward_op(
    ctx,
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    return_lse=False,
    _save_ctx=True,
    _parallel_config=None,
):
    """diffusers' templated context-parallel ``forward_op`` signature (Ulysses / Ring), on FIA."""
    return _run(
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        return_lse,
        "ring attention (return_lse=True)",
    )


def _backward_op(ctx, grad_out, *args, **kwargs):
    raise NotImplementedError("npu_fia attention is inference only: FIA has no backward.")


def npu_fia_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    _parallel_config: Any = None,
):
    """The ``npu_fia`` backend, with the signature of diffusers' backends (``BSND`` tensors).

    Args:
        query, key, value: ``[B, S, N, D]`` (key/value may have fewer heads with ``enable_gqa``).
        attn_mask: SDPA convention (bool True = attend, or additive), broadcastable to ``[B, N, S, S_kv]``;
            every mask SDPA takes gives SDPA's numbers (fully masked rows included), every other its error.
        dropout_p, is_causal, scale, enable_gqa: as SDPA's (calls FIA cannot take run
            `ascend_kernels.npu.attention.fallback`, which computes SDPA's result).
        return_lse: also return the fp32 log-sum-exp ``[B, S, N]`` (FIA only: otherwise a ValueError).
        _parallel_config: diffusers' context-parallel config.

    >>> from diffusers_ascend.attention.npu_fia import npu_fia_attention
    >>> callable(npu_fia_attention)
    True
    """
    if _parallel_config is not None and _parallel_config.context_parallel_config is not None:
        from .._diffusers_compat import templated_context_parallel_attention

        # is_causal and enable_gqa go through: diffusers' templated attention refuses both (with its
        # reason) rather than have its ranks compute something else.
        return templated_context_parallel_attention(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            return_lse,
            forward_op=_forward_op,
            backward_op=_backward_op,
            _parallel_config=_parallel_config,
        )
    return _run(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, "return_lse=True")


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
    from .._diffusers_compat import register_attention_backend

    return register_attention_backend("NPU_FIA", NAME, npu_fia_attention, reduce=backend_name)
