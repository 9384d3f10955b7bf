"""The one place that knows how torch releases differ: every private torch API the engine uses.

Supported: `TORCH_FLOOR` to `TORCH_NEWEST_VERIFIED` (the releases CI runs are in
docs/support-matrix.md). Differences are detected by feature (signatures, attributes), not by
version strings; each shim names the releases seen to differ. A missing or changed API raises
`TorchCompatError` (via `require`), never a silent "0 matches". Nothing here imports Inductor at
import time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import warn

__all__ = [
    "TORCH_FLOOR",
    "TORCH_NEWEST_VERIFIED",
    "TorchCompatError",
    "aot_autograd",
    "aoti_api",
    "aoti_load",
    "cache_artifacts_api",
    "check_engine",
    "compile_cache_counters",
    "compiled_cpp_libraries",
    "compile_fx",
    "compiled_blocks_share_graphs",
    "conj_views_reach_graphs",
    "current_compile_id",
    "custom_graph_pass_base",
    "detect_fake_mode",
    "dynamo_recompile_limit",
    "export_program",
    "fold_parameters",
    "fresh_inductor_cache",
    "fused_rms_norm",
    "fused_rms_norm_pattern",
    "given_patterns_match_as_given",
    "inductor_cache_dir",
    "inductor_freezing_enabled",
    "inductor_freezing_scope",
    "probe_trace",
    "functional_trace",
    "gen_search_pattern",
    "list_mode_options",
    "make_boxed_func",
    "match_kwarg",
    "one_op_graph",
    "op_overload",
    "pattern_matcher_pass",
    "register_replacement",
    "tree_flatten",
    "tree_unflatten",
    "treespec_dumps",
    "treespec_loads",
    "remove_noop_ops",
    "set_dynamo_recompile_limit",
    "support_status",
    "supported_range",
    "torch_version",
    "tracing_context",
    "unset_fake_mode",
]

# Floor: the oldest torch with torch_npu pairs still deployed (pyproject's `torch>=` is tested to agree).
TORCH_FLOOR: tuple[int, int] = (2, 6)
# Newest release CI has run the engine tests on. Newer releases get one warning, not silence.
TORCH_NEWEST_VERIFIED: tuple[int, int] = (2, 15)


class TorchCompatError(RuntimeError):
    """The running torch lacks (or changed) an API the fusion engine needs: the engine cannot work."""


def torch_version(version: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``torch.__version__`` (or of `version`): ``"2.8.0+cu128"`` -> ``(2, 8)``."""
    m = re.match(r"(\d+)\.(\d+)", version or torch.__version__)
    if m is None:  # pragma: no cover - torch always has a numeric version
        raise TorchCompatError(f"cannot parse torch version {torch.__version__!r}")
    return int(m.group(1)), int(m.group(2))


def supported_range() -> str:
    """The supported torch releases in words.

    >>> supported_range()
    '2.6 to 2.15.x'
    """
    return f"{TORCH_FLOOR[0]}.{TORCH_FLOOR[1]} to {TORCH_NEWEST_VERIFIED[0]}.{TORCH_NEWEST_VERIFIED[1]}.x"


def _range() -> str:
    return f"torch {supported_range()}"


def support_status(version: str | None = None) -> tuple[str, str]:
    """Where a torch release stands against the supported range.

    Args:
        version: a torch version string; the running torch's by default.

    Returns:
        ``(status, sentence)`` with status ``"supported"``, ``"too old"`` or ``"newer than verified"``.

    >>> support_status("2.8.0+cu128")[0]
    'supported'
    >>> support_status("2.4.1")[0]
    'too old'
    """
    v = version or torch.__version__
    ver = torch_version(v)
    if ver < TORCH_FLOOR:
        return "too old", f"torch {v} is older than the supported range ({_range()}): upgrade torch."
    if ver > TORCH_NEWEST_VERIFIED:
        return "newer than verified", (
            f"torch {v} is newer than the newest release verified ({_range()}): the engine checks its APIs "
            "and raises if one is missing, but match counts have not been verified in CI on it."
        )
    return "supported", f"torch {v} is in the supported range ({_range()})."


def require(api: str, getter: Callable[[], Any]) -> Any:
    """``getter()``, or a `TorchCompatError` naming torch's version, `api` and the supported range."""
    try:
        return getter()
    except (ImportError, AttributeError, TypeError) as e:
        raise TorchCompatError(
            f"diffusers-ascend: the fusion engine cannot run on torch {torch.__version__}: {api} is missing or "
            f"changed ({type(e).__name__}: {e}). Supported: {_range()}."
        ) from e


def out_dtype_op() -> Any:
    """``torch.ops.higher_order.out_dtype`` (2.1+): how torchao's compiled int8 matmul on a non-CPU
    device appears in aot graphs (``out_dtype(aten.mm.default, torch.int32, a, b)``)."""
    return require(
        "higher_order.out_dtype",
        lambda: __import__("torch._higher_order_ops.out_dtype", fromlist=["out_dtype"]).out_dtype,
    )


@functools.cache
def int_mm_takes_uint8() -> bool:
    """Whether ``torch._int_mm`` takes uint8 activations on the CPU (torchao's ``u8s8`` branch, which it
    takes from torch 2.12 only): the int8_dynamic_linear ``u8s8`` form is registered only then."""
    try:
        torch._int_mm(torch.zeros(17, 8, dtype=torch.uint8), torch.zeros(8, 8, dtype=torch.int8))
    except (RuntimeError, TypeError, AttributeError):
        return False
    return True


