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

from .. import _diffusers_compat as dc
from ..enabled import EnabledModel
from ..errors import warn


def _block_call(module, /, *args, **kwargs):
    """What dynamo compiles for a module enabled in place: its ``_call_impl`` (hooks included).
    Each config of each model runs its own copy of this code object (`CompiledCall`)."""
    return module._call_impl(*args, **kwargs)


def _block_forward(module, /, *args, **kwargs):
    """What dynamo compiles below a diffusers hook that runs the block with dynamo disabled
    (MagCache): the block's own forward, called by that hook (see `compile_in_place`)."""
    return type(module).forward(module, *args, **kwargs)


def _own_copy(fn) -> types.FunctionType:
    """`fn` on an equal but distinct code object: dynamo keeps its own cache of graphs for it."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


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
        self.fn = _own_copy(_block_call)
        # Blocks a diffusers hook runs with dynamo disabled compile their forward below the hook.
        self.forward_fn = _own_copy(_block_forward)
        self.backend, self.cfg = backend, cfg
        self.signatures: dict[str, list[tuple[Any, Any]]] = {}  # see `EnabledModel.signatures`
        self._wrapper = self._forward_wrapper = None
        # The finalizers through which dynamo's guards of these codes' graphs outlive them
        # (`_compat.guard_finalizers`), released once the graphs are gone: on `drop`, on
        # ``torch._dynamo.reset()`` (the backend's reset hook) and when this object is collected.
        # Neither holds this object (the backend lives in dynamo until its reset); each drops the
        # codes' graphs before it detaches (after a reset: none left).
        self._guards: list[Any] = []
        backend.reset_hooks.append(functools.partial(_release, self.codes, self._guards))
        weakref.finalize(self, _release, self.codes, self._guards).atexit = False

    def _compiled(self, attr: str, fn):
        wrapper = getattr(self, attr)
        if wrapper is None:
            with _BOOKKEEPING:  # made at the first call, which threads may reach together
                if getattr(self, attr) is None:
                    compiled = torch.compile(
                        fn, backend=self.backend, dynamic=self.cfg.dynamic, fullgraph=self.cfg.fullgraph
                    )
                    setattr(self, attr, compiled)
                wrapper = getattr(self, attr)
        return wrapper

    def __call__(self, module, *args, **kwargs):
        return self._compiled("_wrapper", self.fn)(module, *args, **kwargs)

    def forward(self, module, *args, **kwargs):
        """`module`'s own forward compiled (no module hooks): what a hook that disables dynamo calls."""
        return self._compiled("_forward_wrapper", self.forward_fn)(module, *args, **kwargs)

    def track_guards(self) -> None:
        """Records the guard finalizers of the graphs compiled so far (after a call that compiled)."""
        from ..compilation._compat import guard_finalizers

        known = {id(f) for f in self._guards}
        for code in self.codes:
            self._guards.extend(f for f in guard_finalizers(code) if id(f) not in known)

    @property
    def code(self) -> types.CodeType:
        return self.fn.__code__

    @property
    def codes(self) -> tuple[types.CodeType, ...]:
        """Every code object this config compiles graphs on."""
        return (self.fn.__code__, self.forward_fn.__code__)

    def drop(self) -> None:
        """Frees this config's compiled graphs (and device graphs); a later call compiles anew."""
        self.track_guards()  # those of a compile that failed after its guards were built, too
        _release(self.codes, self._guards)
        if self.backend.graph_capture is not None:
            self.backend.graph_capture.clear()


