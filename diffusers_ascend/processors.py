"""One attention-processor object per block position, so torch < 2.8 compiles one graph per block class.

Dynamo on torch 2.6/2.7 guards on the identity of the processor a compiled block reaches, so every
block instance compiled its own graph (`_compat.compiled_blocks_share_graphs`). Processors of one
block class are interchangeable when they have the same class, are not ``nn.Module``s, and hold only
class-declared plain values (``_attention_backend``, flags) equal by value; an instance-only
attribute may be per-block data, so such a processor keeps its own object.

>>> from diffusers_ascend.tiny import tiny_wan_transformer
>>> model = tiny_wan_transformer(num_layers=3)
>>> undo = share_processors(model.blocks)
>>> len({id(b.attn1.processor) for b in model.blocks}), len(undo)  # attn1 and attn2 of blocks 1, 2
(1, 4)
>>> unshare_processors(undo)
>>> len({id(b.attn1.processor) for b in model.blocks})
3
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["share_processors", "unshare_processors"]

_PLAIN = (type(None), bool, int, float, str, enum.Enum)


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _state(processor: Any) -> dict[str, Any] | None:
    """The processor's state when it is plain data, else None (not shareable)."""
    if processor is None or isinstance(processor, torch.nn.Module):
        return None
    state = getattr(processor, "__dict__", None)  # no __dict__ (slots): state not inspectable
    cls = type(processor)
    if state is None or not all(hasattr(cls, k) and _plain(v) for k, v in state.items()):
        return None
    return state


def share_processors(blocks: Iterable[torch.nn.Module]) -> list[tuple[torch.nn.Module, Any, Any]]:
    """Points each attention module of ``blocks`` at the interchangeable processor of the same
    position in the first block of its class.

    Args:
        blocks: the blocks compiled one by one (``compile="blocks"``), of one or more classes.

    Returns:
        The undo list for `unshare_processors`: ``(attention module, its own processor, the shared
        one)`` for each module changed.
    """
    first: dict[tuple[type, str], Any] = {}
    undo: list[tuple[torch.nn.Module, Any, Any]] = []
    try:
        for block in blocks:
            for path, module in block.named_modules():
                processor = module.__dict__.get("processor")
                state = _state(processor)
                if state is None:
                    continue
                shared = first.setdefault((type(block), path), processor)
                if shared is processor or type(shared) is not type(processor) or _state(shared) != state:
                    continue
                module.processor = shared
                undo.append((module, processor, shared))
    except BaseException:
        unshare_processors(undo)
        raise
    return undo


def unshare_processors(undo: list[tuple[torch.nn.Module, Any, Any]]) -> None:
    """Gives each attention module its own processor back, unless it was changed since."""
    for module, own, shared in reversed(undo):
        if module.__dict__.get("processor") is shared:
            module.processor = own