def _has_param(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without signatures
        return False


def _require_param(fn: Callable, name: str) -> Callable:
    if not _has_param(fn, name):
        raise TypeError(f"{getattr(fn, '__name__', fn)}() takes no {name!r}")
    return fn


def _accepted(fn: Callable, kwargs: dict) -> dict:
    """`kwargs` less the keywords `fn` does not take (keywords added in later releases)."""
    return {k: v for k, v in kwargs.items() if _has_param(fn, k)}


# -- Inductor pattern matcher --------------------------------------------------------------------
def _pm():
    return require(
        "torch._inductor.pattern_matcher",
        lambda: __import__("torch._inductor.pattern_matcher", fromlist=["register_replacement"]),
    )


def register_replacement(
    search_fn, replace_fn, example_inputs, trace_fn, pass_dict, *, get_decomp_fn, **kwargs
) -> None:
    """`torch._inductor.pattern_matcher.register_replacement`, tracing with `get_decomp_fn`'s table.

    (Inductor's default table would decompose the search function unlike our aot graphs.) 2.13+
    pass ``get_decomp_fn`` on to ``trace_fn``; 2.6-2.12 call ``trace_fn(fn, args)``, so `trace_fn`
    must default to the same table. 2.6 has no ``skip_duplicates`` (emulated below)."""
    pm = _pm()
    fn = require("pattern_matcher.register_replacement", lambda: pm.register_replacement)
    kw = dict(kwargs, get_decomp_fn=get_decomp_fn)
    for needed in ("extra_check", "scalar_workaround", "search_fn_pattern"):
        if needed in kw and not _has_param(fn, needed):
            raise TorchCompatError(
                f"diffusers-ascend: torch {torch.__version__}'s register_replacement() takes no {needed!r}; "
                f"supported: {_range()}."
            )
    if kw.get("skip_duplicates") and not _has_param(fn, "skip_duplicates"):
        # 2.6 asserts a pattern is new to the whole process; ours that trace alike live in separate
        # passes on purpose (`FusionPass.pattern_matcher_passes`), so check per pass as 2.7+ does.
        pattern = kw.get("search_fn_pattern") or pm.gen_pattern(
            search_fn, list(example_inputs), trace_fn, kw.get("scalar_workaround")
        )
        kw.pop("skip_duplicates")
        seen = pass_dict.__dict__.setdefault("_ascend_seen_patterns", set())
        key = pm.PatternPrettyPrinter.run(pattern)
        if key in seen:
            return
        seen.add(key)
        process_wide = pm._seen_patterns
        pm._seen_patterns = set()
        try:
            fn(search_fn, replace_fn, list(example_inputs), trace_fn, pass_dict, **_accepted(fn, kw))
        finally:
            pm._seen_patterns = process_wide
            process_wide.add(key)
        return
    if kw.get("search_fn_pattern") is not None and not given_patterns_match_as_given():
        _register_given_pattern(search_fn, replace_fn, trace_fn, pass_dict, kw)
        return
    fn(search_fn, replace_fn, list(example_inputs), trace_fn, pass_dict, **_accepted(fn, kw))


@functools.cache
def given_patterns_match_as_given() -> bool:
    """Whether ``register_replacement(..., search_fn_pattern=p)`` matches exactly `p`.

    2.6-2.14 do; 2.15 takes `p` as a coarse filter and re-traces the search function on the match,
    which breaks the hand-built ``_fused_rms_norm`` form (it decomposes on CPU) and the
    ``FusionPattern.retrace = False`` forms. Detected by registering a search function tracing to
    ``sub`` with a given ``atan2`` pattern and counting replacements in an ``atan2`` graph."""
    pm = _pm()
    aten = torch.ops.aten
    pattern = pm.CallFunction(aten.atan2.default, pm.KeywordArg("a"), pm.KeywordArg("b"))
    probe = pattern_matcher_pass("ascend_compat_probe")
    register = require("pattern_matcher.register_replacement", lambda: pm.register_replacement)
    example = [torch.ones(2), torch.ones(2)]
    # 2.6 records every pattern process-wide and asserts it is new: leave no trace.
    seen = getattr(pm, "_seen_patterns", None)
    saved = set(seen) if seen is not None else None
    try:
        with unset_fake_mode(), no_tracing_context(), torch.no_grad():
            register(
                lambda a, b: a - b,
                lambda a, b: a * b,
                example,
                pm.fwd_only,
                probe,
                **_accepted(register, {"search_fn_pattern": pattern}),
            )
            graph = one_op_graph(aten.atan2.default, example)
            return probe.apply(graph) == 1
    finally:
        if saved is not None:
            seen.clear()
            seen.update(saved)


def _register_given_pattern(search_fn, replace_fn, trace_fn, pass_dict, kw: dict) -> None:
    """`register_replacement` as 2.6-2.14 do it for a given search pattern, on releases that
    re-trace instead (`given_patterns_match_as_given`): match the pattern as given, then
    ``Match.replace_by_example``."""
    pm = _pm()
    pattern = kw["search_fn_pattern"]
    if kw.get("skip_duplicates"):
        seen = pass_dict.__dict__.setdefault("_ascend_seen_patterns", set())
        key = pm.PatternPrettyPrinter.run(pattern)
        if key in seen:
            return
        seen.add(key)
    names = list(inspect.signature(search_fn).parameters)
    get_decomp_fn = kw["get_decomp_fn"]

    def trace(fn, args):
        return trace_fn(fn, args, get_decomp_fn=get_decomp_fn)

    def rewrite(match, *args, **kwargs):
        match.replace_by_example(replace_fn, [match.kwargs[n] for n in names], trace_fn=trace)

    register = require("pattern_matcher.register_graph_pattern", lambda: pm.register_graph_pattern)
    register(pattern, extra_check=kw.get("extra_check", lambda match: True), pass_dict=pass_dict)(rewrite)


def gen_search_pattern(search_fn, example_inputs, trace_fn, scalar_workaround, *, get_decomp_fn):
    """The search pattern of `search_fn`, traced once (for patterns matched without re-tracing).

    2.6 has ``gen_pattern``; 2.7+ ``gen_pattern_and_search_gm`` (which takes ``get_decomp_fn``
    from 2.13, see `register_replacement`).
    """
    pm = _pm()
    fn = getattr(pm, "gen_pattern_and_search_gm", None)
    if fn is None:
        gen = require("pattern_matcher.gen_pattern", lambda: pm.gen_pattern)
        return gen(search_fn, list(example_inputs), trace_fn, scalar_workaround)
    pattern, _ = fn(
        search_fn, list(example_inputs), trace_fn, scalar_workaround, **_accepted(fn, {"get_decomp_fn": get_decomp_fn})
    )
    return pattern


def match_kwarg(match, name: str, default: Any) -> Any:
    """What `match` (as handed to an ``extra_check``) bound to the search argument `name`.

    2.6-2.12 bake matched float scalars (eps) into the exact pattern and bind no keyword for them;
    callers pass the `default` to use then."""
    return match.kwargs.get(name, default)


def size_hint(value: Any) -> int | float | None:
    """The concrete value a (possibly symbolic) size or scalar stands for, without adding a guard;
    None for an unbacked symbol (no value known at compile time). ``SymNode.hint`` on 2.6-2.15."""
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        node = value.node
        hint = node.hint if getattr(node, "has_hint", lambda: node.hint is not None)() else None
        return None if hint is None else (int(hint) if isinstance(value, torch.SymInt) else float(hint))
    return value


def new_fake_mode():
    """A fresh `FakeTensorMode` (static shapes): tensors with sizes and no data, to trace on."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def pattern_matcher_pass(name: str):
    """A new `PatternMatcherPass` named `name` (``pass_name`` exists from 2.5; ``subsystem`` is 2.9+)."""
    cls = require("pattern_matcher.PatternMatcherPass", lambda: _pm().PatternMatcherPass)
    return cls(**_accepted(cls.__init__, {"pass_name": name}))


def registered_pattern_count(pm_pass) -> int | None:
    """Patterns registered in a `PatternMatcherPass` (its ``patterns`` table, keyed by anchor op), or
    None where a release keeps them otherwise."""
    table = getattr(pm_pass, "patterns", None)
    return sum(len(v) for v in table.values()) if isinstance(table, dict) else None


def functional_trace(fn: Callable, args: Sequence[Any], decompositions: dict) -> torch.fx.GraphModule:
    """Trace `fn` to a functional aten graph with `decompositions`, normalized like Inductor's
    ``fwd_only`` (which alone keeps in-place ops, so `fn` runs under ``dispatch_functionalize``)."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize

    functional = dispatch_functionalize(fn, FunctionalTensorMode())
    fwd_only = require("pattern_matcher.fwd_only", lambda: _pm().fwd_only)
    return fwd_only(functional, list(args), get_decomp_fn=lambda: decompositions)


def remove_noop_ops(graph: torch.fx.Graph) -> None:
    """Inductor's post-grad no-op elimination (``fx_passes.post_grad.remove_noop_ops``, 2.1+)."""
    fn = require(
        "post_grad.remove_noop_ops",
        lambda: __import__("torch._inductor.fx_passes.post_grad", fromlist=["remove_noop_ops"]).remove_noop_ops,
    )
    fn(graph)


def custom_graph_pass_base() -> type:
    """``torch._inductor.custom_graph_pass.CustomGraphPass`` (2.6+: ``uuid()`` keys Inductor's FX cache)."""
    return require(
        "custom_graph_pass.CustomGraphPass",
        lambda: __import__("torch._inductor.custom_graph_pass", fromlist=["CustomGraphPass"]).CustomGraphPass,
    )


# -- fake tensors and tracing context ------------------------------------------------------------
def detect_fake_mode(tensors):
    """The fake mode of `tensors`, or None (``torch._guards.detect_fake_mode``; 2.6 also has it in
    ``torch._dynamo.utils``, where 2.13 keeps a re-export)."""
    fn = require("detect_fake_mode", lambda: torch._guards.detect_fake_mode)
    return fn(tensors)


def unset_fake_mode():
    """Context leaving any active fake mode (``fake_tensor.unset_fake_temporarily``, 2.2+)."""
    return require(
        "fake_tensor.unset_fake_temporarily",
        lambda: __import__("torch._subclasses.fake_tensor", fromlist=["unset_fake_temporarily"]).unset_fake_temporarily,
    )()


def tracing_context():
    """The active `TracingContext` or None."""
    return require("TracingContext.try_get", lambda: torch._guards.TracingContext.try_get)()


def no_tracing_context():
    """Context with no active `TracingContext` (pattern registration inside a compile)."""
    return require("torch._guards.tracing", lambda: torch._guards.tracing)(None)


def current_compile_id():
    """Dynamo's id of the frame being compiled, or None."""
    return require("CompileContext.current_compile_id", lambda: torch._guards.CompileContext.current_compile_id)()


# -- aot_autograd, Inductor entry points ---------------------------------------------------------
def aot_autograd(**kwargs):
    """``torch._dynamo.backends.common.aot_autograd`` (stable since 2.0)."""
    fn = require(
        "dynamo.backends.common.aot_autograd",
        lambda: __import__("torch._dynamo.backends.common", fromlist=["aot_autograd"]).aot_autograd,
    )
    return fn(**kwargs)


def make_boxed_func(fn: Callable) -> Callable:
    """``make_boxed_func``: aot's boxed calling convention.

    From its home module, ``torch._functorch._aot_autograd.utils`` (2.1+; importing torch loads it),
    not through ``torch._functorch.aot_autograd``, whose import costs a warm-started eager process
    about a second for a function of four lines."""

    def get():
        try:
            from torch._functorch._aot_autograd.utils import make_boxed_func as boxed
        except ImportError:
            from torch._functorch.aot_autograd import make_boxed_func as boxed
        return boxed

    return require("aot_autograd.make_boxed_func", get)(fn)


def compile_fx(gm, example_inputs, config_patches=None):
    """Inductor's ``compile_fx``; inside an aot ``fw_compiler`` its result takes its arguments unpacked."""
    fn = require(
        "compile_fx.compile_fx", lambda: __import__("torch._inductor.compile_fx", fromlist=["compile_fx"]).compile_fx
    )
    return fn(gm, example_inputs, config_patches=config_patches)


def list_mode_options(mode: str) -> dict:
    """Inductor's config patches of a ``torch.compile`` mode (``"max-autotune"``...)."""
    return require(
        "torch._inductor.list_mode_options",
        lambda: __import__("torch._inductor", fromlist=["list_mode_options"]).list_mode_options,
    )(mode)


# -- dynamo config -------------------------------------------------------------------------------
def _recompile_limit_name() -> str:
    # 2.6 calls it `cache_size_limit`; 2.7+ `recompile_limit` (the old name an alias on some).
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            return name
    raise TorchCompatError(
        f"diffusers-ascend: torch {torch.__version__}'s torch._dynamo.config has neither recompile_limit nor "
        f"cache_size_limit; supported: {_range()}."
    )


def compiled_blocks_share_graphs() -> bool:
    """Whether the blocks of one class, compiled in place with one backend, share one dynamo graph.

    2.6/2.7's dynamo guard on the identity of each block's attention processor, so every block
    instance compiles its own graph; 2.8+ compile one per class. A guard behaviour, not an API, so
    known by release; `diffusers_ascend.processors` shares processors where it is False."""
    return torch_version() >= (2, 8)


@functools.cache  # asked on every rms_norm match; the op table does not change in a process
def fused_rms_norm() -> Callable | None:
    """``aten._fused_rms_norm`` as ``F.rms_norm`` reaches it on CUDA, or None where it is not that op.

    From 2.9 the CUDA aot graph holds ``_fused_rms_norm(x, [D], w, eps)[0]``; 2.8 has an op of that
    name with another schema (MPS only); 2.6/2.7 have none."""
    op = getattr(torch.ops.aten, "_fused_rms_norm", None)
    if op is None:
        return None
    schema = op.default._schema
    if [a.name for a in schema.arguments[:2]] != ["input", "normalized_shape"] or len(schema.returns) != 2:
        return None
    return op.default


def fused_rms_norm_pattern():
    """The search pattern ``_fused_rms_norm(x, <shape>, w, eps)[0]``, or None. Built by hand: the op
    decomposes when traced on CPU."""
    op = fused_rms_norm()
    if op is None:
        return None
    import operator

    pm = _pm()
    fused = pm.CallFunction(op, pm.KeywordArg("x"), pm.Ignored(), pm.KeywordArg("w"), pm.KeywordArg("eps"))
    return pm.CallFunction(operator.getitem, fused, 0)


def one_op_graph(op: Callable, args: Sequence[Any], index: int | None = None) -> torch.fx.Graph:
    """A graph of the single call ``op(*args)`` (``[index]`` of its result when given), tensors as
    placeholders, with the fake tensor metadata aot graphs carry, built without tracing (for ops
    that tracing on this machine would decompose)."""
    import operator

    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    graph, fx_args, values = torch.fx.Graph(), [], []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            node = graph.placeholder(f"arg{i}")
            node.meta["val"] = mode.from_tensor(a)
            fx_args.append(node)
            values.append(node.meta["val"])
        else:
            fx_args.append(a)
            values.append(a)
    with mode:
        out = op(*values)
    node = graph.call_function(op, tuple(fx_args))
    node.meta["val"] = out
    if index is not None:
        node = graph.call_function(operator.getitem, (node, index))
        node.meta["val"] = out[index]
    graph.output((node,))
    return torch.fx.GraphModule(torch.nn.Module(), graph).graph  # the pattern matcher wants an owner


def dynamo_recompile_limit() -> int:
    """Dynamo's process-wide recompile limit per code object."""
    return getattr(torch._dynamo.config, _recompile_limit_name())


def set_dynamo_recompile_limit(value: int) -> None:
    """Sets dynamo's process-wide recompile limit (callers restore it: see `integration.limits`)."""
    setattr(torch._dynamo.config, _recompile_limit_name(), value)


# -- freezing ------------------------------------------------------------------------------------
def inductor_freezing_enabled() -> bool:
    """Whether ``torch._inductor.config.freezing`` is set (dynamo then lifts weights into graphs)."""
    import torch._inductor.config as inductor_config

    return bool(inductor_config.freezing)


def inductor_freezing_scope():
    """Context setting ``torch._inductor.config.freezing`` for its duration only (``config.patch``
    restores the previous value on exit and on error)."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


def aoti_metadata_scope(metadata: dict):
    """Context giving AOTInductor ``metadata`` for one compile (it writes its device keys into it)."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch({"aot_inductor.metadata": metadata})


def vec_isa_probe_sources() -> tuple[str, ...]:
    """The C++ sources Inductor compiles to probe the CPU's vector ISA: the ``_*_code`` strings of
    ``torch._inductor.cpu_vec_isa.VecISA`` and its subclasses (``_avx_code`` for every ISA; on a
    CPU that has the extension also ``_avx512_bf16_code``, ``_avx512_vnni_code``, ``_amx_code``,
    ``_amx_fp16_code``, 2.6-2.15). Empty where this torch has no such probe."""
    try:
        from torch._inductor.cpu_vec_isa import VecISA
    except ImportError:  # pragma: no cover - Inductor is part of every supported torch
        return ()
    sources = []
    for cls in _class_tree(VecISA):
        for name, value in vars(cls).items():
            if name.startswith("_") and name.endswith("_code") and isinstance(value, str) and value not in sources:
                sources.append(value)
    return tuple(sources)


def _class_tree(base: type) -> list[type]:
    """`base` and every class below it, each once."""
    classes, seen = [base], []
    while classes:
        cls = classes.pop()
        if cls not in seen:
            seen.append(cls)
            classes.extend(cls.__subclasses__())
    return seen


def fresh_inductor_cache():
    """Context with an empty temporary Inductor / AOT cache: ``torch._inductor.utils.fresh_cache``
    (2.8+) or ``fresh_inductor_cache`` (2.6-2.7, an alias until it was dropped)."""
    from torch._inductor import utils

    fresh = getattr(utils, "fresh_cache", None) or require(
        "inductor.utils.fresh_inductor_cache", lambda: utils.fresh_inductor_cache
    )
    return fresh()


# -- warm start: torch's portable compile caches (diffusers_ascend.warm_start) --------------------
def cache_artifacts_api() -> tuple[Callable, Callable] | None:
    """``(save_cache_artifacts, load_cache_artifacts)``: Inductor's portable "mega-cache", public
    since 2.7; None on 2.6."""
    save = getattr(torch.compiler, "save_cache_artifacts", None)
    load = getattr(torch.compiler, "load_cache_artifacts", None)
    return (save, load) if save is not None and load is not None else None


def aoti_api() -> tuple[Callable, Callable] | None:
    """``(aoti_compile_and_package, aoti_load_package)``, or None where absent. Our ops are Python
    custom ops the package calls back, so ``ascend_kernels`` must be imported where it loads."""
    try:
        import torch._inductor as inductor
    except ImportError:  # pragma: no cover - Inductor is part of every supported torch
        return None
    compile_ = getattr(inductor, "aoti_compile_and_package", None)
    load = getattr(inductor, "aoti_load_package", None)
    return (compile_, load) if compile_ is not None and load is not None else None


def aoti_load(path: str):
    """Loads the AOTInductor package at `path` (a model named ``"model"``, one runner).

    2.11+'s ``aoti_load_package`` spends about a second probing this host's CPU ISA only to warn;
    warm start already refuses packages from hosts whose CPU differs, so on 2.8+ the loader is built
    directly, as ``load_package`` does for older archives."""
    api = require("torch._inductor.aoti_load_package", aoti_api)
    loader = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    try:
        from torch._inductor.package import package as pkg
    except ImportError:  # pragma: no cover - present on every release with aoti_load_package
        pkg = None
    model = getattr(pkg, "AOTICompiledModel", None)
    if loader is None or model is None or torch_version() < (2, 8):
        return api[1](path)
    return model(loader(path, "model", False, 1, -1))


def export_program(fn: torch.nn.Module, args: Sequence[Any]):
    """``torch.export.export(fn, args, strict=False)`` (non-strict: traced by Python, as 2.7+
    default; the keyword exists on 2.6+)."""
    return require("torch.export.export", lambda: torch.export.export)(fn, tuple(args), strict=False)


def export_to_json(program) -> bytes:
    """`program` (an ExportedProgram) as torch.export's schema JSON (``_export.serde.serialize``,
    2.3+): the graph, its tensor metadata and signature. Its state dict, constants and example
    inputs (pickles) are left out: our programs take their weights as inputs."""
    serde = require(
        "torch._export.serde.serialize", lambda: __import__("torch._export.serde.serialize", fromlist=["serialize"])
    )
    return serde.serialize(program).exported_program


def op_overload(namespace: str, name: str, overload: str) -> Any:
    """The registered operator overload ``namespace::name.overload`` (``default``: the unnamed
    overload) as ``torch.ops.<namespace>.<name>.<overload>`` resolves it, or None when the
    dispatcher registers no such overload or that path reaches another object.

    The name is looked up in the dispatcher's registry (``_jit_get_operation``: the lookup behind
    ``torch.ops``) before any attribute is read, so no attribute of ``torch.ops`` is read for a
    name that is not an operator. ``_jit_get_operation`` returns ``(None, None)`` for an unknown
    name on recent releases and raised ``RuntimeError`` on older ones: both mean none."""
    try:
        packet, overloads = torch._C._jit_get_operation(f"{namespace}::{name}")
    except RuntimeError:
        return None
    if packet is None or ("" if overload == "default" else overload) not in (overloads or ()):
        return None
    op = getattr(getattr(getattr(torch.ops, namespace), name, None), overload, None)
    if not isinstance(op, torch._ops.OpOverload):
        return None
    schema = op._schema
    return op if (schema.name, schema.overload_name or "default") == (f"{namespace}::{name}", overload) else None


def export_from_json(data: bytes | dict):
    """The ExportedProgram of `export_to_json` bytes (or of their parsed JSON object), with an empty
    state dict, no constants and no example inputs: nothing is unpickled (``deserialize`` reads
    those three as pickles only when they are non-empty).

    ``deserialize`` is JSON -> schema dataclasses (``_dict_to_dataclass``) -> program
    (``ExportedProgramDeserializer``). Its first step resolves each dataclass's type hints again for
    every object (``typing.get_type_hints``: most of the time a warm-started eager process spent
    reading its packages), so where the serializer has both steps, the first runs here with one
    converter per schema type, built once (`_schema_objects`, the same conversion); elsewhere
    torch's own."""
    serde = require(
        "torch._export.serde.serialize",
        lambda: __import__("torch._export.serde.serialize", fromlist=["deserialize", "SerializedArtifact"]),
    )
    reader = getattr(serde, "ExportedProgramDeserializer", None)
    if not (
        hasattr(serde, "_dict_to_dataclass")
        and reader is not None
        and _has_param(reader.deserialize, "constants")
        and _schema_parts() is not None
    ):
        if isinstance(data, dict):
            data = json.dumps(data).encode()
        return serde.deserialize(serde.SerializedArtifact(data, b"", b"", b""))
    program = _schema_objects(serde, serde.ExportedProgram, json.loads(data) if isinstance(data, bytes) else data)
    return reader().deserialize(program, b"", b"", b"")


@functools.cache
def _schema_parts():
    """(the schema module, its ``_Union`` base), from their own modules (2.6's serializer does not
    re-export them as later releases do); None where they are elsewhere."""
    try:
        import torch._export.serde.schema as schema
        from torch._export.serde.union import _Union
    except ImportError:
        return None
    return schema, _Union


def _schema_objects(serde, cls, data):
    """``serialize._dict_to_dataclass(cls, data)`` (2.6-2.15 read alike); tests/test_warm_start_eager.py
    checks it builds equal objects."""
    return _schema_converter(serde, cls)(data)


@functools.cache
def _schema_converter(serde, cls) -> Callable[[Any], Any]:
    """The function that turns JSON data of schema type `cls` into its objects, by
    ``_dict_to_dataclass``'s rules; each class's type hints are resolved here once. A converter
    looks its parts' converters up when it runs (this cache: schema types are recursive)."""
    resolve = getattr(serde, "_resolve_schema_cls", None)
    if resolve is not None:
        cls = resolve(cls)
    origin = typing.get_origin(cls)
    if origin is typing.Annotated:
        return _schema_converter(serde, cls.__origin__)
    if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
        inner = typing.get_args(cls)[0]
        return lambda data: None if data is None else _schema_converter(serde, inner)(data)
    if isinstance(cls, type) and issubclass(cls, _schema_parts()[1]):
        hints = _schema_hints(cls)

        def union(data):
            if not isinstance(data, dict) or len(data) != 1:
                raise ValueError(f"a {cls.__name__} must be an object of one key")
            ((name, value),) = data.items()
            return cls.create(**{name: _schema_converter(serde, hints[name])(value)})

        return union
    if dataclasses.is_dataclass(cls):
        hints = _schema_hints(cls)
        names = tuple(f.name for f in dataclasses.fields(cls))

        def dataclass(data):
            return cls(**{n: _schema_converter(serde, hints[n])(data[n]) for n in names if n in data})

        return dataclass

    def other(data):
        if isinstance(data, list):
            if not data:
                return data
            convert = _schema_converter(serde, typing.get_args(cls)[0])
            return [convert(d) for d in data]
        if isinstance(data, dict):
            convert = _schema_converter(serde, typing.get_args(cls)[1])
            return {k: convert(v) for k, v in data.items()}
        if cls is float:
            return float(data)
        return data

    return other


@functools.cache
def _schema_hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls, globalns=vars(_schema_parts()[0]))


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    """``torch.utils._pytree.tree_flatten`` (leaves, spec)."""
    from torch.utils import _pytree

    return _pytree.tree_flatten(tree)


