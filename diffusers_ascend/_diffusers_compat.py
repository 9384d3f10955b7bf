"""The one place that knows diffusers' private names: every private diffusers import and attribute.

diffusers-ascend subclasses diffusers' attention processors, registers a backend with its attention
dispatcher, sets processors' backends without touching its process-wide default, and records its
settings in model configs: all through names diffusers does not promise to keep. Each such name is
here, once, looked up by feature (does the attribute exist), never by version string.

Supported: `DIFFUSERS_FLOOR` to `DIFFUSERS_NEWEST_VERIFIED` (docs/support-matrix.md). At enable time
`check_diffusers` looks every name up (`enable_ascend_compile` calls it before a model is touched): a
diffusers where one moved raises `DiffusersCompatError` naming the installed release, the missing
name and the supported range, instead of diffusers' own ImportError or an AttributeError mid-run.
Nothing here imports diffusers (or torch) at import time: `import diffusers_ascend` stays light.

>>> from diffusers_ascend._diffusers_compat import supported_range
>>> supported_range()
'0.36 to 0.42.x'
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "DIFFUSERS_FLOOR",
    "DIFFUSERS_NEWEST_VERIFIED",
    "MODEL_BASE",
    "PIPELINE_BASE",
    "PRIVATE_NAMES",
    "DiffusersCompatError",
    "attention_backend",
    "check_backend_requirements",
    "check_diffusers",
    "config_origin",
    "context_parallel_backends",
    "default_processor_class",
    "diffusers_found_torch_npu",
    "diffusers_version",
    "dispatches_attention",
    "is_diffusers_config",
    "keep_in_fp32_modules",
    "hook_forward_refs",
    "rebind_hooked_forward",
    "module_hooks",
    "parallel_config",
    "private_attributes",
    "register_attention_backend",
    "repeated_blocks",
    "require",
    "set_attention_backend",
    "set_config_entry",
    "support_status",
    "supported_range",
    "supports_context_parallel",
    "templated_context_parallel_attention",
]

# Floor: the first release with every name below (0.35 lacks diffusers' context parallelism:
# `_templated_context_parallel_attention`, processors' `_parallel_config`, `register(...,
# supports_context_parallel=)`, `_maybe_download_kernel_for_backend`). pyproject's `diffusers>=`
# agrees (tests/test_diffusers_compat.py).
DIFFUSERS_FLOOR: tuple[int, int] = (0, 36)
# Newest release the suite has run on. Newer releases get one warning, then the name checks.
DIFFUSERS_NEWEST_VERIFIED: tuple[int, int] = (0, 42)

# Where `import diffusers_ascend` waits for diffusers to define the classes it patches (module, class).
PIPELINE_BASE = ("diffusers.pipelines.pipeline_utils", "DiffusionPipeline")
_PIPELINES_PACKAGE = PIPELINE_BASE[0].rpartition(".")[0]  # where every pipeline class is defined
MODEL_BASE = ("diffusers.models.modeling_utils", "ModelMixin")

_DISPATCH = "diffusers.models.attention_dispatch"
_FLUX = "diffusers.models.transformers.transformer_flux"
_WAN = "diffusers.models.transformers.transformer_wan"
# What we use -> ``"module:attribute[.attribute]"``. Every lookup (`require`) and the enable-time
# check (`check_diffusers`) read this table; tests/test_architecture.py reads it too, to refuse any of
# these names outside this module.
PRIVATE_NAMES: dict[str, str] = {
    # Not private, but where `import diffusers_ascend` patches them: a move would leave them unpatched.
    "pipeline base class": ":".join(PIPELINE_BASE),
    "model base class": ":".join(MODEL_BASE),
    "attention backend registry": f"{_DISPATCH}:_AttentionBackendRegistry",
    "registry: context-parallel backends": f"{_DISPATCH}:_AttentionBackendRegistry._supports_context_parallel",
    "registry: context-parallel check": f"{_DISPATCH}:_AttentionBackendRegistry._is_context_parallel_available",
    "registry: register": f"{_DISPATCH}:_AttentionBackendRegistry.register",
    "shape constraint": f"{_DISPATCH}:_check_shape",
    "backend requirements check": f"{_DISPATCH}:_check_attention_backend_requirements",
    "backend kernel download": f"{_DISPATCH}:_maybe_download_kernel_for_backend",
    "context-parallel attention": f"{_DISPATCH}:_templated_context_parallel_attention",
    "Flux qkv projections": f"{_FLUX}:_get_qkv_projections",
    "Flux processor backend": f"{_FLUX}:FluxAttnProcessor._attention_backend",
    "Flux processor parallel config": f"{_FLUX}:FluxAttnProcessor._parallel_config",
    "Wan qkv projections": f"{_WAN}:_get_qkv_projections",
    "Wan added kv projections": f"{_WAN}:_get_added_kv_projections",
    "Wan processor backend": f"{_WAN}:WanAttnProcessor._attention_backend",
    "Wan processor parallel config": f"{_WAN}:WanAttnProcessor._parallel_config",
    "model repeated blocks": "diffusers.models.modeling_utils:ModelMixin._repeated_blocks",
    "model fp32 modules": "diffusers.models.modeling_utils:ModelMixin._keep_in_fp32_modules",
    "frozen config": "diffusers.configuration_utils:FrozenDict",
    "torch_npu found at import": "diffusers.utils.import_utils:is_torch_npu_available",
}
_PIPELINE_PATH = PRIVATE_NAMES["pipeline base class"]
# Parameters we pass (or that diffusers passes to our backend, ``_parallel_config``), by name.
_PARAMETERS: dict[str, tuple[str, ...]] = {
    "registry: register": ("constraints", "supports_context_parallel"),
    "context-parallel attention": ("forward_op", "backward_op", "_parallel_config"),
}
# Private attributes (and config keys) of diffusers objects we read or write that no module-level
# object carries, so `check_diffusers` cannot look them up ahead: the accessors below read them.
_OBJECT_NAMES = ("_internal_dict", "_diffusers_hook", "_default_processor_cls", "_name_or_path")


class DiffusersCompatError(RuntimeError):
    """The installed diffusers lacks (or moved) a private name diffusers-ascend uses: it cannot run on it."""


def diffusers_version() -> str:
    """The installed diffusers release (the imported module's, else the distribution's metadata)."""
    module = sys.modules.get("diffusers")
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version("diffusers")
        except importlib.metadata.PackageNotFoundError:
            return "(not installed)"
    return version


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def supported_range() -> str:
    """The supported diffusers releases in words.

    >>> supported_range()
    '0.36 to 0.42.x'
    """
    (a, b), (c, d) = DIFFUSERS_FLOOR, DIFFUSERS_NEWEST_VERIFIED
    return f"{a}.{b} to {c}.{d}.x"


def support_status(version: str | None = None) -> tuple[str, str]:
    """Where a diffusers release stands against the supported range.

    Args:
        version: a diffusers version string; the installed diffusers' by default.

    Returns:
        ``(status, sentence)`` with status ``"supported"``, ``"too old"`` or ``"newer than verified"``.

    >>> support_status("0.42.1")[0], support_status("0.35.2")[0], support_status("0.50.0")[0]
    ('supported', 'too old', 'newer than verified')
    """
    v = version or diffusers_version()
    ver = _minor(v)
    if ver is None or ver < DIFFUSERS_FLOOR:
        return (
            "too old",
            f"diffusers {v} is older than the supported range (diffusers {supported_range()}): upgrade diffusers.",
        )
    if ver > DIFFUSERS_NEWEST_VERIFIED:
        return "newer than verified", (
            f"diffusers {v} is newer than the newest release verified (diffusers {supported_range()}): its private "
            "names are checked at enable time, but the suite has not run on it."
        )
    return "supported", f"diffusers {v} is in the supported range (diffusers {supported_range()})."


def _error(name: str, cause: BaseException | str) -> DiffusersCompatError:
    why = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
    return DiffusersCompatError(
        f"diffusers-ascend: cannot run on diffusers {diffusers_version()}: {name} is missing or moved ({why}). "
        f"Supported: diffusers {supported_range()}."
    )


def _lookup(path: str) -> Any:
    module, _, attrs = path.partition(":")
    obj = importlib.import_module(module)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


def require(what: str) -> Any:
    """The diffusers object `PRIVATE_NAMES[what]` names, or a `DiffusersCompatError` naming the
    installed diffusers, the missing name and the supported range.

    Args:
        what: a key of `PRIVATE_NAMES`.

    Raises:
        DiffusersCompatError: the name is gone from (or moved in) the installed diffusers.

    >>> require("Flux qkv projections").__name__
    '_get_qkv_projections'
    """
    path = PRIVATE_NAMES[what]
    try:
        return _lookup(path)
    except (ImportError, AttributeError) as e:
        raise _error(f"`{path.replace(':', '.')}` ({what})", e) from e


def check_diffusers() -> None:
    """Raises `DiffusersCompatError` unless the installed diffusers has every name of
    `PRIVATE_NAMES` (all missing ones in one message; the pipeline base class once diffusers'
    pipelines package is imported, as no pipeline exists before); warns once on a release newer than
    `DIFFUSERS_NEWEST_VERIFIED`. Called at enable time, before any model is changed.

    Raises:
        DiffusersCompatError: diffusers is older than `DIFFUSERS_FLOOR`, or a name moved.

    >>> check_diffusers()  # on a supported diffusers: nothing happens
    """
    status, sentence = support_status()
    if status == "too old":
        raise DiffusersCompatError(f"diffusers-ascend: {sentence}")
    if status == "newer than verified":
        _warn_untested(sentence)
    missing: dict[str, str] = {}
    for what, path in PRIVATE_NAMES.items():
        if path == _PIPELINE_PATH and _PIPELINES_PACKAGE not in sys.modules:
            # Every pipeline class is defined under `diffusers.pipelines`: while that package is not
            # imported no pipeline exists, and importing it to check (every family's package: 0.1-0.3 s)
            # would cost a model-only process more than a warm-started enable. Checked once it is.
            continue
        try:
            _lookup(path)
        except (ImportError, AttributeError) as e:
            missing[what] = f"`{path.replace(':', '.')}` ({what}; {type(e).__name__}: {e})"
    for what, names in _PARAMETERS.items():
        if what not in missing:
            gone = [n for n in names if n not in _parameters(_lookup(PRIVATE_NAMES[what]))]
            if gone:
                missing[what] = (
                    f"the {', '.join(f'`{n}`' for n in gone)} argument of `{PRIVATE_NAMES[what].split(':')[1]}`"
                )
    if missing:
        raise _error(", ".join(missing.values()), "diffusers changed its internals")


@functools.cache
def _warn_untested(sentence: str) -> None:
    from .errors import warn

    warn(sentence, stacklevel=3)


def _parameters(fn: Callable) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return ()


def private_attributes() -> frozenset[str]:
    """Every private diffusers name this module owns (the last part of each `PRIVATE_NAMES` path
    that starts with ``_``, and the object attributes it reads): what tests/test_architecture.py
    refuses elsewhere.

    >>> "_repeated_blocks" in private_attributes()
    True
    """
    names = {part for path in PRIVATE_NAMES.values() for part in re.split(r"[:.]", path) if part.startswith("_")}
    return frozenset(names | set(_OBJECT_NAMES))


# -- models ---------------------------------------------------------------------------------------
def repeated_blocks(model: Any) -> tuple[str, ...]:
    """The class names of `model`'s repeated blocks as diffusers declares them (``_repeated_blocks``,
    read by ``compile_repeated_blocks``); ``()`` where the model declares none."""
    return tuple(getattr(model, "_repeated_blocks", None) or ())


def keep_in_fp32_modules(model: Any) -> tuple[str, ...]:
    """The module names `model` keeps in fp32 when loaded with another dtype (``_keep_in_fp32_modules``)."""
    return tuple(getattr(model, "_keep_in_fp32_modules", None) or ())


def module_hooks(module: Any) -> list:
    """The diffusers hooks (``ModelHook``s of ``diffusers.hooks``) registered on `module` itself."""
    registry = module.__dict__.get("_diffusers_hook")
    hooks = getattr(registry, "hooks", None)
    return list(hooks.values()) if isinstance(hooks, dict) else []


def hook_forward_refs(module: Any) -> list[tuple[Any, Any]]:
    """``(hook, function reference)`` for each diffusers hook on `module` that replaces its forward
    (``new_forward``): the reference's ``original_forward`` is what that hook calls to run the module,
    the module's own forward for the first such hook registered."""
    return [(h, h.fn_ref) for h in module_hooks(module) if hasattr(h, "new_forward") and getattr(h, "fn_ref", None)]


