"""Block compile: each repeated block (or the whole model) compiled in place through one config's
own dynamo code object, with a per-module fallback to eager at its first call."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import types
import weakref
from typing import Any

import torch

from ..errors import warn
from .state import EnabledModel


def _block_call(module, /, *args, **kwargs):
    """What dynamo compiles for a module enabled in place: its ``_call_impl`` (hooks included).
    Each config of each model runs its own copy of this code object (`CompiledCall`)."""
    return module._call_impl(*args, **kwargs)


# Guards what calls from several threads share: a module's dynamo wrapper made at its first call,
# and a block's fallback (its report entry, the graphs it discards). Never held while compiling.
_BOOKKEEPING = threading.Lock()


class CompiledCall:
    """One config's compiled call for the modules of one model: ``torch.compile`` of a fresh copy
    of `_block_call`'s code object.

    Dynamo keeps compiled graphs, and counts the recompile limit, per code object. Compiling the
    modules themselves puts every graph on the block class's ``forward`` code, which every config
    and every model of that class shares: each new config spent the same budget until dynamo
    compiled nothing more (and ran eager, silently), and a model's limit counted per block class.
    On its own code object a config compiles as if it were the first, its graphs of every block
    class count against one limit, and `drop` frees them.
    """

    def __init__(self, backend, cfg) -> None:
        code = _block_call.__code__.replace()  # an equal but distinct code object: its own dynamo cache
        self.fn = types.FunctionType(code, _block_call.__globals__, _block_call.__name__)
        self.backend, self.cfg = backend, cfg
        self.signatures: dict[str, list[tuple[Any, Any]]] = {}  # see `EnabledModel.signatures`
        self._wrapper = None
        # The finalizers through which dynamo's guards of this code's graphs outlive them
        # (`_compat.guard_finalizers`), released once the graphs are gone: on `drop`, on
        # ``torch._dynamo.reset()`` (the backend's reset hook) and when this object is collected.
        # Neither holds this object (the backend lives in dynamo until its reset); each drops the
        # code's graphs before it detaches (after a reset: none left).
        self._guards: list[Any] = []
        backend.reset_hooks.append(functools.partial(_release, self.code, self._guards))
        weakref.finalize(self, _release, self.code, self._guards).atexit = False

    def __call__(self, module, *args, **kwargs):
        wrapper = self._wrapper
        if wrapper is None:
            with _BOOKKEEPING:  # made at the first call, which threads may reach together
                if self._wrapper is None:
                    self._wrapper = torch.compile(
                        self.fn, backend=self.backend, dynamic=self.cfg.dynamic, fullgraph=self.cfg.fullgraph
                    )
                wrapper = self._wrapper
        return wrapper(module, *args, **kwargs)

    def track_guards(self) -> None:
        """Records the guard finalizers of the graphs compiled so far (after a call that compiled)."""
        from ..compilation._compat import guard_finalizers

        known = {id(f) for f in self._guards}
        self._guards.extend(f for f in guard_finalizers(self.code) if id(f) not in known)

    @property
    def code(self) -> types.CodeType:
        return self.fn.__code__

    def drop(self) -> None:
        """Frees this config's compiled graphs (and device graphs); a later call compiles anew."""
        self.track_guards()  # those of a compile that failed after its guards were built, too
        _release(self.code, self._guards)
        if self.backend.graph_capture is not None:
            self.backend.graph_capture.clear()


def _release(code, guards: list) -> None:
    """Frees `code`'s graphs, then the guard records `guards` kept alive: detaching a finalizer
    only skips dynamo's invalidation of a cache entry that no longer exists."""
    from ..compilation._compat import drop_compiled_code

    drop_compiled_code(code)
    while guards:
        guards.pop().detach()


# The configs whose compiled graphs a model keeps (least recently enabled dropped first): enabling
# a config again within them compiles nothing, and the graphs held stay bounded (dynamo still
# keeps each backend until its reset: docs/configuration.md#the-recompile-limit-process-wide).
KEPT_CONFIGS = 4