def _release(codes, guards: list) -> None:
    """Frees the graphs of `codes`, then the guard records `guards` kept alive: detaching a
    finalizer only skips dynamo's invalidation of a cache entry that no longer exists."""
    from ..compilation._compat import drop_compiled_code

    for code in codes:
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
    (warm start) do not take.

    A block that a diffusers hook runs with dynamo disabled (MagCache's ``new_forward`` is
    ``torch.compiler.disable``d: dynamo tracing the block's call would compile nothing) is compiled
    below that hook instead: the hook's reference to the block's own forward is pointed at this
    config's compiled forward, so the hook's decisions (skip, reuse a residual) stay eager, outside
    any graph, and the block's math runs compiled, as vLLM-Omni's regional compile does.
    `restore_hooks` points it back."""
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

    def run(compiled, eager, *args, **kwargs):  # `compiled`: the block's call, or its forward (`below`)
        token = graph_label.set(label)
        graphs = []
        sink = compiled_graphs.set(graphs)  # the report entries of the graphs this call compiles
        try:
            with scope():
                out = compiled(module, *args, **kwargs)
        except Exception as e:
            cause = root_cause(e)
            if isinstance(cause, (TorchCompatError, FusionSelfCheckError)):
                raise cause from e  # a broken engine or pattern is never a per-block fallback
            if cfg.on_error == "raise":
                raise
            # Eager first: if the module fails there too, the error is the model's own (bad
            # inputs, ...) and propagates as without compilation; the block stays compiled.
            out = eager(*args, **kwargs)
            fall_back(module, name, state, call, e, graphs)
            return out
        finally:
            compiled_graphs.reset(sink)
            graph_label.reset(token)
        if graphs:  # this call compiled a graph: its guards now exist
            compiled_call.track_guards()
        # A call that compiled a graph is packaged by `save_ascend_cache` (warm start), which replays
        # the block's call: not the forward below a hook (its graphs are not packaged).
        if state.record_signatures and graphs and compiled is compiled_call:
            record_signature(state.signatures, label, module, args, kwargs)
        return out

    def below(*args, **kwargs):
        """The block's forward as a dynamo-disabling hook calls it: compiled while `call` is ours."""
        if module._compiled_call_impl is not call:  # fell back, or replaced by another compile
            return type(module).forward(module, *args, **kwargs)
        return run(compiled_call.forward, functools.partial(type(module).forward, module), *args, **kwargs)

    @functools.wraps(module._call_impl)
    def call(*args, **kwargs):
        state.compiled_ran = True  # a warm-start package answering the call counts too
        if route_below_hooks(module, below):
            return module._call_impl(*args, **kwargs)  # the hooks eager; the block's forward via `below`
        if state.aot_blocks and label in state.aot_blocks:
            if plain_call(module):
                for aot in state.aot_blocks[label]:
                    out = aot(module, args, kwargs)
                    if out is not MISS:
                        return out
            state.packages_passed_on += 1
        return run(compiled_call, module._call_impl, *args, **kwargs)

    call._ascend_state = state  # marks it ours (see `diagnostics.foreign_compiles`)
    below._ascend_block = module  # marks a hook's reference rerouted (see `restore_hooks`)
    module._compiled_call_impl = call
    state.compiled.append(module)


def _disabled_refs(module: torch.nn.Module) -> list:
    """The function references of the diffusers hooks on `module` whose ``new_forward`` runs with
    dynamo disabled (MagCache's block hooks)."""
    return [
        ref
        for hook, ref in dc.hook_forward_refs(module)
        if getattr(getattr(type(hook), "new_forward", None), "_torchdynamo_disable", False)
    ]


def _is_own_forward(module: torch.nn.Module, fn) -> bool:
    return getattr(fn, "__self__", None) is module and getattr(fn, "__func__", None) is type(module).forward


def route_below_hooks(module: torch.nn.Module, below) -> bool:
    """Whether a hook runs `module` with dynamo disabled; if so, the one among them that calls the
    block's own forward (or an earlier enable's `below`) calls `below` from now on (`restore_hooks`
    undoes it)."""
    refs = _disabled_refs(module)
    for ref in refs:
        fn = ref.original_forward
        if fn is not below and (_is_own_forward(module, fn) or _routed(module, fn)):
            ref.original_forward = below
    return bool(refs)


def unroutable_hooks(module: torch.nn.Module) -> list:
    """The dynamo-disabling hooks on `module` below which nothing of ours can compile: none of
    them calls the block's own forward (or ours already), each something else."""
    refs = _disabled_refs(module)
    if any(_is_own_forward(module, r.original_forward) or _routed(module, r.original_forward) for r in refs):
        return []
    return [hook for hook, ref in dc.hook_forward_refs(module) if any(ref is r for r in refs)]


def _routed(module: torch.nn.Module, fn) -> bool:
    return getattr(fn, "_ascend_block", None) is module


def restore_hooks(module: torch.nn.Module) -> None:
    """Points the hooks `route_below_hooks` rerouted back at the block's own forward."""
    for _, ref in dc.hook_forward_refs(module):
        if _routed(module, ref.original_forward):
            ref.original_forward = type(module).forward.__get__(module)


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
