"""`enable_ascend_compile` / `disable_ascend_compile` / `ascend_report` for diffusers pipelines and models.

Per-object state lives on the object (`_ascend_state`); nothing here is process-global except
`torch._dynamo.config.recompile_limit`, which dynamo itself keeps process-wide: it is only ever
raised (to `config.recompile_limit`), never lowered.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from typing import Any

import torch

ASCEND_CONFIG_KEY = "_ascend_config"
_DYNAMO_DEFAULT_RECOMPILE_LIMIT = 8
# Set while a pipeline loads its components, so each model's from_pretrained does not apply the
# config a second time (the pipeline applies it once at the end).
_LOADING_PIPELINE = contextvars.ContextVar("diffusers_ascend_loading_pipeline", default=False)


class _State:
    def __init__(self, config, backend):
        self.config = config
        self.backend = backend
        self.compiled: list[torch.nn.Module] = []
        self.fallbacks: list[dict[str, str]] = []
        self.attention: dict[Any, Any] | None = None  # processor -> its previous _attention_backend
        self.swapped: list[tuple[object, type]] = []  # (object, original class), see layers.apply_swaps
        self.swaps: dict[str, int] = {}


def _is_pipeline(obj) -> bool:
    from diffusers import DiffusionPipeline

    return isinstance(obj, DiffusionPipeline)


def _models(obj) -> list[tuple[str, torch.nn.Module]]:
    """The models of `obj` that have an adapter: the model itself, or a pipeline's transformers."""
    from .adapters import adapter_for

    if not _is_pipeline(obj):
        return [("", obj)]
    out = []
    for name, comp in obj.components.items():
        if isinstance(comp, torch.nn.Module) and adapter_for(comp) is not None:
            out.append((name, comp))
    return out


def _set_config_key(obj, value) -> None:
    from diffusers.configuration_utils import FrozenDict

    d = dict(obj._internal_dict)
    if value is None:
        d.pop(ASCEND_CONFIG_KEY, None)
    else:
        d[ASCEND_CONFIG_KEY] = value
    obj._internal_dict = FrozenDict(d)


def _raise_recompile_limit(limit) -> None:
    if limit is None:
        return
    from .compilation._compat import dynamo_recompile_limit, set_dynamo_recompile_limit

    if dynamo_recompile_limit() < limit:  # process-global in dynamo: only ever raised
        set_dynamo_recompile_limit(limit)


def _compile_in_place(module: torch.nn.Module, name: str, state: _State, cfg) -> None:
    """Like `module.compile(...)` (no `_orig_mod.` keys), with per-module fallback at first call."""
    from .compilation._compat import TorchCompatError
    from .compilation.backend import describe_failure, graph_label, root_cause

    compiled = torch.compile(module._call_impl, backend=state.backend, dynamic=cfg.dynamic, fullgraph=cfg.fullgraph)
    label = type(module).__name__
    if cfg.freezing:  # dynamo lifts weights into the graph only under this flag; set for our calls only
        from .compilation._compat import inductor_freezing_scope

        scope = inductor_freezing_scope
    else:
        scope = contextlib.nullcontext

    @functools.wraps(module._call_impl)
    def call(*args, **kwargs):
        token = graph_label.set(label)
        first_graph = len(state.backend.report.graphs)  # graphs compiled from here on belong to this call
        try:
            with scope():
                return compiled(*args, **kwargs)
        except Exception as e:
            if isinstance(root_cause(e), TorchCompatError):
                raise root_cause(e) from e  # a broken engine is never a per-block fallback
            if cfg.on_error == "raise":
                raise
            # Eager first: if the module fails there too, the error is the model's own (bad
            # inputs, ...) and propagates as without compilation; the block stays compiled.
            out = module._call_impl(*args, **kwargs)
            reason = describe_failure(e)
            warnings.warn(f"diffusers_ascend: {name or type(module).__name__} failed to compile, running eager ({reason})")
            # The graphs compiled for this call never run: stop counting their matches.
            lost = state.backend.report.discard_graphs(first_graph)
            entry = {"module": name or type(module).__name__, "reason": reason}
            if lost:
                entry["lost"] = lost
            state.fallbacks.append(entry)
            module._compiled_call_impl = None
            return out
        finally:
            graph_label.reset(token)

    module._compiled_call_impl = call
    state.compiled.append(module)


def _set_attention(model, cfg, state: _State) -> None:
    from .platform import current_platform

    backend = cfg.attention
    if backend == "auto":
        backend = "_native_npu" if current_platform() == "npu" else None
    if backend is None or not hasattr(model, "set_attention_backend"):
        return
    procs = {}
    for m in model.modules():
        p = getattr(m, "processor", None)
        if p is not None and hasattr(p, "_attention_backend"):
            procs[p] = p._attention_backend
    state.attention = procs
    model.set_attention_backend(backend)


