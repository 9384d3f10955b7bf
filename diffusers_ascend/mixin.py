"""`enable_ascend_compile` / `disable_ascend_compile` / `ascend_report` for diffusers pipelines and models.
State lives on the object; enable is all-or-nothing (docs/configuration.md#enable-is-all-or-nothing)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import types
import warnings
import weakref
from typing import Any

import torch

from . import _diffusers_compat as dc

ASCEND_CONFIG_KEY = "_ascend_config"
_DYNAMO_DEFAULT_RECOMPILE_LIMIT = 8
# Set while a pipeline loads its components: the pipeline applies the config once, at the end.
_LOADING_PIPELINE = contextvars.ContextVar("diffusers_ascend_loading_pipeline", default=False)


class _State:
    def __init__(self, config, backend):
        self.config = config
        self.backend = backend
        self.compiled: list[torch.nn.Module] = []
        self.fallbacks: list[dict[str, str]] = []
        self.attention: dict[Any, Any] | None = None  # processor -> its previous _attention_backend
        self.attention_hooks: list[Any] = []  # npu_fia's forward hooks (`attention.npu_fia.track`)
        self.swapped: list[tuple[object, type]] = []  # (object, original class), see layers.apply_swaps
        self.swaps: dict[str, int] = {}
        self.shared: list[tuple[Any, Any, Any]] = []  # see processors.share_processors
        # Warm start (`warm_start.EnabledModel`): per block class, the signature of each inference
        # call that compiled a graph (`save_ascend_cache` packages them), and the packages loaded.
        self.record_signatures = False
        self.signatures: dict[str, list[tuple[Any, Any]]] = {}  # class name -> [(CallSignature, weakref to a block)]
        self.aot_blocks: dict[str, list[Any]] = {}  # class name -> [AotBlock]
        self.compiled_call: _CompiledCall | None = None  # what compiles this config's modules, see `_Backends`
        self.packages_passed_on = 0  # calls of a packaged class that no package took
        # Whether the model ran (`_RunMarker`, a hook on it) and whether a module's compiled call
        # ran: a model that ran while none did was traced by another torch.compile around it.
        self.marker: _RunMarker | None = None
        self.compiled_ran = False

    def __getstate__(self):
        # A pickled model keeps its config, swaps and attention backends; like torch's in-place
        # `Module.compile()`, compilation does not travel (blocks run uncompiled until enabled again).
        state = dict(self.__dict__)
        state["backend"] = None
        state["compiled"] = []
        state["signatures"] = {}
        state["aot_blocks"] = {}
        state["compiled_call"] = None
        return state


def _block_call(module, /, *args, **kwargs):
    """What dynamo compiles for a module enabled in place: its ``_call_impl`` (hooks included).
    Each config of each model runs its own copy of this code object (`_CompiledCall`)."""
    return module._call_impl(*args, **kwargs)


class _RunMarker:
    """A forward pre-hook on an enabled model that records that the model ran (also when another
    ``torch.compile`` traces it: dynamo replays the attribute write), see `_foreign_compiles`."""

    def __init__(self) -> None:
        self.ran = False

    def __call__(self, module, args) -> None:
        self.ran = True


def _remove_run_markers(model) -> None:
    for key, hook in list(model._forward_pre_hooks.items()):
        if isinstance(hook, _RunMarker):
            del model._forward_pre_hooks[key]


class _CompiledCall:
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
        self.signatures: dict[str, list[tuple[Any, Any]]] = {}  # see `_State.signatures`
        self._wrapper = None

    def __call__(self, module, *args, **kwargs):
        wrapper = self._wrapper
        if wrapper is None:
            with _BOOKKEEPING:  # made at the first call, which threads may reach together
                if self._wrapper is None:
                    self._wrapper = torch.compile(self.fn, backend=self.backend, dynamic=self.cfg.dynamic,
                                                  fullgraph=self.cfg.fullgraph)
                wrapper = self._wrapper
        return wrapper(module, *args, **kwargs)

    @property
    def code(self) -> types.CodeType:
        return self.fn.__code__

    def drop(self) -> None:
        """Frees this config's compiled graphs (and device graphs); a later call compiles anew."""
        from .compilation._compat import drop_compiled_code

        drop_compiled_code(self.code)
        if self.backend.graph_capture is not None:
            self.backend.graph_capture.clear()


# The configs whose compiled graphs a model keeps (least recently enabled dropped first): enabling
# a config again within them compiles nothing, and the graphs held stay bounded (dynamo still
# keeps each backend until its reset: docs/configuration.md#the-recompile-limit-process-wide).
_KEPT_CONFIGS = 4


