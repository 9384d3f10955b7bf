"""Graph capture: the compiled graphs of an `AscendBackend` replayed as device graphs.

`AscendConfig.graph_capture` selects it: ``"graph_only"`` captures dynamo's graph without fusion
passes, ``"graph_with_compile"`` after them. The device graph API comes from
`diffusers_ascend.platform.graph_api` (CUDAGraph, NPUGraph; none on CPU).

A call's key is its input signature plus the addresses of its parameter inputs, so each block
instance replays its own graph reading its weights in place (never copied); activations are
copied into per-signature static buffers. Graphs that cannot be captured (gradients, inputs off
the device, `UNCAPTURABLE_OPS`, diffusers' own torch_npu calls on their acl_op path
(`OP_API_ONLY`), ``jit_compile=True`` on NPU, a failed capture) run as compiled,
with a warning and a report entry. docs/graph-capture.md describes the rest.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import GRAPH_CAPTURE_MODES, check_field
from ..errors import warn
from . import _compat

__all__ = [
    "MODES",
    "OP_API_ONLY",
    "UNCAPTURABLE_OPS",
    "WARMUP_CALLS",
    "CapturedCallable",
    "GraphCaptureManager",
    "TokenBuckets",
    "mutated_inputs",
    "static_input_indices",
    "uncapturable_ops",
]

MODES = GRAPH_CAPTURE_MODES
WARMUP_CALLS = 3  # as torch.cuda/npu.make_graphed_callables
# namespace::op -> why it cannot be captured (an aten-level graph node calling it is refused).
UNCAPTURABLE_OPS = {
    "npu::npu_fusion_attention": "torch_npu documents npu_fusion_attention as not supporting aclgraph",
    "npu::npu_fusion_attention_v2": "torch_npu documents npu_fusion_attention as not supporting aclgraph",
}
# torch_npu ops diffusers calls itself on an NPU host (`diffusers_ascend.layers.upstream_fused`), not
# through our providers: op -> its aclnn kernel. torch_npu runs the acl_op fallback where that
# kernel is missing from CANN or jit_compile=True, and NPU graphs capture aclnn kernels only.
OP_API_ONLY = {"npu::npu_rms_norm": "aclnnRmsNorm", "npu::npu_geglu": "aclnnGeGluV3"}


def static_input_indices() -> tuple[int, ...]:
    """Indices of the parameter/buffer inputs of the graph aot is compiling now (from its metadata), or ()."""
    ctx = _compat.tracing_context()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return tuple(getattr(meta, "static_input_indices", None) or ())


def uncapturable_ops(gm: torch.fx.GraphModule) -> dict[str, str]:
    """``{node name: reason}`` for the nodes of `gm` that call an op in `UNCAPTURABLE_OPS`, or an
    op of `OP_API_ONLY` that torch_npu runs as its acl_op kernel here."""
    found = {}
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            continue
        name = target.name() if isinstance(target, torch._ops.OpOverload) else target._qualified_op_name
        op = name.split(".")[0]
        reason = UNCAPTURABLE_OPS.get(op) or _acl_op_reason(op)
        if reason is not None:
            found[node.name] = reason
    return found


def _acl_op_reason(op: str) -> str | None:
    """Why `op` (an `OP_API_ONLY` op) cannot be captured here, or None (not such an op, or its
    aclnn kernel runs)."""
    api = OP_API_ONLY.get(op)
    if api is None:
        return None
    from ascend_kernels.npu import probe  # only reached when the graph holds a torch_npu op

    if probe.jit_compile():
        why = "jit_compile=True"
    elif not probe.aclnn_available(api):
        why = f"{api} is missing from CANN's op-api libraries"
    else:
        return None
    # Our rms_norm swap replaces diffusers' RMSNorm.forward, and our provider picks a capturable kernel.
    hint = "enable the rms_norm fusion or " if op == "npu::npu_rms_norm" else ""
    return (
        f"diffusers calls torch_npu's {op.split('::')[1]} itself here and torch_npu runs it as an acl_op kernel "
        f"({why}), which NPU graphs cannot capture; {hint}run without graph capture"
    )


def mutated_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """Indices of the inputs `gm` writes in place: under capture the write lands in the static
    buffer and is copied back."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    found = set()
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
            continue
        for i, arg in enumerate(target._schema.arguments):
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write and value in placeholders:
                found.add(placeholders[value])
    return found


@dataclass
class _Graph:
    graph: Any
    outputs: Any  # the static outputs, as the compiled function returned them