class Backends:
    """The backends a model was enabled with, one per (config, platform), kept across
    enable/disable on the model (``model.__dict__["_ascend_backends"]``): the `KEPT_CONFIGS`
    most recently enabled.

    Dynamo guards compiled graphs on the backend's identity and keeps every backend until
    ``torch.compiler.reset()``: a new backend per enable would compile again every cycle. Each
    entry also keeps the recorded call signatures (a cache hit records nothing again) and the
    config's `CompiledCall`; an entry dropped frees its graphs.

    Not pickled or deep-copied (a copy is another module: it compiles its own graphs).
    """

    def __init__(self) -> None:
        self.entries: dict[tuple[Any, str], CompiledCall] = {}

    @classmethod
    def of(cls, model: torch.nn.Module) -> Backends:
        """`model`'s own, made at its first enable."""
        backends = model.__dict__.get("_ascend_backends")
        if backends is None:
            backends = model.__dict__["_ascend_backends"] = cls()
        return backends

    def get(self, cfg, verify: bool) -> CompiledCall:
        """The `CompiledCall` of `cfg` on the current platform: the one made before unless dynamo
        was reset since (its graphs are gone)."""
        from ..compilation import AscendBackend
        from ..platform import current_platform

        key = (cfg, current_platform())
        found = self.entries.pop(key, None)
        if found is not None and not found.backend.was_reset:
            if verify:
                found.backend.ensure_verified()
        else:
            found = CompiledCall(AscendBackend(cfg, verify=verify), cfg)
        self.entries[key] = found  # the most recent last
        while len(self.entries) > KEPT_CONFIGS:
            self.entries.pop(next(iter(self.entries))).drop()
        return found

    def __getstate__(self):
        return {"entries": {}}

    def __deepcopy__(self, memo):
        return Backends()


def compile_in_place(module: torch.nn.Module, name: str, state: EnabledModel, cfg) -> None:
    """Like `module.compile(...)` (no `_orig_mod.` keys), with per-module fallback at first call.
    Compiles through the config's `CompiledCall`, at the first call that loaded block packages
    (warm start) do not take."""
    from ..compilation._compat import TorchCompatError
    from ..compilation.backend import compiled_graphs, graph_label, root_cause
    from ..compilation.passes.base import FusionSelfCheckError
    from ..warm_start import MISS, plain_call, record_signature

    compiled_call = state.compiled_call
    label = type(module).__name__
    if cfg.freezing:  # dynamo lifts weights into the graph only under this flag; set for our calls only
        from ..compilation._compat import inductor_freezing_scope

        scope = inductor_freezing_scope
    else:
        scope = contextlib.nullcontext

    @functools.wraps(module._call_impl)
    def call(*args, **kwargs):
        state.compiled_ran = True  # a warm-start package answering the call counts too
        if state.aot_blocks and label in state.aot_blocks:
            if plain_call(module):
                for aot in state.aot_blocks[label]:
                    out = aot(module, args, kwargs)
                    if out is not MISS:
                        return out
            state.packages_passed_on += 1
        token = graph_label.set(label)
        compiled = []
        sink = compiled_graphs.set(compiled)  # the report entries of the graphs this call compiles
        try:
            with scope():
                out = compiled_call(module, *args, **kwargs)
        except Exception as e:
            cause = root_cause(e)
            if isinstance(cause, (TorchCompatError, FusionSelfCheckError)):
                raise cause from e  # a broken engine or pattern is never a per-block fallback
            if cfg.on_error == "raise":
                raise
            # Eager first: if the module fails there too, the error is the model's own (bad
            # inputs, ...) and propagates as without compilation; the block stays compiled.
            out = module._call_impl(*args, **kwargs)
            fall_back(module, name, state, call, e, compiled)
            return out
        finally:
            compiled_graphs.reset(sink)
            graph_label.reset(token)
        if compiled:  # this call compiled a graph: its guards now exist
            compiled_call.track_guards()
        if state.record_signatures and compiled:  # this call compiled a graph
            record_signature(state.signatures, label, module, args, kwargs)
        return out

    call._ascend_state = state  # marks it ours (see `diagnostics.foreign_compiles`)
    module._compiled_call_impl = call
    state.compiled.append(module)


def is_ours(module: torch.nn.Module, state: EnabledModel) -> bool:
    """Whether `module` runs the compiled call `state` installed (not another compile made since)."""
    return getattr(module._compiled_call_impl, "_ascend_state", None) is state


def fall_back(module: torch.nn.Module, name: str, state: EnabledModel, call, error: Exception, graphs: list) -> None:
    """`module` runs eager from now on: one warning and one report entry, whichever of the threads
    whose calls failed at the same time comes first; `graphs` (those the failing call compiled)
    never run, so their matches stop counting."""
    from ..compilation.backend import describe_failure
    from ..compilation.report import Fallback

    reason = describe_failure(error)
    where = name or type(module).__name__
    with _BOOKKEEPING:
        lost = state.backend.report.discard_graphs(graphs)
        first = module._compiled_call_impl is call
        if first:
            module._compiled_call_impl = None
            state.fallbacks.append(Fallback(where, reason, dict(lost)))
        elif lost:  # another thread's call of this module failed first and recorded it: add what this one lost
            i = next((i for i in reversed(range(len(state.fallbacks))) if state.fallbacks[i].module == where), None)
            if i is not None:
                merged = dict(state.fallbacks[i].lost)
                for fusion, n in lost.items():
                    merged[fusion] = merged.get(fusion, 0) + n
                state.fallbacks[i] = dataclasses.replace(state.fallbacks[i], lost=merged)
    if first:
        warn(f"{where} failed to compile, running eager ({reason})")