class _Backends:
    """The backends a model was enabled with, one per (config, platform), kept across
    enable/disable on the model (``model.__dict__["_ascend_backends"]``): the `_KEPT_CONFIGS`
    most recently enabled.

    Dynamo guards compiled graphs on the backend's identity and keeps every backend until
    ``torch.compiler.reset()``: a new backend per enable would compile again every cycle. Each
    entry also keeps the recorded call signatures (a cache hit records nothing again) and the
    config's `_CompiledCall`; an entry dropped frees its graphs.

    Not pickled or deep-copied (a copy is another module: it compiles its own graphs).
    """

    def __init__(self) -> None:
        self.entries: dict[tuple[Any, str], _CompiledCall] = {}

    def get(self, cfg, verify: bool) -> _CompiledCall:
        """The `_CompiledCall` of `cfg` on the current platform: the one made before unless dynamo
        was reset since (its graphs are gone)."""
        from .compilation import AscendBackend
        from .platform import current_platform

        key = (cfg, current_platform())
        found = self.entries.pop(key, None)
        if found is not None and not found.backend.was_reset:
            if verify:
                found.backend.ensure_verified()
        else:
            found = _CompiledCall(AscendBackend(cfg, verify=verify), cfg)
        self.entries[key] = found  # the most recent last
        while len(self.entries) > _KEPT_CONFIGS:
            self.entries.pop(next(iter(self.entries))).drop()
        return found

    def __getstate__(self):
        return {"entries": {}}

    def __deepcopy__(self, memo):
        return _Backends()


def _is_pipeline(obj) -> bool:
    from diffusers import DiffusionPipeline

    return isinstance(obj, DiffusionPipeline)


def _models(obj) -> list[tuple[str, torch.nn.Module]]:
    """The models of `obj` that have an adapter: the model itself, or a pipeline's transformers;
    each without torch.compile's wrapper (see `_outer_compiled`)."""
    from .adapters import adapter_for

    if not _is_pipeline(obj):
        return [("", _unwrapped(obj))]
    out = []
    for name, comp in obj.components.items():
        comp = _unwrapped(comp)
        if isinstance(comp, torch.nn.Module) and adapter_for(comp) is not None:
            out.append((name, comp))
    return out


def _unwrapped(obj):
    """`obj` without the ``OptimizedModule``s that ``torch.compile(module)`` wraps it in."""
    from .compilation._compat import unwrap_compiled_module

    return unwrap_compiled_module(obj)


def _outer_compiled(obj) -> set[str]:
    """The names (as in `_models`) of the models that `obj` holds inside a ``torch.compile(module)``
    wrapper: ``pipe.transformer = torch.compile(pipe.transformer)``, or `obj` itself (``""``)."""
    if _is_pipeline(obj):
        return {name for name, comp in obj.components.items() if _unwrapped(comp) is not comp}
    return {""} if _unwrapped(obj) is not obj else set()


def _set_config_key(obj, value) -> None:
    dc.set_config_entry(obj, ASCEND_CONFIG_KEY, value)


# Dynamo's process-wide recompile limit: the largest of the holds (weak: a dropped model lets go)
# and the baseline found before them. A value someone else set meanwhile becomes the new baseline.
_LIMIT_LOCK = threading.Lock()
_LIMIT_HOLDS: "weakref.WeakKeyDictionary[_State, int]" = weakref.WeakKeyDictionary()
_LIMIT = {"baseline": None, "applied": None}


def _apply_limit(current: int) -> None:
    from .compilation._compat import set_dynamo_recompile_limit

    target = max([_LIMIT["baseline"], *_LIMIT_HOLDS.values()])
    if target != current:
        set_dynamo_recompile_limit(target)
    _LIMIT["applied"] = target


def _hold_recompile_limit(state: _State, limit: int | None) -> None:
    """Raises dynamo's recompile limit to at least ``limit`` for as long as ``state`` is enabled."""
    from .compilation._compat import dynamo_recompile_limit

    if limit is None:
        return
    with _LIMIT_LOCK:
        current = dynamo_recompile_limit()
        if _LIMIT["applied"] is None or current != _LIMIT["applied"]:
            _LIMIT["baseline"] = current  # never touched by us, or changed by someone else since
        _LIMIT_HOLDS[state] = limit
        _apply_limit(current)


def _release_recompile_limit(state: _State) -> None:
    from .compilation._compat import dynamo_recompile_limit

    with _LIMIT_LOCK:
        if _LIMIT_HOLDS.pop(state, None) is None:
            return
        current = dynamo_recompile_limit()
        if current != _LIMIT["applied"]:  # set by someone else after us: leave it
            return
        _apply_limit(current)


