"""Eager block packages: warm start for ``executor="eager"``.

The eager executor compiles nothing, but every process pays dynamo's trace, the aot trace and the
fusion passes of each block class before its first output. An eager package is the graph those
produced, per compiled block class and call signature, in torch.export's serialized form:

    the block as a function of (its parameters and buffers, the call's tensors)
      -> `fused_graph` (the functional aten graph, rewritten by the backend's passes)
      -> torch.export (non-strict) -> the program's schema JSON -> ``ascend_export_<n>.json``

A warm process parses it back into an FX graph of aten and ``ascend_kernels`` ops, binds providers
and wraps it in graph capture as the backend does for a graph it compiled, and runs it in front of
the block's compiled path (`AotBlock`'s rules: exact signature, no gradient, same weights layout).

Trust model: a package is data, never code or a pickle. torch's own ``.pt2`` archive
(``torch.export.save``) holds pickles (state dict, constants, example inputs; ``torch.export.load``
falls back to ``weights_only=False``), and its JSON names call targets by Python attribute path, so
`check_program` reads the JSON first and lets through only what a package of ours holds: calls of
registered ``aten``, ``prims`` and ``ascend_kernels`` operator overloads (each name parsed by a
strict grammar and looked up in the dispatcher's registry before any attribute of it is read) and
``operator.getitem``, user inputs and outputs only, static shapes (no symbolic expression, which
torch parses with ``sympy.sympify``),
no guard code, no custom object, no subgraph, no node metadata (whose ``source_fn_stack`` torch
resolves by attribute path too). Only then does torch's deserializer see it, with an
empty state dict, no constants and no example inputs, so nothing is unpickled.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import torch

from ..compilation import _compat
from ..enabled import EnabledModel
from ..errors import warn
from .packages import (
    AotBlock,
    CallSignature,
    PackageMismatchError,
    fused_graph,
    package_binding,
    parse_outputs,
    parse_state,
)

# The call targets an eager package may hold: an operator overload of these namespaces, or tuple
# indexing. A name is parsed by this grammar (ASCII identifiers, exactly three parts below
# ``torch.ops``), then looked up in the dispatcher's registry (`_compat.op_overload`), never by
# reading attributes it names: torch's reader resolves a target by ``getattr`` on each part, so
# ``torch.ops.aten.__class__.__init__`` matches the grammar and only the registry refuses it.
_TARGET = re.compile(r"torch\.ops\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")
_NAMESPACES = ("aten", "prims", "ascend_kernels")
_GETITEM = "_operator.getitem"
# Schema fields no package of ours holds: symbolic values (parsed by sympy), custom objects,
# subgraphs of higher-order ops, operators passed as arguments.
_REFUSED_FIELDS = frozenset(
    {
        "as_sym_int",
        "as_sym_ints",
        "as_sym_float",
        "as_sym_floats",
        "as_sym_bool",
        "as_sym_bools",
        "as_expr",
        "as_custom_obj",
        "as_graph",
        "as_operator",
    }
)
_PAYLOAD_KEYS = {"binding", "program"}


def build_eager_package(block: torch.nn.Module, signature: CallSignature, manager) -> tuple[bytes, dict[str, Any]]:
    """`block` at `signature`, fused by `manager` (a `FusionPassManager`), as an eager package.

    Returns:
        ``(package bytes, manifest fields)`` (the fields of `fused_graph`).

    Raises:
        RuntimeError: the program does not survive its own round trip through the serializer with
            the same outputs (then it is not saved).
    """
    gm, inputs, fields = fused_graph(block, signature, manager)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated", category=FutureWarning)
        program = _compat.export_program(gm, inputs)
    payload = {
        "binding": package_binding(signature.to_json(), fields["state"], fields["outputs"]),
        "program": json.loads(_compat.export_to_json(program)),
    }
    for node in payload["program"]["graph_module"]["graph"]["nodes"]:
        node["metadata"] = {}  # source locations and module paths: not needed to run, names resolved by torch
    check_program(payload["program"])
    data = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    _check_round_trip(data, gm, inputs, len(fields["state"]["names"]))
    return data, fields


def _check_round_trip(data: bytes, gm: torch.fx.GraphModule, inputs: list, n_state: int) -> None:
    """The package read back must give the fused graph's outputs exactly, on random inputs of its signature."""
    from .packages import _random_like

    graph = _read_program(json.loads(data)["program"])
    gen = torch.Generator().manual_seed(0)
    args = list(inputs[:n_state]) + [_random_like(t, gen) for t in inputs[n_state:]]
    with torch.no_grad():
        expected, got = gm(*args), graph(*args)
    if len(expected) != len(got) or not all(torch.equal(e, g) for e, g in zip(expected, got)):
        raise RuntimeError("the serialized program gives other outputs than the graph it was exported from")


