"""Attention backends diffusers-ascend adds to diffusers' dispatcher, and how a config picks one.

- ``"npu_fia"`` (`npu_fia`): ``torch_npu.npu_fused_infer_attention_score`` on Ascend; capturable
  in NPU graphs, returns the log-sum-exp ring attention needs, falls back to diffusers'
  ``"_native_npu"`` per call outside FIA's documented limits.

What ``attention="auto"`` resolves to is decided in one place, `diffusers_ascend.platform.auto_attention`
(through `AscendConfig.resolved_attention`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BACKENDS", "NPU_FIA", "backend_for", "processors"]

NPU_FIA = "npu_fia"
# Our backend names (valid `AscendConfig.attention` values besides diffusers' own).
BACKENDS = (NPU_FIA,)


def backend_for(name: str) -> Any:
    """The value to set as a processor's ``_attention_backend`` for backend ``name``: our registered
    ``AttentionBackendName`` instance for names in `BACKENDS`, else diffusers' enum member.

    >>> from diffusers_ascend.attention import backend_for
    >>> backend_for("native").value
    'native'
    """
    if name == NPU_FIA:
        from .npu_fia import backend_name

        return backend_name()
    from diffusers.models.attention_dispatch import AttentionBackendName

    return AttentionBackendName(name)


def processors(model) -> list:
    """The attention processors of ``model`` that carry a dispatcher backend (``_attention_backend``),
    each once."""
    seen, out = set(), []
    for m in model.modules():
        p = getattr(m, "processor", None)
        if p is not None and hasattr(p, "_attention_backend") and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out