def _compile_in_place(module: torch.nn.Module, name: str, state: _State, cfg) -> None:
    """Like `module.compile(...)` (no `_orig_mod.` keys), with per-module fallback at first call.
    Compiles through the config's `_CompiledCall`, at the first call that loaded block packages
    (warm start) do not take."""
    from .compilation._compat import TorchCompatError
    from .compilation.backend import compiled_graphs, graph_label, root_cause
    from .warm_start import MISS
    from .warm_start import plain_call as _plain_call

    compiled_call = state.compiled_call
    label = type(module).__name__
    if cfg.freezing:  # dynamo lifts weights into the graph only under this flag; set for our calls only
        from .compilation._compat import inductor_freezing_scope

        scope = inductor_freezing_scope
    else:
        scope = contextlib.nullcontext

    @functools.wraps(module._call_impl)
    def call(*args, **kwargs):
        state.compiled_ran = True  # a warm-start package answering the call counts too
        if state.aot_blocks and label in state.aot_blocks:
            if _plain_call(module):
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
            if isinstance(cause, TorchCompatError):
                raise cause from e  # a broken engine is never a per-block fallback
            if cfg.on_error == "raise":
                raise
            # Eager first: if the module fails there too, the error is the model's own (bad
            # inputs, ...) and propagates as without compilation; the block stays compiled.
            out = module._call_impl(*args, **kwargs)
            _fall_back(module, name, state, call, e, compiled)
            return out
        finally:
            compiled_graphs.reset(sink)
            graph_label.reset(token)
        if state.record_signatures and compiled:
            _record_signature(state, label, module, args, kwargs)  # this call compiled a graph
        return out

    call._ascend_state = state  # marks it ours (see `_foreign_compiles`)
    module._compiled_call_impl = call
    state.compiled.append(module)


# Guards what calls from several threads share: a module's dynamo wrapper made at its first call,
# and a block's fallback (its report entry, the graphs it discards). Never held while compiling.
_BOOKKEEPING = threading.Lock()


def _fall_back(module: torch.nn.Module, name: str, state: _State, call, error: Exception, graphs: list) -> None:
    """`module` runs eager from now on: one warning and one report entry, whichever of the threads
    whose calls failed at the same time comes first; `graphs` (those the failing call compiled)
    never run, so their matches stop counting."""
    from .compilation.backend import describe_failure

    reason = describe_failure(error)
    where = name or type(module).__name__
    with _BOOKKEEPING:
        lost = state.backend.report.discard_graphs(graphs)
        first = module._compiled_call_impl is call
        if first:
            module._compiled_call_impl = None
            entry = {"module": where, "reason": reason}
            state.fallbacks.append(entry)
        else:  # another thread's call of this module failed first and recorded it
            entry = next((fb for fb in reversed(state.fallbacks) if fb["module"] == where), {})
        if lost:
            merged = entry.setdefault("lost", {})
            for fusion, n in lost.items():
                merged[fusion] = merged.get(fusion, 0) + n
    if first:
        warnings.warn(f"diffusers_ascend: {where} failed to compile, running eager ({reason})")


def _foreign_compiles(model: torch.nn.Module, name: str, state: _State, outer: bool = False) -> None:
    """Records (once, with a warning) what keeps our compiled blocks from running: a
    ``torch.compile`` the user applied after enabling (``Module.compile()`` /
    ``compile_repeated_blocks()`` on a block replaces its compiled call; on the whole model, under
    ``compile="blocks"``, dynamo traces the blocks into the model's graph with the user's backend),
    the same traced from outside (`outer`: the model runs inside a ``torch.compile(model)``
    wrapper, before or after enabling), or a diffusers hook that runs the block with dynamo
    disabled (MagCache), or a method of a swapped class patched after enabling (`layers._patched`)."""
    from .layers import _patched

    found = []
    if outer and state.config.compile != "none":
        found.append((name or type(model).__name__, "it runs inside a torch.compile(model) wrapper (OptimizedModule), "
                      "whose dynamo traces our compiled blocks into its own graph: our backend compiles nothing (no "
                      "graph fusions; layer swaps and attention still apply). Call the unwrapped model (e.g. "
                      "pipe.transformer = pipe.transformer._orig_mod), with compile='model' for one graph per model"))
    if state.config.compile == "blocks" and model._compiled_call_impl is not None:
        found.append((name or type(model).__name__, "the whole model was compiled by another torch.compile (Module.compile()): "
                      "its backend traces every block, ours never runs; for one compiled graph per model use "
                      "enable_ascend_compile(compile='model')"))
    # A block that fell back to eager has no compiled call at all: that is not another compile.
    replaced = [m for m in state.compiled
                if m._compiled_call_impl is not None and getattr(m._compiled_call_impl, "_ascend_state", None) is not state]
    hooked = [(m, h) for m in state.compiled if m not in replaced for h in _compile_disabling_hooks(m)]
    if hooked:
        found.append((f"{name + '.' if name else ''}<{type(hooked[0][0]).__name__}>",
                      f"{len({id(m) for m, _ in hooked})} compiled block(s) run eager: diffusers' "
                      f"{type(hooked[0][1]).__name__} wraps their forward in torch.compiler.disable, so dynamo never "
                      "compiles them (no graph, no fusion); remove the hook (e.g. disable_cache()) to get them back"))
    patched: dict[tuple[type, type], list] = {}
    for obj, cls in state.swapped:
        patched.setdefault((cls, type(obj)), []).append(obj)
    for (cls, fused), objs in patched.items():
        patch = _patched(cls, fused)
        if patch is not None:
            found.append((f"{name + '.' if name else ''}<{cls.__name__}>",
                          f"{len(objs)} {cls.__name__} object(s) run our {fused.__name__}, which replaces {patch}, patched "
                          "in after enabling (e.g. cache-dit's async Ulysses): that code never runs on them; enable "
                          "again to keep it (the swap is then left out)"))
    if replaced:
        found.append((f"{name + '.' if name else ''}<{type(replaced[0]).__name__}>",
                      f"{len(replaced)} compiled block(s) were compiled again after enabling (Module.compile() or "
                      "compile_repeated_blocks()): that compile replaced ours, which no longer runs on them; "
                      "enable_ascend_compile compiles the blocks itself (enable again to restore it)"))
    ours = [m for m in state.compiled if getattr(m._compiled_call_impl, "_ascend_state", None) is state]
    if not found and ours and state.marker is not None and state.marker.ran and not state.compiled_ran:
        found.append((name or type(model).__name__, "it ran, but none of its compiled modules' calls did: another "
                      "torch.compile traced it, most likely a torch.compile(model) wrapper (OptimizedModule) around "
                      "it, whose dynamo traces the blocks into its own graph with its own backend: our backend compiles "
                      "nothing (no graph fusions; layer swaps and attention still apply). Call the model itself, "
                      "with compile='model' for one graph per model"))
    for module, reason in found:
        _note_once(state, module, reason)


