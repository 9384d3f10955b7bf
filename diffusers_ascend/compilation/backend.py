"""`AscendBackend`: the torch.compile backend that rewrites aot graphs into fused ``ascend_kernels``
ops and runs them with the eager or the Inductor executor; inference rewrites aot's forward graph,
training the functional graph before aot (docs/how-fusion-works.md#the-backend-pipeline)."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import os
from collections.abc import Callable
from typing import Any

import torch

from ..errors import warn
from . import _compat
from .report import FusionReport, GraphEntry

__all__ = ["AscendBackend", "compiled_graphs", "describe_failure", "graph_label", "root_cause"]

# What the caller compiles (e.g. the block class), so reports and graph logs name it.
graph_label: contextvars.ContextVar[str | None] = contextvars.ContextVar("diffusers_ascend_graph_label", default=None)
# Gets the report entry of each graph the call compiles (other threads compile meanwhile).
compiled_graphs: contextvars.ContextVar[list[GraphEntry] | None] = contextvars.ContextVar(
    "diffusers_ascend_compiled_graphs", default=None
)


def root_cause(exc: BaseException) -> BaseException:
    """The exception behind dynamo's wrappers (``BackendCompilerFailed``'s message cuts it off)."""
    seen = set()
    while id(exc) not in seen and type(exc).__module__.startswith("torch._dynamo"):
        seen.add(id(exc))
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None:
            break
        exc = inner
    return exc


def describe_failure(exc: BaseException) -> str:
    """``"Type: first line"`` of the real cause of `exc` (for fallback reasons and warnings).

    >>> describe_failure(ValueError("bad shape\\nmore detail"))
    'ValueError: bad shape'
    """
    cause = root_cause(exc)
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__


def _needs_grad(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def _is_dynamic(example_inputs) -> bool:
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape):
            return True
    return False


class AscendBackend:
    """A torch.compile backend that fuses diffusion-transformer patterns into ``ascend_kernels`` ops.

    Share ONE backend object across every block of a model: dynamo guards on the backend's identity,
    so a backend per block recompiles per block and hits `recompile_limit`.

    Args:
        config: an `AscendConfig`, a dict of its fields, a local directory or Hub id with an
            ``ascend_config.json``, or None for the defaults.
        verify: check the torch APIs, register and probe every pattern now, so a broken engine
            raises before any model is touched. ``False`` defers it to the first graph (warm start
            may never compile one).
        **overrides: `AscendConfig` fields replacing those of `config`.

    The config fields the backend uses (docs/configuration.md):
        fusions: which passes run (`config.resolved_fusions(platform)`).
        executor: ``"eager"`` | ``"inductor"`` | ``"auto"`` (`config.resolved_executor(platform)`).
        mode: Inductor mode, passed by the backend (torch.compile refuses ``mode=`` with a custom
            backend). Ignored by the eager executor.
        freezing: inference only: parameters folded into the graph as constants, so later weight
            changes are not seen. Dynamo lifts parameters only while
            ``torch._inductor.config.freezing`` is set as it traces (the backend raises otherwise).
        graph_log_dir: write each graph's code before and after every pass there.
        graph_capture: ``"graph_only"`` (no fusion passes) or ``"graph_with_compile"``: each compiled
            graph replays as a device graph (docs/graph-capture.md). Inference only; not on CPU.
        on_error: ``"fallback"`` (a graph whose rewrite fails runs unfused, with a warning and a
            `report.fallbacks` entry) or ``"raise"``.

    Attributes:
        report: the `FusionReport` of every graph this backend compiled.
        fusions: the fusions it applies, in pass order.
        executor: the resolved executor.
        graph_capture: the `GraphCaptureManager` holding this backend's device graphs, or None.
        deferred_caches: called before the first graph is compiled (hands loaded compile caches
            to torch only when a graph needs them), or None.

    >>> import torch
    >>> from diffusers_ascend.compilation import AscendBackend
    >>> backend = AscendBackend(fusions=["rms_norm"], executor="eager")
    >>> norm = torch.compile(torch.nn.RMSNorm(8), backend=backend)
    >>> _ = norm(torch.randn(2, 8))
    >>> backend.report.matches["rms_norm"]
    1
    """

    def __init__(self, config=None, *, verify: bool = True, **overrides) -> None:
        from diffusers_ascend.config import AscendConfig
        from diffusers_ascend.platform import current_platform

        from .passes import ordered_fusions

        self.config = AscendConfig.coerce(config, **overrides)  # validates every field (config.py)
        self.platform = current_platform()
        self.config.check_backend(self.platform)  # and what this platform cannot run, before anything is built
        self.fusions = ordered_fusions(self.config.resolved_fusions(self.platform))
        self.executor = self.config.resolved_executor(self.platform)
        self.report = FusionReport(matches={f: 0 for f in self.fusions})
        self.graph_capture = None  # the GraphCaptureManager of this backend's graphs (graph_capture.py)
        if self.config.graph_capture is not None:
            from .graph_capture import GraphCaptureManager

            self.graph_capture = GraphCaptureManager.from_config(self.config, self.platform, report=self.report)
        self._graph_index = 0
        from .passes.manager import FusionPassManager

        self.manager = FusionPassManager(self.fusions)
        self.deferred_caches: Callable[[], None] | None = None
        self.was_reset = False
        self.reset_hooks: list[Callable[[], None]] = []  # run by `reset` (graphs gone: what held them goes)
        self._verified = False
        if verify:
            self.ensure_verified()

    def ensure_verified(self) -> None:
        """Checks the torch APIs, registers and probes every pattern, unless that already ran."""
        if self._verified:
            return
        # Outside dynamo's fake mode and tracing context when deferred: the probes trace real patterns.
        with _compat.unset_fake_mode(), _compat.no_tracing_context():
            self.manager.ensure_verified()  # skipped where this machine passed it (passes/verdict.py)
        self._verified = True

    def reset(self) -> None:
        """Called by ``torch.compiler.reset()``: this backend's graphs are gone, so are its device
        graphs; `report` stays."""
        self.was_reset = True
        if self.graph_capture is not None:
            self.graph_capture.clear()
        for hook in self.reset_hooks:
            hook()

    def __repr__(self) -> str:
        return f"AscendBackend(fusions={list(self.fusions)}, executor={self.executor!r}, platform={self.platform!r})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        if self.deferred_caches is not None:
            self.deferred_caches()  # torch's caches, before the first lookup in them
        self.ensure_verified()
        index = self._graph_index
        self._graph_index += 1
        compile_id = _compat.current_compile_id()
        compile_id = None if compile_id is None else str(compile_id)
        name = self._graph_name(index, compile_id)
        if self.config.freezing:
            self._check_freezing(example_inputs)
        elif _needs_grad(example_inputs):
            if self.graph_capture is not None:
                raise RuntimeError(
                    f"AscendBackend(graph_capture={self.config.graph_capture!r}) is inference-only, but this graph "
                    "needs gradients: call the compiled module under torch.no_grad() / torch.inference_mode(), "
                    "or use graph_capture=None."
                )
            return self._compile_training(gm, example_inputs, name, compile_id)

        def fw_compiler(aot_gm: torch.fx.GraphModule, aot_inputs):
            entry = self._rewrite(aot_gm, name, compile_id, training=False, dynamic=_is_dynamic(aot_inputs))
            if self.config.freezing:
                aot_gm, keep = _fold_parameters(aot_gm)
                entry.frozen_params = len(aot_inputs) - len(keep)
                return self._execute(aot_gm, aot_inputs, keep)
            return self._execute(aot_gm, aot_inputs)

        return _compat.aot_autograd(fw_compiler=fw_compiler)(gm, example_inputs)

    def _graph_name(self, index: int, compile_id: str | None) -> str:
        label = graph_label.get()
        return (f"{label}:" if label else "") + f"g{index:03d}" + (f"[{compile_id}]" if compile_id is not None else "")

    def _inductor_patches(self, training: bool) -> dict:
        patches = dict(_compat.list_mode_options(self.config.mode)) if self.config.mode else {}
        if self.graph_capture is not None:  # our capture wraps Inductor's code: no CUDA graphs inside it
            patches["triton.cudagraphs"] = False
        return patches

    def _rewrite(
        self, gm: torch.fx.GraphModule, name: str, compile_id: str | None, training: bool, dynamic: bool
    ) -> GraphEntry:
        from .passes.base import FusionSelfCheckError
        from .passes.manager import count_ops

        before = count_ops(gm.graph)
        log = self._graph_logger(name)
        if log is not None:
            log("input", gm.graph)
        backup = copy.deepcopy(gm.graph) if self.config.on_error != "raise" else None
        try:
            counts = self.manager(gm.graph, after_step=log)
        except (_compat.TorchCompatError, FusionSelfCheckError):
            raise  # a broken engine or pattern is never a per-graph fallback
        except Exception as e:  # a failed rewrite must not take the model down unless asked to
            if backup is None:
                raise
            warn(f"rewriting graph {name} failed ({type(e).__name__}: {e}); it runs unfused.", stacklevel=1)
            self.report.add_fallback(name, f"rewrite failed: {type(e).__name__}: {e}")
            gm.graph = backup  # the original graph, not a half-rewritten one
            counts = {f: 0 for f in self.fusions}
        gm.recompile()
        entry = self.report.add_graph(
            name,
            counts,
            before,
            count_ops(gm.graph),
            executor=self.executor,
            training=training,
            dynamic=dynamic,
            compile_id=compile_id,
        )
        sink = compiled_graphs.get()
        if sink is not None:
            sink.append(entry)
        return entry

    def _execute(self, gm: torch.fx.GraphModule, example_inputs, keep: list[int] | None = None) -> Callable:
        """Runs the rewritten `gm` with the executor; `keep`: the inputs a frozen graph still takes."""
        fn = self._executor_callable(gm, example_inputs, keep)
        if self.graph_capture is None:
            return fn
        from .graph_capture import static_input_indices

        unused = [] if keep is None else sorted(set(range(len(example_inputs))) - set(keep))
        entry = self.report.graphs[-1]  # dynamo's compile lock: no other graph came in between
        entry.graph_capture = self.config.graph_capture
        return self.graph_capture.wrap(fn, gm, name=entry.name, static_indices=static_input_indices(), unused=unused)

    def _executor_callable(self, gm: torch.fx.GraphModule, example_inputs, keep: list[int] | None = None) -> Callable:
        pick = (lambda args: args) if keep is None else (lambda args: [args[i] for i in keep])
        if self.executor == "eager":
            from ascend_kernels.registry import capturing

            # A graph that will be captured binds capturable providers (never an acl_op fallback).
            capture = self.graph_capture is not None and self.graph_capture.blocked is None
            with capturing() if capture else contextlib.nullcontext():
                self.report.graphs[-1].bound_providers = bind_providers(gm)
            if keep is None:
                return _identity_compiler(gm, example_inputs)
            return _compat.make_boxed_func(lambda *args: gm(*pick(args)))
        graph = self.report.graphs[-1]
        graph.bound_providers = bind_compiler_ops(gm)
        patches = self._inductor_patches(training=False)
        if keep is not None:  # already frozen: Inductor must not freeze again (the flag is still set here)
            patches["freezing"] = False
        try:
            compiled = _compat.compile_fx(gm, pick(list(example_inputs)), config_patches=patches)
        except Exception as e:
            if not graph.bound_providers or self.config.on_error == "raise":
                raise
            # The fused nodes go back to being ops, which call the same kernels through the dispatcher.
            reason = describe_failure(e)
            warn(
                f"Inductor could not launch the Triton kernels of graph {graph.name} "
                f"itself ({reason}); they run as ascend_kernels ops instead.",
                stacklevel=1,
            )
            graph.bound_providers, graph.unbound_reason = {}, reason
            unbind_compiler_ops(gm)
            compiled = _compat.compile_fx(gm, pick(list(example_inputs)), config_patches=patches)

        # Called from aot's fw_compiler, the compiled function takes its arguments unpacked.
        def run(*args):
            return compiled(*pick(args))

        return run

    @staticmethod
    def _check_freezing(example_inputs) -> None:
        if _needs_grad(example_inputs):
            raise RuntimeError(
                "AscendBackend(freezing=True) is inference-only, but this graph needs gradients: call the compiled "
                "module under torch.no_grad() / torch.inference_mode(), or use freezing=False."
            )
        if not _compat.inductor_freezing_enabled():
            raise RuntimeError(
                "AscendBackend(freezing=True): dynamo traced this graph without torch._inductor.config.freezing, so "
                "the weights are graph inputs and nothing can be frozen. Use enable_ascend_compile(compile='model', "
                "freezing=True), or wrap the first call in torch._inductor.config.patch(freezing=True)."
            )

    def _compile_training(
        self, gm: torch.fx.GraphModule, example_inputs, name: str, compile_id: str | None
    ) -> Callable:
        aten_gm, reason = self._functional_graph(gm, example_inputs)
        if aten_gm is None:
            warn(f"graph {name} is compiled for training without fusion: {reason}", stacklevel=1)
            self.report.add_fallback(name, f"training graph not fused: {reason}")
            aten_gm = gm
        else:
            self._rewrite(aten_gm, name, compile_id, training=True, dynamic=_is_dynamic(example_inputs))
        if self.executor == "inductor":
            return _compat.compile_fx(
                aten_gm, list(example_inputs), config_patches=self._inductor_patches(training=True)
            )
        return _compat.aot_autograd(fw_compiler=_identity_compiler, bw_compiler=_identity_compiler)(
            aten_gm, example_inputs
        )

    @staticmethod
    def _functional_graph(gm: torch.fx.GraphModule, example_inputs):
        """The functional aten graph of `gm` without autograd, or (None, reason) when it cannot stand
        in for `gm` (aot handles input mutations and aliasing outputs outside the graph)."""
        captured = {}

        def capture(aot_gm, aot_inputs):
            captured["gm"] = aot_gm
            ctx = _compat.tracing_context()
            captured["meta"] = getattr(ctx, "fw_metadata", None) if ctx is not None else None
            return aot_gm

        with torch.no_grad():
            _compat.aot_autograd(fw_compiler=capture)(gm, example_inputs)
        aten_gm, meta = captured.get("gm"), captured.get("meta")
        if aten_gm is None:
            return None, "no forward graph was traced"
        placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(example_inputs):
            return None, f"traced graph takes {len(placeholders)} inputs, dynamo passes {len(example_inputs)}"
        if meta is not None:
            if getattr(meta, "num_mutated_inp_runtime_indices", 0) or any(
                getattr(info, "mutates_data", False) or getattr(info, "mutates_metadata", False)
                for info in getattr(meta, "input_info", [])
            ):
                return None, "the graph mutates its inputs"
            if getattr(meta, "num_outputs_aliased", 0) or getattr(meta, "num_intermediate_bases", 0):
                return None, "outputs alias inputs or each other"
        return aten_gm, ""

    def _graph_logger(self, name: str):
        directory = getattr(self.config, "graph_log_dir", None)
        if not directory:
            return None
        os.makedirs(directory, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name).strip("_")
        step = [0]

        def log(stage: str, graph: torch.fx.Graph) -> None:
            path = os.path.join(str(directory), f"{safe}.{step[0]:02d}.{stage}.py")
            with open(path, "w") as f:
                f.write(f"# graph {name}, after step {step[0]}: {stage}\n")
                f.write(graph.python_code("self").src)
            step[0] += 1

        return log


def _full_args(node: torch.fx.Node) -> list | None:
    """The node's arguments, positional and complete (schema defaults filled in), or None."""
    out = []
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            out.append(node.args[i])
        elif arg.name in node.kwargs:
            out.append(node.kwargs[arg.name])
        elif arg.has_default_value():
            out.append(arg.default_value)
        else:
            return None
    return out