def tree_unflatten(leaves: Sequence[Any], spec: Any) -> Any:
    from torch.utils import _pytree

    return _pytree.tree_unflatten(list(leaves), spec)


def treespec_dumps(spec: Any) -> str:
    """A pytree spec as JSON text (``_pytree.treespec_dumps``: type names and structure, no code)."""
    from torch.utils import _pytree

    return _pytree.treespec_dumps(spec)


def treespec_loads(text: str) -> Any:
    """The spec of `treespec_dumps` text. Only node types registered with pytree by name can be
    named (tuple, list, dict...): parsing never imports or runs anything."""
    from torch.utils import _pytree

    return _pytree.treespec_loads(text)


def unwrap_compiled_module(obj: Any) -> Any:
    """`obj` without the ``OptimizedModule`` wrappers ``torch.compile(module)`` puts around it."""
    if "torch._dynamo" not in sys.modules:  # nothing was compiled: no wrapper exists
        return obj
    from torch._dynamo.eval_frame import OptimizedModule

    while isinstance(obj, OptimizedModule):
        obj = obj._orig_mod
    return obj


def compile_cache_counters() -> dict[str, int]:
    """Hits and misses of Inductor's FX graph cache and the AOTAutograd cache in this process
    (``torch._dynamo.utils.counters``; the names are those of 2.6-2.14, absent ones read 0)."""
    from torch._dynamo.utils import counters

    return {
        "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
        "autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "autograd_cache_miss": counters["aot_autograd"]["autograd_cache_miss"],
    }


