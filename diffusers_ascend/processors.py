"""One attention-processor object per block position, so torch < 2.8 compiles one graph per block class.

Dynamo on torch 2.6 and 2.7 guards on the identity of the plain objects a compiled block reaches,
and a diffusers block reaches its attention processor (``___check_obj_id(L['self']._modules
['attn1'].processor, ...)``): every block instance fails the previous instance's guard and compiles
its own graph, so a Flux.1 model compiles 57 graphs where 2.8+ compile 3
(`diffusers_ascend.compilation._compat.compiled_blocks_share_graphs`). diffusers builds one
processor per attention module, but the processors of one block class are interchangeable: the
same class, and state that is plain values (``_attention_backend``, flags), equal from block to
block. `share_processors` gives the attention module at each position (``attn1`` of every
``WanTransformerBlock``) the processor of the first block at that position; the others are kept
and `unshare_processors` puts them back.

Only processors that are provably interchangeable are shared: same class, no ``nn.Module``
processors (IP-Adapter and other processors with weights), and instance state only in attributes
the class itself declares (configuration such as diffusers' ``_attention_backend`` and
``_parallel_config``), holding ``None``, bools, numbers, strings, enums or tuples of them, equal by
value. An attribute only the instance has may be per-block data that ``__call__`` fills in (an
attention store starts as ``None``), so such a processor keeps its own object. A processor changed
after sharing (``set_attn_processor``) is left as the user set it.

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
from typing import Any, Iterable

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
    """Points each attention module of ``blocks`` at the processor of the same position in the first
    block of its class, where the two are interchangeable.

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