def rebind_hooked_forward(module: Any, old: type, new: type) -> int:
    """Points the references of `module`'s diffusers hooks that call ``old.forward`` on it (the
    forward they wrap: group offloading at leaf level hooks every leaf) at ``new.forward``; returns
    how many there were. A class swap under such hooks then runs inside them, its parameters
    untouched (the hooks move them)."""
    n = 0
    for hook in module_hooks(module):
        ref = getattr(hook, "fn_ref", None)
        for attr in ("forward", "original_forward"):
            fn = getattr(ref, attr, None)
            if getattr(fn, "__self__", None) is module and getattr(fn, "__func__", None) is old.forward:
                setattr(ref, attr, new.forward.__get__(module))
                n += 1
    return n


def default_processor_class(module: Any) -> type | None:
    """The attention processor class an attention module builds by default, or None."""
    return getattr(module, "_default_processor_cls", None)


def diffusers_found_torch_npu() -> bool:
    """Whether diffusers found the torch_npu distribution when it was imported (then its own NPU
    branches run, whatever the tensors' device). Read at call time, as diffusers reads it."""
    return bool(require("torch_npu found at import")())


# -- configs --------------------------------------------------------------------------------------
def set_config_entry(obj: Any, key: str, value: Any) -> None:
    """Sets (``value`` not None) or removes `key` in the config of a diffusers model or pipeline,
    so ``save_pretrained`` writes it. diffusers' configs are frozen: ``register_to_config`` would
    also set an attribute on `obj`, so its private dict is replaced instead.

    Raises:
        DiffusersCompatError: diffusers no longer keeps configs in ``_internal_dict``.
    """
    try:
        d = dict(obj._internal_dict)
    except AttributeError as e:
        raise _error(f"`{type(obj).__name__}._internal_dict` (the config's storage)", e) from e
    if value is None:
        d.pop(key, None)
    else:
        d[key] = value
    obj._internal_dict = require("frozen config")(d)


