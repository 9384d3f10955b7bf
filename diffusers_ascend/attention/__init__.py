"""Attention backends diffusers-ascend adds to diffusers' dispatcher: ``"npu_fia"`` (`npu_fia`).

``attention="auto"`` is resolved in one place, `diffusers_ascend.platform.auto_attention`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BACKENDS", "NPU_FIA", "backend_for", "processors"]

NPU_FIA = "npu_fia"
# Backend names we add (valid `AscendConfig.attention` values besides diffusers' own).
BACKENDS = (NPU_FIA,)


def backend_for(name: str) -> Any:
    """A processor's backend (`_diffusers_compat.attention_backend`) for ``name``: ours for `BACKENDS`, else diffusers' enum.

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
    """The attention processors of ``model`` that carry a dispatcher backend, each once."""
    from .._diffusers_compat import dispatches_attention

    seen, out = set(), []
    for m in model.modules():
        p = getattr(m, "processor", None)
        if p is not None and dispatches_attention(p) and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out