def check_program(program: Any) -> None:
    """Refuses (ValueError, naming what) a serialized program that holds anything but what
    `build_eager_package` writes; see the module docstring. Reads the JSON as data only."""
    if not isinstance(program, dict):
        raise ValueError("the package's 'program' must be a JSON object")
    if program.get("range_constraints") or program.get("guards_code"):
        raise ValueError("the package's program has symbolic shapes or guard code; a package has neither")
    graph_module = program.get("graph_module")
    graph = graph_module.get("graph") if isinstance(graph_module, dict) else None
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise ValueError("the package's program has no graph")
    for node in graph["nodes"]:
        target = node.get("target") if isinstance(node, dict) else None
        if not _allowed_target(target):
            raise ValueError(
                f"the package's program calls {target!r}: only overloads of registered aten, prims and "
                "ascend_kernels operators (torch.ops.<namespace>.<op>.<overload>) and _operator.getitem are allowed"
            )
        if node.get("metadata"):
            raise ValueError(
                "the package's program holds node metadata (torch resolves names in it); a package has none"
            )
    signature = graph_module.get("signature")
    specs = (
        (signature.get("input_specs"), signature.get("output_specs")) if isinstance(signature, dict) else (None, None)
    )
    if not all(isinstance(s, list) for s in specs):
        raise ValueError("the package's program has no input and output specs")
    for spec, kind in zip(specs, ("user_input", "user_output")):
        if not all(isinstance(s, dict) and set(s) == {kind} for s in spec):
            raise ValueError(
                f"the package's program has inputs or outputs other than {kind}s (parameters, "
                "buffers, constants, mutations): a package takes its weights as inputs"
            )
    for key in ("sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values"):
        if graph.get(key):
            raise ValueError(f"the package's program holds {key}; a package has none")
    _refuse_fields(program)


def _allowed_target(target: Any) -> bool:
    """Whether `target` names tuple indexing or a registered overload of an allowed namespace."""
    if target == _GETITEM:
        return True
    parts = _TARGET.fullmatch(target) if isinstance(target, str) else None
    if parts is None or parts[1] not in _NAMESPACES:
        return False
    if parts[1] == "ascend_kernels":
        import ascend_kernels.ops  # noqa: F401  (our ops: registered before they are looked up)
    return _compat.op_overload(*parts.groups()) is not None