def inductor_cache_dir() -> str:
    """Inductor's on-disk cache root (``TORCHINDUCTOR_CACHE_DIR`` or its default):
    ``runtime.cache_dir_utils.cache_dir`` (2.7+) or ``runtime.runtime_utils.cache_dir`` (2.6)."""
    for name in ("torch._inductor.runtime.cache_dir_utils", "torch._inductor.runtime.runtime_utils"):
        try:
            fn = __import__(name, fromlist=["cache_dir"]).cache_dir
        except (ImportError, AttributeError):
            continue
        return fn()
    return require(
        "inductor cache_dir",
        lambda: __import__("torch._inductor.runtime.cache_dir_utils", fromlist=["cache_dir"]).cache_dir,
    )()


def compiled_cpp_libraries() -> list[str]:
    """Paths of the C++ kernel libraries Inductor's CPU backend built or loaded in this process.

    The mega-cache does not carry them, and rebuilding them is most of a CPU warm start. Read from
    ``codecache.CppCodeCache`` loaders (2.6-2.14); loaders not yet run are skipped."""
    try:
        from torch._inductor import codecache
    except ImportError:  # pragma: no cover - Inductor is part of every supported torch
        return []
    base = getattr(codecache, "CppCodeCache", None)
    if base is None:
        return []
    paths = []
    for cls in _class_tree(base):
        for load in list(getattr(cls, "__dict__", {}).get("cache", {}).values()):
            lib = _loaded_library(load)
            path = getattr(lib, "__file__", None) or getattr(lib, "_name", None)
            if isinstance(path, str) and path.endswith(".so") and path not in paths:
                paths.append(path)
    return paths


