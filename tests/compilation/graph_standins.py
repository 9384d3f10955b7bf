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
"""

from __future__ import annotations

import contextlib
import itertools
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from diffusers_ascend.platform import GraphAPI

_pools = itertools.count()


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: "StandInGraph") -> None:
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
    return GraphAPI(device_type="cpu", graph_class=StandInGraph, capture=_capture, pool_handle=_pool,
                    new_stream=StandInStream, use_stream=_use_stream, current_stream=_current_stream)


def _npu_graph(npu_graph, pool=None, stream=None, auto_dispatch_capture=False, capture_error_mode="global"):
    """``torch.npu.graph``'s signature (torch_npu/npu/graphs.py: the keyword is ``npu_graph``)."""
    assert isinstance(npu_graph, StandInGraph)
    assert capture_error_mode in ("global", "thread_local", "relaxed")
    return _capture(npu_graph, pool, stream)


def standin_torch_npu_graphs() -> types.SimpleNamespace:
    """A stand-in ``torch.npu`` namespace: ``NPUGraph``, ``graph``, ``graph_pool_handle``, ``Stream``,
    ``stream``, ``current_stream`` over the same `StandInGraph` (what `platform.graph_api("npu")` reads)."""
    return types.SimpleNamespace(NPUGraph=StandInGraph, graph=_npu_graph, graph_pool_handle=_pool, Stream=StandInStream,
                                 stream=_use_stream, current_stream=_current_stream, is_available=lambda: True)