def _note_once(state: _State, module: str, reason: str) -> None:
    """A warning and a fallback entry for `module`, unless this one was recorded already."""
    if any(fb["module"] == module and fb["reason"] == reason for fb in state.fallbacks):
        return
    warnings.warn(f"diffusers_ascend: {module}: {reason}")
    state.fallbacks.append({"module": module, "reason": reason})


def _recompile_limit_reached(model, name: str, state: _State) -> None:
    """Records (once, with a warning) that the model's compiled graphs reached dynamo's recompile
    limit: a call of a shape none of them takes then runs uncompiled, without fusion. Counted on
    the config's own code object (`_CompiledCall`), where the limit counts every graph of the
    model (2.8+; before, dynamo counts the graphs of each block instance apart)."""
    from .compilation._compat import compiled_blocks_share_graphs, compiled_code_entries, dynamo_recompile_limit

    if state.compiled_call is None or not compiled_blocks_share_graphs():
        return
    graphs, limit = compiled_code_entries(state.compiled_call.code), dynamo_recompile_limit()
    if graphs >= limit:
        _note_once(state, name or type(model).__name__, (
            f"{graphs} graphs compiled for this config reach dynamo's recompile limit ({limit}): a call of a new shape "
            "runs uncompiled, without fusion. Use dynamic=None (the default) or True for varying resolutions, or a "
            "higher recompile_limit"))


def _compile_disabling_hooks(module: torch.nn.Module) -> list:
    """The diffusers hooks on `module` whose ``new_forward`` (which runs the block's forward) is
    ``torch.compiler.disable``d: MagCache's block hooks."""
    return [h for h in dc.module_hooks(module) if getattr(getattr(type(h), "new_forward", None), "_torchdynamo_disable", False)]


def _record_signature(state: _State, label: str, module: torch.nn.Module, args, kwargs) -> None:
    from .warm_start import record_signature

    record_signature(state.signatures, label, module, args, kwargs)


def _foreign_processors(model, adapter, fusions, swapped, skipped) -> list[tuple[str, str, str, str]]:
    """The attention processors left unswapped that a processor swap of `adapter` was written for
    (the module's default processor class is the swap's source), as `apply_swaps`' ``skipped``
    entries: another class there (the user's, cache-dit's) is kept, and its code runs unfused."""
    if adapter is None:
        return []
    swaps = [s for s in adapter.swaps if s.fusion in fusions and not issubclass(s.target(), torch.nn.Module)]
    done = {id(obj) for obj, _ in swapped}
    reported = {n for _, n, _, _ in skipped}
    out = []
    for n, module in model.named_modules():
        proc = module.__dict__.get("processor")
        default = dc.default_processor_class(module)
        swap = next((s for s in swaps if getattr(default, "__name__", None) == s.source), None)
        if swap is None or proc is None or id(proc) in done or f"{n}.processor" in reported:
            continue
        cls = type(proc)
        out.append((swap.fusion, f"{n}.processor", cls.__name__,
                    f"{cls.__module__}.{cls.__qualname__} is not diffusers' {swap.source}, which the swap replaces"))
    return out


def _runs_ring(model) -> bool:
    """Whether diffusers' context parallelism runs ring attention in ``model`` (``enable_parallelism``
    with ``ring_degree > 1``): ring merges partial results with the log-sum-exp."""
    from .attention import processors

    for p in processors(model):
        cp = getattr(dc.parallel_config(p), "context_parallel_config", None)
        if cp is not None and (getattr(cp, "ring_degree", None) or 1) > 1:
            return True
    return False


