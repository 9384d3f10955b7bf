"""Pre-traced search graphs: a process registers patterns another process traced.

Registering a pattern with Inductor's pattern matcher traces its search function once on real
example inputs (make_fx, functionalized) to build the pattern it looks for: about 30 ms a pattern,
seconds for every fusion in every new process. That first trace depends only on the torch build
and the pattern code, so the first process on a machine writes each fusion's traced search graphs
here, and later ones rebuild the graphs from that file instead of tracing. Only that first trace
is replaced: what happens at a match (Inductor's exact re-trace on the matched shapes and dtypes,
the replacement's trace, our checks) is unchanged, so a cached graph finds the same matches.

Like Inductor's own serialized patterns (``torch/_inductor/fx_passes/serialized_patterns``), but
stored as data, not Python: a file is JSON that names call targets from ``aten``, ``prims`` or
``operator.getitem`` and holds literals of a few types. Nothing is executed or unpickled. A file
is used only while its bytes have the sha256 recorded when it was written (beside the verdicts);
any other file is dropped with a `PretracedCacheWarning` naming it, and the process traces and
writes it anew. A self-check failing on graphs read from a file drops it and traces again before
it blames torch (`base._verified_impl`).

The file of one fusion is named by the sha256 of what its graphs depend on (torch's version and
git revision, Python, the machine, the fusion's and the machinery's source: `FusionPass.source_hash`,
`_compat` and the ``ascend_kernels`` op definitions, as `verdict.verdict_key` hashes them), so a
new torch or a changed pattern traces again, and its self-check runs again (the verdict's key
changes with it). It lives beside the verdicts (`verdict.verdict_dir`; the variable set to an empty
string turns both off) and is written atomically; a directory that cannot be written only means the
next process traces again.
"""

from __future__ import annotations

import json
import operator
import os
from typing import Any

import torch

from ... import errors
from ...errors import AscendWarning
from . import verdict

FORMAT = 1
# Literals a traced search graph holds besides node references, as tagged JSON values.
_ENUMS = {
    "dtype": (torch.dtype, lambda name: getattr(torch, name)),
    "layout": (torch.layout, lambda name: getattr(torch, name)),
    "memory_format": (torch.memory_format, lambda name: getattr(torch, name)),
}
_NAMESPACES = ("aten", "prims")


class _NotStorable(ValueError):
    """A graph holds something this format does not store: its pattern is traced in every process."""


def cache_key(fusion_pass: type) -> str:
    """sha256 of everything `fusion_pass`'s traced search graphs depend on."""
    return verdict.engine_key(str(FORMAT), fusion_pass.__module__, fusion_pass.__qualname__, fusion_pass.source_hash())


def _path(key: str) -> str | None:
    return verdict.cache_path(key, "patterns")


# -- graph <-> JSON --------------------------------------------------------------------------------
def _target_name(target: Any) -> str:
    if target is operator.getitem:
        return "operator.getitem"
    if target is _out_dtype():  # torchao's int8 matmul off the CPU (the int8_dynamic_linear device form)
        return "higher_order.out_dtype"
    if isinstance(target, torch._ops.OpOverload):
        namespace = target.namespace
        if namespace in _NAMESPACES:
            return f"{namespace}.{target._schema.name.split('::', 1)[1]}.{target._overloadname}"
    raise _NotStorable(f"call target {target!r}")


def _out_dtype():
    return getattr(torch.ops.higher_order, "out_dtype", None)


def _resolve_target(name: Any):
    if name == "operator.getitem":
        return operator.getitem
    if name == "higher_order.out_dtype" and _out_dtype() is not None:
        return _out_dtype()
    if not isinstance(name, str):
        raise ValueError(f"target {name!r}")
    parts = name.split(".")
    if len(parts) != 3 or parts[0] not in _NAMESPACES or not all(p.isidentifier() for p in parts):
        raise ValueError(f"target {name!r}")
    packet = getattr(getattr(torch.ops, parts[0]), parts[1])  # AttributeError: no such op on this torch
    overload = getattr(packet, parts[2])
    if not isinstance(overload, torch._ops.OpOverload):
        raise ValueError(f"target {name!r}")
    return overload