def _static_op_nodes(gm: torch.fx.GraphModule):
    """``(node, op name, full args, fake values)`` of each forward ``ascend_kernels`` op node whose
    arguments all have static shapes (`supports_args` cannot be decided for every size)."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if target.namespace != "ascend_kernels" or target._opname.endswith("_backward"):
            continue
        args = _full_args(node)
        if args is None:
            continue
        vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in args]
        if any(v is None for v, a in zip(vals, args) if isinstance(a, torch.fx.Node)):
            continue
        if any(isinstance(d, torch.SymInt) for v in vals if isinstance(v, torch.Tensor) for d in v.shape):
            continue
        yield node, target._opname, args, vals


def bind_providers(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Eager executor, inference graphs: each ``ascend_kernels`` op node calls its provider directly.

    The provider is selected once, from the node's fake arguments, as `select_provider` would at
    run time (a `use_providers` choice included), so replays skip the custom-op dispatcher. Nodes
    with symbolic shapes, and training graphs, keep the op.

    Returns:
        ``{node name: provider name}`` for the bound nodes.
    """
    from ascend_kernels.registry import select_provider

    bound = {}
    for node, op, args, vals in _static_op_nodes(gm):
        provider = select_provider(op, *vals)
        node.target, node.args, node.kwargs = provider.impl, tuple(args), {}
        bound[node.name] = provider.name
    if bound:
        gm.recompile()
    return bound


