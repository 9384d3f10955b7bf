"""`enable_ascend_compile` / `disable_ascend_compile` / `ascend_report` / `save_ascend_cache` /
`package_counters` for diffusers pipelines and models.

State lives on each model (`state.EnabledModel`); enable is all-or-nothing
(docs/configuration.md#enable-is-all-or-nothing).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .. import _diffusers_compat as dc
from ..attention.setup import report_attention, restore_attention, set_attention
from ..enabled import ASCEND_CONFIG_KEY, EnabledModel, state_of
from .block_compile import Backends, compile_in_place, is_ours
from .diagnostics import (
    foreign_compiles,
    foreign_processors,
    mark_runs,
    note_missing_blocks,
    note_unswapped,
    recompile_limit_reached,
    remove_run_markers,
)
from .limits import DYNAMO_DEFAULT_RECOMPILE_LIMIT, hold_recompile_limit, release_recompile_limit
from .models import is_pipeline, models_of, outer_compiled, set_config_key

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline, ModelMixin

    from ..compilation import FusionReport
    from ..config import AscendConfig

# A pipeline or a model; the entry points that return it return the object they were given.
PipeOrModel = TypeVar("PipeOrModel", bound="DiffusionPipeline | ModelMixin")


def enable_model(model: torch.nn.Module, cfg: AscendConfig, name: str = "", verify: bool = True) -> None:
    """Enables `model`; its record is stored first, so a failure half-way can be undone by `disable_model`."""
    from ..adapters import adapter_for
    from ..adapters.registry import adapter_swaps
    from ..compilation._compat import compiled_blocks_share_graphs
    from ..layers import apply_swaps

    adapter = adapter_for(model)
    compiled_call = Backends.of(model).get(cfg, verify) if cfg.compile != "none" else None
    state = EnabledModel(
        cfg, compiled_call.backend if compiled_call is not None else None, model_class=type(model).__name__
    )
    if compiled_call is not None:
        state.signatures, state.compiled_call = compiled_call.signatures, compiled_call
    # Block packages (`save_ascend_cache`): AOTInductor ones run uncaptured, eager ones under capture too.
    state.record_signatures = (
        cfg.compile == "blocks"
        and not cfg.freezing
        and state.backend is not None
        and (state.backend.executor == "eager" or state.backend.graph_capture is None)
    )
    model._ascend_state = state
    unswapped: list[tuple[str, str, str, str | None]] = []
    state.swapped, state.swaps = apply_swaps(model, cfg.resolved_fusions(), skipped=unswapped, extra=adapter_swaps())
    unswapped += foreign_processors(model, adapter, cfg.resolved_fusions(), state.swapped, unswapped)
    note_unswapped(state, model, name, unswapped)
    set_attention(model, cfg, state)
    # Blocks compiled in place share `Module._call_impl`, hence one recompile budget, past which
    # dynamo silently runs eager: each block class gets the default, plus one per block where
    # dynamo may compile every instance on its own (torch < 2.8).
    found, missing = adapter.block_modules(model) if cfg.compile == "blocks" else ([], [])
    per_blocks = None
    if cfg.compile == "blocks":
        per_blocks = DYNAMO_DEFAULT_RECOMPILE_LIMIT * len(adapter.blocks)
        per_blocks += 0 if compiled_blocks_share_graphs() else len(found)
    hold_recompile_limit(state, cfg.recompile_limit or per_blocks)
    note_missing_blocks(state, model, name, adapter, missing)
    if found and not compiled_blocks_share_graphs():
        from ..processors import share_processors

        # torch < 2.8 guards on each block's processor object: one object per position, one graph.
        state.shared = share_processors(sub for _, sub in found)
    for sub_name, sub in found:
        compile_in_place(sub, f"{name + '.' if name else ''}{sub_name}", state, cfg)
    if cfg.compile == "model":
        compile_in_place(model, name, state, cfg)
    if state.compiled:
        mark_runs(model, state)
    foreign_compiles(model, name, state)  # e.g. MagCache applied before enabling
    model.register_to_config(**{ASCEND_CONFIG_KEY: cfg.to_dict()})


def enabled(pipe_or_model) -> dict[str, EnabledModel]:
    """The records of the enabled models of `pipe_or_model`, by component name (``""`` for a
    model alone): what the enable path hands to warm start."""
    out = {}
    for name, model in models_of(pipe_or_model):
        state = state_of(model)
        if state is not None:
            out[name] = state
    return out


def disable_model(model: torch.nn.Module) -> None:
    state = state_of(model)
    if state is None:
        return
    from ..layers import restore_swaps
    from ..processors import unshare_processors
    from .block_compile import restore_hooks

    for m in state.compiled:
        restore_hooks(m)  # hooks whose call of the block's forward was rerouted to our compiled forward
        if is_ours(m, state):  # another compile since is the user's
            m._compiled_call_impl = None
    if state.backend is not None and state.backend.graph_capture is not None:
        state.backend.graph_capture.clear()  # device memory back; an enable again captures anew
    unshare_processors(getattr(state, "shared", []))  # a record pickled before this field has none
    restore_swaps(state.swapped)
    restore_attention(state)
    remove_run_markers(model)
    del model._ascend_state
    set_config_key(model, None)
    release_recompile_limit(state)


def enable_ascend_compile(
    pipe_or_model: PipeOrModel,
    config: AscendConfig | dict[str, Any] | str | os.PathLike[str] | None = None,
    *,
    cache: str | os.PathLike[str] | None = None,
    trust_remote_artifacts: bool = False,
    **overrides: Any,
) -> PipeOrModel:
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
    from ..config import AscendConfig

    cfg = AscendConfig.coerce(config, **overrides)  # validates before anything changes
    dc.check_diffusers()  # every private diffusers name we use, before anything changes
    probe = None
    if cfg.compile != "none":
        from ..compilation import AscendBackend

        cfg.check_enable()  # every rule on these settings (config.py), before anything changes
        probe = AscendBackend(cfg, verify=False)  # ensure_verified below
    from ..adapters import adapter_for

    models = models_of(pipe_or_model)
    if not models:
        raise ValueError(f"{type(pipe_or_model).__name__} holds no model with an Ascend adapter.")
    if cfg.compile == "blocks":
        for name, model in models:
            if adapter_for(model) is None:
                raise ValueError(
                    f"{name or type(model).__name__} ({type(model).__name__}) has no Ascend adapter and no "
                    "`_repeated_blocks`: use compile='model' or compile='none'."
                )
    from .quantization import check_quantized_weights

    for name, model in models:  # quantized weights whose scales do not fit: refused before anything changes
        check_quantized_weights(model, name)
    loaded = None
    from ..warm_start import install_packages, load_ascend_cache, trusted_opt_in

    trusted_opt_in(trust_remote_artifacts)  # only the bool True opts in, with or without `cache`
    if cache is not None:  # validated (and refused, for a remote source without opt-in) before anything changes
        loaded = load_ascend_cache(cache, cfg, trust_remote_artifacts=trust_remote_artifacts)
    # Matching artifacts were verified when built: pattern registration waits for a graph they lack.
    verify = loaded is None
    if probe is not None and verify:
        probe.ensure_verified()
    previous = _current_config(pipe_or_model)
    disable_ascend_compile(pipe_or_model)
    outer = outer_compiled(pipe_or_model)
    try:
        for name, model in models:
            enable_model(model, cfg, name, verify=verify)
            if name in outer:
                foreign_compiles(model, name, model._ascend_state, outer=True)
        if loaded:
            install_packages(enabled(pipe_or_model), loaded.blocks, loaded.caches)
        if is_pipeline(pipe_or_model):
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


def save_ascend_cache(
    pipe_or_model: DiffusionPipeline | ModelMixin, save_directory: str | os.PathLike[str]
) -> dict[str, Any]:
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
    from ..warm_start import save_cache

    return save_cache(enabled(pipe_or_model), save_directory, owner=type(pipe_or_model).__name__)


def package_counters(pipe_or_model: DiffusionPipeline | ModelMixin) -> dict[str, int]:
    """Block packages loaded into an enabled pipeline or model (a warm start), the calls they ran,
    and the calls of a packaged block class that no package took (another signature, gradients,
    hooks), which went to the compiled path.

    Args:
        pipe_or_model: a `DiffusionPipeline` or a diffusers `ModelMixin`.

    Returns:
        ``{"packages": int, "calls": int, "passed_on": int}`` (zeros when none was loaded).

    >>> from diffusers_ascend.integration import package_counters
    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> package_counters(tiny_flux_transformer())
    {'packages': 0, 'calls': 0, 'passed_on': 0}
    """
    from ..warm_start import count_packages

    return count_packages(enabled(pipe_or_model))


def _current_config(pipe_or_model) -> AscendConfig | None:
    for _, model in models_of(pipe_or_model):
        state = state_of(model)
        if state is not None:
            return state.config
    return None


def disable_ascend_compile(pipe_or_model: PipeOrModel) -> PipeOrModel:
    """Restores the original modules, attention processors' backends and config (no-op if not enabled).

    Args:
        pipe_or_model: a `DiffusionPipeline` or a diffusers `ModelMixin`.

    Returns:
        `pipe_or_model`.

    >>> import diffusers_ascend
    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> model = diffusers_ascend.disable_ascend_compile(tiny_flux_transformer())
    """
    for _, model in models_of(pipe_or_model):
        disable_model(model)
    if is_pipeline(pipe_or_model):
        pipe_or_model.__dict__.pop("_ascend_config_obj", None)
        set_config_key(pipe_or_model, None)
    return pipe_or_model


def ascend_report(pipe_or_model: DiffusionPipeline | ModelMixin) -> FusionReport | None:
    """The `FusionReport` merged over every enabled model of `pipe_or_model`; for one that was not
    enabled but compiled with ``backend="ascend"`` (``torch.compile`` or ``compile_repeated_blocks``),
    the report of those compiles (`compiled_report`); None if neither.

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
    from ..compilation import FusionReport
    from ..layers import upstream_fused
    from .quantization import unfused_schemes

    reports = []
    outer = outer_compiled(pipe_or_model)
    for name, model in models_of(pipe_or_model):
        state = state_of(model)
        if state is None:
            continue
        rep = FusionReport.merge([state.backend.report]) if state.backend is not None else FusionReport()
        foreign_compiles(model, name, state, outer=name in outer)
        recompile_limit_reached(model, name, state)
        rep.fallbacks.extend(state.fallbacks)  # frozen records: shared
        rep.record_swaps(state.swaps)
        rep.record_upstream_fused(upstream_fused(model))
        rep.record_unfused_quantization(unfused_schemes(model, state.backend.fusions if state.backend else ()))
        report_attention(model, state, rep)
        reports.append(rep)
    if reports:
        return FusionReport.merge(reports)
    from ..compilation.named_backend import compiled_report

    return compiled_report(pipe_or_model)
