"""A stand-in device-graph API, for CONTRACT tests of graph capture (no GPU or NPU exists here).

It is not hardware and proves nothing about speed, streams or the real allocator. It records the
aten ops dispatched through Python, so Inductor's compiled CPU kernels are invisible to it: the
suite captures the eager executor (Inductor under capture is in the ``cuda`` suite). It reproduces
the semantics a capture wrapper relies on, so that a wrapper breaking them fails here:

- capture records the aten ops run inside ``capture(graph, pool, stream)`` (a ``TorchDispatchMode``)
  and, like a CUDA/NPU graph, does NOT leave their results usable: every tensor the captured
  work created is filled with NaN when the capture ends (a real capture runs no kernels);
- ``replay()`` re-runs the recorded ops on the same tensors (the static inputs it was captured on,
  the weights it read) and overwrites the same output tensors in place, so a value baked into
  the graph at capture (a Python scalar) stays baked, and outputs alias across replays;
- a pool token per ``pool_handle()`` call; graphs record the pool and stream they were captured
  with; ``reset()`` drops the recording.

`standin_torch_npu_graphs` adds what ``torch.npu.graph`` does around a capture, from the wheels
users install (torch_npu 2.10.0.post6 and 2.14.0; the file each rule comes from is named where
it is modelled): the synchronize and cache emptying of every capture, the refusal of acl_op
kernels and of ``TASK_QUEUE_ENABLE=2``, and the ``capture_error_mode`` semantics, with
`NpuRuntime` counting the runtime calls. It is still a CONTRACT test, not hardware: nothing here
measures what a synchronize or an emptied cache costs on a 910B.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import threading
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from diffusers_ascend.platform import GraphAPI

_pools = itertools.count()


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: StandInGraph) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.graph.ops.append((func, args, kwargs, out))
        return out


class StandInGraph:
    """Stand-in for ``torch.cuda.CUDAGraph`` / ``torch.npu.NPUGraph`` (see the module docstring)."""

    def __init__(self) -> None:
        self.ops: list = []
        self.replays = 0
        self.pool = None
        self.stream = None
        self.was_reset = False

    def _poison(self) -> None:
        for func, _, _, out in self.ops:
            if func.is_view or func._schema.is_mutable:
                continue  # aliases an input, or writes one: not memory the capture allocated
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    t.fill_(float("nan"))

    def replay(self) -> None:
        assert not self.was_reset, "replay of a graph that was reset"
        for func, args, kwargs, out in self.ops:
            new = func(*args, **kwargs)
            if func._schema.is_mutable or func.is_view:
                continue  # in place: already written; views: alias what they view
            for old, fresh in zip(tree_flatten(out)[0], tree_flatten(new)[0]):
                if isinstance(old, torch.Tensor):
                    old.copy_(fresh)
        self.replays += 1

    def reset(self) -> None:
        self.ops = []
        self.was_reset = True


class StandInStream:
    def __init__(self) -> None:
        self.waits = 0

    def wait_stream(self, other) -> None:
        self.waits += 1


@contextlib.contextmanager
def _capture(graph: StandInGraph, pool, stream):
    graph.pool, graph.stream = pool, stream
    with _Recorder(graph):
        yield
    graph._poison()


_main_stream = StandInStream()


def _pool() -> tuple:
    return ("standin-pool", next(_pools))


def _use_stream(stream) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _current_stream() -> StandInStream:
    return _main_stream


def standin_graph_api() -> GraphAPI:
    """A `GraphAPI` over `StandInGraph` for tensors on the CPU (``device_type="cpu"``)."""
    return GraphAPI(
        device_type="cpu",
        graph_class=StandInGraph,
        capture=_capture,
        pool_handle=_pool,
        new_stream=StandInStream,
        use_stream=_use_stream,
        current_stream=_current_stream,
    )


# -- torch.npu.graph, as torch_npu/npu/graphs.py and libtorch_npu.so of the wheels do it ----------------
CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")
RELEASES = ("2.10.0.post6", "2.14.0")


class _Capture:
    def __init__(self, mode: str) -> None:
        self.mode, self.invalidated_by = mode, None


# The NPU graph captures under way, by capturing thread: the capture status of that thread's
# stream, which the runtime checks on every unsafe action, whichever thread makes it.
_captures: dict[int, _Capture] = {}
_captures_lock = threading.Lock()


def _unsafe_action(what: str, capturing_thread_ok: bool) -> None:
    """An action ``aclmdlRICaptureMode`` restricts during a capture (an ``npuMalloc``, a device
    synchronize). torch_npu/npu/graphs.py, ``graph`` and ``NPUGraph.capture_begin`` docstrings
    (both wheels): "global" errors on such actions in other threads, "thread_local" only on those
    of the capturing thread, "relaxed" on none; the capture they break fails at its end. The
    capturing thread's own allocations come from the graph's private pool, which the caching
    allocator serves safely (`capturing_thread_ok`)."""
    me = threading.get_ident()
    with _captures_lock:
        for ident, cap in _captures.items():
            own = ident == me
            if (own and not capturing_thread_ok and cap.mode != "relaxed") or (not own and cap.mode == "global"):
                cap.invalidated_by = f"{what} in {'the capturing' if own else 'another'} thread"
                raise RuntimeError(
                    f"{what} is not permitted while an NPU graph capture is under way "
                    f"(capture_error_mode={cap.mode!r}); the capture is invalidated"
                )


def check_aclop(name: str) -> None:
    """Called by the stand-in torch_npu on its acl_op paths: acl_op kernels cannot run in a
    capture (libtorch_npu.so, both wheels: "Cannot run aclop operators during NPU graph capture.
    Current working aclop is <op>")."""
    with _captures_lock:
        capturing = threading.get_ident() in _captures
    if capturing:
        raise RuntimeError(f"Cannot run aclop operators during NPU graph capture. Current working aclop is {name}")


class NpuRuntime:
    """The ``torch.npu`` runtime calls around graph capture, counted (`calls`), with the capture
    error modes each capture was begun with (`modes`). `release` picks the wheel whose
    ``graph.__enter__`` is modelled; `on_capture_begin` callbacks run inside each capture, right
    after it began (for tests forcing another thread's work into a capture)."""

    def __init__(self, release: str = "2.14.0") -> None:
        if release not in RELEASES:
            raise ValueError(f"release {release!r}: modelled releases are {RELEASES}")
        self.release = release
        self.calls: collections.Counter = collections.Counter()
        self.modes: list[str] = []
        self.on_capture_begin: list = []

    def synchronize(self, device=None) -> None:
        _unsafe_action("synchronize", capturing_thread_ok=False)
        self.calls["synchronize"] += 1

    def empty_cache(self) -> None:
        self.calls["empty_cache"] += 1

    def host_empty_cache(self) -> None:  # torch_npu.npu.host_empty_cache (2.14.0)
        self.calls["host_empty_cache"] += 1

    def caching_allocator_alloc(self, size, device=None, stream=None) -> torch.Tensor:
        """An allocation through the caching allocator (torch_npu/npu/memory.py); after a capture
        emptied the cache it is an ``npuMalloc``. Returns host bytes (torch_npu: the address)."""
        _unsafe_action("npuMalloc", capturing_thread_ok=True)
        self.calls["alloc"] += 1
        return torch.empty(int(size), dtype=torch.uint8)

    @contextlib.contextmanager
    def graph(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False, capture_error_mode="global"):
        """``torch.npu.graph`` (torch_npu/npu/graphs.py; the keyword is ``npu_graph``)."""
        assert isinstance(npu_graph, StandInGraph)
        # graph.__enter__: torch.npu.synchronize(), gc, torch.npu.empty_cache() (2.10.0.post6 and
        # 2.14.0), then torch_npu.npu.host_empty_cache() (2.14.0 only), then capture_begin.
        self.synchronize()
        self.empty_cache()
        if self.release == "2.14.0":
            self.host_empty_cache()
        # NPUGraph::capture_begin (libtorch_npu.so, both wheels).
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise RuntimeError(
                f"Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got {capture_error_mode}"
            )
        if os.environ.get("TASK_QUEUE_ENABLE") == "2":
            raise RuntimeError(
                "Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture, please export TASK_QUEUE_ENABLE=1/0."
            )
        cap = _Capture(capture_error_mode)
        me = threading.get_ident()
        with _captures_lock:
            assert me not in _captures, "a capture is already under way in this thread"
            _captures[me] = cap
        self.modes.append(capture_error_mode)
        try:
            with _capture(npu_graph, pool, stream):
                for callback in list(self.on_capture_begin):
                    callback()
                yield
        finally:
            with _captures_lock:
                del _captures[me]
        if cap.invalidated_by is not None:  # capture_end reports the broken capture
            raise RuntimeError(
                f"NPU graph capture failed: invalidated by {cap.invalidated_by} "
                f"(capture_error_mode={capture_error_mode!r})"
            )


def standin_torch_npu_graphs(release: str = "2.14.0") -> types.SimpleNamespace:
    """A stand-in ``torch.npu`` namespace: ``NPUGraph``, ``graph``, ``graph_pool_handle``, ``Stream``,
    ``stream``, ``current_stream`` over the same `StandInGraph` (what `platform.graph_api("npu")`
    reads), and ``synchronize``, ``empty_cache``, ``caching_allocator_alloc`` of one `NpuRuntime`
    (``runtime``)."""
    runtime = NpuRuntime(release)
    return types.SimpleNamespace(
        NPUGraph=StandInGraph,
        graph=runtime.graph,
        graph_pool_handle=_pool,
        Stream=StandInStream,
        stream=_use_stream,
        current_stream=_current_stream,
        is_available=lambda: True,
        synchronize=runtime.synchronize,
        empty_cache=runtime.empty_cache,
        caching_allocator_alloc=runtime.caching_allocator_alloc,
        runtime=runtime,
    )