def _loaded_library(load: Any) -> Any:
    # A loader that has run closes over `lib`; never call one: an unbuilt one would compile.
    if not callable(load) or getattr(load, "__closure__", None) is None:
        return load
    names = load.__code__.co_freevars
    cells = dict(zip(names, load.__closure__))
    cell = cells.get("lib")
    try:
        return cell.cell_contents if cell is not None else None
    except ValueError:  # empty cell
        return None


def fold_parameters(aot_gm: torch.fx.GraphModule) -> list[int]:
    """Parameters of `aot_gm` (inside an aot ``fw_compiler``) become constants, then constant
    folding; returns the indices of the inputs the graph still takes (``enter_freezing``: 2.7+)."""
    from torch._inductor import freezing

    ctx = tracing_context()
    params = getattr(ctx, "params_flat_unwrap_subclasses", None)
    if params is None:
        params = ctx.params_flat
    replace = require("freezing.replace_params_with_constants", lambda: freezing.replace_params_with_constants)
    scope = getattr(freezing, "enter_freezing", contextlib.nullcontext)
    with scope():
        keep = replace(aot_gm, params, ctx.fw_metadata)
        aot_gm.graph = freezing.fx_graph_cse(aot_gm.graph)
        aot_gm.recompile()
        freezing.constant_fold(aot_gm)
        record = getattr(freezing, "record_has_frozen_params", None)
        if record is not None:
            record(aot_gm)
    return keep