def _refuse_fields(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            bad = _REFUSED_FIELDS.intersection(item)
            if bad:
                raise ValueError(f"the package's program holds {sorted(bad)[0]!r} values; a package has none")
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _read_program(program: dict) -> torch.fx.GraphModule:
    """The graph of a checked program: inputs ``(*state, *call tensors)``, outputs a tuple."""
    ep = _compat.export_from_json(program)
    return ep.graph_module


class EagerBlock(AotBlock):
    """A loaded eager package: the fused graph of one block class and call signature, run op by op
    (graph capture on top where the backend captures). Calls are taken as by `AotBlock`.

    Args:
        graph: the package's graph (``ascend_kernels`` op nodes not yet bound to providers).
        signature, state, state_keys, out_spec: see `AotBlock`.
    """

    def __init__(self, graph: torch.fx.GraphModule, signature: CallSignature, state, state_keys, out_spec) -> None:
        super().__init__(None, signature, state, state_keys, out_spec)
        self.graph = graph

    @classmethod
    def read(cls, data: bytes, signature: dict[str, Any], state: dict[str, Any], outputs: str) -> EagerBlock:
        """The package `data` (its bytes already checked against the manifest) for the manifest entry's
        `signature`, `state` and `outputs`.

        Raises:
            PackageMismatchError: the package records another entry than this one, or holds what no
                package of ours holds (`check_program`): the loader refuses the whole cache.
            ValueError: the package is not a JSON object of our keys.
        """
        import ascend_kernels.ops  # noqa: F401  (the graph names our ops: registered before it is read)

        sig = CallSignature.from_json(signature)
        names, keys = parse_state(state)
        spec = parse_outputs(outputs)
        try:
            payload = json.loads(data)
        except ValueError:
            raise ValueError("the package is not JSON") from None
        if not isinstance(payload, dict) or set(payload) != _PAYLOAD_KEYS or not isinstance(payload["binding"], str):
            raise ValueError(f"the package must be a JSON object of the keys {sorted(_PAYLOAD_KEYS)}")
        if payload["binding"] != package_binding(signature, state, outputs):
            raise PackageMismatchError(
                "the package was built for another call signature, state or output than its "
                "manifest entry says (entries swapped or edited?)"
            )
        try:
            check_program(payload["program"])
        except ValueError as e:  # matching sha256 and binding, yet not ours: a crafted cache, refused whole
            raise PackageMismatchError(str(e)) from None
        return cls(_read_program(payload["program"]), sig, names, keys, spec)

    def attach(self, backend) -> None:
        """Runs the graph the way `backend` (eager executor) runs one it compiled: providers bound,
        captured where it captures. `backend.report`'s last graph entry must be this graph's."""
        fn = backend._execute(self.graph, [])  # the eager executor: `example_inputs` unused
        self.runner = lambda *flat: fn(list(flat))  # boxed, as aot calls a compiled forward


def save_eager_cache(models: dict[str, EnabledModel], target: str, owner: str, keys: dict[str, str]) -> dict[str, Any]:
    """`save_ascend_cache` for ``executor="eager"``: one eager package per recorded block class and
    call signature, committed with its manifest to `target`. Returns the manifest written."""
    from ..compilation.backend import describe_failure
    from .manifest import EAGER_MECHANISM, new_manifest
    from .store import commit

    cfg = next(iter(models.values())).config
    if cfg.compile != "blocks":
        raise ValueError(
            "executor='eager' saves one package per compiled block class: enable with compile='blocks' "
            f"(compile={cfg.compile!r} has none)."
        )
    if not any(m.backend is not None and m.backend.report.graphs_compiled for m in models.values()):
        raise ValueError(f"{owner} has compiled no graph yet: call it once, then save.")
    blobs: dict[str, bytes] = {}
    entries: list[dict[str, Any]] = []
    for model_name, m in models.items():
        if m.backend is None or not m.signatures:
            continue
        m.backend.ensure_verified()
        for label, signature, ref in [(k, sig, ref) for k, v in sorted(m.signatures.items()) for sig, ref in v]:
            block = ref()
            if block is None:
                continue
            try:
                data, info = build_eager_package(block, signature, m.backend.manager)
            except Exception as e:  # noqa: BLE001 - that class compiles in the warm process
                warn(
                    f"{model_name or m.model_class}.{label} was not packaged "
                    f"({describe_failure(e)}); a process loading this cache compiles it.",
                    stacklevel=3,
                )
                continue
            name = f"ascend_export_{len(entries)}.json"
            blobs[name] = data
            entries.append(
                {"model": model_name, "class": label, "file": name, "signature": signature.to_json(), **info}
            )
    if not entries:
        raise ValueError(f"{owner}: no block call could be packaged (see the warnings), so there is nothing to save.")
    manifest = new_manifest(EAGER_MECHANISM, keys, blobs, entries)
    commit(target, blobs, manifest)
    return manifest
