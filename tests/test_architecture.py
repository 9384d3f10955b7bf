"""The house: the package's import graph has no cycles and its imports run down the floors.

Module-level and function-level imports both count (a lazy import is still a dependency), and so
does every package above the module imported: ``from ..integration.state import X`` runs
``integration/__init__.py`` first, so it imports ``integration``. The floors, lowest first, are the
layering docs/index.md draws; a module may import its own floor or any lower one."""

import ast
import pathlib

import pytest

from diffusers_ascend._diffusers_compat import private_attributes

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Lowest first. A module belongs to the first floor with a prefix that names it or its package.
FLOORS = (
    ("ascend_kernels",),
    (
        "diffusers_ascend._import_hooks",
        "diffusers_ascend.compilation._compat",
        "diffusers_ascend._diffusers_compat",
        "diffusers_ascend.errors",
        "diffusers_ascend.platform",
        "diffusers_ascend.fusions",
        "diffusers_ascend.hub",
    ),
    (
        "diffusers_ascend.config",
        "diffusers_ascend.compilation",
        "diffusers_ascend.layers",
        "diffusers_ascend.processors",
        "diffusers_ascend.attention",
        "diffusers_ascend.enabled",
    ),
    ("diffusers_ascend.adapters",),
    ("diffusers_ascend.warm_start",),
    ("diffusers_ascend.integration",),
    ("diffusers_ascend.cli", "diffusers_ascend.benchmarks", "diffusers_ascend.tiny", "diffusers_ascend"),
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
            # Python runs each package above the target first. The module's own packages (their
            # __init__) run before it anyway: not an edge.
            while target:
                if target in mods and target != name and not name.startswith(target + "."):
                    found.add(target)
                target = target.rpartition(".")[0]
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
    assert "diffusers_ascend.integration.api" in mods and "ascend_kernels.registry" in mods
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
    assert [
        (a, b)
        for a, t in graph.items()
        if a.startswith("ascend_kernels")
        for b in t
        if b.startswith("diffusers_ascend")
    ] == []


def test_the_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_the_check_sees_an_import_up_through_a_package(tmp_path):
    # The layout before #41: the record in integration/state.py, read by warm start (floor 4). Importing
    # it runs integration/__init__.py (floor 5) first, so that edge runs up a floor even where FLOORS
    # would place integration.state itself lower (as it did then).
    path = tmp_path / "save.py"
    path.write_text("from ..integration.state import EnabledModel\n")
    name = "diffusers_ascend.warm_start.save"
    mods = {m: path for m in (name, "diffusers_ascend.integration", "diffusers_ascend.integration.state")}
    found = _imports(name, path, mods)
    assert found == {"diffusers_ascend.integration", "diffusers_ascend.integration.state"}
    assert _floor("diffusers_ascend.integration") > _floor(name)


# -- diffusers' private names live in diffusers_ascend/_diffusers_compat.py only --------------------
SHIM = "diffusers_ascend._diffusers_compat"
# diffusers modules that are internal as a whole (any name imported from them is private).
INTERNAL_DIFFUSERS_MODULES = ("diffusers.utils.import_utils",)


def _is_private_diffusers_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "diffusers" and (
        any(p.startswith("_") for p in parts)
        or any(module == m or module.startswith(m + ".") for m in INTERNAL_DIFFUSERS_MODULES)
    )


def _private_diffusers_uses(source: str, private: frozenset[str]) -> list[str]:
    """Where `source` imports a private diffusers name, or reads/writes one of the private
    attributes the shim owns (``obj._repeated_blocks``, ``getattr(p, "_attention_backend")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _is_private_diffusers_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "diffusers":
            found += [
                f"{node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if a.name.startswith("_") or _is_private_diffusers_module(f"{node.module}.{a.name}")
            ]
        elif isinstance(node, ast.Attribute) and node.attr in private:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call):
            found += [
                f"{node.lineno}: {a.value!r} passed to a call"
                for a in node.args
                if isinstance(a, ast.Constant) and a.value in private
            ]
    return found


def test_no_module_outside_the_shim_uses_a_private_diffusers_name():
    private = private_attributes()
    offenders = {
        name: uses
        for name, path in _modules().items()
        if name != SHIM
        for uses in [_private_diffusers_uses(path.read_text(), private)]
        if uses
    }
    assert offenders == {}, "private diffusers names outside diffusers_ascend/_diffusers_compat.py"


@pytest.mark.parametrize(
    "source, found",
    [
        (
            "from diffusers.models.attention_dispatch import dispatch_attention_fn, _check_shape",
            ["1: from diffusers.models.attention_dispatch import _check_shape"],
        ),
        ("def f():\n    from diffusers.utils import import_utils", ["2: from diffusers.utils import import_utils"]),
        (
            "from diffusers.utils.import_utils import is_torch_npu_available",
            ["1: from diffusers.utils.import_utils import is_torch_npu_available"],
        ),
        ("import diffusers.models._modeling_internals", ["1: import diffusers.models._modeling_internals"]),
        ("blocks = model._repeated_blocks", ["1: ._repeated_blocks"]),
        ("p._attention_backend = member", ["1: ._attention_backend"]),
        ("cp = getattr(p, '_parallel_config', None)", ["1: '_parallel_config' passed to a call"]),
        ("registry = module.__dict__.get('_diffusers_hook')", ["1: '_diffusers_hook' passed to a call"]),
        # public names, our own private attributes, relative imports: not flagged
        (
            "from diffusers import FluxPipeline\nfrom diffusers.models.attention_dispatch import dispatch_attention_fn",
            [],
        ),
        ("self._state = model._ascend_state\nfrom ._diffusers_compat import repeated_blocks", []),
    ],
)
def test_the_private_name_check_sees_a_planted_use(source, found):
    assert _private_diffusers_uses(source, private_attributes()) == found