def _encode(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}  # bit-exact, and inf/nan too (eps placeholders must survive exactly)
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [_encode(v) for v in value]}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch._ops.OpOverload):  # out_dtype's first argument (aten.mm.default)
        return {"op": _target_name(value)}
    for tag, (cls, _) in _ENUMS.items():
        if isinstance(value, cls):
            return {tag: str(value).replace("torch.", "")}
    raise _NotStorable(f"argument {value!r} of type {type(value).__name__}")


def _decode(value: Any, nodes: dict[str, torch.fx.Node]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((tag, item),) = value.items()
        if tag == "node" and isinstance(item, str) and item in nodes:
            return nodes[item]
        if tag == "float" and isinstance(item, str):
            return float.fromhex(item)
        if tag in ("list", "tuple") and isinstance(item, list):
            items = [_decode(v, nodes) for v in item]
            return items if tag == "list" else tuple(items)
        if tag == "device" and isinstance(item, str):
            return torch.device(item)
        if tag == "op" and isinstance(item, str) and item != "operator.getitem":
            return _resolve_target(item)
        if tag in _ENUMS and isinstance(item, str) and item.isidentifier():
            cls, resolve = _ENUMS[tag]
            resolved = resolve(item)
            if isinstance(resolved, cls):
                return resolved
    raise ValueError(f"value {value!r}")


def graph_to_json(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    """The nodes of a traced search graph as JSON data.

    Raises:
        _NotStorable: the graph holds a node or value the format does not store (e.g. a tensor constant).
    """
    out = []
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise _NotStorable(f"{node.op} node {node.name}")
        entry: dict[str, Any] = {
            "op": node.op,
            "name": node.name,
            "args": _encode(node.args),
            "kwargs": {k: _encode(v) for k, v in node.kwargs.items()},
        }
        entry["target"] = _target_name(node.target) if node.op == "call_function" else node.target
        out.append(entry)
    return out


def graph_from_json(nodes: Any) -> torch.fx.GraphModule:
    """The graph `graph_to_json` wrote. Raises ValueError (or AttributeError for an op this torch
    lacks) on anything else; the caller then ignores the file."""
    if not isinstance(nodes, list):
        raise ValueError("nodes")
    graph = torch.fx.Graph()
    made: dict[str, torch.fx.Node] = {}
    for entry in nodes:
        if not isinstance(entry, dict) or set(entry) != {"op", "name", "target", "args", "kwargs"}:
            raise ValueError("node entry")
        op, name, kwargs = entry["op"], entry["name"], entry["kwargs"]
        if not isinstance(name, str) or not name.isidentifier() or name in made or not isinstance(kwargs, dict):
            raise ValueError(f"node {name!r}")
        args = _decode(entry["args"], made)
        kw = {k: _decode(v, made) for k, v in kwargs.items() if isinstance(k, str)}
        if not isinstance(args, tuple) or len(kw) != len(kwargs):
            raise ValueError(f"node {name!r} arguments")
        if op == "placeholder":
            if not isinstance(entry["target"], str) or args or kw:
                raise ValueError(f"placeholder {name!r}")
            node = graph.placeholder(entry["target"])
        elif op == "call_function":
            node = graph.call_function(_resolve_target(entry["target"]), args, kw)
        elif op == "output":
            if len(args) != 1 or kw:
                raise ValueError("output")
            node = graph.output(args[0])
        else:
            raise ValueError(f"op {op!r}")
        node.name = name
        made[name] = node
    graph.lint()
    return torch.fx.GraphModule(torch.nn.Module(), graph)


# -- the per-fusion file ---------------------------------------------------------------------------
KIND = "patterns"


class PretracedCacheWarning(AscendWarning):
    """A pre-traced pattern file was not used: it is not the file this cache wrote (edited, truncated,
    unparsable, or with no digest recorded), or the self-check failed on the graphs read from it and
    passed on a fresh trace. The message names the file; it is dropped, the patterns are traced
    again and the file is written anew."""


def distrust(path: str, why: str, *, dropped: bool = False) -> None:
    """Warns that the file at `path` is not used because `why`, and drops it (unless the caller
    `dropped` it already and the fresh trace rewrote it)."""
    errors.warn(
        f"the pre-traced pattern file {path} is not used: {why}. It is dropped and the patterns "
        "are traced again (the file is written anew).",
        category=PretracedCacheWarning,
        stacklevel=3,
    )
    if not dropped:
        try:
            os.unlink(path)
        except OSError:
            pass


def cached_file(fusion_pass: type) -> str | None:
    """The path of `fusion_pass`'s file when there is one, else None."""
    path = _path(cache_key(fusion_pass))
    return path if path is not None and os.path.exists(path) else None


def drop(fusion_pass: type) -> None:
    """Removes `fusion_pass`'s file and its digest (the self-check failed on its graphs)."""
    key = cache_key(fusion_pass)
    path = _path(key)
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass
    verdict.forget_digest(key, KIND)


def load(fusion_pass: type) -> dict[str, torch.fx.GraphModule]:
    """The pre-traced search graphs of `fusion_pass` (by pattern key), or {} where there are none.

    A file is used only while its bytes have the sha256 `save` recorded beside the verdicts
    (`verdict.record_digest`), and only when it parses as exactly what `save` writes for this key;
    any other file is dropped with a `PretracedCacheWarning` naming it (then the process traces)."""
    key = cache_key(fusion_pass)
    path = _path(key)
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        distrust(path, f"it cannot be read ({e})")
        return {}
    recorded = verdict.recorded_digest(key, KIND)
    if recorded is None:
        distrust(path, "no digest of it was recorded when it was written")
        return {}
    if verdict.sha256_of(raw) != recorded:
        distrust(path, "its sha256 is not the one recorded when it was written (it was changed since)")
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("graphs"), dict):
            raise ValueError("not a pattern file of this key")
        return {str(name): graph_from_json(nodes) for name, nodes in data["graphs"].items()}
    except (ValueError, AttributeError, RuntimeError, TypeError, UnicodeDecodeError) as e:
        distrust(path, f"it is not a pattern file this torch reads ({type(e).__name__}: {e})")
        return {}


def save(fusion_pass: type, graphs: dict[str, list]) -> None:
    """Writes `fusion_pass`'s traced search graphs (JSON nodes by pattern key), atomically, and
    records its sha256 beside the verdicts; silently not where the directory cannot be written."""
    key = cache_key(fusion_pass)
    path = _path(key)
    if path is None or not graphs:
        return
    text = json.dumps({"key": key, "torch": torch.__version__, "graphs": graphs}, separators=(",", ":"))
    # Digest first: a file of one key holds the same graphs in every process that writes it, so a
    # reader between the two writes finds the digest of the file it reads.
    verdict.record_digest(key, KIND, verdict.sha256_of(text.encode("utf-8")))
    verdict.write_text(path, text)


class InitialTrace:
    """The ``trace_fn`` one pattern registers with: its first trace on real example inputs (the one
    registration makes) comes from `pretraced` when there, else is traced and kept in `record`;
    every other trace (at a match, under fake tensors; the replacement's) is `trace`'s.

    Args:
        key: the pattern's key in its fusion's file.
        trace: the real trace function (`trace_functional`).
        pretraced: graphs `load` returned.
        record: where a traced graph's JSON goes (None when this pattern is not to be stored).
    """

    def __init__(self, key: str, trace, pretraced: dict[str, torch.fx.GraphModule], record: dict | None) -> None:
        self.key, self.trace, self.pretraced, self.record = key, trace, pretraced, record

    def __call__(self, fn, args, **kwargs):
        initial = not any(
            isinstance(a, torch._subclasses.FakeTensor) for a in torch.utils._pytree.tree_leaves(list(args))
        )
        if initial and self.key in self.pretraced:
            return self.pretraced[self.key]
        gm = self.trace(fn, args, **kwargs)
        if initial and self.record is not None:
            try:
                self.record[self.key] = graph_to_json(gm)
            except _NotStorable:
                self.record = None  # traced in every process
        return gm
