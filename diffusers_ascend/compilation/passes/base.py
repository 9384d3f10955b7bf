"""Shared machinery of the fusion passes: pattern variants, lazy registration, match counting.

A fusion is one file here (``XxxPattern`` variants and an ``XxxFusionPass``) plus its row in
`diffusers_ascend.fusions.TABLE`. Patterns are traced as their graphs were made (aot without
decompositions, functionalized): plain ``fwd_only`` keeps in-place ops and silently matches nothing. Besides
Inductor's exact re-trace, every pattern checks under fake tensors that the replacement returns
the matched code's dtype and shape, and every traced pattern checks each match's ops, wiring and
literals against its search function traced again (`FusionPattern.literal_mismatch`): patterns
matched without the re-trace, or read from the pre-traced cache, take no look-alike.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import torch

import ascend_kernels  # noqa: F401  (the replacements call torch.ops.ascend_kernels.*: register them)

from .. import _compat

__all__ = [
    "FusionPattern",
    "FusionPass",
    "FusionSelfCheckError",
    "EPS_PLACEHOLDER",
    "trace_functional",
    "no_decompositions",
]

# Float arguments are captured through `scalar_workaround`: the placeholder must survive tracing
# bit-exactly (an fp32-exact value; 1e-6 would be rounded by fp32 ops and never be found again).
EPS_PLACEHOLDER = 2.0**-20


def no_decompositions() -> dict:
    """Decomposition table of the graphs the passes run on (``aot_autograd`` without decompositions)."""
    return {}


class _PrivateRandom(torch.overrides.TorchFunctionMode):
    """Random draws inside it use its own seeded generator, not torch's global RNG: registering
    patterns draws example inputs, and must not change a seeded pipeline's image. Per thread,
    unlike `torch.random.fork_rng`."""

    _SAMPLERS = {
        torch.randn,
        torch.rand,
        torch.randint,
        torch.randperm,
        torch.normal,
        torch.Tensor.normal_,
        torch.Tensor.uniform_,
        torch.Tensor.random_,
    }
    _LIKE = {torch.randn_like: torch.randn, torch.rand_like: torch.rand}

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(0)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self._LIKE and kwargs.get("generator") is None:
            like = args[0]
            kwargs.setdefault("dtype", like.dtype)
            kwargs.setdefault("device", like.device)
            func, args = self._LIKE[func], (tuple(like.shape),)
        if func in self._SAMPLERS and kwargs.get("generator") is None:
            device = kwargs.get("device")
            if device is None and args and isinstance(args[0], torch.Tensor):  # a Tensor method
                device = args[0].device
            if device is not None and torch.device(device).type != "cpu":
                raise RuntimeError(f"a pattern's example inputs must be CPU tensors (drawn on {device})")
            kwargs["generator"] = self.generator
        return func(*args, **kwargs)


def example_inputs_of(pattern: FusionPattern) -> list[Any]:
    """`pattern.example_inputs()`, drawn from a private generator (see `_PrivateRandom`)."""
    with _PrivateRandom():
        return pattern.example_inputs()


def trace_functional(fn: Callable, args: Sequence[Any], *, get_decomp_fn: Callable[[], dict] = no_decompositions, **_):
    """Trace `fn` to a functional aten graph, like ``aot_autograd`` presents a dynamo graph.

    Used as ``trace_fn`` of ``register_replacement`` for search and replacement functions. Its
    default table matters: torch releases before 2.13 call it without ``get_decomp_fn``.
    """
    return _compat.functional_trace(fn, args, get_decomp_fn())


def _meta_val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


def _outputs(result: Any) -> list[Any]:
    """A search or replacement function's result as a list of its outputs (one, or several)."""
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _signature(values: Sequence[Any]) -> list[str]:
    """``["float32(2, 3, 8)", ...]``: dtype and shape of each output, for messages."""
    return [
        f"{str(v.dtype).replace('torch.', '')}{tuple(v.shape)}" if isinstance(v, torch.Tensor) else repr(v)
        for v in values
    ]


