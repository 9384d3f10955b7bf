"""The house: the package's import graph has no cycles and its imports run down the floors.

Module-level and function-level imports both count (a lazy import is still a dependency). The
floors, lowest first, are the layering docs/how-fusion-works.md draws; a module may import its own
floor or any lower one."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Lowest first. A module belongs to the first floor with a prefix that names it or its package.
FLOORS = (
    ("ascend_kernels",),
    ("diffusers_ascend._import_hooks", "diffusers_ascend.compilation._compat", "diffusers_ascend.platform",
     "diffusers_ascend.fusions", "diffusers_ascend.hub", "diffusers_ascend.errors"),
    ("diffusers_ascend.config", "diffusers_ascend.compilation", "diffusers_ascend.layers", "diffusers_ascend.processors",
     "diffusers_ascend.attention"),
    ("diffusers_ascend.adapters",),
    ("diffusers_ascend.warm_start",),
    ("diffusers_ascend.mixin",),
    ("diffusers_ascend.cli", "diffusers_ascend.benchmarks", "diffusers_ascend.tiny",
     "diffusers_ascend"),
)
# Imports allowed to run up a floor, each with its reason (the issue allows at most one).
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for top in ("diffusers_ascend", "ascend_kernels"):
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: pathlib.Path, mods) -> set[str]:
    found = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                pkg = name.split(".")[: None if is_pkg else -1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            # A module's own package (its __init__) runs before it anyway: not an edge.
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def _floor(module: str) -> int:
    best = None
    for level, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (level, len(prefix))
    assert best is not None, f"{module} is on no floor: add it to FLOORS"
    return best[0]


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    assert "diffusers_ascend.mixin" in mods and "ascend_kernels.registry" in mods
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycles(graph) -> list[list[str]]:
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles(graph):
    assert _cycles(graph) == []


def test_imports_run_down_the_floors(graph):
    upward = sorted((a, b) for a, targets in graph.items() for b in targets if _floor(b) > _floor(a))
    assert [edge for edge in upward if edge not in UPWARD_ALLOWED] == []
    assert len(upward) <= 1


def test_kernels_never_import_diffusers_ascend(graph):
    assert [(a, b) for a, t in graph.items() if a.startswith("ascend_kernels") for b in t
            if b.startswith("diffusers_ascend")] == []


def test_the_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