@dataclass
class _Entry:
    """One signature (without parameter addresses): its activation buffers and a graph per instance."""

    buffers: dict[int, torch.Tensor]
    graphs: dict[tuple, _Graph] = field(default_factory=dict)


class GraphCaptureManager:
    """The graphs of one backend: memory pool, side stream, FIFO of signatures, counters.

    Args:
        mode: ``"graph_only"`` or ``"graph_with_compile"``.
        api: the platform's `diffusers_ascend.platform.GraphAPI` (tests pass a stand-in).
        safe_output: return clones of the static outputs.
        max_captured_graphs: signatures kept (each with one graph per parameter set), FIFO.
        warmup: eager calls on the side stream before a capture.
        on_error: ``"fallback"`` (run uncaptured, with a warning and a `report` entry) or ``"raise"``.
        report: the backend's `FusionReport`.

    Raises:
        TypeError / ValueError: an argument of the wrong type or out of its range, naming the valid
            values (the config's rules: `diffusers_ascend.config.check_field`).

    Thread-safe: its graphs' calls take one lock. ``stats`` counts captures, replays, evictions and
    input copies.

    >>> from diffusers_ascend.compilation.graph_capture import GraphCaptureManager
    >>> GraphCaptureManager("graph_only", api=None).num_graphs
    0
    """

    def __init__(
        self,
        mode: str,
        api,
        safe_output: bool = True,
        max_captured_graphs: int = 8,
        warmup: int = WARMUP_CALLS,
        on_error: str = "fallback",
        report=None,
    ) -> None:
        # The config's own rules for the settings it holds (config.py); `warmup` is the manager's.
        for arg, value in (
            ("graph_capture", mode),
            ("max_captured_graphs", max_captured_graphs),
            ("safe_output", safe_output),
            ("on_error", on_error),
        ):
            check_field(arg, value)
        if mode is None:
            raise ValueError(f"GraphCaptureManager needs a graph_capture mode; valid: {', '.join(map(repr, MODES))}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
        self.mode, self.api, self.safe_output = mode, api, safe_output
        self.max_captured_graphs, self.warmup, self.on_error, self.report = (
            max_captured_graphs,
            warmup,
            on_error,
            report,
        )
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._pool = None
        self._stream = None
        self._uids = itertools.count()
        self.blocked: str | None = None  # why no graph of this backend can be captured here
        self.stats = dict(captures=0, replays=0, evictions=0, input_copies=0, input_copies_skipped=0)
        self._lock = threading.RLock()  # one call at a time: see `CapturedCallable.__call__`

    @classmethod
    def from_config(cls, config, platform: str, report=None) -> GraphCaptureManager:
        """The manager of `config`'s graph capture on `platform` (`AscendConfig.check_backend`
        raises first where the platform cannot run it)."""
        from diffusers_ascend.platform import capture_blocked, graph_api

        config.check_backend(platform)
        manager = cls(
            config.graph_capture,
            graph_api(platform),
            safe_output=config.safe_output,
            max_captured_graphs=config.max_captured_graphs,
            on_error=config.on_error,
            report=report,
        )
        manager.blocked = capture_blocked(platform)
        return manager

    @property
    def num_graphs(self) -> int:
        """Device graphs held now (all signatures, all instances)."""
        return sum(len(e.graphs) for e in self._entries.values())

    @property
    def num_signatures(self) -> int:
        """Input signatures held now, over all compiled graphs (what `max_captured_graphs` bounds)."""
        return len({k[1] for k in self._entries})

    def pool(self):
        if self._pool is None:
            self._pool = self.api.pool_handle()
        return self._pool

    def stream(self):
        if self._stream is None:
            self._stream = self.api.new_stream()
        return self._stream

    def clear(self) -> None:
        """Drops every captured graph (their memory returns to the pool)."""
        with self._lock:
            while self._entries:
                self._evict()

    def _evict(self, key: tuple | None = None) -> None:
        entry = self._entries.pop(next(iter(self._entries)) if key is None else key)
        for g in entry.graphs.values():
            reset = getattr(g.graph, "reset", None)
            if reset is not None:
                reset()
        self.stats["evictions"] += 1

    def _entry(self, key: tuple, args: Sequence[Any], activations: Sequence[int]) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            # The cap counts input signatures (key[1]), not graphs: torch < 2.8 compiles one graph
            # per block instance, all of one signature.
            shapes = list(dict.fromkeys(k[1] for k in self._entries))
            while key[1] not in shapes and len(shapes) >= self.max_captured_graphs:
                oldest = shapes.pop(0)
                for k in [k for k in self._entries if k[1] == oldest]:
                    self._evict(k)
            buffers = {
                i: torch.empty_strided(args[i].shape, args[i].stride(), dtype=args[i].dtype, device=args[i].device)
                for i in activations
            }
            entry = self._entries[key] = _Entry(buffers)
        return entry

    def _fallback(self, name: str, reason: str) -> None:
        if self.on_error == "raise":
            raise RuntimeError(f"graph capture of {name} failed: {reason}")
        warn(f"graph {name} runs without graph capture: {reason}", stacklevel=1)
        if self.report is not None:
            self.report.add_fallback(name, f"not captured: {reason}")

    def wrap(
        self,
        fn: Callable,
        gm: torch.fx.GraphModule | None = None,
        name: str = "graph",
        static_indices: Sequence[int] = (),
        unused: Sequence[int] = (),
    ) -> Callable:
        """`fn` (a compiled graph, boxed or not) under capture; `fn` itself when `gm` cannot be captured.

        Args:
            static_indices: parameter/buffer inputs (besides ``nn.Parameter`` inputs).
            unused: inputs `fn` ignores (parameters folded by freezing): neither keyed nor copied.
        """
        if self.blocked is not None:
            self._fallback(name, self.blocked)
            return fn
        if gm is not None:
            bad = uncapturable_ops(gm)
            if bad:
                node, reason = next(iter(bad.items()))
                self._fallback(name, f"node {node}: {reason}")
                return fn
        mutated = mutated_inputs(gm) if gm is not None else set()
        return CapturedCallable(self, fn, name, static_indices, unused, next(self._uids), mutated)


class CapturedCallable:
    """A compiled graph under capture; called like aot's compiled forward (boxed)."""

    _boxed_call = True

    def __init__(
        self,
        manager: GraphCaptureManager,
        fn: Callable,
        name: str,
        static_indices,
        unused,
        uid: int,
        mutated: set[int] = frozenset(),
    ) -> None:
        self.manager, self.fn, self.name, self.uid, self.mutated = manager, fn, name, uid, set(mutated)
        self._boxed = getattr(fn, "_boxed_call", False)
        self._static = set(static_indices)
        self._unused = set(unused)
        self._classified = False
        self.disabled: str | None = None  # why this graph runs uncaptured

    def _run(self, args: list):
        return self.fn(list(args)) if self._boxed else self.fn(*args)

    def _classify(self, args) -> None:
        # Parameters are passed as themselves at run time; aot's static indices also cover buffers.
        self._static |= {i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter)}
        self._static -= self._unused
        self._classified = True

    def signature(self, args: Sequence[Any]) -> tuple[tuple, tuple, list[int]]:
        """``(shape key, parameter key, activation indices)`` of a call."""
        shape, params, activations = [], [], []
        for i, a in enumerate(args):
            if i in self._unused:
                continue
            if isinstance(a, torch.Tensor):
                shape.append((i, tuple(a.shape), a.stride(), a.dtype, a.device))
                if i in self._static:
                    params.append((i, a.data_ptr()))
                else:
                    activations.append(i)
            else:  # a size or scalar: baked into the device graph, so part of the key
                shape.append((i, type(a).__name__, a))
        return tuple(shape), tuple(params), activations

    def __call__(self, args: list):
        if self.disabled is not None:
            return self._run(args)
        # Copy-in, replay and output read form one step: callers share static buffers and outputs.
        with self.manager._lock:
            return self._call_locked(args)

    def _call_locked(self, args: list):
        if self.disabled is not None:  # another thread's call found this graph uncapturable
            return self._run(args)
        mgr = self.manager
        if not self._classified:
            self._classify(args)
        shape, params, activations = self.signature(args)
        off_device = [i for i in activations + [i for i, _ in params] if args[i].device.type != mgr.api.device_type]
        if off_device:
            self.disabled = f"input {off_device[0]} is on {args[off_device[0]].device}, not {mgr.api.device_type}"
            mgr._fallback(self.name, self.disabled)
            return self._run(args)
        key = (self.uid, shape)
        entry = mgr._entry(key, args, activations)
        for i, buf in entry.buffers.items():
            a = args[i]
            if a is buf or a.data_ptr() == buf.data_ptr():  # same shape and strides (keyed): the buffer itself
                mgr.stats["input_copies_skipped"] += 1
            else:
                buf.copy_(a)
                mgr.stats["input_copies"] += 1
        static_args = [entry.buffers.get(i, a) for i, a in enumerate(args)]
        graph = entry.graphs.get(params)
        if graph is None:
            graph = self._capture(static_args)
            if graph is None:
                if not entry.graphs:
                    del mgr._entries[key]
                return self._run(args)
            entry.graphs[params] = graph
            for i in self.mutated & entry.buffers.keys():  # warm-up wrote these buffers: reload them
                if args[i].data_ptr() != entry.buffers[i].data_ptr():
                    entry.buffers[i].copy_(args[i])
        graph.graph.replay()
        mgr.stats["replays"] += 1
        for i in self.mutated:  # an in-graph write to an activation landed in its buffer
            buf = entry.buffers.get(i)
            if buf is not None and args[i].data_ptr() != buf.data_ptr():
                args[i].copy_(buf)
        return _outputs(graph.outputs, mgr.safe_output)

    def _capture(self, static_args: list) -> _Graph | None:
        from ascend_kernels.registry import capturing

        mgr, api = self.manager, self.manager.api
        try:
            stream = mgr.stream()
            stream.wait_stream(api.current_stream())
            # capturing() in the warm-up too, so it initialises the kernels the capture launches.
            with capturing(), api.use_stream(stream):  # warm-up off the capturing path, as the CUDA/NPU graph docs ask
                for _ in range(mgr.warmup):
                    self._run(static_args)
            api.current_stream().wait_stream(stream)
            g = api.graph_class()
            with capturing(), api.capture(g, mgr.pool(), stream):
                outputs = self._run(static_args)
        except Exception as e:  # a graph that cannot be captured still runs, uncaptured
            self.disabled = (
                f"capture failed ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})"
            )
            mgr._fallback(self.name, self.disabled)
            return None
        mgr.stats["captures"] += 1
        return _Graph(g, outputs)