def probe_trace(fn: Callable, args: Sequence[Any]) -> torch.fx.GraphModule:
    """`fn` traced the way aot_autograd presents a graph to a backend (functionalized, fake tensor
    metadata, no decompositions), outside any active compile."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    with unset_fake_mode(), no_tracing_context(), torch.no_grad():
        return make_fx(dispatch_functionalize(fn, FunctionalTensorMode()), tracing_mode="fake")(*args)


@functools.cache
def conj_views_reach_graphs() -> bool:
    """Whether the graphs the passes see hold ``t.conj()`` as a bare ``aten._conj`` node.

    `remove_noop_ops` drops functionalization's ``clone(_conj(t))`` clone up to 2.10 and keeps it
    from 2.11; the rope pass has a pattern for the bare form. Detected on a probe trace."""
    g = probe_trace(
        lambda x, f: torch.view_as_complex(x.view(2, 2)) * f.conj(),
        [torch.ones(4), torch.ones(2, dtype=torch.complex64)],
    ).graph
    remove_noop_ops(g)
    conj = [n for n in g.nodes if n.target is torch.ops.aten._conj.default]
    return any(u.target is torch.ops.aten.mul.Tensor for n in conj for u in n.users)


# -- the whole engine ----------------------------------------------------------------------------
_ENGINE_APIS: tuple[tuple[str, Callable[[], Any]], ...] = (
    ("torch.library.custom_op", lambda: torch.library.custom_op),
    ("torch.library.register_fake", lambda: torch.library.register_fake),
    ("torch.library.register_autograd", lambda: torch.library.register_autograd),
    (
        "functional_tensor.dispatch_functionalize",
        lambda: (
            __import__(
                "torch._subclasses.functional_tensor", fromlist=["dispatch_functionalize"]
            ).dispatch_functionalize
        ),
    ),
    ("pattern_matcher.register_replacement", lambda: _pm().register_replacement),
    ("pattern_matcher.gen_pattern", lambda: _pm().gen_pattern),
    ("pattern_matcher.PatternMatcherPass", lambda: _pm().PatternMatcherPass),
    ("pattern_matcher.fwd_only(get_decomp_fn=)", lambda: _require_param(_pm().fwd_only, "get_decomp_fn")),
    ("custom_graph_pass.CustomGraphPass", custom_graph_pass_base),
    (
        "fx_passes.post_grad.remove_noop_ops",
        lambda: __import__("torch._inductor.fx_passes.post_grad", fromlist=["remove_noop_ops"]).remove_noop_ops,
    ),
    ("torch._dynamo.config recompile limit", _recompile_limit_name),
)


@functools.cache
def _check_apis() -> None:
    for api, getter in _ENGINE_APIS:
        require(api, getter)


def check_engine(fusions: bool = True) -> None:
    """Raises `TorchCompatError` if the running torch lacks an API the engine needs; warns once if
    it is newer than `TORCH_NEWEST_VERIFIED`. Called when a backend is built.

    Args:
        fusions: whether fusion passes will run (then Inductor's pattern matcher is checked too).

    >>> check_engine(fusions=False)  # on a supported torch: nothing happens
    """
    status, sentence = support_status()
    if status == "too old":
        raise TorchCompatError(f"diffusers-ascend: {sentence}")
    if status == "newer than verified":
        _warn_untested(sentence)
    if fusions:
        _check_apis()


@functools.cache
def _warn_untested(sentence: str) -> None:
    warn(sentence, stacklevel=3)


# -- dynamo's cache of one code object ------------------------------------------------------------
def drop_compiled_code(code) -> None:
    """Frees every graph dynamo compiled for the frames of `code` (its cache entries): a later
    call of `code` compiles anew. ``reset_code`` of ``torch._C._dynamo.eval_frame`` (2.6-2.15)."""
    torch._C._dynamo.eval_frame.reset_code(code)


def compiled_code_entries(code) -> int:
    """How many graphs (cache entries) dynamo holds for the frames of `code`: what its recompile
    limit counts where no module is guarded by identity (2.8+ compiling blocks in place)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(code))