def _enable_model(model, cfg, name: str = "") -> None:
    """Enables `model`; its state is recorded first, so a failure half-way can be undone by `_disable_model`."""
    from .adapters import adapter_for
    from .compilation import AscendBackend
    from .layers import apply_swaps

    adapter = adapter_for(model)
    backend = AscendBackend(cfg) if cfg.compile != "none" else None
    state = _State(cfg, backend)
    model._ascend_state = state
    state.swapped, state.swaps = apply_swaps(model, cfg.resolved_fusions())
    _set_attention(model, cfg, state)
    # Every block compiled in place shares the code object `Module._call_impl`, hence one dynamo
    # cache and one recompile budget for all block classes: a Flux model spends 6 of the default 8
    # entries after one resolution change (FINDINGS section 3), and past the limit dynamo silently
    # runs eager. So under compile="blocks" each block class gets the default budget.
    per_blocks = _DYNAMO_DEFAULT_RECOMPILE_LIMIT * len(adapter.blocks) if cfg.compile == "blocks" else None
    _raise_recompile_limit(cfg.recompile_limit or per_blocks)
    if cfg.compile == "blocks":
        found, missing = adapter.block_modules(model)
        for block in missing:  # e.g. a `_repeated_blocks` name this config does not build
            reason = (f"block class {block!r} named by the {adapter.name!r} adapter matches no submodule of "
                      f"{type(model).__name__}: nothing of it is compiled")
            warnings.warn(f"diffusers_ascend: {name or type(model).__name__}: {reason}")
            state.fallbacks.append({"module": f"{name + '.' if name else ''}<{block}>", "reason": reason})
        for sub_name, sub in found:
            _compile_in_place(sub, f"{name + '.' if name else ''}{sub_name}", state, cfg)
    elif cfg.compile == "model":
        _compile_in_place(model, name, state, cfg)
    model.register_to_config(**{ASCEND_CONFIG_KEY: cfg.to_dict()})


def _disable_model(model) -> None:
    state = getattr(model, "_ascend_state", None)
    if state is None:
        return
    from .layers import restore_swaps

    for m in state.compiled:
        m._compiled_call_impl = None
    restore_swaps(state.swapped)
    if state.attention is not None:
        for proc, prev in state.attention.items():
            proc._attention_backend = prev
    del model._ascend_state
    _set_config_key(model, None)


def enable_ascend_compile(pipe_or_model, config=None, **overrides):
    """Accelerates a diffusers pipeline or model for Ascend: fusion backend, per-block compile, attention.

    Enabling again replaces the previous configuration (it never stacks).

    Args:
        pipe_or_model: a `DiffusionPipeline` or a diffusers `ModelMixin`.
        config: `AscendConfig` | dict | local directory | Hub repo id | None (defaults).
        **overrides: `AscendConfig` fields replacing those of `config`.

    Returns:
        `pipe_or_model`.

    >>> import diffusers_ascend
    >>> from diffusers_ascend.tiny import tiny_flux_pipeline
    >>> pipe = diffusers_ascend.enable_ascend_compile(tiny_flux_pipeline(), executor="eager")
    """
    from .config import AscendConfig

    cfg = AscendConfig.coerce(config, **overrides)  # validates before anything changes
    if cfg.compile != "none":
        from .compilation import AscendBackend

        AscendBackend(cfg)  # constructor errors (freezing, graph_capture) before anything changes
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
    previous = _current_config(pipe_or_model)
    disable_ascend_compile(pipe_or_model)
    try:
        for name, model in models:
            _enable_model(model, cfg, name)
    except BaseException:
        # Leave the object as it was: undo every model touched, then re-apply the previous setup.
        disable_ascend_compile(pipe_or_model)
        if previous is not None:
            enable_ascend_compile(pipe_or_model, previous)
        raise
    if _is_pipeline(pipe_or_model):
        pipe_or_model._ascend_config_obj = cfg
        pipe_or_model.register_to_config(**{ASCEND_CONFIG_KEY: cfg.to_dict()})
    return pipe_or_model


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

    reports = []
    for _, model in _models(pipe_or_model):
        state = getattr(model, "_ascend_state", None)
        if state is None:
            continue
        rep = FusionReport.merge([state.backend.report]) if state.backend is not None else FusionReport()
        for fb in state.fallbacks:
            rep.add_fallback(fb["module"], fb["reason"], fb.get("lost"))
        rep.record_swaps(state.swaps)
        reports.append(rep)
    return FusionReport.merge(reports) if reports else None


class AscendAccelerationMixin:
    """Methods added to `diffusers.DiffusionPipeline` and `diffusers.ModelMixin` by `import diffusers_ascend`."""

    def enable_ascend_compile(self, config=None, **overrides):
        """See `diffusers_ascend.enable_ascend_compile`."""
        return enable_ascend_compile(self, config, **overrides)

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
            ascend_config = _saved_config(obj)
        if ascend_config is not None:
            enable_ascend_compile(obj, ascend_config)
        return obj

    from_pretrained._ascend_wrapped = True
    setattr(cls, "from_pretrained", classmethod(from_pretrained))


def _saved_config(obj):
    for _, model in _models(obj):
        saved = model.config.get(ASCEND_CONFIG_KEY) if hasattr(model, "config") else None
        if saved:
            return dict(saved)
    return None


def patch_class(cls, is_pipeline: bool) -> None:
    """Adds `AscendAccelerationMixin`'s methods to `cls` (DiffusionPipeline or ModelMixin) and wraps its `from_pretrained`."""
    for meth in ("enable_ascend_compile", "disable_ascend_compile", "ascend_report"):
        if not hasattr(cls, meth):
            setattr(cls, meth, AscendAccelerationMixin.__dict__[meth])
    _wrap_from_pretrained(cls, is_pipeline)