def _set_attention(model, cfg, state: _State) -> None:
    """Sets the resolved attention backend on `model`'s attention processors (recorded first, so
    disable restores them). Not through ``model.set_attention_backend``: that also sets diffusers'
    process-wide active backend, which every other model without a backend of its own would use."""
    from .attention import NPU_FIA, backend_for, processors
    from .attention.npu_fia import track

    if not hasattr(model, "set_attention_backend"):
        return
    backend = cfg.resolved_attention(ring=_runs_ring(model), dtype=getattr(model, "dtype", None))
    if backend is None:
        return
    member = backend_for(backend)
    if backend == NPU_FIA:
        from ascend_kernels.npu import torch_npu_available

        if not torch_npu_available():  # as diffusers refuses "_native_npu" here
            raise RuntimeError(f"attention={backend!r} needs torch_npu, which is not installed; install torch_npu on "
                               "an Ascend host, or use attention='auto' or a diffusers backend (e.g. 'native').")
    else:  # diffusers' own checks of set_attention_backend (package installed, kernel)
        dc.check_backend_requirements(member)
    procs = processors(model)
    if any(dc.parallel_config(p) is not None for p in procs) and not dc.supports_context_parallel(member):
        raise ValueError(
            f"attention={backend!r} does not support diffusers' context parallelism, which this model runs; "
            f"valid: {dc.context_parallel_backends()}."
        )
    state.attention = {p: dc.attention_backend(p) for p in procs}
    for p in procs:
        dc.set_attention_backend(p, member)
    if backend == NPU_FIA:
        state.attention_hooks = track(model)  # its own fallback log, for its report


def _enable_model(model, cfg, name: str = "", verify: bool = True) -> None:
    """Enables `model`; its state is recorded first, so a failure half-way can be undone by `_disable_model`."""
    from .adapters import adapter_for
    from .adapters.registry import adapter_swaps
    from .layers import apply_swaps

    adapter = adapter_for(model)
    compiled_call = None
    if cfg.compile != "none":
        backends = model.__dict__.get("_ascend_backends")
        if backends is None:
            backends = model.__dict__["_ascend_backends"] = _Backends()
        compiled_call = backends.get(cfg, verify)
    state = _State(cfg, compiled_call.backend if compiled_call is not None else None)
    if compiled_call is not None:
        state.signatures, state.compiled_call = compiled_call.signatures, compiled_call
    # Block packages (`save_ascend_cache`): AOTInductor ones run uncaptured, eager ones under capture too.
    state.record_signatures = (cfg.compile == "blocks" and not cfg.freezing and state.backend is not None
                               and (state.backend.executor == "eager" or state.backend.graph_capture is None))
    model._ascend_state = state
    unswapped: list[tuple[str, str, str, str | None]] = []
    state.swapped, state.swaps = apply_swaps(model, cfg.resolved_fusions(), skipped=unswapped,
                                             extra=adapter_swaps())
    unswapped += _foreign_processors(model, adapter, cfg.resolved_fusions(), state.swapped, unswapped)
    for fusion, patch in dict.fromkeys((f, p) for f, _, _, p in unswapped):
        mods = [(n, c) for f, n, c, p in unswapped if f == fusion and p == patch]
        if patch is None:
            reason = (f"{len(mods)} {mods[0][1]} module(s) not fused by {fusion!r} (first: {mods[0][0] or '<root>'}): their "
                      "`forward` is an instance attribute (a hook applied before enabling, e.g. leaf-level group "
                      "offloading) that calls the original class's forward. Apply the hook after enable_ascend_compile, "
                      "or use block-level offloading.")
        else:
            reason = (f"{len(mods)} {mods[0][1]} object(s) kept, not fused by the {fusion!r} swap (first: "
                      f"{mods[0][0] or '<root>'}): {patch}; the fused class would replace that code")
        warnings.warn(f"diffusers_ascend: {name or type(model).__name__}: {reason}")
        state.fallbacks.append({"module": f"{name + '.' if name else ''}<{fusion} swaps>", "reason": reason,
                                "lost": {fusion: len(mods)}})
    _set_attention(model, cfg, state)
    # Blocks compiled in place share `Module._call_impl`, hence one recompile budget, past which
    # dynamo silently runs eager: each block class gets the default, plus one per block where
    # dynamo may compile every instance on its own (torch < 2.8).
    found, missing = adapter.block_modules(model) if cfg.compile == "blocks" else ([], [])
    per_blocks = None
    from .compilation._compat import compiled_blocks_share_graphs

    if cfg.compile == "blocks":
        per_blocks = _DYNAMO_DEFAULT_RECOMPILE_LIMIT * len(adapter.blocks)
        per_blocks += 0 if compiled_blocks_share_graphs() else len(found)
    _hold_recompile_limit(state, cfg.recompile_limit or per_blocks)
    for block in missing:  # e.g. a `_repeated_blocks` name this config does not build
        reason = (f"block class {block!r} named by the {adapter.name!r} adapter matches no submodule of "
                  f"{type(model).__name__}: nothing of it is compiled")
        warnings.warn(f"diffusers_ascend: {name or type(model).__name__}: {reason}")
        state.fallbacks.append({"module": f"{name + '.' if name else ''}<{block}>", "reason": reason})
    if found and not compiled_blocks_share_graphs():
        from .processors import share_processors

        # torch < 2.8 guards on each block's processor object: one object per position, one graph.
        state.shared = share_processors(sub for _, sub in found)
    for sub_name, sub in found:
        _compile_in_place(sub, f"{name + '.' if name else ''}{sub_name}", state, cfg)
    if cfg.compile == "model":
        _compile_in_place(model, name, state, cfg)
    if state.compiled:
        state.marker = _RunMarker()
        model.register_forward_pre_hook(state.marker)
    _foreign_compiles(model, name, state)  # e.g. MagCache applied before enabling
    model.register_to_config(**{ASCEND_CONFIG_KEY: cfg.to_dict()})


