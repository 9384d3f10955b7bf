"""`AscendConfig`: every setting in one flat, validated, versioned dataclass, loaded from JSON as
data only (docs/configuration.md)."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import warn
from .fusions import FUSION_TO_OP, FUSIONS, default_fusions

__all__ = [
    "AscendConfig",
    "CONFIG_NAME",
    "CONFIG_VERSION",
    "FUSIONS",
    "FUSION_TO_OP",
    "CACHE_KEY_EXCLUDED",
    "GRAPH_CAPTURE_MODES",
    "LOCAL_FIELDS",
    "MAX_CONFIG_BYTES",
    "LOADED_CAPS",
    "MAX_LOADED_CAPTURED_GRAPHS",
    "MAX_LOADED_RECOMPILE_LIMIT",
    "check_field",
    "read_json_object",
]

CONFIG_NAME = "ascend_config.json"
# Bump when the meaning of a saved field changes (older readers load newer files best-effort).
CONFIG_VERSION = 1

_FUSION_KEYWORDS = ("auto", "all", "none")
_COMPILE = ("blocks", "model", "none")
_EXECUTORS = ("auto", "eager", "inductor")
_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
GRAPH_CAPTURE_MODES = ("graph_only", "graph_with_compile")
_GRAPH_CAPTURE = (None, *GRAPH_CAPTURE_MODES)
_ON_ERROR = ("fallback", "raise")
# Set only by code, saved as null: a tampered config must not make the backend write files.
LOCAL_FIELDS = ("graph_log_dir",)
# Fields that do not change the compiled code.
CACHE_KEY_EXCLUDED = ("graph_log_dir",)
# Caps on what a loaded (not code-built) config may set: field -> (cap, what more would cost).
MAX_LOADED_RECOMPILE_LIMIT = 64
MAX_LOADED_CAPTURED_GRAPHS = 32
LOADED_CAPS = types.MappingProxyType(
    {
        "recompile_limit": (MAX_LOADED_RECOMPILE_LIMIT, "dynamo keeps the limit process-wide"),
        "max_captured_graphs": (MAX_LOADED_CAPTURED_GRAPHS, "each one holds device memory"),
    }
)
MAX_CONFIG_BYTES = 1 << 20  # an ascend_config.json is about 500 bytes
_MAX_DEPTH = 8  # an ascend config is an object of scalars and one list (depth 2)
_JSON_TYPE = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _closest(name: str, choices) -> str:
    match = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1)
    return f" Did you mean {match[0]!r}?" if match else ""


def _choice(name: str, value: Any, choices: tuple) -> Any:
    # `value in choices` would accept True for 1 etc.; compare type-strictly.
    if not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        hint = _closest(value, [c for c in choices if c is not None]) if isinstance(value, str) else ""
        raise ValueError(f"{name}={_short(value)} is invalid; valid: {', '.join(map(repr, choices))}.{hint}")
    return value


def _normalize_fusions(value: Any) -> str | tuple[str, ...]:
    if isinstance(value, str) and "," in value:
        # The CLI's syntax ("rms_norm,rope"), accepted in Python too: it is the list of its names.
        names = [n.strip() for n in value.split(",")]
        keywords = [n for n in names if n in _FUSION_KEYWORDS]
        if keywords or not all(names):
            why = f"{keywords[0]!r} is a keyword, not a fusion name" if keywords else "it has an empty name"
            raise ValueError(
                f"fusions={_short(value)} is invalid: {why}; a comma-separated string holds fusion names "
                f"only, of {list(FUSIONS)} (or pass 'auto', 'all' or 'none' alone)."
            )
        value = names
    if isinstance(value, str):
        if value in _FUSION_KEYWORDS:
            return value
        if value in FUSIONS:  # a single name is a one-element list
            return (value,)
        raise ValueError(
            f"fusions={value!r} is invalid; valid: 'auto', 'all', 'none' or a list of {list(FUSIONS)}."
            + _closest(value, _FUSION_KEYWORDS + FUSIONS)
        )
    if isinstance(value, (list, tuple, set, frozenset)):
        names = list(value)
        bad = [n for n in names if not isinstance(n, str) or n not in FUSIONS]
        if bad:
            hints = "".join(_closest(n, FUSIONS) for n in bad if isinstance(n, str))
            raise ValueError(f"unknown fusion(s) {bad!r} in fusions; valid: {list(FUSIONS)}.{hints}")
        # Deduplicated, in FUSIONS order, so equal sets compare and hash equal.
        chosen = set(names)
        if "fast_gelu" in chosen and "gelu_tanh" in chosen:
            raise ValueError(
                "fusions names both 'gelu_tanh' and 'fast_gelu'; they replace the same GELU "
                "(exact tanh-GELU vs x*sigmoid(1.702x)): pick one."
            )
        return tuple(f for f in FUSIONS if f in chosen)
    raise TypeError(
        f"fusions must be 'auto', 'all', 'none' or a list of fusion names, got {type(value).__name__} {value!r}; "
        f"valid names: {list(FUSIONS)}."
    )


def _attention_backends() -> tuple[str, ...]:
    from diffusers.models.attention_dispatch import AttentionBackendName  # lazy: diffusers is heavy

    from .attention import BACKENDS

    return BACKENDS + tuple(b.value for b in AttentionBackendName)


def _check_attention(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(
            f"attention must be 'auto', None, 'npu_fia' or a diffusers attention backend name, got {value!r}"
        )
    if value not in (None, "auto"):
        valid = _attention_backends()
        if value not in valid:
            raise ValueError(
                f"attention={value!r} is not an attention backend; valid: 'auto', None, "
                f"{', '.join(map(repr, valid))}.{_closest(value, valid)}"
            )
    return value


def _check_bool(name: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
        return value

    return check


def _check_int(name: str, minimum: int, optional: bool) -> Callable[[Any], int | None]:
    def check(value: Any) -> int | None:
        if value is None and optional:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int >= {minimum}{' or None' if optional else ''}, got {_short(value)}")
        if value < minimum:
            raise ValueError(f"{name}={value!r} is invalid; it must be >= {minimum}{' or None' if optional else ''}")
        return value

    return check


def _check_path(value: Any) -> str | None:
    if value is None:
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"graph_log_dir must be a path (str or os.PathLike) or None, got {value!r}")
    return os.fspath(value)


def _one_of(name: str, choices: tuple) -> Callable[[Any], Any]:
    return lambda value: _choice(name, value, choices)


# Each field's own rule (type and range), in field order: the one place a field is validated.
# Rules that relate fields are `AscendConfig._check_combinations`; those of a backend on a platform,
# `AscendConfig.check_backend`; those of enable_ascend_compile, `AscendConfig.check_enable`.
_FIELD_CHECKS: dict[str, Callable[[Any], Any]] = {
    "fusions": _normalize_fusions,
    "attention": _check_attention,
    "compile": _one_of("compile", _COMPILE),
    "executor": _one_of("executor", _EXECUTORS),
    "mode": _one_of("mode", _MODES),
    "dynamic": _one_of("dynamic", (None, True, False)),
    "fullgraph": _check_bool("fullgraph"),
    "recompile_limit": _check_int("recompile_limit", 1, optional=True),
    "graph_capture": _one_of("graph_capture", _GRAPH_CAPTURE),
    "safe_output": _check_bool("safe_output"),
    "freezing": _check_bool("freezing"),
    "max_captured_graphs": _check_int("max_captured_graphs", 1, optional=False),
    "graph_log_dir": _check_path,
    "on_error": _one_of("on_error", _ON_ERROR),
}


def check_field(name: str, value: Any) -> Any:
    """Validates one `AscendConfig` field on its own, by the rule the config applies, and returns
    the value as the config stores it (e.g. ``fusions`` as a tuple). For code that takes a field's
    value without a whole config (`GraphCaptureManager`).

    Args:
        name: an `AscendConfig` field.
        value: its value.

    Raises:
        TypeError / ValueError: the value breaks the field's rule (naming the field and the valid
            choices), or `name` is not a field.

    >>> from diffusers_ascend.config import check_field
    >>> check_field("fusions", ["rope", "rms_norm"])
    ('rms_norm', 'rope')
    >>> check_field("on_error", "ignore")
    Traceback (most recent call last):
    ...
    ValueError: on_error='ignore' is invalid; valid: 'fallback', 'raise'.
    """
    if name not in _FIELD_CHECKS:
        _check_names({name: value}, "check_field()")
    return _FIELD_CHECKS[name](value)


@dataclass(frozen=True, eq=False)
class AscendConfig:
    """Settings of `enable_ascend_compile` and `AscendBackend` (docs/configuration.md).

    Immutable (use `replace`). Bad values, and contradictions that would silently do nothing, raise
    ``ValueError``/``TypeError`` naming the field and the valid choices.

    Args:
        fusions: ``"auto"`` (those with a kernel faster than the unfused ops on the platform),
            ``"all"`` (all but ``fast_gelu``, which changes numerics), ``"none"``, or `FUSIONS`
            names: a list, or a comma-separated string as the CLI takes (``"rms_norm,rope"``); stored
            as a tuple in `FUSIONS` order, saved as a JSON list.
        attention: ``"auto"`` (see `resolved_attention`), None (keep the model's), ``"npu_fia"``
            or a diffusers ``AttentionBackendName`` value.
        compile: ``"blocks"`` (each repeated block compiled in place), ``"model"`` or ``"none"``.
        executor: ``"auto"`` (``"eager"`` on NPU, ``"inductor"`` elsewhere), ``"eager"`` or ``"inductor"``.
        mode: Inductor mode, or None.
        dynamic: passed to ``torch.compile``.
        fullgraph: passed to ``torch.compile``.
        recompile_limit: int >= 1, or None (dynamo's 8 per compiled block class). Dynamo keeps it
            process-wide: raised while an enabled model needs it, restored after.
        graph_capture: None, ``"graph_only"`` or ``"graph_with_compile"``.
        safe_output: clone outputs of captured graphs.
        freezing: fold parameters into the graph as constants; later weight changes are not seen.
        max_captured_graphs: int >= 1, FIFO cap on captured graphs.
        graph_log_dir: directory to write graphs before/after each pass; local, never saved.
        on_error: ``"fallback"`` (a block that fails to compile runs eager, with a warning) or ``"raise"``.

    >>> from diffusers_ascend.config import AscendConfig
    >>> cfg = AscendConfig(fusions=["rope", "rms_norm"])
    >>> cfg.fusions
    ('rms_norm', 'rope')
    >>> cfg.resolved_fusions("cpu")
    ('rms_norm', 'rope')
    >>> AscendConfig.from_dict(cfg.to_dict()) == cfg
    True
    """

    fusions: Any = "auto"
    attention: str | None = "auto"
    compile: str = "blocks"
    executor: str = "auto"
    mode: str | None = None
    dynamic: bool | None = None
    fullgraph: bool = False
    recompile_limit: int | None = None
    graph_capture: str | None = None
    safe_output: bool = True
    freezing: bool = False
    max_captured_graphs: int = 8
    graph_log_dir: str | None = None
    on_error: str = "fallback"

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, check_field(f.name, getattr(self, f.name)))  # frozen dataclass
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Settings that contradict each other, whatever the platform."""
        if self.compile == "none":
            useless = {
                "graph_capture": self.graph_capture is not None,
                "freezing": self.freezing,
                "executor": self.executor != "auto",
                "mode": self.mode is not None,
                "dynamic": self.dynamic is not None,
                "fullgraph": self.fullgraph,
                "recompile_limit": self.recompile_limit is not None,
            }
            bad = [k for k, v in useless.items() if v]
            if bad:
                raise ValueError(
                    f"compile='none' compiles nothing, so {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)} "
                    "cannot take effect; use compile='blocks' or 'model', or leave these at their defaults."
                )
        if self.executor == "eager" and self.mode is not None:
            raise ValueError(
                f"mode={self.mode!r} is an Inductor setting but executor='eager'; use executor='inductor' or 'auto', or mode=None."
            )

    def check_backend(self, platform: str | None = None) -> None:
        """Raises for settings an `AscendBackend` cannot run on ``platform`` (default: the current
        one), which it calls when built: graph capture where the platform has no device graphs,
        ``"graph_only"`` with a list of fusions, Inductor's own CUDA graphs inside ours, or the one
        attention backend whose NPU kernel cannot be captured (``"_native_npu"``:
        ``npu_fusion_attention``). A config holding them stays valid data (it may be saved, or
        used on another platform).

        Raises:
            ValueError: naming the settings, the platform and what is valid there.

        >>> AscendConfig(graph_capture="graph_only").check_backend("cpu")
        Traceback (most recent call last):
        ...
        ValueError: graph_capture='graph_only' needs device graphs (NPUGraph on 'npu', CUDAGraph on 'cuda'); the current platform 'cpu' has none. Valid here: graph_capture=None.
        """
        mode = self.graph_capture
        if mode is None:
            return
        from .platform import graph_api, graph_capture_supported, uncapturable_attention

        platform = _platform(platform)
        if not graph_capture_supported(platform):
            raise ValueError(
                f"graph_capture={mode!r} needs device graphs (NPUGraph on 'npu', CUDAGraph on 'cuda'); "
                f"the current platform {platform!r} has none. Valid here: graph_capture=None."
            )
        if mode == "graph_only" and isinstance(self.fusions, tuple) and self.fusions:
            raise ValueError(
                f"graph_capture='graph_only' captures the graph without fusion passes, but fusions={list(self.fusions)} "
                "were asked for; use graph_capture='graph_with_compile' to fuse and capture, or fusions='auto'/'none'."
            )
        if self.mode == "reduce-overhead":
            raise ValueError(
                f"graph_capture={mode!r} and mode='reduce-overhead' both capture device graphs (Inductor's CUDA graphs "
                "would be captured inside ours); use graph_capture with mode=None, 'default', 'max-autotune' or "
                "'max-autotune-no-cudagraphs', or mode='reduce-overhead' with graph_capture=None."
            )
        bad = uncapturable_attention(platform)
        if bad is not None and self.resolved_attention(platform) == bad:
            raise ValueError(
                f"graph_capture={mode!r} on NPU with attention={self.attention!r}: diffusers' '_native_npu' attention "
                "calls npu_fusion_attention, which torch_npu documents as not supporting aclgraph capture. Use "
                "attention='auto' or 'npu_fia' (npu_fused_infer_attention_score, capturable) with graph_capture, "
                "or graph_capture=None. See docs/graph-capture.md."
            )
        if graph_api(platform) is None:
            raise ValueError(
                f"graph_capture={mode!r}: the platform {platform!r} offers no device graphs "
                "(torch.cuda.CUDAGraph on 'cuda'; torch.npu.NPUGraph needs torch_npu 2.5.1 or newer on 'npu'). "
                "Valid here: graph_capture=None."
            )

    def check_enable(self, platform: str | None = None) -> None:
        """`check_backend`, plus what `enable_ascend_compile` cannot do with these settings:
        ``freezing=True`` under ``compile="blocks"`` (a bare `AscendBackend` takes it).

        Raises:
            ValueError: naming the setting and the valid choices.

        >>> AscendConfig(freezing=True).check_enable("cpu")
        Traceback (most recent call last):
        ...
        ValueError: freezing=True needs compile='model': ...
        """
        self.check_backend(platform)
        if self.freezing and self.compile == "blocks":
            raise ValueError(
                "freezing=True needs compile='model': under compile='blocks' every block of a class runs one shared "
                "graph that takes the block's weights as inputs, and freezing would bake one block's weights into it. "
                "Use compile='model' with freezing=True, or freezing=False."
            )

    def resolved_fusions(self, platform: str | None = None) -> tuple[str, ...]:
        """The fusions to apply on ``platform`` (default: the current one), in `FUSIONS` order.

        ``"auto"``: those whose op has a provider flagged ``faster_than_unfused``
        (`ascend_kernels.registry.auto_provider`). ``graph_capture="graph_only"`` resolves to none.

        >>> AscendConfig(fusions="all").resolved_fusions("cpu")
        ('rms_norm', 'rope', 'gelu_tanh', 'adaln', 'mul_add', 'swiglu', 'int8_dynamic_linear', 'int8_weight_only_linear')
        >>> AscendConfig().resolved_fusions("cpu")
        ()
        """
        if self.graph_capture == "graph_only":
            return ()
        if isinstance(self.fusions, tuple):
            return self.fusions
        if self.fusions == "none":
            return ()
        default = default_fusions()
        if self.fusions == "all":
            return default
        platform = _platform(platform)
        return tuple(f for f in default if _has_fast_kernel(FUSION_TO_OP[f], platform))

    def resolved_executor(self, platform: str | None = None) -> str:
        """``"eager"`` or ``"inductor"``; ``"auto"`` is `diffusers_ascend.platform.default_executor`.

        >>> AscendConfig().resolved_executor("npu"), AscendConfig().resolved_executor("cpu")
        ('eager', 'inductor')
        """
        if self.executor != "auto":
            return self.executor
        from .platform import default_executor

        return default_executor(_platform(platform))

    def resolved_attention(self, platform: str | None = None, *, ring: bool = False, dtype=None) -> str | None:
        """The attention backend set on the model's processors, or None (the model's own is kept).

        ``"auto"`` is `diffusers_ascend.platform.auto_attention`; an explicit name is returned as is.

        Args:
            platform: ``"npu"``, ``"cuda"`` or ``"cpu"`` (default: the current one).
            ring: the model is context-parallel with ``ring_degree > 1``.
            dtype: the model's dtype (``"auto"`` keeps float32 models off ``"_native_npu"``).

        >>> AscendConfig().resolved_attention("npu"), AscendConfig(graph_capture="graph_only").resolved_attention("npu")
        ('_native_npu', 'npu_fia')
        >>> AscendConfig().resolved_attention("cpu") is None
        True
        """
        if self.attention != "auto":
            return self.attention
        from .platform import auto_attention

        return auto_attention(_platform(platform), graph_capture=self.graph_capture, ring=ring, dtype=dtype)

    def replace(self, **overrides: Any) -> AscendConfig:
        """A validated copy with ``overrides`` applied; ``self`` is unchanged.

        Raises:
            TypeError: an override name that is not a field (the message lists the fields).

        >>> AscendConfig().replace(on_error="raise").on_error
        'raise'
        """
        _check_names(overrides, "replace()")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def coerce(cls, obj: Any = None, **overrides: Any) -> AscendConfig:
        """Turns what users pass as ``config=`` into an `AscendConfig`, then applies ``overrides``.

        Args:
            obj: an `AscendConfig`, a dict of fields (loaded by `from_dict`), a directory or path
                of an ``ascend_config.json``, a Hub repo id, or None (the defaults).
            **overrides: fields replacing those of ``obj`` (local fields are set here).

        Raises:
            TypeError: ``obj`` of another type, or an unknown override name.

        >>> AscendConfig.coerce({"fusions": "none"}, compile="model").compile
        'model'
        """
        _check_names(overrides, "overrides")
        if obj is None:
            return cls(**overrides)
        if isinstance(obj, cls):
            return obj.replace(**overrides) if overrides else obj
        if isinstance(obj, Mapping):
            base = cls.from_dict(obj)
            return base.replace(**overrides) if overrides else base
        if isinstance(obj, (str, os.PathLike)):
            base = cls.from_pretrained(obj)
            return base.replace(**overrides) if overrides else base
        raise TypeError(
            f"cannot make an AscendConfig from {type(obj).__name__}; accepted: AscendConfig, dict, "
            "a local directory or ascend_config.json path (str or os.PathLike), a Hub repo id, or None."
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field plus ``"version"`` and ``"diffusers_ascend_version"``;
        `LOCAL_FIELDS` are written as null.

        >>> AscendConfig().to_dict()["version"]
        1
        """
        from diffusers_ascend import __version__

        d: dict[str, Any] = {"version": CONFIG_VERSION, "diffusers_ascend_version": __version__}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else v
        for k in LOCAL_FIELDS:
            d[k] = None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str | None = None) -> AscendConfig:
        """Builds a validated config from loaded data (e.g. `to_dict` output), never mutating ``d``.

        Warns and drops unknown keys and `LOCAL_FIELDS`; a newer ``version`` warns and loads the
        known keys; values above `LOADED_CAPS` are lowered, with a warning. Invalid values raise.

        Args:
            d: the fields, as `to_dict` writes them.
            source: what ``d`` was read from, named in messages; with it every problem is a ``ValueError``.

        >>> AscendConfig.from_dict({"version": 1, "fusions": ["rope"]}).fusions
        ('rope',)
        """
        try:
            kwargs = cls._fields_from_data(d, source)
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            if source is None:
                raise
            raise ValueError(f"invalid ascend config in {source}: {e}") from e

    @classmethod
    def _fields_from_data(cls, d: Any, source: str | None) -> dict[str, Any]:
        where = f" from {source}" if source else ""
        if not isinstance(d, Mapping):
            if source is None:
                raise TypeError(f"from_dict expects a dict, got {type(d).__name__}")
            raise ValueError(
                f"it holds a JSON {_JSON_TYPE.get(type(d), type(d).__name__)}, expected an object of AscendConfig fields"
            )
        _check_depth(d)
        version = d.get("version", CONFIG_VERSION)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"config 'version' must be an int >= 1, got {_short(version)}")
        if version > CONFIG_VERSION:
            warn(
                f"ascend config version {version}{where} is newer than this diffusers-ascend supports "
                f"({CONFIG_VERSION}); loading the fields it knows. Upgrade diffusers-ascend to use all of it.",
                stacklevel=3,
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in set(d) - known - {"version", "diffusers_ascend_version"})
        if unknown:
            warn(f"ignoring unknown ascend config keys {unknown}{where}; valid: {sorted(known)}", stacklevel=3)
        kwargs = {k: v for k, v in d.items() if k in known}
        local = {k: kwargs.pop(k) for k in LOCAL_FIELDS if kwargs.get(k) is not None}
        if local:
            warn(
                f"ignoring {', '.join(f'{k}={_short(v)}' for k, v in local.items())}{where}: "
                "local settings are never loaded from a config (they name this machine's paths); "
                f"set them in code, e.g. enable_ascend_compile(..., {next(iter(local))}=...).",
                stacklevel=3,
            )
        for name, (cap, cost) in LOADED_CAPS.items():
            value = kwargs.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                warn(
                    f"{name}={_short(value)}{where} is above the {cap} a loaded config may set ({cost}); "
                    f"using {cap}. Pass a higher value in code if you need it.",
                    stacklevel=3,
                )
                kwargs[name] = cap
        return kwargs

    def to_json_string(self) -> str:
        """Canonical JSON (sorted keys, indented).

        >>> '"version": 1' in AscendConfig().to_json_string()
        True
        """
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> AscendConfig:
        """Reads an ``ascend_config.json``.

        Raises:
            OSError: the file cannot be opened.
            ValueError: anything wrong with its content, naming the file.

        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "ascend_config.json")
        >>> _ = open(path, "w").write('{"fusions": ["rope"]}')
        >>> AscendConfig.from_json_file(path).fusions
        ('rope',)
        """
        path = os.fspath(path)
        return cls.from_dict(read_json_object(path, "an ascend config written by save_pretrained"), source=path)

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs: Any) -> str:
        """Writes ``ascend_config.json`` into ``save_directory`` (created if needed).

        Args:
            save_directory: target directory.
            push_to_hub: also upload it with `push_to_hub`; ``kwargs`` must then include
                ``repo_id`` and may include its other arguments.

        Returns:
            The path of the written file.

        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> AscendConfig.from_pretrained(AscendConfig(fusions="all").save_pretrained(d)).fusions
        'all'
        """
        if os.path.isfile(save_directory):
            raise ValueError(f"save_directory {os.fspath(save_directory)!r} is a file, expected a directory")
        if push_to_hub and "repo_id" not in kwargs:  # before anything is written
            raise ValueError("save_pretrained(push_to_hub=True) needs repo_id=...")
        os.makedirs(save_directory, exist_ok=True)
        path = os.path.join(os.fspath(save_directory), CONFIG_NAME)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json_string())
        if push_to_hub:
            self.push_to_hub(**kwargs)
        return path

    @classmethod
    def from_pretrained(
        cls,
        dir_or_repo_id: str | os.PathLike,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool | None = None,
        token: str | bool | None = None,
        subfolder: str | None = None,
    ) -> AscendConfig:
        """Loads ``ascend_config.json`` from a local directory, a path to the file, or a Hub repo.

        Raises:
            diffusers_ascend.hub.AscendConfigNotFoundError (an ``OSError``): not found locally
                nor on the Hub; the message names what was tried.
            ValueError: any problem with the file's content, naming the file.

        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = AscendConfig(compile="model").save_pretrained(d)
        >>> AscendConfig.from_pretrained(d).compile
        'model'
        """
        from .hub import resolve_config_file

        path = resolve_config_file(
            dir_or_repo_id,
            CONFIG_NAME,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            token=token,
            subfolder=subfolder,
        )
        return cls.from_json_file(path)

    def push_to_hub(
        self,
        repo_id: str,
        token: str | bool | None = None,
        private: bool | None = None,
        revision: str | None = None,
        commit_message: str | None = None,
        create_pr: bool = False,
    ):
        """Uploads this config as ``ascend_config.json`` to a Hub model repo (created if missing).

        Returns:
            huggingface_hub's ``CommitInfo``.

        >>> AscendConfig().push_to_hub("me/flux-ascend")  # doctest: +SKIP
        """
        from .hub import upload_config

        return upload_config(
            self.to_json_string(),
            repo_id,
            CONFIG_NAME,
            token=token,
            private=private,
            revision=revision,
            commit_message=commit_message or "Upload ascend_config.json",
            create_pr=create_pr,
        )

    def cache_key(self) -> str:
        """sha256 of the canonical JSON without ``diffusers_ascend_version`` and `CACHE_KEY_EXCLUDED`.

        >>> AscendConfig(fusions=["rope", "rms_norm"]).cache_key() == AscendConfig(fusions=["rms_norm", "rope"]).cache_key()
        True
        """
        d = self.to_dict()
        d.pop("diffusers_ascend_version")
        for k in CACHE_KEY_EXCLUDED:
            d.pop(k)
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AscendConfig):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self))

    def __hash__(self) -> int:
        # The key is a function of a subset of the fields, so equal configs hash equal.
        return hash(self.cache_key())


def _has_fast_kernel(op: str, platform: str) -> bool:
    from ascend_kernels.registry import auto_provider

    return auto_provider(op, platform) is not None


def read_json_object(path: str, what: str = "a JSON object") -> dict[str, Any]:
    """Reads a JSON object from ``path`` (at most `MAX_CONFIG_BYTES`, UTF-8, no ``NaN``).

    Args:
        path: the file.
        what: what the file should hold, for the messages.

    Raises:
        OSError: the file cannot be opened.
        ValueError: its content is not a JSON object.

    >>> import os, tempfile
    >>> from diffusers_ascend.config import read_json_object
    >>> path = os.path.join(tempfile.mkdtemp(), "c.json")
    >>> _ = open(path, "w").write("[1]")
    >>> read_json_object(path)
    Traceback (most recent call last):
    ...
    ValueError: ... holds a JSON array, expected a JSON object
    """
    with open(path, "rb") as fh:
        raw = fh.read(MAX_CONFIG_BYTES + 1)  # bounded: the file may be a device or grow
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes; expected {what} (about 500 bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}); expected {what}"
        ) from None

    def no_constant(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        data = json.loads(text, parse_constant=no_constant)
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be {what}") from None
    except ValueError as e:  # JSONDecodeError, too many digits, NaN/Infinity
        raise ValueError(f"{path} is not valid JSON ({e}); expected {what}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {_JSON_TYPE.get(type(data), type(data).__name__)}, expected {what}")
    return data


def _check_depth(data: Any) -> None:
    stack = [(data, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise ValueError(f"values are nested more than {_MAX_DEPTH} levels deep; an ascend config is flat")
        children = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, (list, tuple)) else ()
        stack.extend((c, depth + 1) for c in children)


def _short(value: Any, limit: int = 80) -> str:
    # Loaded values can be huge (a 1 MB string, a 4000-digit int): messages show a bounded repr.
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<int of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "... (truncated)"


def _check_names(overrides: Mapping[str, Any], what: str) -> None:
    valid = [f.name for f in fields(AscendConfig)]
    bad = [k for k in overrides if k not in valid]
    if bad:
        hints = "".join(_closest(k, valid) for k in bad)
        raise TypeError(f"unknown AscendConfig field(s) {bad} in {what}; valid: {valid}.{hints}")


def _platform(platform: str | None) -> str:
    from .platform import PLATFORMS, current_platform

    if platform is None:
        return current_platform()
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; valid: {PLATFORMS}")
    return platform
