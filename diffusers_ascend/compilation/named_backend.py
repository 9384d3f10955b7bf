"""The backend by name: ``torch.compile(module, backend="ascend", options={...})``.

The package declares ``ascend`` in the ``torch_dynamo_backends`` entry points (pyproject.toml), so
torch finds `ascend_backend` in a process that never imported diffusers_ascend, as it finds
torch_npu's ``npugraph_ex``; dynamo's ``list_backends`` lists it. ``options`` are the
`AscendConfig` fields a backend uses (`OPTIONS`), validated by the config's own rules.

What a backend by name cannot do that `enable_ascend_compile` does (layer swaps, attention, per-block
fallback, warm start, recompile limits) is listed side by side in docs/named-backend.md.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import config as _config
from . import _compat

if TYPE_CHECKING:
    import torch

    from .backend import AscendBackend
    from .report import FusionReport

__all__ = [
    "NOT_BY_NAME",
    "OPTIONS",
    "ascend_backend",
    "backend_from_options",
    "compiled_report",
    "options_config",
]

# The AscendConfig fields a backend by name takes in `options`: those `AscendBackend` reads.
OPTIONS = (
    "fusions",
    "executor",
    "mode",
    "graph_capture",
    "safe_output",
    "freezing",
    "max_captured_graphs",
    "graph_log_dir",
    "on_error",
)
# The other fields, and why a backend (which only ever sees graphs) cannot honour them.
NOT_BY_NAME = types.MappingProxyType(
    {
        "attention": "it sets the attention backend of the model's processors, which a backend never sees; "
        "use enable_ascend_compile(attention=...) or diffusers' model.set_attention_backend(...)",
        "compile": "it chooses what enable_ascend_compile compiles; by name you choose that yourself "
        "(torch.compile(model, ...) or model.compile_repeated_blocks(...))",
        "dynamic": "it is torch.compile's own argument: torch.compile(..., dynamic=...)",
        "fullgraph": "it is torch.compile's own argument: torch.compile(..., fullgraph=...)",
        "recompile_limit": "dynamo keeps it process-wide, and enable_ascend_compile raises it only while a model "
        "needs it; by name set torch._dynamo.config.recompile_limit yourself",
    }
)
# Attribute set on the torch.compile wrapper a backend by name serves: one AscendBackend (and one
# report) per torch.compile call, living as long as the wrapper (no registry of ours keeps it).
_BACKEND_ATTR = "_diffusers_ascend_backend"
# The AscendBackends made by name that are alive, for `ascend_backend.reset` (torch.compiler.reset()).
_LIVE: weakref.WeakSet = weakref.WeakSet()


def options_config(options: Mapping[str, Any] | None = None, *, mode: str | None = None) -> _config.AscendConfig:
    """The `AscendConfig` of ``torch.compile(..., backend="ascend", options=options)``, validated as
    `enable_ascend_compile` validates its settings, plus what this platform cannot run.

    Args:
        options: `OPTIONS` names and their values, or None (the defaults: note that
            ``fusions="auto"`` fuses nothing on a CPU host).
        mode: torch.compile's ``mode=`` (the Inductor mode; torch refuses it together with ``options``).

    Returns:
        `AscendConfig` with ``compile="model"``: the fields not in `OPTIONS` keep their defaults.

    Raises:
        TypeError: ``options`` is not a dict, a key is not a string, a name is unknown, or a value
            has the wrong type; the message names it and the valid choices.
        ValueError: a value out of range, settings that contradict each other, a field only
            `enable_ascend_compile` can apply (`NOT_BY_NAME`, with the reason), or what this
            platform cannot run (e.g. graph capture on a CPU host).

    >>> from diffusers_ascend.compilation.named_backend import options_config
    >>> options_config({"fusions": ["rope", "rms_norm"], "executor": "eager"}).fusions
    ('rms_norm', 'rope')
    >>> options_config({"fusion": "all"})
    Traceback (most recent call last):
    ...
    TypeError: backend='ascend': unknown option(s) ['fusion']; valid: ... Did you mean 'fusions'?
    """
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TypeError(
            f"backend='ascend': options must be a dict of {list(OPTIONS)}, got {type(options).__name__} "
            f"{_config._short(options)}"
        )
    fields = dict(options)
    bad_keys = [k for k in fields if not isinstance(k, str)]
    if bad_keys:
        raise TypeError(f"backend='ascend': option names must be strings, got {bad_keys!r}; valid: {list(OPTIONS)}")
    enable_only = [k for k in fields if k in NOT_BY_NAME]
    if enable_only:
        reasons = "; ".join(f"{k!r}: {NOT_BY_NAME[k]}" for k in enable_only)
        raise ValueError(
            f"backend='ascend' cannot take option(s) {enable_only} ({reasons}). Options by name: {list(OPTIONS)}; "
            "enable_ascend_compile takes every AscendConfig field (docs/named-backend.md)."
        )
    unknown = [k for k in fields if k not in OPTIONS]
    if unknown:
        hints = "".join(_config._closest(k, OPTIONS) for k in unknown)
        raise TypeError(f"backend='ascend': unknown option(s) {unknown}; valid: {list(OPTIONS)}.{hints}")
    if mode is not None:
        if "mode" in fields:  # torch refuses mode= with options=, but a direct call may pass both
            raise ValueError(
                "backend='ascend': mode given twice (torch.compile's mode= and options['mode']); give one."
            )
        fields["mode"] = mode
    try:
        cfg = _config.AscendConfig(compile="model", **fields)  # every field's rule, and the contradictions
        cfg.check_backend()  # what the current platform cannot run (graph capture on a CPU host, ...)
    except (TypeError, ValueError) as e:
        raise type(e)(f"backend='ascend': {e}") from None
    return cfg


def backend_from_options(
    options: Mapping[str, Any] | None = None, *, mode: str | None = None, verify: bool = True
) -> AscendBackend:
    """An `AscendBackend` configured as ``torch.compile(..., backend="ascend", options=options)`` would
    be, for stacks that pass backend objects (as cache-dit passes MindIE SD's ``MindieSDBackend()``).
    Unlike the name, it validates now and can be shared across several torch.compile calls.

    Args:
        options: `OPTIONS` names and their values (see `options_config`).
        mode: the Inductor mode (torch.compile's ``mode=``).
        verify: check the torch APIs and probe every pattern now (see `AscendBackend`).

    Returns:
        `AscendBackend`; its ``report`` covers every graph it compiles.

    Raises:
        TypeError / ValueError: as `options_config`.

    >>> import torch
    >>> from diffusers_ascend.compilation.named_backend import backend_from_options
    >>> backend = backend_from_options({"fusions": ["rms_norm"], "executor": "eager"})
    >>> norm = torch.compile(torch.nn.RMSNorm(8), backend=backend)
    >>> _ = norm(torch.randn(2, 8))
    >>> backend.report.matches["rms_norm"]
    1
    """
    from .backend import AscendBackend

    return AscendBackend(options_config(options, mode=mode), verify=verify)


def ascend_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    *,
    options: Mapping[str, Any] | None = None,
    mode: str | None = None,
    **kwargs: Any,
) -> Callable:
    """The backend torch finds by the name ``"ascend"`` (entry point in ``torch_dynamo_backends``).

    Dynamo calls it once per graph; every graph of one torch.compile call goes to one `AscendBackend`
    (made at the first graph, after ``options`` are validated; nothing is compiled when they are
    invalid), so one report covers a compile. Read it with `compiled_report`.

    Args:
        gm: the graph dynamo traced.
        example_inputs: its example inputs.
        options: torch.compile's ``options=``: `OPTIONS` names and their values (`options_config`).
        mode: torch.compile's ``mode=`` (the Inductor mode).
        **kwargs: what newer torch releases add to a backend call: ``name`` (torch.compile's
            ``name=``, 2.15) labels the graphs in the report; anything else is refused.

    Returns:
        The compiled callable of `gm`.

    Raises:
        TypeError / ValueError: invalid ``options`` (`options_config`); dynamo reports it as a
            ``BackendCompilerFailed`` naming the backend, with this message.

    >>> import torch
    >>> import diffusers_ascend
    >>> norm = torch.nn.RMSNorm(8)
    >>> compiled = torch.compile(norm, backend="ascend", options={"fusions": ["rms_norm"], "executor": "eager"})
    >>> _ = compiled(torch.randn(2, 8))
    >>> diffusers_ascend.compiled_report(compiled).matches["rms_norm"]
    1
    """
    name = kwargs.pop("name", None)
    if kwargs:
        raise TypeError(
            f"backend='ascend' got torch.compile argument(s) {sorted(kwargs)} it does not know; it takes "
            "options=, mode= and name=."
        )
    wrapper = _compat.calling_compile_wrapper()
    backend = getattr(wrapper, _BACKEND_ATTR, None) if wrapper is not None else None
    if backend is None:
        backend = backend_from_options(options, mode=mode, verify=False)  # verified at its first graph
        _LIVE.add(backend)
        if wrapper is not None:
            setattr(wrapper, _BACKEND_ATTR, backend)
    if name is None:
        return backend(gm, example_inputs)
    from .backend import graph_label

    token = graph_label.set(graph_label.get() or str(name))
    try:
        return backend(gm, example_inputs)
    finally:
        graph_label.reset(token)


def _reset() -> None:
    # torch.compiler.reset() calls `reset` on each compile wrapper, which calls it here: the graphs
    # of every backend by name are gone, so are their device graphs.
    for backend in list(_LIVE):
        backend.reset()


ascend_backend.reset = _reset


def named_backends(obj: Any) -> list[AscendBackend]:
    """The `AscendBackend`s that ``backend="ascend"`` made for `obj` and its submodules, each once."""
    import torch

    candidates = []
    if hasattr(obj, "components") and isinstance(getattr(obj, "components", None), Mapping):  # a pipeline
        candidates.extend(v for v in obj.components.values() if isinstance(v, torch.nn.Module))
    else:
        candidates.append(obj)
    found: dict[int, Any] = {}
    for item in candidates:
        compiled = [item]
        if isinstance(item, torch.nn.Module):
            for module in item.modules():
                compiled.append(module)
                # module.compile() keeps its compiled call here; stacks that compile a bound forward
                # (vLLM-Omni's regional compile, xDiT) set it on the instance as `forward`.
                for attr in ("_compiled_call_impl", "forward"):
                    call = module.__dict__.get(attr)
                    if call is not None:
                        compiled.append(call)
        for c in compiled:
            backend = getattr(_compat.compile_wrapper_of(c), _BACKEND_ATTR, None)
            if backend is not None:
                found.setdefault(id(backend), backend)
    return list(found.values())


def compiled_report(obj: Any) -> FusionReport | None:
    """The `FusionReport` of what ``torch.compile(..., backend="ascend")`` compiled for `obj`: merged
    over the backends of `obj` and of its submodules (e.g. the blocks ``compile_repeated_blocks``
    compiles in place), or None when none was compiled by name.

    Graphs are reported when compiled, so call it after the first forward. Blocks compiled by equal
    torch.compile calls share dynamo's code: a graph is counted once, in the backend that compiled it.

    Args:
        obj: an ``OptimizedModule`` (``torch.compile(module)``), a module (its submodules compiled with
            ``module.compile`` count), a ``DiffusionPipeline`` (its components), or a function
            torch.compile returned.

    Returns:
        `FusionReport` or None.

    >>> import torch
    >>> import diffusers_ascend
    >>> from diffusers_ascend.tiny import tiny_flux_transformer, flux_model_inputs
    >>> model = tiny_flux_transformer()
    >>> model.compile_repeated_blocks(backend="ascend", options={"fusions": "all", "executor": "eager"})
    >>> with torch.no_grad():
    ...     _ = model(**flux_model_inputs())
    >>> diffusers_ascend.compiled_report(model).matches["rms_norm"]
    6
    """
    from .report import FusionReport

    backends = named_backends(obj)
    return FusionReport.merge(b.report for b in backends) if backends else None