def config_origin(model: Any) -> str | None:
    """Where `model` was loaded from, as diffusers records it in its config, or None."""
    config = getattr(model, "config", None)
    return config.get("_name_or_path") if config is not None else None


def is_diffusers_config(data: dict) -> bool:
    """Whether a JSON object is a config file diffusers wrote (model, scheduler or pipeline index)."""
    return "_class_name" in data or "_diffusers_version" in data


# -- attention processors and the dispatcher ------------------------------------------------------
def dispatches_attention(processor: Any) -> bool:
    """Whether `processor` runs attention through diffusers' dispatcher (it carries a backend)."""
    return hasattr(processor, "_attention_backend")


def attention_backend(processor: Any) -> Any:
    """The dispatcher backend `processor` uses (None: diffusers' process-wide default)."""
    return processor._attention_backend


def set_attention_backend(processor: Any, backend: Any) -> None:
    """Sets `processor`'s own backend, leaving diffusers' process-wide default alone (unlike
    ``model.set_attention_backend``)."""
    processor._attention_backend = backend


def parallel_config(processor: Any) -> Any:
    """The context-parallel config diffusers gave `processor` (``enable_parallelism``), or None."""
    return getattr(processor, "_parallel_config", None)


def check_backend_requirements(backend: Any) -> None:
    """diffusers' own checks of ``set_attention_backend`` for `backend`: its package is installed
    (else diffusers' error), its kernel fetched where it comes from the Hub."""
    require("backend requirements check")(backend)
    require("backend kernel download")(backend)