def _enabled(pipe_or_model) -> list:
    """The enabled models of `pipe_or_model` as the enable path hands them to warm start."""
    from .warm_start import EnabledModel

    out = []
    for name, model in _models(pipe_or_model):
        s = getattr(model, "_ascend_state", None)
        if s is not None:
            out.append(EnabledModel(name, model, s.config, s.backend, s.compiled, s.record_signatures,
                                    s.signatures, s.aot_blocks, s.packages_passed_on))
    return out


def _disable_model(model) -> None:
    state = getattr(model, "_ascend_state", None)
    if state is None:
        return
    from .layers import restore_swaps
    from .processors import unshare_processors

    for m in state.compiled:
        if getattr(m._compiled_call_impl, "_ascend_state", None) is state:  # another compile since is the user's
            m._compiled_call_impl = None
    if state.backend is not None and state.backend.graph_capture is not None:
        state.backend.graph_capture.clear()  # device memory back; an enable again captures anew
    unshare_processors(getattr(state, "shared", []))  # a state pickled before this field has none
    restore_swaps(state.swapped)
    if state.attention is not None:
        for proc, prev in state.attention.items():
            dc.set_attention_backend(proc, prev)
    for hook in getattr(state, "attention_hooks", ()):  # a state pickled before this field has none
        hook.remove()
    _remove_run_markers(model)
    del model._ascend_state
    _set_config_key(model, None)
    _release_recompile_limit(state)


def enable_ascend_compile(pipe_or_model, config=None, *, cache=None, trust_remote_artifacts=False, **overrides):
    """Accelerates a diffusers pipeline or model for Ascend: fusion backend, per-block compile, attention.

    Enabling again replaces the previous configuration (it never stacks).

    Args:
        pipe_or_model: a `DiffusionPipeline` or a diffusers `ModelMixin`.
        config: `AscendConfig` | dict | local directory | Hub repo id | None (defaults).
        cache: compile artifacts written by `save_ascend_cache` (a local directory or a Hub repo
            id) to start warm from. They are validated first; artifacts made for another torch,
            platform, config or pass source are ignored with a warning (see docs/warm-start.md).
        trust_remote_artifacts: required when `cache` is a Hub repo id: the artifacts hold
            compiled code that runs in this process.
        **overrides: `AscendConfig` fields replacing those of `config`.

    Returns:
        `pipe_or_model`.

    >>> import diffusers_ascend
    >>> from diffusers_ascend.tiny import tiny_flux_pipeline
    >>> pipe = diffusers_ascend.enable_ascend_compile(tiny_flux_pipeline(), executor="eager")
    """
    from .config import AscendConfig

    cfg = AscendConfig.coerce(config, **overrides)  # validates before anything changes
    dc.check_diffusers()  # every private diffusers name we use, before anything changes
    probe = None
    if cfg.compile != "none":
        from .compilation import AscendBackend

        probe = AscendBackend(cfg, verify=False)  # constructor errors (freezing, graph_capture) before anything changes
    from .adapters import adapter_for

    if cfg.freezing and cfg.compile == "blocks":
        raise ValueError(
            "freezing=True needs compile='model': under compile='blocks' every block of a class runs one shared "
            "graph that takes the block's weights as inputs, and freezing would bake one block's weights into it. "
            "Use compile='model' with freezing=True, or freezing=False."
        )
    models = _models(pipe_or_model)
    if not models:
        raise ValueError(f"{type(pipe_or_model).__name__} holds no model with an Ascend adapter.")
    if cfg.compile == "blocks":
        for name, model in models:
            if adapter_for(model) is None:
                raise ValueError(
                    f"{name or type(model).__name__} ({type(model).__name__}) has no Ascend adapter and no "
                    "`_repeated_blocks`: use compile='model' or compile='none'."
                )
    loaded = None
    from .warm_start import install_packages, load_ascend_cache, trusted_opt_in

    trusted_opt_in(trust_remote_artifacts)  # only the bool True opts in, with or without `cache`
    if cache is not None:  # validated (and refused, for a remote source without opt-in) before anything changes
        loaded = load_ascend_cache(cache, cfg, trust_remote_artifacts=trust_remote_artifacts)
    # Matching artifacts were verified when built: pattern registration waits for a graph they lack.
    verify = loaded is None
    if probe is not None and verify:
        probe.ensure_verified()
    previous = _current_config(pipe_or_model)
    disable_ascend_compile(pipe_or_model)
    outer = _outer_compiled(pipe_or_model)
    try:
        for name, model in models:
            _enable_model(model, cfg, name, verify=verify)
            if name in outer:
                _foreign_compiles(model, name, model._ascend_state, outer=True)
        if loaded:
            install_packages(_enabled(pipe_or_model), loaded["blocks"], loaded["caches"])
        if _is_pipeline(pipe_or_model):
            pipe_or_model._ascend_config_obj = cfg
            pipe_or_model.register_to_config(**{ASCEND_CONFIG_KEY: cfg.to_dict()})
    except BaseException:
        # Leave the object and the process as they were: undo every model touched (swaps,
        # attention, compiled blocks, the recompile limit), then re-apply the previous setup.
        disable_ascend_compile(pipe_or_model)
        if previous is not None:
            enable_ascend_compile(pipe_or_model, previous)
        raise
    return pipe_or_model