def _outputs(outputs, clone: bool):
    if isinstance(outputs, torch.Tensor):
        return outputs.clone() if clone else outputs
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(o.clone() if clone and isinstance(o, torch.Tensor) else o for o in outputs)
    return outputs


class TokenBuckets:
    """Pads a token sequence to the next of a few lengths, so a multi-resolution service captures one
    graph per bucket instead of one per resolution. Attention must ignore the padded keys
    (`attention_mask`); `unpad` slices off the padded outputs.

    Args:
        buckets: the sequence lengths to pad to (positive ints; sorted and deduplicated).

    >>> import torch
    >>> from diffusers_ascend.compilation.graph_capture import TokenBuckets
    >>> buckets = TokenBuckets([256, 1024, 4096])
    >>> x, n = buckets.pad(torch.randn(1, 900, 8))
    >>> x.shape, n
    (torch.Size([1, 1024, 8]), 900)
    >>> buckets.unpad(x, n).shape
    torch.Size([1, 900, 8])
    """

    def __init__(self, buckets: Sequence[int]) -> None:
        if (
            isinstance(buckets, int)
            or not buckets
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets)
        ):
            raise ValueError(f"buckets must be a non-empty sequence of ints >= 1, got {buckets!r}")
        self.buckets = tuple(sorted(set(buckets)))

    def bucket_for(self, length: int) -> int:
        """The smallest bucket >= `length` (ValueError past the largest)."""
        for b in self.buckets:
            if length <= b:
                return b
        raise ValueError(
            f"sequence length {length} exceeds the largest bucket; buckets: {list(self.buckets)} (add a larger one)"
        )

    def pad(self, x: torch.Tensor, dim: int = 1, value: float = 0.0) -> tuple[torch.Tensor, int]:
        """`x` padded with `value` along `dim` to its bucket; returns ``(padded, original length)``."""
        n = x.shape[dim]
        extra = self.bucket_for(n) - n
        if extra == 0:
            return x, n
        shape = list(x.shape)
        shape[dim] = extra
        return torch.cat([x, x.new_full(shape, value)], dim=dim), n

    @staticmethod
    def unpad(y: torch.Tensor, length: int, dim: int = 1) -> torch.Tensor:
        """The first `length` positions of `y` along `dim`."""
        return y.narrow(dim, 0, length)

    def attention_mask(self, length: int, batch: int = 1, prefix: int = 0, device=None) -> torch.Tensor:
        """Boolean key mask ``(batch, 1, 1, prefix + bucket)``, True where a key is real (SDPA convention).

        Args:
            length: real tokens of the padded sequence.
            prefix: tokens before the padded sequence in the joint attention (Flux: the text tokens).
        """
        bucket = self.bucket_for(length)
        mask = torch.zeros(batch, 1, 1, prefix + bucket, dtype=torch.bool, device=device)
        mask[..., : prefix + length] = True
        return mask