_UNBOUND = "ascend_kernels_op"  # node.meta key: the op a node bound by `bind_compiler_ops` replaced


def bind_compiler_ops(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Inductor executor, inference graphs: each ``ascend_kernels`` op node whose provider has a
    `Provider.compiler_op` (the ``triton`` kernels, on CUDA) becomes that op, which Inductor traces
    into and launches from its own generated code.

    An opaque ``ascend_kernels`` op costs a dispatcher call and Python launch planning per run; a
    ``torch.library.triton_op`` is traced into the kernel launch itself, planned once. Providers
    are selected as in `bind_providers`; nodes without a compiler op stay ops.

    Returns:
        ``{node name: provider name}`` for the bound nodes.
    """
    from ascend_kernels.registry import select_provider

    bound = {}
    for node, op, args, vals in _static_op_nodes(gm):
        provider = select_provider(op, *vals)
        device_type = next(v.device.type for v in vals if isinstance(v, torch.Tensor))
        target = provider.compiler_op(device_type) if provider.compiler_op is not None else None
        if target is None:
            continue
        node.meta[_UNBOUND] = node.target
        node.target, node.args, node.kwargs = target, tuple(args), {}
        bound[node.name] = provider.name
    if bound:
        gm.recompile()
    return bound


def unbind_compiler_ops(gm: torch.fx.GraphModule) -> int:
    """Undoes `bind_compiler_ops`: each bound node calls its ``ascend_kernels`` op again (same
    arguments: both ops share one schema). Returns the number of nodes restored."""
    restored = 0
    for node in gm.graph.nodes:
        if _UNBOUND in node.meta:
            node.target = node.meta.pop(_UNBOUND)
            restored += 1
    if restored:
        gm.recompile()
    return restored


def _fold_parameters(aot_gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[int]]:
    """Inductor's freezing minus its CPU-Inductor layout passes: parameters become constants, then
    constant folding. Returns the graph and the indices of the inputs it still takes.

    `torch._inductor.freezing.freeze` also prepacks CPU weights (ops neither executor can take) and
    may discard the parameters `disable_ascend_compile` needs back.
    """
    keep = _compat.fold_parameters(aot_gm)
    return aot_gm, keep


def _identity_compiler(gm: torch.fx.GraphModule, example_inputs):
    """The eager executor: the (rewritten) GraphModule itself, dispatched op by op."""
    return _compat.make_boxed_func(gm)