# Set while `FusionPass.verify` applies a pattern to its own form: `extra_check` records there why it
# refused a structural match, for the self-check's message.
_REJECTIONS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "ascend_pattern_rejections", default=None
)


def normalized_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def matched_nodes(match, target) -> list:
    """The nodes of `match` calling `target` (an OpOverload or OpOverloadPacket)."""
    return [
        n
        for n in match.nodes
        if n.op == "call_function" and (n.target == target or getattr(n.target, "overloadpacket", None) == target)
    ]


def tensor_arg(match, name: str):
    """The fake tensor bound to the pattern argument `name`, or None when it is not a tensor node."""
    node = match.kwargs.get(name)
    val = _meta_val(node)
    return val if isinstance(node, torch.fx.Node) and isinstance(val, torch.Tensor) else None


class _TensorSpec(tuple):
    """Sizes, strides and dtype of a matched tensor, concrete (hashable: a key of the traces cache)."""

    def __new__(cls, shape, stride, dtype):
        return super().__new__(cls, (tuple(shape), tuple(stride), dtype))

    def empty(self) -> torch.Tensor:
        shape, stride, dtype = self
        return torch.empty_strided(shape, stride, dtype=dtype)


_UNBOUND = object()


def _graph_difference(graph: torch.fx.Graph, names: Sequence[str], match, has_scalars: bool) -> str | None:
    """The first difference between `graph` (the search function traced on the match's inputs,
    placeholders in the order of `names`) and the nodes `match` holds, walking both from the outputs
    (see `FusionPattern.literal_mismatch`); None when there is none."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(names):
        return f"its search function traced to {len(placeholders)} inputs for {len(names)} parameters"
    bound = {p: match.kwargs.get(n, _UNBOUND) for p, n in zip(placeholders, names)}
    paired: dict[torch.fx.Node, Any] = {}
    scalars: list[Any] = []
    (output,) = [n for n in graph.nodes if n.op == "output"]
    want, have = _outputs(output.args[0]), list(match.output_nodes())
    if len(want) != len(have):
        return f"the form has {len(want)} outputs where the match has {len(have)}"

    def differs(t: Any, m: Any, where: str) -> str | None:
        if isinstance(t, torch.fx.Node):
            if t in paired:
                return None if paired[t] is m else f"{where}: the form reads one value where the match reads two"
            paired[t] = m
            if t.op == "placeholder":
                if bound[t] is _UNBOUND or bound[t] is m:
                    return None
                return f"{where}: the form reads its input {t.target!r} where the match reads another value"
            shown = m.format_node() if isinstance(m, torch.fx.Node) else repr(m)
            if not isinstance(m, torch.fx.Node) or m.op != "call_function" or m.target != t.target:
                return f"{where}: the form calls {t.target} where the match has {shown}"
            if len(t.args) != len(m.args) or set(t.kwargs) != set(m.kwargs):
                return f"{where}: the form calls {t.format_node()} where the match has {shown}"
            here = f"{t.target}"
            for i, (ta, ma) in enumerate(zip(t.args, m.args)):
                why = differs(ta, ma, f"{here} argument {i}")
                if why is not None:
                    return why
            for k, ta in t.kwargs.items():
                why = differs(ta, m.kwargs[k], f"{here} argument {k}")
                if why is not None:
                    return why
            return None
        if isinstance(t, (list, tuple)):
            if not isinstance(m, (list, tuple)) or len(m) != len(t):
                return f"{where}: the form has {t!r} where the match has {m!r}"
            for i, (ta, ma) in enumerate(zip(t, m)):
                why = differs(ta, ma, f"{where}[{i}]")
                if why is not None:
                    return why
            return None
        if isinstance(t, torch.device):
            return None
        value = _compat.size_hint(_meta_val(m)) if isinstance(m, torch.fx.Node) else _compat.size_hint(m)
        if has_scalars and isinstance(t, float) and t == EPS_PLACEHOLDER:
            # a float parameter (eps): any number, the same wherever the form uses it
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"{where}: the form takes a float parameter where the match has {m!r}"
            scalars.append(value)
            return None if len(set(scalars)) == 1 else f"{where}: the form uses one eps where the match has {scalars}"
        if isinstance(m, torch.fx.Node):
            # a size the graph computes at run time (dynamic shapes): equal to the traced one now
            if isinstance(t, int) and not isinstance(t, bool) and isinstance(_meta_val(m), torch.SymInt) and value == t:
                return None
            return f"{where}: the form has {t!r} where the match computes {m.format_node()}"
        if isinstance(t, bool) or isinstance(value, bool):
            same = type(t) is type(value) and t == value
        elif isinstance(t, (int, float)) and isinstance(value, (int, float)):
            same = t == value  # 1 and 1.0 compute alike; dtypes are checked on every match
        else:
            same = type(t) is type(value) and t == value
        return None if same else f"{where}: the form has {t!r} where the match has {m!r}"

    for i, (t, m) in enumerate(zip(want, have)):
        why = differs(t, m, f"output {i}")
        if why is not None:
            return why
    return None


class FusionPattern:
    """One variant of a fusion: a search function, its replacement and example inputs to trace them.

    Subclasses implement `search`, `replace` and `example_inputs`; names of the parameters of
    `search` are the names the match binds (``replace`` takes the same parameters). Float
    parameters listed in `scalars` are traced with `EPS_PLACEHOLDER` and captured from the match.
    A search may return several tensors (e.g. a normalized value and the residual sum it was
    computed from, both used later): its replacement then returns as many, in the same order, and
    each match counts once.

    Args:
        form: which written form of the fusion this is, one of `FORMS` (when the class has forms).
        dtype: dtype of the example inputs. Casts vanish in fp32 graphs, so patterns with casts are
            registered per dtype (bf16 also covers fp16: dtypes are checked when a match is re-traced).
    """

    FORMS: ClassVar[tuple[str, ...]] = ()
    scalars: ClassVar[tuple[str, ...]] = ()
    # False for forms with sizes computed from shapes: under dynamic shapes a re-trace never matches,
    # so they match the generic pattern and must check what matters in `check`.
    retrace: ClassVar[bool] = True

    def __init__(self, form: str | None = None, dtype: torch.dtype = torch.float32):
        if self.FORMS and form not in self.FORMS:
            raise ValueError(f"unknown {type(self).__name__} form {form!r}; valid: {self.FORMS}")
        self.form, self.dtype = form, dtype

    # -- to implement -------------------------------------------------------------------------
    def search(self, *args):  # pragma: no cover - abstract
        raise NotImplementedError

    def replace(self, *args):  # pragma: no cover - abstract
        raise NotImplementedError

    def example_inputs(self) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def check(self, match) -> bool:
        """Extra condition on a match (beyond structure, dtype and shape); True by default."""
        return True

    def search_pattern(self):
        """A hand-built search pattern, for forms tracing cannot produce here; None: traced."""
        return None

    def variant(self) -> str:
        """The written form this pattern matches, without the dtype (e.g. ``"torch,weight"``)."""
        return self.form or ""

    # -- machinery ----------------------------------------------------------------------------
    @property
    def group(self) -> str:
        """Variants of one group differ only by dtype and share one `PatternMatcherPass`."""
        return f"{type(self).__name__}[{self.variant()}]"

    @property
    def name(self) -> str:
        return f"{type(self).__name__}[{self.variant()},{str(self.dtype).replace('torch.', '')}]"

    def rejection(self, match) -> str | None:
        """Why `match` is not this fusion's (None: it is): `check` refused it, or the replacement
        does not yield the dtype and shape of each matched output (its output nodes' fake values) on
        the matched fake tensors. A pattern whose search returns several tensors is compared output
        by output."""
        if not self.check(match):
            return f"{type(self).__name__}.check() refused it"
        if self.search_pattern() is None:
            differs = self.literal_mismatch(match)
            if differs is not None:
                return differs
        names = list(inspect.signature(self.search).parameters)
        # Float scalars (eps) change neither dtype nor shape: the placeholder stands in where a
        # torch release binds none (see `_compat.match_kwarg`).
        args = [
            _meta_val(_compat.match_kwarg(match, n, EPS_PLACEHOLDER) if n in self.scalars else match.kwargs[n])
            for n in names
        ]
        fake_mode = _compat.detect_fake_mode([a for a in args if isinstance(a, torch.Tensor)])
        if fake_mode is None:
            return "its tensors carry no fake values"
        expected = [_meta_val(n) for n in match.output_nodes()]
        try:
            with fake_mode:
                if not all(isinstance(e, torch.Tensor) for e in expected):
                    expected = _outputs(self.search(*args))
                actual = _outputs(self.replace(*args))
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            # A replacement that cannot take these inputs is not a match. Anything else (e.g. an
            # unregistered op) is a bug and must surface, never read as "0 matches".
            return f"the replacement raised {type(e).__name__}: {e}"
        # Shapes compare as torch.Size (symbolic sizes through the shape environment), not as text.
        same = len(actual) == len(expected) and all(
            isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and a.dtype == e.dtype and a.shape == e.shape
            for a, e in zip(actual, expected)
        )
        if not same:
            return f"the replacement returns {_signature(actual)} where the matched code returns {_signature(expected)}"
        return None

    def literal_mismatch(self, match) -> str | None:
        """What differs between the matched code and this form as written (None: nothing).

        The first trace of `search` becomes a pattern whose int, float, list, dtype and device
        arguments are wildcards (Inductor's ``ignore_types``): ``norm(x) * (2 + scale)`` matches a
        form written ``1 + scale``, and a search graph read from the pre-traced cache is believed as
        it stands. Inductor's re-trace catches both only for the forms registered with it. So every
        traced form traces `search` again here, from its source, on fake tensors of the match's
        concrete sizes, strides and dtypes, and walks that graph against the matched nodes from the
        outputs: the same op at every node, the same wiring to the matched inputs, and every
        literal equal (constants of adds and multiplies, dims, split and view sizes, indices,
        dtypes). Exceptions: float scalars in `scalars` (eps: a parameter of the fused op, passed
        through, the same value wherever the form uses it), devices (placement, not computation)
        and, in dynamic graphs, sizes computed at run time where this trace has their current value.
        """
        names = list(inspect.signature(self.search).parameters)
        args, key = [], []
        for name in names:
            if name in self.scalars:
                args.append(EPS_PLACEHOLDER)
                key.append(name)
                continue
            val = _meta_val(match.kwargs.get(name))
            if isinstance(val, torch.Tensor):
                sizes = tuple(_compat.size_hint(s) for s in (*val.shape, *val.stride()))
                if None in sizes:
                    return "its inputs have sizes unknown at compile time"
                args.append(_TensorSpec(sizes[: val.dim()], sizes[val.dim() :], val.dtype))
                key.append(args[-1])
            else:
                args.append(_compat.size_hint(val))
                key.append(repr(args[-1]))
        traces = self.__dict__.setdefault("_literal_traces", {})
        graph = traces.get(tuple(key))
        if graph is None:
            try:
                with _compat.unset_fake_mode(), _compat.no_tracing_context(), torch.no_grad():
                    with _compat.new_fake_mode():
                        inputs = [a.empty() if isinstance(a, _TensorSpec) else a for a in args]
                        graph = trace_functional(self.search, inputs, get_decomp_fn=no_decompositions).graph
            except (RuntimeError, ValueError, TypeError, IndexError) as e:
                return f"tracing its search function on the match's inputs raised {type(e).__name__}: {e}"
            if len(traces) >= 64:  # bounded: a dynamic model's many shapes
                traces.clear()
            traces[tuple(key)] = graph
        return _graph_difference(graph, names, match, bool(self.scalars))

    def extra_check(self, match) -> bool:
        why = self.rejection(match)
        log = _REJECTIONS.get()
        if why is not None and log is not None:  # a self-check is listening (`FusionPass.verify`)
            log.append(f"{self.name}: {why}")
        return why is None

    def register(self, pm_pass, trace_fn: Callable = None) -> None:
        """Registers this pattern in `pm_pass`; `trace_fn` (default `trace_functional`) traces the
        search and replacement functions (`pretraced.InitialTrace` serves the first from a cache)."""
        trace_fn = trace_fn or trace_functional
        scalar_workaround = {name: EPS_PLACEHOLDER for name in self.scalars}
        pattern = self.search_pattern()
        if pattern is None and not self.retrace:
            pattern = _compat.gen_search_pattern(
                self.search,
                example_inputs_of(self),
                trace_fn,
                scalar_workaround,
                get_decomp_fn=no_decompositions,
            )
        _compat.register_replacement(
            self.search,
            self.replace,
            example_inputs_of(self),
            trace_fn,
            pm_pass,
            extra_check=self.extra_check,
            scalar_workaround=scalar_workaround,
            search_fn_pattern=pattern,
            skip_duplicates=True,
            get_decomp_fn=no_decompositions,
        )

    def probe_graph(self) -> torch.fx.Graph:
        """This form written out as the backend sees it: a functional aten graph traced from
        `search` on the example inputs (a realistic eps for float scalars), with fake tensor
        metadata and no-ops removed, like the graphs the passes run on. Used by `FusionPass.verify`."""
        names = list(inspect.signature(self.search).parameters)
        args = [1e-6 if n in self.scalars else a for n, a in zip(names, example_inputs_of(self))]
        gm = _compat.probe_trace(self.search, args)
        _compat.remove_noop_ops(gm.graph)
        gm.graph.eliminate_dead_code()
        return gm.graph


_registration_lock = threading.RLock()


class FusionPass:
    """Applies one fusion's patterns to an aot graph and counts the replacements.

    Patterns are registered once per process, lazily; an instance only holds counts, so two backends
    never share them.

    Attributes:
        fusion: its name in `diffusers_ascend.fusions.TABLE`.
        matched_count: replacements made by this instance over all graphs it ran on."""

    fusion: ClassVar[str] = ""

    def __init__(self) -> None:
        self.matched_count = 0

    @classmethod
    def patterns(cls) -> Iterable[FusionPattern]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def pattern_matcher_passes(cls) -> tuple:
        """This fusion's registered `PatternMatcherPass`es, one per pattern group (built once).

        Forms that trace alike in fp32 but differ in bf16 would shadow each other in one matcher, so each
        form gets its own; only dtype variants of one form share one."""
        return _registered(cls)

    def __call__(self, graph: torch.fx.Graph) -> int:
        count = 0
        for pm_pass in self.pattern_matcher_passes():
            count += pm_pass.apply(graph)
        if count:
            graph.eliminate_dead_code()
        self.matched_count += count
        return count

    @classmethod
    def verify(cls) -> None:
        """Registers this fusion's patterns and proves each form, written as the backend sees it, is
        replaced exactly once on the running torch (once per process and fusion).

        Raises:
            TorchCompatError: the running torch is at fault (an API missing or changed, a registration
                that registers nothing, a trace that differs from the graphs it must match): naming the
                torch version, the fusion, the pattern and form, the failing step and the supported range.
            FusionSelfCheckError: the pattern is at fault (its code raised, it refused or matched its own
                form more than once): naming the fusion, pattern, form, expected and found counts, and
                what differed."""
        _verified(cls)

    @classmethod
    def source_hash(cls) -> str:
        """Hash of the source of this fusion's module and of this base: changes with any pattern."""
        import sys

        h = hashlib.sha256()
        for mod in (sys.modules[cls.__module__], sys.modules[__name__]):
            h.update(inspect.getsource(mod).encode())
        return h.hexdigest()


@functools.cache
def _registered_impl(cls: type[FusionPass]):
    from . import pretraced

    passes: dict[str, Any] = {}
    # Search graphs another process traced for this torch build and pattern code (`pretraced`):
    # registering then traces nothing; what happens at a match is unchanged.
    cached = pretraced.load(cls)
    traced: dict[str, list] = {}
    # Registration may run inside a compile (first use): trace real example tensors, outside the
    # compile's fake mode and tracing context, without autograd.
    with _compat.unset_fake_mode(), _compat.no_tracing_context(), torch.no_grad():
        for i, pattern in enumerate(cls.patterns()):
            if pattern.group not in passes:
                passes[pattern.group] = _compat.pattern_matcher_pass(f"ascend_{cls.fusion}:{pattern.group}")
            key = f"{i}:{pattern.name}"
            try:
                pattern.register(passes[pattern.group], pretraced.InitialTrace(key, trace_functional, cached, traced))
            except (_compat.TorchCompatError, FusionSelfCheckError):
                raise
            except Exception as e:
                raise _failure(cls, pattern, "registering it with Inductor's pattern matcher raised", e) from e
    if traced:  # something was traced here: the next process needs none of it
        pretraced.save(cls, {**{k: pretraced.graph_to_json(g) for k, g in cached.items()}, **traced})
    return passes


def _registered(cls: type[FusionPass]) -> tuple:
    with _registration_lock:
        return tuple(_registered_impl(cls).values())


class FusionSelfCheckError(RuntimeError):
    """A fusion's pattern fails its self-check for a reason of its own, not of the running torch:
    its code raised, its own `check` or result check refused its own form, or it matched its own
    form more than once. The message names the fusion, the pattern, the form, the expected and found
    replacement counts and what differed."""


def _engine_error(cls, step: str, detail: str) -> _compat.TorchCompatError:
    return _compat.TorchCompatError(
        f"diffusers-ascend: the {cls.fusion!r} fusion pass cannot work on torch {torch.__version__}: {step} "
        f"{detail}. Supported torch: {_compat.supported_range()}; or leave this fusion out of `fusions`."
    )


def _pattern_error(cls, pattern: FusionPattern, what: str) -> FusionSelfCheckError:
    return FusionSelfCheckError(
        f"diffusers-ascend: the {cls.fusion!r} fusion failed its self-check: pattern {pattern.name} "
        f"(form {pattern.variant()!r}) {what}. The pattern's code ({inspect.getsourcefile(type(pattern))}) is at "
        f"fault, not torch {torch.__version__}; leave this fusion out of `fusions` until it is fixed."
    )


def _pattern_frame(e: BaseException, pattern: FusionPattern) -> tuple[str | None, bool]:
    """``(file:line in function, innermost)``: the innermost frame of `e`'s traceback in the module of
    `pattern`'s class (or of a pattern class it builds on, outside this base), and whether `e` was
    raised there; ``(None, False)``: only torch and the machinery were running."""
    files = {
        inspect.getsourcefile(k)
        for k in type(pattern).__mro__
        if issubclass(k, FusionPattern) and k is not FusionPattern
    }
    files |= {inspect.getsourcefile(type(v)) for v in vars(pattern).values() if isinstance(v, FusionPattern)}
    found, innermost, tb = None, False, e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        innermost = code.co_filename in files
        if innermost:
            found = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return found, innermost


def _failure(cls, pattern: FusionPattern, step: str, e: Exception) -> RuntimeError:
    """The error for `e`, raised while `step` ran for `pattern`: the pattern's fault when its own code
    raised it, else torch's (`TorchCompatError`)."""
    if isinstance(e, (_compat.TorchCompatError, FusionSelfCheckError)):
        return e
    where, innermost = _pattern_frame(e, pattern)
    if where is not None:
        at = f"at {where}" if innermost else f"inside torch, called at {where}: check that call against torch's API"
        return _pattern_error(cls, pattern, f"failed: {step} {type(e).__name__}: {e} ({at})")
    return _engine_error(
        cls, f"pattern {pattern.name} (form {pattern.variant()!r}): {step}", f"({type(e).__name__}: {e})"
    )


def _op_names(graph: torch.fx.Graph) -> list[str]:
    return sorted(str(n.target) for n in graph.nodes if n.op == "call_function")


def _trace_difference(pattern: FusionPattern, probe: torch.fx.Graph) -> str:
    """What differs between the ops Inductor's registration traced from `pattern.search` and the
    ops of its form as the backend sees it (`probe`), or why that could not be told."""
    try:
        with _compat.unset_fake_mode(), _compat.no_tracing_context(), torch.no_grad():
            traced = trace_functional(pattern.search, example_inputs_of(pattern), get_decomp_fn=no_decompositions).graph
    except Exception as e:  # a diagnosis only: the failure it explains is raised either way
        return f"(tracing the search function for comparison raised {type(e).__name__}: {e})"
    want, have = _op_names(traced), _op_names(probe)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    if not missing and not extra:
        return f"both hold the same ops ({', '.join(sorted(set(want)))}): they differ in arguments or wiring"
    return (
        f"the pattern's trace has {missing or 'no op'} that the form's graph lacks, and the form's graph has "
        f"{extra or 'no op'} that the trace lacks"
    )


@functools.cache
def _verified_impl(cls: type[FusionPass]) -> None:
    from . import pretraced

    cached = pretraced.cached_file(cls)
    try:
        _prove(cls, _registered_impl(cls))  # raises TorchCompatError or FusionSelfCheckError, saying whose fault
    except (_compat.TorchCompatError, FusionSelfCheckError) as e:
        if cached is None:
            raise
        # Registered from pre-traced graphs: a bad file, not torch, may be at fault. Only a fresh
        # trace failing the same check is torch's (or the pattern's) failure.
        pretraced.drop(cls)
        _registered_impl.cache_clear()  # the others register again from their files when next needed
        _prove(cls, _registered_impl(cls))
        pretraced.distrust(
            cached,
            f"the self-check failed on the graphs read from it and passed on a fresh trace ({e})",
            dropped=True,
        )


def _prove(cls: type[FusionPass], passes: dict) -> None:
    # One probe per matcher (the first form of each group): the pattern must replace its own form,
    # once (a match of a pattern returning several outputs counts once).
    seen = set()
    for pattern in cls.patterns():
        if pattern.group in seen:
            continue
        seen.add(pattern.group)
        pm_pass = passes[pattern.group]
        try:
            graph = pattern.probe_graph()
        except Exception as e:
            raise _failure(cls, pattern, "tracing its own form (probe_graph) raised", e) from e
        rejected: list[str] = []
        token = _REJECTIONS.set(rejected)
        try:
            count = pm_pass.apply(graph)
        except Exception as e:
            raise _failure(cls, pattern, "applying its matcher to its own form raised", e) from e
        finally:
            _REJECTIONS.reset(token)
        if count == 1:
            continue
        counts = f"replaced its own form {count} times instead of once"
        if count > 1:
            raise _pattern_error(
                cls,
                pattern,
                f"{counts} (expected 1, found {count}): the search matches more than one site of its own form",
            )
        if rejected:
            raise _pattern_error(
                cls,
                pattern,
                f"{counts} (expected 1, found 0): the matcher found its "
                f"structure and the pattern refused it: {rejected[0]}",
            )
        if _compat.registered_pattern_count(pm_pass) == 0:
            raise _engine_error(
                cls,
                f"pattern {pattern.name} {counts}",
                f"(form {pattern.variant()!r}: register_replacement returned and left the "
                "pattern matcher without a pattern)",
            )
        diff = _trace_difference(pattern, graph)
        if pattern.search_pattern() is not None:  # written by hand: ours to keep in step with the form
            raise _pattern_error(
                cls,
                pattern,
                f"{counts} (expected 1, found 0): its hand-built search "
                f"pattern does not match the form as the backend sees it; {diff}",
            )
        raise _engine_error(
            cls,
            f"pattern {pattern.name} {counts}",
            f"(form {pattern.variant()!r}, expected 1, found 0: torch traces the search function "
            f"for its pattern matcher otherwise than aot_autograd presents the form; {diff})",
        )


def _verified(cls: type[FusionPass]) -> None:
    with _registration_lock:
        _verified_impl(cls)