# torch.compile with a backend given by name or as a function builds one `torch._TorchCompileWrapper`
# per call and calls the backend from the wrapper's `__call__` as `compiler_fn(gm, inputs, **kwargs)`
# (2.6 to 2.15). Dynamo wraps that wrapper in its own callables, each pointing at the next by
# `_torchdynamo_orig_callable` (2.6) or `_torchdynamo_orig_backend` (2.13 on).
_ORIG_BACKEND_ATTRS = ("_torchdynamo_orig_backend", "_torchdynamo_orig_callable")


def calling_compile_wrapper(max_depth: int = 8) -> Any:
    """The ``torch._TorchCompileWrapper`` whose ``__call__`` is up the stack of the caller (the one
    torch.compile call a graph handed to a named backend belongs to), or None (e.g. a backend
    called by ``torch._dynamo.optimize(name)`` or directly)."""
    wrapper_cls = getattr(torch, "_TorchCompileWrapper", None)
    code = getattr(vars(wrapper_cls).get("__call__") if wrapper_cls is not None else None, "__code__", None)
    if code is None:
        return None
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        if frame.f_code is code:
            wrapper = frame.f_locals.get("self")
            return wrapper if isinstance(wrapper, wrapper_cls) else None
        frame = frame.f_back
    return None


def _compile_wrapper_from(obj: Any) -> Any:
    wrapper_cls = getattr(torch, "_TorchCompileWrapper", None)
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        if wrapper_cls is not None and isinstance(obj, wrapper_cls):
            return obj
        obj = next((getattr(obj, a) for a in _ORIG_BACKEND_ATTRS if getattr(obj, a, None) is not None), None)
    return None


