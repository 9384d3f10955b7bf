"""`FusionPassManager`: the whole rewrite of one backend, a ``CustomGraphPass`` whose `uuid()` hashes
the fusion set and every pattern's source, so no cache serves a graph rewritten with other fusions."""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Callable

import torch

from .. import _compat
from . import get_pass_class, ordered_fusions
from . import normalize as _normalize
from .normalize import eliminate_common_subexpressions, eliminate_noops

__all__ = ["FusionPassManager", "count_ops", "eliminate_common_subexpressions", "eliminate_noops"]


def count_ops(graph: torch.fx.Graph) -> int:
    """Operator calls that dispatch work: OpOverload calls returning tensors, views left out
    (metadata only), as are ``getitem`` and ``sym_size`` (host arithmetic)."""
    n = 0
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        # `_unsafe_view` is a view without the alias annotation (newer aot graphs write it for `view`).
        if node.target.is_view or node.target is torch.ops.aten._unsafe_view.default:
            continue
        val = node.meta.get("val")
        if (
            val is not None
            and not isinstance(val, torch.Tensor)
            and not (isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val))
        ):
            continue
        n += 1
    return n


class FusionPassManager(_compat.custom_graph_pass_base()):
    """Runs no-op elimination, the passes of `fusions` in `PASS_ORDER`, then merges repeated pure
    calls and, where that changed the graph, runs the passes again.

    Args:
        fusions: fusion names (see `diffusers_ascend.fusions.FUSIONS`).

    Attributes:
        passes: the `FusionPass` instances (their `matched_count` are this manager's only).

    >>> manager = FusionPassManager(["rms_norm", "mul_add"])
    >>> manager.uuid() == FusionPassManager(["mul_add", "rms_norm"]).uuid()
    True
    """

    def __init__(self, fusions) -> None:
        self.fusions = ordered_fusions(fusions)
        self.passes = {f: get_pass_class(f)() for f in self.fusions}

    def __call__(
        self, graph: torch.fx.Graph, after_step: Callable[[str, torch.fx.Graph], None] | None = None
    ) -> dict[str, int]:
        """Rewrite `graph` in place; `after_step(name, graph)` is called after each step (graph logs).

        The passes run before merging repeated pure calls too: merging first would share nodes
        between two sites (``freqs[..., 0::2]`` sliced for q and k) that no single match may consume.
        """
        eliminate_noops(graph)
        if after_step is not None:
            after_step("noop_elimination", graph)
        counts = self._apply(graph, after_step)
        merged = eliminate_common_subexpressions(graph)
        if merged:
            graph.eliminate_dead_code()
        if after_step is not None:
            after_step("cse", graph)
        if merged:
            for name, n in self._apply(graph, None).items():
                counts[name] += n
            if after_step is not None:
                after_step("after_cse", graph)
        graph.lint()
        return counts

    def _apply(self, graph: torch.fx.Graph, after_step) -> dict[str, int]:
        counts = {}
        for name, fusion_pass in self.passes.items():
            counts[name] = fusion_pass(graph)
            if after_step is not None:
                after_step(name, graph)
        return counts

    def verify(self) -> None:
        """Registers every pass's patterns and proves they match on this torch (`TorchCompatError` if not)."""
        for fusion_pass in self.passes.values():
            fusion_pass.verify()

    def ensure_verified(self) -> bool:
        """`_compat.check_engine` and `verify`, unless a process on this machine passed both for the
        same torch build and pattern code (`verdict.py`); then only torch's support range is checked
        and the patterns are registered when a graph first needs them.

        Returns:
            Whether the checks ran (False: a recorded verdict stood in for them).

        Raises:
            TorchCompatError: as `verify`.
        """
        from . import verdict

        checks_fusions = bool(self.fusions)
        key = verdict.verdict_key(self, checks_fusions)
        if verdict.passed_before(key):
            _compat.check_engine(fusions=False)  # the support range and its warning, every time
            return False
        _compat.check_engine(fusions=checks_fusions)
        self.verify()
        verdict.record_pass(key)
        return True

    def uuid(self) -> str:
        h = hashlib.sha256(repr(self.fusions).encode())
        for name, fusion_pass in self.passes.items():
            h.update(name.encode())
            h.update(fusion_pass.source_hash().encode())
        for module in (sys.modules[__name__], _normalize):  # this rewrite and its normalisation
            h.update(inspect.getsource(module).encode())
        return h.hexdigest()
