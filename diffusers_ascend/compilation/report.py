"""`FusionReport`: what a backend (or a whole pipeline) fused, per fusion and per graph."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["FusionReport"]


@dataclass
class FusionReport:
    """Replacements made, operator counts before/after, compiled graphs, fallbacks and layer swaps.

    Attributes:
        matches: fusion name -> pattern replacements made in graphs that run (every enabled fusion
            has an entry). Graphs whose module fell back to eager are not counted.
        ops_before / ops_after: operator calls (call_function nodes of non-view ops, see
            `count_ops`) in the compiled graphs that run, before and after rewriting.
        graphs: one dict per compiled graph: ``name``, ``compile_id``, ``matches``, ``ops_before``,
            ``ops_after``, ``executor``, ``training``, ``dynamic``; ``fell_back: True`` for a
            graph whose module runs eager instead (see `discard_graphs`).
        graphs_compiled: number of graphs compiled (recompilations and fallen-back graphs included).
        fallbacks: ``{"module": ..., "reason": ...}`` for each part that runs unfused, with
            ``"lost": {fusion: matches}`` when graphs compiled for it were discarded.
        swaps: module-level layer swaps (a swapped-in fused RMSNorm shows here, not as a match).
        upstream_fused: modules fused by diffusers itself, not by us: torch_npu kernel -> modules
            whose stock forward calls it (diffusers takes these branches where the torch_npu
            distribution is installed, e.g. ``RMSNorm`` -> ``npu_rms_norm``; see
            `diffusers_ascend.layers.upstream_fused`). Never counted in `matches` or `swaps`.

    >>> r = FusionReport(matches={"rms_norm": 2})
    >>> r.add_fallback("blocks.0", "compile failed")
    >>> FusionReport.merge([r, r]).matches["rms_norm"]
    4
    """

    matches: dict[str, int] = field(default_factory=dict)
    ops_before: int = 0
    ops_after: int = 0
    graphs: list[dict[str, Any]] = field(default_factory=list)
    graphs_compiled: int = 0
    fallbacks: list[dict[str, str]] = field(default_factory=list)
    swaps: dict[str, int] = field(default_factory=dict)
    upstream_fused: dict[str, int] = field(default_factory=dict)

    # -- recording ------------------------------------------------------------------------------
    def add_graph(self, name: str, matches: dict[str, int], ops_before: int, ops_after: int, **info: Any) -> None:
        """Record one compiled graph (called by the backend)."""
        for fusion, n in matches.items():
            self.matches[fusion] = self.matches.get(fusion, 0) + n
        self.ops_before += ops_before
        self.ops_after += ops_after
        self.graphs_compiled += 1
        self.graphs.append(dict(name=name, matches=dict(matches), ops_before=ops_before, ops_after=ops_after, **info))

    def add_fallback(self, module: str, reason: str, lost: dict[str, int] | None = None) -> None:
        """Record that `module` runs without fusion, and why; `lost`: the matches that no longer run."""
        entry: dict[str, Any] = {"module": str(module), "reason": str(reason)}
        if lost:
            entry["lost"] = {k: int(v) for k, v in lost.items() if v}
        self.fallbacks.append(entry)

    def discard_graphs(self, start: int | list[dict[str, Any]]) -> dict[str, int]:
        """Stop counting ``graphs[start:]`` (or the entries of `graphs` in the list `start`): their
        module fell back to eager, so their matches and ops never run. The graphs stay listed with
        ``fell_back: True``.

        Returns:
            the matches per fusion removed from `matches` (nonzero entries only).

        >>> r = FusionReport(matches={"rope": 0})
        >>> r.add_graph("g000", {"rope": 2}, ops_before=10, ops_after=4)
        >>> r.discard_graphs(0), r.matches, r.graphs[0]["fell_back"]
        ({'rope': 2}, {'rope': 0}, True)
        """
        lost: dict[str, int] = {}
        for g in self.graphs[start:] if isinstance(start, int) else start:
            if g.get("fell_back"):
                continue
            g["fell_back"] = True
            for fusion, n in g["matches"].items():
                self.matches[fusion] = self.matches.get(fusion, 0) - n
                if n:
                    lost[fusion] = lost.get(fusion, 0) + n
            self.ops_before -= g["ops_before"]
            self.ops_after -= g["ops_after"]
        return lost

    def record_swaps(self, counts: dict[str, int]) -> None:
        """Add module-level layer swaps (name -> number of modules swapped)."""
        for name, n in counts.items():
            self.swaps[name] = self.swaps.get(name, 0) + int(n)

    def record_upstream_fused(self, counts: dict[str, int]) -> None:
        """Add modules fused by diffusers' own torch_npu calls (kernel -> number of modules)."""
        for name, n in counts.items():
            self.upstream_fused[name] = self.upstream_fused.get(name, 0) + int(n)

    # -- reading --------------------------------------------------------------------------------
    @property
    def total_matches(self) -> int:
        return sum(self.matches.values())

    @property
    def ops_ratio(self) -> float | None:
        """``ops_after / ops_before`` (None before any graph was compiled)."""
        return self.ops_after / self.ops_before if self.ops_before else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable copy."""
        return json.loads(json.dumps(dict(
            matches=self.matches, ops_before=self.ops_before, ops_after=self.ops_after,
            graphs=self.graphs, graphs_compiled=self.graphs_compiled, fallbacks=self.fallbacks,
            swaps=self.swaps, upstream_fused=self.upstream_fused,
        ), default=str))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FusionReport":
        return cls(**{k: d[k] for k in ("matches", "ops_before", "ops_after", "graphs", "graphs_compiled",
                                        "fallbacks", "swaps", "upstream_fused") if k in d})

    @classmethod
    def merge(cls, reports: Iterable["FusionReport"]) -> "FusionReport":
        """One report summing `reports` (e.g. the transformers of a pipeline)."""
        out = cls()
        for r in reports:
            for fusion, n in r.matches.items():
                out.matches[fusion] = out.matches.get(fusion, 0) + n
            out.ops_before += r.ops_before
            out.ops_after += r.ops_after
            out.graphs.extend(dict(g) for g in r.graphs)
            out.graphs_compiled += r.graphs_compiled
            out.fallbacks.extend(dict(f) for f in r.fallbacks)
            out.record_swaps(r.swaps)
            out.record_upstream_fused(r.upstream_fused)
        return out

    def __str__(self) -> str:
        fusions = list(self.matches)
        lines = ["FusionReport"]
        if self.ops_before:
            lines.append(f"  graphs compiled: {self.graphs_compiled}; ops {self.ops_before} -> {self.ops_after} "
                         f"({self.ops_after / self.ops_before:.0%})")
        else:
            lines.append(f"  graphs compiled: {self.graphs_compiled}")
        header = ["graph", *fusions, "ops before", "ops after", "executor"]
        rows = [[str(g.get("name")) + (" (fell back)" if g.get("fell_back") else ""), *[str(g["matches"].get(f, 0)) for f in fusions], str(g["ops_before"]),
                 str(g["ops_after"]), str(g.get("executor", ""))] for g in self.graphs]
        rows.append(["total", *[str(self.matches[f]) for f in fusions], str(self.ops_before), str(self.ops_after), ""])
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            lines.append("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if self.swaps:
            lines.append("  layer swaps: " + ", ".join(f"{k}={v}" for k, v in self.swaps.items()))
        if self.upstream_fused:
            lines.append("  fused by diffusers: " + ", ".join(f"{k}={v}" for k, v in self.upstream_fused.items()))
        for f in self.fallbacks:
            lost = f.get("lost")
            lost_text = f" (not run: {', '.join(f'{k}={v}' for k, v in lost.items())})" if lost else ""
            lines.append(f"  fallback: {f['module']}: {f['reason']}{lost_text}")
        return "\n".join(lines)