def save_ascend_cache(pipe_or_model, save_directory):
    """Writes the compile artifacts of an enabled pipeline or model, after its first call, to
    `save_directory`, for `enable_ascend_compile(..., cache=save_directory)` in another process.

    With ``compile="blocks"``, this also builds one AOTInductor package per compiled block class
    and call signature (one Inductor compile each; a package that fails its check is left out with
    a warning), which a process started from these artifacts runs without tracing or compiling.
    Under ``executor="eager"`` (``compile="blocks"``) the cache holds one eager package per block
    class and signature instead: the fused graph as torch.export's program JSON (docs/warm-start.md).

    Args:
        pipe_or_model: enabled (``executor="inductor"``, or ``"eager"`` with ``compile="blocks"``),
            and called at least once.
        save_directory: a local directory (created if missing), replaced whole by the new cache;
            plain files in it that are not the cache's (a model's ``save_pretrained`` output) are
            carried over, a subdirectory is refused.

    Returns:
        The manifest written (see `diffusers_ascend.warm_start`).

    Raises:
        ValueError: `pipe_or_model` is not enabled, has compiled nothing yet, uses the eager
            executor with ``compile="model"``, nothing could be packaged (eager), torch has no
            portable compile cache (2.6, Inductor), or `save_directory` is a file or
            holds a subdirectory (checked before anything is compiled). Nothing is written then.
        OSError: writing failed (the previous cache at `save_directory` is left as it was).

    >>> import diffusers_ascend, tempfile
    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> model = tiny_flux_transformer()
    >>> diffusers_ascend.save_ascend_cache(model, tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    ValueError: FluxTransformer2DModel is not enabled: call enable_ascend_compile(..., executor='inductor') first.
    """
    from .warm_start import save_cache

    return save_cache(_enabled(pipe_or_model), save_directory, owner=type(pipe_or_model).__name__)


def package_counters(pipe_or_model) -> dict[str, int]:
    """Block packages loaded into an enabled pipeline or model (a warm start), the calls they ran,
    and the calls of a packaged block class that no package took (another signature, gradients,
    hooks), which went to the compiled path.

    Args:
        pipe_or_model: a `DiffusionPipeline` or a diffusers `ModelMixin`.

    Returns:
        ``{"packages": int, "calls": int, "passed_on": int}`` (zeros when none was loaded).

    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> package_counters(tiny_flux_transformer())
    {'packages': 0, 'calls': 0, 'passed_on': 0}
    """
    from .warm_start import count_packages

    return count_packages(_enabled(pipe_or_model))


def _current_config(pipe_or_model):
    for _, model in _models(pipe_or_model):
        state = getattr(model, "_ascend_state", None)
        if state is not None:
            return state.config
    return None


def disable_ascend_compile(pipe_or_model):
    """Restores the original modules, attention processors' backends and config (no-op if not enabled).

    >>> import diffusers_ascend
    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> model = diffusers_ascend.disable_ascend_compile(tiny_flux_transformer())
    """
    for _, model in _models(pipe_or_model):
        _disable_model(model)
    if _is_pipeline(pipe_or_model):
        pipe_or_model.__dict__.pop("_ascend_config_obj", None)
        _set_config_key(pipe_or_model, None)
    return pipe_or_model