def supports_context_parallel(backend: Any) -> bool:
    """Whether diffusers' dispatcher runs `backend` under context parallelism."""
    return bool(require("registry: context-parallel check")(backend))


def context_parallel_backends() -> list[str]:
    """The backends diffusers' dispatcher runs under context parallelism, sorted, for messages."""
    return sorted(str(getattr(b, "value", b)) for b in require("registry: context-parallel backends"))


def templated_context_parallel_attention(*args: Any, **kwargs: Any) -> Any:
    """diffusers' context-parallel attention around a backend's forward and backward ops
    (``_templated_context_parallel_attention``). Imported where called, as diffusers' own backends
    do, so dynamo traces it inside a compiled block.

    Raises:
        DiffusersCompatError: the function is gone from diffusers' dispatcher.
    """
    try:
        from diffusers.models.attention_dispatch import _templated_context_parallel_attention as attention
    except ImportError as e:
        raise _error(f"`{PRIVATE_NAMES['context-parallel attention'].replace(':', '.')}`", e) from e
    return attention(*args, **kwargs)


def register_attention_backend(name: str, value: str, fn: Callable, reduce: Callable[[], Any]) -> Any:
    """Adds a member to diffusers' ``AttentionBackendName`` enum and registers `fn` for it with
    diffusers' shape checks and context-parallel support.

    The enum is closed, so the member is built as the enum builds its own (a ``str`` subclass
    instance with the enum's private fields). It pickles as a call of `reduce` (enums pickle as
    ``EnumClass(value)``, which this value is not).

    Args:
        name: the member's name (``"NPU_FIA"``).
        value: its value, the name users pass (``"npu_fia"``).
        fn: the attention function, with the signature of diffusers' backends.
        reduce: a module-level function returning the member (for pickle).

    Returns:
        The new ``AttentionBackendName`` member.

    Raises:
        DiffusersCompatError: diffusers' backend names or registry changed.
    """
    import enum

    from diffusers.models.attention_dispatch import AttentionBackendName

    if not (isinstance(AttentionBackendName, type) and issubclass(AttentionBackendName, enum.Enum)):
        raise _error("`AttentionBackendName` as an Enum", f"it is a {type(AttentionBackendName).__name__}")
    member = str.__new__(AttentionBackendName, value)  # a str-valued enum, as diffusers defines it
    member._name_, member._value_ = name, value
    member._sort_order_ = len(AttentionBackendName.__members__)
    member.__reduce_ex__ = lambda protocol: (reduce, ())
    register = require("registry: register")
    try:
        decorator = register(member, constraints=[require("shape constraint")], supports_context_parallel=True)
    except TypeError as e:
        raise _error("the `supports_context_parallel` argument of `_AttentionBackendRegistry.register`", e) from e
    decorator(fn)
    return member
