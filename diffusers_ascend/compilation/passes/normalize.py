"""Graph normalisation: no-op elimination and the merging of repeated pure calls.

A pattern is traced from a search function and the matcher compares it node by node with the
graph: a no-op or a repeated pure call present on one side only hides the match. No-ops are
removed from both sides (Inductor's pattern tracing removes them from the patterns). Repeated
calls are merged in the graph only, after a first round of the passes (`FusionPassManager`):
merging also makes nodes shared between two sites, which no single match may consume.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from .. import _compat

__all__ = ["eliminate_common_subexpressions", "eliminate_noops"]


def eliminate_noops(graph: torch.fx.Graph) -> None:
    """Inductor's no-op elimination, as the patterns are traced with (clones, same-dtype casts...)."""
    _compat.remove_noop_ops(graph)
    graph.eliminate_dead_code()


_UNFOLDABLE = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


def _pure(node: torch.fx.Node) -> bool:
    """A call whose result depends on its arguments only: a functional aten op that is neither
    random nor an uninitialised allocation, or a ``getitem`` of one's outputs."""
    target = node.target
    if node.op != "call_function":
        return False
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return (
        not target._schema.is_mutable
        and torch.Tag.nondeterministic_seeded not in target.tags
        and target.overloadpacket.__name__ not in _UNFOLDABLE
    )


def _key(value: Any) -> Any:
    """A hashable key equal for arguments that are the same: nodes by identity, Python numbers
    with their type (``1``, ``1.0`` and ``True`` differ; ``-0.0`` is not ``0.0``)."""
    if isinstance(value, torch.fx.Node):
        return value
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_key(v) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple((k, _key(v)) for k, v in sorted(value.items()))
    if isinstance(value, float):
        return ("float", repr(value))
    hash(value)  # TypeError for anything unhashable: the caller leaves that node alone
    return (type(value).__name__, value)


def eliminate_common_subexpressions(graph: torch.fx.Graph) -> int:
    """Merges pure nodes that repeat an earlier node's call (same op, same arguments), in place.

    A hand-written RMSNorm casting ``x`` twice would not match a one-cast pattern. Returned nodes are
    left alone: merging them would make separate outputs alias.

    Returns:
        the number of nodes removed.
    """
    (output,) = graph.find_nodes(op="output")
    returned = set(output.all_input_nodes)
    seen: dict[Any, torch.fx.Node] = {}
    removed = 0
    for node in list(graph.nodes):
        if node in returned or not _pure(node):
            continue
        try:
            key = (node.target, _key(node.args), _key(node.kwargs))
        except TypeError:  # an unhashable argument: not compared
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            removed += 1
    return removed
