"""`FusionReport`: what a backend (or a whole pipeline) fused, per fusion and per graph; its
per-graph entries (`GraphEntry`) and fallbacks (`Fallback`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Fallback", "FusionReport", "GraphEntry"]


class _KeyReads:
    """Read-only ``entry["key"]`` and ``entry.get("key")`` over the keys of `to_dict`.

    Kept on purpose: the entries were plain dicts before, and code written against them (users'
    scripts, the ``fb["module"]`` reads docs/troubleshooting.md showed, much of the test suite)
    reads them by key. New code reads the attributes. Each read returns a copy (writes go through
    the attributes); a key `to_dict` leaves out (an optional field not set) raises ``KeyError``,
    as it did on the dicts.
    """

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)


@dataclass
class GraphEntry(_KeyReads):
    """One graph a backend compiled (or a warm-start package stands for), as `FusionReport.graphs`
    lists it.

    Mutable on purpose: the backend records it when the rewrite is done and fills in what the
    executor decides later (`bound_providers`, `graph_capture`, `frozen_params`), and a block that
    falls back to eager later marks it `fell_back`. In `to_dict` the optional fields appear only
    when set (``fell_back`` only when True).

    Attributes:
        name: ``<label>:g<index>[<compile id>]`` (label: the block class under
            `enable_ascend_compile`, none for a standalone backend), or ``<block class>:aoti`` /
            ``<block class>:export`` for a loaded warm-start package.
        matches: fusion name -> pattern replacements made in this graph.
        ops_before / ops_after: operator calls in the graph before and after rewriting.
        executor: ``"eager"``, ``"inductor"`` or ``"aoti"`` (a loaded AOTInductor package).
        training: compiled for training (the functional graph before aot).
        dynamic: traced with symbolic shapes.
        compile_id: dynamo's compile id (``"<frame>/<recompile>"``), None for a graph not compiled
            under dynamo (a loaded package).
        fell_back: its module runs eager instead; its matches and ops are not counted
            (`FusionReport.discard_graphs`).
        frozen_params: ``freezing=True``: parameters folded into the graph as constants.
        graph_capture: the ``graph_capture`` mode its calls replay under.
        bound_providers: node name -> provider bound at compile time (`bind_providers`, eager
            executor; `bind_compiler_ops`, Inductor executor).
        unbound_reason: why Inductor could not launch the bound kernels itself (they run as
            ``ascend_kernels`` ops instead).
        package: the warm-start package file it was loaded from.

    >>> g = GraphEntry("g000", {"rope": 2}, ops_before=10, ops_after=4, executor="eager")
    >>> g.matches, g["executor"], "package" in g.to_dict()
    ({'rope': 2}, 'eager', False)
    """

    name: str
    matches: dict[str, int]
    ops_before: int
    ops_after: int
    executor: str | None = None
    training: bool = False
    dynamic: bool = False
    compile_id: str | None = None
    fell_back: bool = False
    frozen_params: int | None = None
    graph_capture: str | None = None
    bound_providers: dict[str, str] | None = None
    unbound_reason: str | None = None
    package: str | None = None

    _OPTIONAL = ("frozen_params", "graph_capture", "bound_providers", "unbound_reason", "package")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy: the always-present keys, then the optional ones that are set."""
        d = {
            k: getattr(self, k)
            for k in ("name", "matches", "ops_before", "ops_after", "executor", "training", "dynamic", "compile_id")
        }
        d["matches"] = dict(self.matches)
        if self.fell_back:
            d["fell_back"] = True
        for k in self._OPTIONAL:
            v = getattr(self, k)
            if v is not None:
                d[k] = dict(v) if isinstance(v, dict) else v
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GraphEntry:
        """From `to_dict` output (or an entry of a report's JSON).

        Raises:
            ValueError: a key that is not a field (the message lists the fields).
        """
        return cls(**_known_fields(cls, d, "graph entry"))