def compile_wrapper_of(compiled: Any) -> Any:
    """The ``torch._TorchCompileWrapper`` torch.compile built for `compiled`, or None.

    Args:
        compiled: an ``OptimizedModule`` (``torch.compile(module)``), or the function torch.compile
            returned for a function (also a module's ``_compiled_call_impl`` after ``module.compile()``).
    """
    if "torch._dynamo" not in sys.modules:  # nothing was compiled
        return None
    from torch._dynamo.eval_frame import OptimizedModule, _TorchDynamoContext

    if isinstance(compiled, OptimizedModule):
        return _compile_wrapper_from(getattr(getattr(compiled, "dynamo_ctx", None), "callback", None))
    # The function holds its context (and, on 2.6, the context's callback) in its closure.
    for cell in getattr(compiled, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, _TorchDynamoContext):
            value = getattr(value, "callback", None)
        found = _compile_wrapper_from(value) if not isinstance(value, torch.nn.Module) else None
        if found is not None:
            return found
    return None


def guard_finalizers(code) -> list:
    """The ``weakref.finalize`` callbacks that dynamo's guards of `code`'s compiled graphs hold.

    Dynamo's ``CheckFunctionManager.id_ref`` registers, for each object a guard matches by
    identity, a finalizer holding the manager (``partial(self.invalidate, ...)`` on 2.13+, the bound
    ``self.invalidate`` before), and with it the guard tree, its code parts and user stacks: about
    0.1-0.2 MiB per compiled block graph. Most of those objects (modules, classes, builtins) live as
    long as the process, so the managers outlive the graphs they guarded, through
    ``torch._dynamo.reset()`` too. Matched to `code` by the identity of its cache entries' guard
    managers; an empty list where a release lays these out otherwise (nothing is released then)."""
    import weakref

    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        from torch._dynamo.guards import CheckFunctionManager
    except ImportError:
        return []
    managers = {id(m) for m in (getattr(e, "guard_manager", None) for e in _debug_get_cache_entry_list(code)) if m}
    if not managers:
        return []
    found = []
    # A garbage collection that runs a finalizer while the registry is read changes its size:
    # `dict.copy` reads it without allocating per entry (no collection can start half-way).
    for fin, info in weakref.finalize._registry.copy().items():
        func = getattr(info, "func", None)
        owner = getattr(getattr(func, "func", func), "__self__", None)
        if isinstance(owner, CheckFunctionManager) and id(getattr(owner, "guard_manager", None)) in managers:
            found.append(fin)
    return found
