"""`FusionPassManager`: the whole rewrite of one backend (no-op elimination, then one pass per fusion).

It is a `torch._inductor.custom_graph_pass.CustomGraphPass` whose `uuid()` is derived from the fusion
set and the source of every pattern, so a cache keyed on it (Inductor's FX graph cache) never serves
a graph rewritten with other fusions. Imported lazily: it imports Inductor.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from typing import Callable

import torch

from .. import _compat
from . import get_pass_class, ordered_fusions

__all__ = ["FusionPassManager", "count_ops", "eliminate_noops"]


def count_ops(graph: torch.fx.Graph) -> int:
    """Operator calls that dispatch work: call_function nodes of an OpOverload that is not a view
    and returns tensors.

    Views (and ``getitem`` of multi-output ops) only change metadata, and symbolic-size queries
    of dynamic graphs (``sym_size``) are host arithmetic: they are left out.
    """
    n = 0
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        # `_unsafe_view` is a view without the alias annotation (a reshape of a fresh tensor): 2.15's
        # aot graphs write it where 2.14's wrote `view` (12 of the 35 in a Flux double block).
        if node.target.is_view or node.target is torch.ops.aten._unsafe_view.default:
            continue
        val = node.meta.get("val")
        if val is not None and not isinstance(val, torch.Tensor) and not (
            isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val)
        ):
            continue
        n += 1
    return n


def eliminate_noops(graph: torch.fx.Graph) -> None:
    """Inductor's no-op elimination (same-metadata clones, same-dtype casts, full slices...).

    Patterns are traced with the same normalization, so running it first keeps them matching.
    """
    _compat.remove_noop_ops(graph)
    graph.eliminate_dead_code()


class FusionPassManager(_compat.custom_graph_pass_base()):
    """Runs no-op elimination then the passes of `fusions`, in `PASS_ORDER`.

    Args:
        fusions: fusion names (see `diffusers_ascend.config.FUSIONS`).

    Attributes:
        passes: the `FusionPass` instances (their `matched_count` are this manager's only).
        last_counts: replacements per fusion made by the last call.

    >>> manager = FusionPassManager(["rms_norm", "mul_add"])
    >>> manager.uuid() == FusionPassManager(["mul_add", "rms_norm"]).uuid()
    True
    """

    def __init__(self, fusions) -> None:
        self.fusions = ordered_fusions(fusions)
        self.passes = {f: get_pass_class(f)() for f in self.fusions}
        self.last_counts: dict[str, int] = {}

    def __call__(self, graph: torch.fx.Graph, after_step: Callable[[str, torch.fx.Graph], None] | None = None) -> dict[str, int]:
        """Rewrite `graph` in place; `after_step(name, graph)` is called after each step (graph logs)."""
        eliminate_noops(graph)
        if after_step is not None:
            after_step("noop_elimination", graph)
        counts = {}
        for name, fusion_pass in self.passes.items():
            counts[name] = fusion_pass(graph)
            if after_step is not None:
                after_step(name, graph)
        graph.lint()
        self.last_counts = counts
        return counts

    def verify(self) -> None:
        """Registers every pass's patterns now and proves they match on the running torch
        (`FusionPass.verify`); raises `TorchCompatError` where the engine cannot work."""
        for fusion_pass in self.passes.values():
            fusion_pass.verify()

    @property
    def matched(self) -> dict[str, int]:
        return {name: p.matched_count for name, p in self.passes.items()}

    def uuid(self) -> str:
        h = hashlib.sha256(repr(self.fusions).encode())
        for name, fusion_pass in self.passes.items():
            h.update(name.encode())
            h.update(fusion_pass.source_hash().encode())
        h.update(inspect.getsource(sys.modules[__name__]).encode())
        return h.hexdigest()