@dataclass(frozen=True)
class Fallback(_KeyReads):
    """A part that runs unfused or eager, and why, as `FusionReport.fallbacks` lists it.

    Attributes:
        module: the block, graph or group of modules (``<model>.<fusion swaps>``, ``attention
            (npu_fia)``, ...).
        reason: why, in one sentence.
        lost: fusion -> matches that no longer run because of it (graphs compiled for the module
            and discarded, or modules a swap left alone); empty when nothing was lost, and then
            left out of `to_dict`.

    >>> Fallback("blocks.0", "compile failed", {"rope": 2}).to_dict()
    {'module': 'blocks.0', 'reason': 'compile failed', 'lost': {'rope': 2}}
    """

    module: str
    reason: str
    lost: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "module", str(self.module))
        object.__setattr__(self, "reason", str(self.reason))
        object.__setattr__(self, "lost", {k: int(v) for k, v in (self.lost or {}).items() if v})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (``lost`` only when something was lost)."""
        d: dict[str, Any] = {"module": self.module, "reason": self.reason}
        if self.lost:
            d["lost"] = dict(self.lost)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fallback:
        """From `to_dict` output (or an entry of a report's JSON).

        Raises:
            ValueError: a key that is not a field (the message lists the fields).
        """
        return cls(**_known_fields(cls, d, "fallback"))


def _known_fields(cls, d: Mapping[str, Any], what: str) -> dict[str, Any]:
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(str(k) for k in d if k not in names)
    if unknown:
        raise ValueError(f"unknown {what} key(s) {unknown}; valid: {names}")
    return dict(d)


def _graph(g: GraphEntry | Mapping[str, Any]) -> GraphEntry:
    return g if isinstance(g, GraphEntry) else GraphEntry.from_dict(g)


def _fallback(f: Fallback | Mapping[str, Any]) -> Fallback:
    return f if isinstance(f, Fallback) else Fallback.from_dict(f)


@dataclass
class FusionReport:
    """Replacements made, operator counts before/after, compiled graphs, fallbacks and layer swaps.

    Attributes:
        matches: fusion name -> pattern replacements made in graphs that run (every enabled fusion
            has an entry). Graphs whose module fell back to eager are not counted.
        ops_before / ops_after: operator calls (call_function nodes of non-view ops, see
            `count_ops`) in the compiled graphs that run, before and after rewriting.
        graphs: a `GraphEntry` per compiled graph (and per loaded warm-start package), fallen-back
            ones included (``fell_back``, see `discard_graphs`).
        graphs_compiled: number of graphs compiled (recompilations and fallen-back graphs included).
        fallbacks: a `Fallback` (``module``, ``reason``, ``lost``) for each part that runs unfused.
        swaps: module-level layer swaps (a swapped-in fused RMSNorm shows here, not as a match).
        upstream_fused: modules fused by diffusers itself, not by us: torch_npu kernel -> modules
            whose stock forward calls it (diffusers takes these branches where the torch_npu
            distribution is installed, e.g. ``RMSNorm`` -> ``npu_rms_norm``; see
            `diffusers_ascend.layers.upstream_fused`). Never counted in `matches` or `swaps`.
        unfused_quantization: torchao quantization schemes no enabled fusion rewrites: scheme ->
            linears, which keep torchao's own path (e.g. ``"torchao Int4Tensor"``).

    >>> r = FusionReport(matches={"rms_norm": 2})
    >>> r.add_fallback("blocks.0", "compile failed")
    >>> FusionReport.merge([r, r]).matches["rms_norm"]
    4
    """

    matches: dict[str, int] = field(default_factory=dict)
    ops_before: int = 0
    ops_after: int = 0
    graphs: list[GraphEntry] = field(default_factory=list)
    graphs_compiled: int = 0
    fallbacks: list[Fallback] = field(default_factory=list)
    swaps: dict[str, int] = field(default_factory=dict)
    upstream_fused: dict[str, int] = field(default_factory=dict)
    unfused_quantization: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Entries given as dicts (a report's JSON, `from_dict`) become records.
        self.graphs = [_graph(g) for g in self.graphs]
        self.fallbacks = [_fallback(f) for f in self.fallbacks]

    # -- recording ------------------------------------------------------------------------------
    def add_graph(self, name: str, matches: dict[str, int], ops_before: int, ops_after: int, **info: Any) -> GraphEntry:
        """Record one compiled graph (called by the backend).

        Args:
            name, matches, ops_before, ops_after, **info: the `GraphEntry` fields.

        Returns:
            the new entry (the last of `graphs`).
        """
        entry = GraphEntry(name, dict(matches), ops_before, ops_after, **info)
        for fusion, n in matches.items():
            self.matches[fusion] = self.matches.get(fusion, 0) + n
        self.ops_before += ops_before
        self.ops_after += ops_after
        self.graphs_compiled += 1
        self.graphs.append(entry)
        return entry

    def add_fallback(self, module: str, reason: str, lost: dict[str, int] | None = None) -> None:
        """Record that `module` runs without fusion, and why; `lost`: the matches that no longer run."""
        self.fallbacks.append(Fallback(module, reason, lost or {}))

    def discard_graphs(self, start: int | list[GraphEntry]) -> dict[str, int]:
        """Stop counting ``graphs[start:]`` (or the entries of `graphs` in the list `start`): their
        module fell back to eager, so their matches and ops never run. The graphs stay listed with
        ``fell_back: True``.

        Returns:
            the matches per fusion removed from `matches` (nonzero entries only).

        >>> r = FusionReport(matches={"rope": 0})
        >>> _ = r.add_graph("g000", {"rope": 2}, ops_before=10, ops_after=4)
        >>> r.discard_graphs(0), r.matches, r.graphs[0].fell_back
        ({'rope': 2}, {'rope': 0}, True)
        """
        lost: dict[str, int] = {}
        for g in self.graphs[start:] if isinstance(start, int) else start:
            if g.fell_back:
                continue
            g.fell_back = True
            for fusion, n in g.matches.items():
                self.matches[fusion] = self.matches.get(fusion, 0) - n
                if n:
                    lost[fusion] = lost.get(fusion, 0) + n
            self.ops_before -= g.ops_before
            self.ops_after -= g.ops_after
        return lost

    def record_swaps(self, counts: dict[str, int]) -> None:
        """Add module-level layer swaps (name -> number of modules swapped)."""
        for name, n in counts.items():
            self.swaps[name] = self.swaps.get(name, 0) + int(n)

    def record_upstream_fused(self, counts: dict[str, int]) -> None:
        """Add modules fused by diffusers' own torch_npu calls (kernel -> number of modules)."""
        for name, n in counts.items():
            self.upstream_fused[name] = self.upstream_fused.get(name, 0) + int(n)

    def record_unfused_quantization(self, counts: dict[str, int]) -> None:
        """Add linears of torchao schemes no enabled fusion rewrites (scheme -> number of linears)."""
        for name, n in counts.items():
            self.unfused_quantization[name] = self.unfused_quantization.get(name, 0) + int(n)

    # -- reading --------------------------------------------------------------------------------
    @property
    def total_matches(self) -> int:
        return sum(self.matches.values())

    @property
    def ops_ratio(self) -> float | None:
        """``ops_after / ops_before`` (None before any graph was compiled)."""
        return self.ops_after / self.ops_before if self.ops_before else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable copy (entries as `GraphEntry.to_dict` / `Fallback.to_dict`)."""
        return json.loads(
            json.dumps(
                dict(
                    matches=self.matches,
                    ops_before=self.ops_before,
                    ops_after=self.ops_after,
                    graphs=[g.to_dict() for g in self.graphs],
                    graphs_compiled=self.graphs_compiled,
                    fallbacks=[f.to_dict() for f in self.fallbacks],
                    swaps=self.swaps,
                    upstream_fused=self.upstream_fused,
                    unfused_quantization=self.unfused_quantization,
                ),
                default=str,
            )
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FusionReport:
        """The report `to_dict` wrote (entries become `GraphEntry` / `Fallback` records)."""
        return cls(
            **{
                k: d[k]
                for k in (
                    "matches",
                    "ops_before",
                    "ops_after",
                    "graphs",
                    "graphs_compiled",
                    "fallbacks",
                    "swaps",
                    "upstream_fused",
                    "unfused_quantization",
                )
                if k in d
            }
        )

    @classmethod
    def merge(cls, reports: Iterable[FusionReport]) -> FusionReport:
        """One report summing `reports` (e.g. the transformers of a pipeline)."""
        out = cls()
        for r in reports:
            for fusion, n in r.matches.items():
                out.matches[fusion] = out.matches.get(fusion, 0) + n
            out.ops_before += r.ops_before
            out.ops_after += r.ops_after
            out.graphs.extend(dataclasses.replace(g) for g in r.graphs)  # copies: `discard_graphs` marks them
            out.graphs_compiled += r.graphs_compiled
            out.fallbacks.extend(r.fallbacks)  # frozen: shared
            out.record_swaps(r.swaps)
            out.record_upstream_fused(r.upstream_fused)
            out.record_unfused_quantization(r.unfused_quantization)
        return out

    def __str__(self) -> str:
        fusions = list(self.matches)
        lines = ["FusionReport"]
        if self.ops_before:
            lines.append(
                f"  graphs compiled: {self.graphs_compiled}; ops {self.ops_before} -> {self.ops_after} "
                f"({self.ops_after / self.ops_before:.0%})"
            )
        else:
            lines.append(f"  graphs compiled: {self.graphs_compiled}")
        header = ["graph", *fusions, "ops before", "ops after", "executor"]
        rows = [
            [
                g.name + (" (fell back)" if g.fell_back else ""),
                *[str(g.matches.get(f, 0)) for f in fusions],
                str(g.ops_before),
                str(g.ops_after),
                str(g.executor or ""),
            ]
            for g in self.graphs
        ]
        rows.append(["total", *[str(self.matches[f]) for f in fusions], str(self.ops_before), str(self.ops_after), ""])
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            lines.append("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if self.swaps:
            lines.append("  layer swaps: " + ", ".join(f"{k}={v}" for k, v in self.swaps.items()))
        if self.upstream_fused:
            lines.append("  fused by diffusers: " + ", ".join(f"{k}={v}" for k, v in self.upstream_fused.items()))
        for f in self.fallbacks:
            lost_text = f" (not run: {', '.join(f'{k}={v}' for k, v in f.lost.items())})" if f.lost else ""
            lines.append(f"  fallback: {f.module}: {f.reason}{lost_text}")
        return "\n".join(lines)