def ascend_report(pipe_or_model):
    """The `FusionReport` merged over every enabled model of `pipe_or_model` (None if not enabled).

    Args:
        pipe_or_model: a `DiffusionPipeline` or a diffusers `ModelMixin`.

    Returns:
        `FusionReport` with pattern matches, layer swaps, compiled graphs and fallbacks, or None.

    >>> import diffusers_ascend
    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> model = diffusers_ascend.enable_ascend_compile(tiny_flux_transformer(), fusions=["rms_norm"], compile="none")
    >>> diffusers_ascend.ascend_report(model).swaps
    {'rms_norm': 6}
    """
    from .compilation import FusionReport
    from .layers import upstream_fused

    reports = []
    outer = _outer_compiled(pipe_or_model)
    for name, model in _models(pipe_or_model):
        state = getattr(model, "_ascend_state", None)
        if state is None:
            continue
        rep = FusionReport.merge([state.backend.report]) if state.backend is not None else FusionReport()
        _foreign_compiles(model, name, state, outer=name in outer)
        _recompile_limit_reached(model, name, state)
        for fb in state.fallbacks:
            rep.add_fallback(fb["module"], fb["reason"], fb.get("lost"))
        rep.record_swaps(state.swaps)
        rep.record_upstream_fused(upstream_fused(model))
        _report_attention(model, rep)
        reports.append(rep)
    return FusionReport.merge(reports) if reports else None


def _report_attention(model, rep) -> None:
    """Adds `model`'s own ``npu_fia`` calls that FIA could not take (reason and path), since enable."""
    from .attention import NPU_FIA
    from .attention.npu_fia import model_fallbacks

    if not getattr(model._ascend_state, "attention_hooks", None):
        return
    for reason, calls in model_fallbacks(model).items():
        rep.add_fallback(f"attention ({NPU_FIA})", f"{calls} call(s) fell back: {reason}")


class AscendAccelerationMixin:
    """Methods added to `diffusers.DiffusionPipeline` and `diffusers.ModelMixin` by `import diffusers_ascend`."""

    def enable_ascend_compile(self, config=None, **overrides):
        """See `diffusers_ascend.enable_ascend_compile`."""
        return enable_ascend_compile(self, config, **overrides)

    def save_ascend_cache(self, save_directory):
        """See `diffusers_ascend.save_ascend_cache`."""
        return save_ascend_cache(self, save_directory)

    def disable_ascend_compile(self):
        """See `diffusers_ascend.disable_ascend_compile`."""
        return disable_ascend_compile(self)

    def ascend_report(self):
        """See `diffusers_ascend.ascend_report`."""
        return ascend_report(self)


def _wrap_from_pretrained(cls, is_pipeline: bool) -> None:
    orig = cls.__dict__["from_pretrained"].__func__
    if getattr(orig, "_ascend_wrapped", False):
        return

    @functools.wraps(orig)
    def from_pretrained(klass, *args, ascend_config=None, **kwargs):
        if not is_pipeline and _LOADING_PIPELINE.get():
            return orig(klass, *args, **kwargs)
        token = _LOADING_PIPELINE.set(True) if is_pipeline else None
        try:
            obj = orig(klass, *args, **kwargs)
        finally:
            if token is not None:
                _LOADING_PIPELINE.reset(token)
        if ascend_config is False:  # the saved key stays in the configs (a re-save keeps it); nothing is applied
            return obj
        if ascend_config is None:
            try:
                ascend_config = _saved_config(obj)
            except ValueError as e:
                sep = " " if str(e).endswith((".", "?")) else ". "
                raise ValueError(
                    f"{e}{sep}Load without it with from_pretrained(..., ascend_config=False), or replace it with "
                    "ascend_config=AscendConfig(...)."
                ) from e
        if ascend_config is not None:
            enable_ascend_compile(obj, ascend_config)
        return obj

    from_pretrained._ascend_wrapped = True
    setattr(cls, "from_pretrained", classmethod(from_pretrained))


def _saved_config(obj):
    """The `AscendConfig` saved in the first adapted model's config, loaded as data (None if absent).

    Raises:
        ValueError: the saved value is not an object of valid fields; names the model.
    """
    from .config import AscendConfig

    for name, model in _models(obj):
        saved = model.config.get(ASCEND_CONFIG_KEY) if hasattr(model, "config") else None
        if saved is None or (isinstance(saved, dict) and not saved):
            continue
        origin = dc.config_origin(model) or getattr(obj, "name_or_path", None)
        where = f"{type(model).__name__}{f' ({name})' if name else ''}" + (f" loaded from {origin!r}" if origin else "")
        return AscendConfig.from_dict(saved, source=f"`{ASCEND_CONFIG_KEY}` of the {where}")
    return None


def patch_class(cls, is_pipeline: bool) -> None:
    """Adds `AscendAccelerationMixin`'s methods to `cls` (DiffusionPipeline or ModelMixin) and wraps its `from_pretrained`."""
    for meth in ("enable_ascend_compile", "disable_ascend_compile", "ascend_report", "save_ascend_cache"):
        if not hasattr(cls, meth):
            setattr(cls, meth, AscendAccelerationMixin.__dict__[meth])
    _wrap_from_pretrained(cls, is_pipeline)

