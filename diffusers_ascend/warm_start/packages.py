"""Block packages: one AOTInductor package per compiled block class and call signature.

A warm start from torch's caches alone still pays dynamo's trace of every block class, pattern
registration and the import of Inductor (docs/warm-start.md); a package skips all of it. Under
``compile="blocks"`` and ``executor="inductor"``, each inference call of a block that made dynamo
compile a graph records its `CallSignature`, and `build_package` makes one package per signature:

    the block as a function of (its parameters and buffers, the call's tensors)
      -> a functional aten graph (`_compat.probe_trace`: the form aot_autograd gives the backend)
      -> the backend's fusion passes -> torch.export -> AOTInductor -> one ``.pt2`` file

The weights are inputs, not constants: one package serves every block of the class and sees later
weight changes. `AotBlock` takes a call only when it has exactly the recorded signature and needs
no gradient; any other call gets `MISS` and takes the compiled path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import threading
import warnings
import weakref
from typing import Any

import torch

from ..compilation import _compat
from ..errors import warn

MISS = object()  # `AotBlock.__call__`: not this package's call; compile it normally
# The package's own record of the manifest entry it was built for (AOTInductor string metadata).
BINDING_KEY = "diffusers_ascend.binding"
_VALUE_TYPES = (type(None), bool, int, float, str)


def _tensor_key(t: torch.Tensor) -> tuple:
    return ("tensor", str(t.dtype), str(t.device), tuple(t.shape), tuple(t.stride()))


def _leaf_key(leaf: Any) -> tuple | None:
    if isinstance(leaf, torch.Tensor):
        if type(leaf) is not torch.Tensor and not isinstance(leaf, torch.nn.Parameter):
            return None  # a tensor subclass (DTensor, quantized...): its layout is not ours to describe
        return _tensor_key(leaf)
    if type(leaf) in _VALUE_TYPES:
        if type(leaf) is float and not math.isfinite(leaf):
            return None
        return ("value", leaf)
    return None


class CallSignature:
    """What a block call looked like: the pytree of ``(args, kwargs)``, each tensor's
    ``(dtype, device, shape, stride)`` and every other leaf's value (None, bool, int, float, str).

    Args:
        spec: the pytree spec of ``(args, kwargs)``.
        leaves: one key per leaf: ``("tensor", dtype, device, shape, stride)`` or ``("value", v)``.
        training: the block's ``training`` flag at the call.

    >>> sig = CallSignature.of((torch.zeros(2, 3),), {"scale": 1.0}, training=False)
    >>> sig.tensors((torch.ones(2, 3),), {"scale": 1.0}) is not None
    True
    >>> sig.tensors((torch.ones(2, 4),), {"scale": 1.0}) is None
    True
    >>> CallSignature.from_json(sig.to_json()) == sig
    True
    """

    def __init__(self, spec: Any, leaves: tuple, training: bool) -> None:
        self.spec = spec
        self.leaves = tuple(leaves)
        self.training = bool(training)

    @classmethod
    def of(cls, args: tuple, kwargs: dict, training: bool) -> CallSignature | None:
        """The signature of a call, or None when a leaf is something else (a module, a callable,
        a tensor subclass, a non-finite float...): such a call has no package."""
        leaves, spec = _compat.tree_flatten((tuple(args), dict(kwargs)))
        keys = [_leaf_key(leaf) for leaf in leaves]
        if any(k is None for k in keys):
            return None
        return cls(spec, tuple(keys), training)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CallSignature)
            and self.leaves == other.leaves
            and self.training == other.training
            and self.spec == other.spec
        )

    def __hash__(self) -> int:
        return hash((self.leaves, self.training))

    def tensors(self, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
        """The call's tensors in pytree order if the call has exactly this signature, else None."""
        leaves, spec = _compat.tree_flatten((args, kwargs))
        if len(leaves) != len(self.leaves):
            return None
        tensors = []
        for leaf, key in zip(leaves, self.leaves):
            if key[0] == "tensor":
                if not isinstance(leaf, torch.Tensor) or _tensor_key(leaf) != key:
                    return None
                tensors.append(leaf)
            elif type(leaf) is not type(key[1]) or leaf != key[1]:
                return None
        return tensors if spec == self.spec else None

    def example_tensors(self) -> list[torch.Tensor]:
        """Zero tensors of the recorded layouts, for `torch.export` (which traces with fake values)."""
        return [
            torch.empty_strided(k[3], k[4], dtype=_dtype(k[1]), device=k[2]).zero_()
            for k in self.leaves
            if k[0] == "tensor"
        ]

    def rebuild(self, tensors) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with `tensors` at the tensor leaves and the recorded values elsewhere."""
        it = iter(tensors)
        leaves = [next(it) if k[0] == "tensor" else k[1] for k in self.leaves]
        return _compat.tree_unflatten(leaves, self.spec)

    # -- JSON (a manifest field: data only) ---------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "tree": _compat.treespec_dumps(self.spec),
            "training": self.training,
            "leaves": [_json_key(k) for k in self.leaves],
        }

    @classmethod
    def from_json(cls, data: Any) -> CallSignature:
        """Parses `to_json` output; raises ValueError naming what is malformed."""
        if not isinstance(data, dict) or set(data) != {"tree", "training", "leaves"}:
            raise ValueError("a block signature must be {'tree': str, 'training': bool, 'leaves': list}")
        if (
            not isinstance(data["tree"], str)
            or type(data["training"]) is not bool
            or not isinstance(data["leaves"], list)
        ):
            raise ValueError("a block signature must be {'tree': str, 'training': bool, 'leaves': list}")
        spec = _parse_spec(data["tree"], "a block signature's 'tree'")
        leaves = [_parse_leaf(leaf) for leaf in data["leaves"]]
        if getattr(spec, "num_leaves", len(leaves)) != len(leaves):
            raise ValueError(f"a block signature's tree has {spec.num_leaves} leaves, its 'leaves' {len(leaves)}")
        return cls(spec, tuple(leaves), data["training"])


def _json_key(key: tuple) -> list:
    return [key[0], *[list(v) if isinstance(v, tuple) else v for v in key[1:]]]


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(type(i) is int and i >= 0 for i in v)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name[len("torch.") :], None) if name.startswith("torch.") else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"a block signature names dtype {name!r}, which is not a torch dtype")
    return dtype


def _parse_leaf(leaf: Any) -> tuple:
    if isinstance(leaf, list) and len(leaf) == 5 and leaf[0] == "tensor":
        _, dtype, device, shape, stride = leaf
        if not (isinstance(device, str) and _ints(shape) and _ints(stride) and len(shape) == len(stride)):
            raise ValueError(f"a block signature's tensor leaf is malformed: {leaf!r}")
        _dtype(dtype)
        try:
            torch.device(device)
        except (RuntimeError, ValueError):
            raise ValueError(f"a block signature names device {device!r}") from None
        return ("tensor", dtype, device, tuple(shape), tuple(stride))
    if isinstance(leaf, list) and len(leaf) == 2 and leaf[0] == "value" and _leaf_key(leaf[1]) is not None:
        return ("value", leaf[1])
    raise ValueError(
        f"a block signature's leaf must be ['tensor', dtype, device, shape, stride] or ['value', v]: {leaf!r}"
    )


def parse_state(data: Any) -> tuple[list[str], list[tuple]]:
    """The ``state`` entry of a manifest: ``{"names": [str], "keys": [tensor leaf]}``."""
    if (
        not isinstance(data, dict)
        or set(data) != {"names", "keys"}
        or not isinstance(data["names"], list)
        or not all(isinstance(n, str) for n in data["names"])
        or not isinstance(data["keys"], list)
        or len(data["keys"]) != len(data["names"])
    ):
        raise ValueError("a block's 'state' must be {'names': [str], 'keys': [tensor leaf]} of equal lengths")
    keys = [_parse_leaf(k) for k in data["keys"]]
    if any(k[0] != "tensor" for k in keys):
        raise ValueError("a block's 'state' keys must all be tensor leaves")
    return list(data["names"]), keys


def parse_outputs(text: Any) -> Any:
    """The ``outputs`` entry of a manifest: a pytree spec as `treespec_dumps` writes it."""
    if not isinstance(text, str):
        raise ValueError("a block's 'outputs' must be a string")
    return _parse_spec(text, "a block's 'outputs'")


def _parse_spec(text: str, what: str) -> Any:
    try:
        return _compat.treespec_loads(text)
    except Exception as e:
        raise ValueError(f"{what} is not a pytree spec: {type(e).__name__}: {e}") from None


def _state(block: torch.nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    """The block's parameters then buffers, by name (the package's leading inputs)."""
    items = list(block.named_parameters()) + list(block.named_buffers())
    return [n for n, _ in items], [t for _, t in items]


def _as_function(block: torch.nn.Module, names: list[str], signature: CallSignature, out: dict):
    """The block as a function of ``(*state, *call tensors)`` returning its flat outputs (their
    pytree spec goes to ``out["spec"]``)."""

    def fn(*flat):
        n = len(names)
        args, kwargs = signature.rebuild(flat[n:])
        result = torch.func.functional_call(block, dict(zip(names, flat[:n])), args, kwargs)
        leaves, out["spec"] = _compat.tree_flatten(result)
        if not all(isinstance(t, torch.Tensor) for t in leaves):
            raise ValueError(f"{type(block).__name__} returns non-tensor outputs; it cannot be packaged")
        return tuple(leaves)

    return fn


def build_package(block: torch.nn.Module, signature: CallSignature, manager, path: str) -> dict[str, Any]:
    """Compiles `block` at `signature`, fused by `manager` (a `FusionPassManager`), into the
    AOTInductor package `path`.

    Returns:
        The package's manifest fields: ``state`` (parameter and buffer names and tensor keys),
        ``outputs`` (the output's pytree spec), ``matches``, ``ops_before`` and ``ops_after``.

    Raises:
        RuntimeError: this torch has no AOTInductor, or the package failed `_check_package`.
    """
    api = _compat.aoti_api()
    if api is None:
        raise RuntimeError(f"torch {torch.__version__} has no AOTInductor packaging (aoti_compile_and_package)")
    gm, inputs, fields = fused_graph(block, signature, manager)
    state_json, outputs = fields["state"], fields["outputs"]
    # A dict of our own for the package's metadata: AOTInductor writes its device keys into the
    # configured dict in place, which would otherwise stay in torch's config after the save.
    metadata = {BINDING_KEY: package_binding(signature.to_json(), state_json, outputs)}
    with torch.no_grad(), warnings.catch_warnings(), _compat.aoti_metadata_scope(metadata):
        # torch's own graph deepcopy inside the AOT compile warns about `LeafSpec`: torch's code, not the user's.
        warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated", category=FutureWarning)
        program = _compat.export_program(gm, inputs)
        api[0](program, package_path=path)
    _check_package(path, gm, inputs, len(state_json["names"]))
    return fields


def fused_graph(block: torch.nn.Module, signature: CallSignature, manager) -> tuple[torch.fx.GraphModule, list, dict]:
    """`block` at `signature` as the graph the backend would run: traced as a function of ``(*state,
    *call tensors)`` (`_compat.probe_trace`: the form aot_autograd gives the backend), then
    rewritten by `manager` (a `FusionPassManager`).

    Returns:
        ``(graph module, example inputs, fields)``; the manifest fields are ``state`` (parameter and
        buffer names and tensor keys), ``outputs`` (the output's pytree spec), ``matches``,
        ``ops_before`` and ``ops_after``.
    """
    from ..compilation.passes.manager import count_ops

    names, state = _state(block)
    out: dict[str, Any] = {}
    fn = _as_function(block, names, signature, out)
    inputs = [t.detach() for t in state] + signature.example_tensors()
    was_training, compiled_call = block.training, block._compiled_call_impl
    block.train(signature.training)
    block._compiled_call_impl = None  # trace the block's Python, not its dynamo-compiled call
    try:
        gm = _compat.probe_trace(fn, inputs)
    finally:
        block.train(was_training)
        block._compiled_call_impl = compiled_call
    before = count_ops(gm.graph)
    matches = manager(gm.graph)
    gm.recompile()
    state_json = {"names": names, "keys": [_json_key(_tensor_key(t)) for t in state]}
    return (
        gm,
        inputs,
        {
            "state": state_json,
            "outputs": _compat.treespec_dumps(out["spec"]),
            "matches": matches,
            "ops_before": before,
            "ops_after": count_ops(gm.graph),
        },
    )


def package_binding(signature: Any, state: Any, outputs: Any) -> str:
    """The sha256 of a package's manifest fields (`CallSignature.to_json`, ``state``, ``outputs``)
    as canonical JSON: stored in the package when it is built, compared with its manifest entry
    when it is loaded, so an entry naming another package's file (each file's own checksum still
    valid) cannot make a package run calls of a signature it was not built for.

    >>> package_binding({"tree": "", "training": False, "leaves": []}, {"names": [], "keys": []}, "")[:8]
    'a073bb10'
    """
    text = json.dumps([signature, state, outputs], sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


class PackageMismatchError(ValueError):
    """A package's recorded binding differs from the manifest entry that names it."""


def _random_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Normal values in `t`'s dtype, device and strides (floating tensors; others stay as they are)."""
    if not t.is_floating_point():
        return t
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(torch.randn(t.shape, generator=gen))


def _check_package(path: str, gm: torch.fx.GraphModule, inputs: list[torch.Tensor], n_state: int) -> None:
    """Loads the package just built and runs it against the fused graph it was compiled from, on
    random inputs of the recorded signature: a package that fails or differs is never saved (some
    torch releases decode our ops' ``dtype`` arguments wrongly in AOTInductor: docs/warm-start.md)."""
    gen = torch.Generator().manual_seed(0)
    args = list(inputs[:n_state]) + [_random_like(t, gen) for t in inputs[n_state:]]
    with torch.no_grad():
        expected = gm(*args)
        try:
            got = _compat.aoti_load(path)(*args)
        except Exception as e:
            lines = str(e).strip().splitlines()
            raise RuntimeError(
                "the package fails on inputs of the signature it was built for "
                f"({type(e).__name__}: {lines[0] if lines else ''})"
            ) from e
    for e, g in zip(expected, got, strict=True):
        tol = 1e-4 if e.dtype in (torch.float32, torch.float64) else 3e-2
        torch.testing.assert_close(g, e, rtol=tol, atol=tol, msg=lambda m: f"the package differs from its graph: {m}")


class AotBlock:
    """A loaded package of one block class, called in front of the block's compiled path.

    Args:
        runner: the loaded package (``aoti_load_package``).
        signature: the `CallSignature` it was built for.
        state: the block's parameter and buffer names, in the package's input order.
        state_keys: their ``("tensor", dtype, device, shape, stride)`` when the package was built.
        out_spec: the pytree spec of the block's output.

    Attributes:
        hits / misses: calls run by this package / declined by it.
        broken: the package raised once (with a warning) and takes no call any more.
    """

    def __init__(self, runner, signature: CallSignature, state: list[str], state_keys: list[tuple], out_spec) -> None:
        self.runner = runner
        self.signature = signature
        self.state = list(state)
        self.state_keys = list(state_keys)
        self.out_spec = out_spec
        self.hits = 0
        self.misses = 0
        self.broken = False
        # One call of the runner at a time, waited for here, in Python. The package's container
        # holds its runner while the package calls our Python custom ops back, which need the GIL;
        # a second thread entering the runner waits for it inside C++ holding the GIL, and the
        # process hangs. Waiting on this lock releases the GIL.
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str, signature: dict[str, Any], state: dict[str, Any], outputs: str) -> AotBlock:
        """Loads the package at `path` (its bytes already checked against the manifest) for the
        manifest entry's `signature` (`CallSignature.to_json`), `state` and `outputs`. The custom
        ops it calls back are registered first.

        Raises:
            PackageMismatchError: the package records another entry than this one (entries
                swapped or edited): it would run calls it was not built for.
            ValueError: the package records none (built before packages carried one).
        """
        import ascend_kernels.ops  # noqa: F401  (the package calls our ops through the dispatcher)

        sig = CallSignature.from_json(signature)
        names, keys = parse_state(state)
        spec = parse_outputs(outputs)
        runner = _compat.aoti_load(path)
        get = getattr(runner, "get_metadata", None)
        recorded = (get() if get is not None else {}).get(BINDING_KEY)
        if recorded is None:
            raise ValueError("the package records no call signature to check its manifest entry against")
        if recorded != package_binding(signature, state, outputs):
            raise PackageMismatchError(
                "the package was built for another call signature, state or output than its "
                "manifest entry says (entries swapped or edited?)"
            )
        return cls(runner, sig, names, keys, spec)

    def __call__(self, block: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        """The block's output computed by the package, or `MISS`."""
        tensors = (
            self.signature.tensors(args, kwargs)
            if not self.broken and block.training == self.signature.training
            else None
        )
        state = None
        if tensors is not None:
            names, state = _state(block)
            if torch.is_grad_enabled() and (
                any(t.requires_grad for t in state) or any(t.requires_grad for t in tensors)
            ):
                tensors = None  # needs autograd: the package is forward only
            elif names != self.state or [_tensor_key(t) for t in state] != self.state_keys:
                tensors = None  # weights cast, moved or replaced since the package was built
        if tensors is None:
            self.misses += 1
            return MISS
        try:
            with self._lock, torch.no_grad():
                if self.broken:  # retired by another thread meanwhile
                    self.misses += 1
                    return MISS
                out = self.runner(*state, *tensors)
                self.hits += 1
        except Exception as e:  # noqa: BLE001 - the compiled path can still serve this call
            # Checked when it was saved, a package should not fail; if it does, it is retired
            # and every call of its class takes the compiled path (the runner is functional:
            # nothing was written to the block's inputs or weights).
            warn(
                f"the ahead-of-time package of {type(block).__name__} failed "
                f"({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}); "
                "it is no longer used and the block compiles normally.",
                stacklevel=1,
            )
            self.broken = True
            self.misses += 1
            return MISS
        return _compat.tree_unflatten(out, self.out_spec)


@contextlib.contextmanager
def temporary_file(data: bytes, suffix: str):
    """`data` in a private temporary file (the loader takes a path), removed afterwards."""
    fd, path = tempfile.mkstemp(suffix=suffix, prefix="ascend-aoti-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield path
    finally:
        os.unlink(path)


def plain_call(module: torch.nn.Module) -> bool:
    """Whether calling `module` is exactly calling its class's ``forward`` (no module hooks, no
    instance ``forward`` such as a diffusers hook or an offloading wrapper): a package runs only then."""
    from torch.nn.modules import module as nn_module

    return not (
        module._forward_pre_hooks
        or module._forward_hooks
        or "forward" in module.__dict__
        or nn_module._global_forward_pre_hooks
        or nn_module._global_forward_hooks
    )


def record_signature(signatures: dict, label: str, module: torch.nn.Module, args, kwargs) -> None:
    """Adds the signature of a call of block class `label` that compiled a graph to `signatures`,
    for the packages a save builds; calls that need gradients or hold other leaves are skipped."""
    if not plain_call(module):
        return
    if torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters()):
        return
    sig = CallSignature.of(args, kwargs, training=module.training)
    recorded = signatures.setdefault(label, [])
    if sig is not None and all(sig != s for s, _ in recorded):
        recorded.append((sig, weakref.ref(module)))
