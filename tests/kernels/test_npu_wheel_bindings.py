"""Every torch_npu / torch.npu / mindiesd call of the package, bound by name and type against each wheel.

A CONTRACT test (no Ascend device here). A static scan finds every call site of a torch_npu op
(``<torch_npu>.npu_*(...)``, ``torch.ops.npu.*``, ``torch.ops.mindiesd.*``, and names bound to
``getattr(torch.ops.npu, ...)``) in ascend_kernels and diffusers_ascend; `CASES` drives the package
through the stand-ins (tests/kernels/npu_standins.py) so that each of those sites runs, recording
every call with the file and line it came from. A site no case drives, or a recorded call from a
site the scan did not find, fails the test: a call added later cannot escape it (add one `Case`).

Each recorded call is then bound against the schema its stack ships: torch_npu 2.10.0.post6's and
2.14.0's as read out of their ``libtorch_npu.so`` (MindIE SD 3.1.0: its ``libPTAExtensionOPS.so``),
from ``npu_contracts.json`` (``tools/npu_wheels.py``; ``--check`` verifies it against the wheels).
Binding is torch's own (the dispatcher's argument parser, which the real ops go through: names,
arity, keyword-only arguments, torch's type rules) and then a strict one of the Python type of each
value against the schema type (`value_matches`: no ``bool`` for ``int``, no tensor for ``float``).
The ``torch_npu.npu`` Python API calls are bound against the ``def`` in the wheel's source.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ascend_kernels.npu import attention as npu_attention
from ascend_kernels.npu import probe

from .npu_quant_standins import install_quant_ops
from .npu_standins import (
    CONTRACTS,
    MINDIESD,
    NEWEST,
    SCHEMAS,
    WHEELS,
    api_signature,
    install_torch_npu,
    mindiesd_standin,
    npu_attention_ops,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ascend_kernels", "diffusers_ascend")
ops = torch.ops.ascend_kernels


# -- binding one call against one schema ----------------------------------------------------------
_ARG = re.compile(r"^(?P<type>[\w\[\]?().!]+)\s+(?P<name>\w+)(?:=(?P<default>.+))?$")


def schema_arguments(schema: str) -> list[tuple[str, str, str | None]]:
    """``(type, name, default or None)`` of each argument of a schema string, as written (``*`` dropped)."""
    args = schema[schema.index("(") + 1 : schema.rindex(") ->")]
    pieces, depth, part = [], 0, ""
    for ch in args + ",":  # split at top-level commas (defaults such as [128,128] contain commas)
        depth += ch in "[(" or -(ch in "])")
        if ch == "," and depth == 0:
            pieces.append(part.strip())
            part = ""
        else:
            part += ch
    out = []
    for piece in pieces:
        if piece and piece != "*":
            m = _ARG.match(piece)
            assert m, f"unparsed schema argument {piece!r} in {schema}"
            out.append((m["type"], m["name"], m["default"]))
    return out


def _not_bool(kinds):
    return lambda v: isinstance(v, kinds) and not isinstance(v, bool)


# Python values each schema type takes from our calls. Stricter than torch's parser, which takes a
# bool or a 0-dim tensor for an int: a call of ours that passes one is a mistake even where it binds.
PY_TYPES: dict[str, Callable[[object], bool]] = {
    "Tensor": lambda v: isinstance(v, torch.Tensor),
    # torch_npu writes dtype arguments as int (npu_quant_matmul's `int? output_dtype`) and documents a
    # torch.dtype there: torch's parser turns a dtype given for an int into its ScalarType number.
    "int": lambda v: _not_bool(int)(v) or isinstance(v, torch.dtype),
    "SymInt": _not_bool((int, torch.SymInt)),
    "float": _not_bool((float, int)),  # an int where a float goes, as Python's numeric tower allows
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "ScalarType": lambda v: isinstance(v, torch.dtype),
    "Scalar": _not_bool((int, float)),
    "Device": lambda v: isinstance(v, (torch.device, str)),
}


def value_matches(value, schema_type: str) -> bool:
    """Whether ``value`` is of ``schema_type`` (``Tensor?``, ``int[]``, ``SymInt[]?``, ``ScalarType``, ...).

    Raises an AssertionError for a schema type `PY_TYPES` does not list: extend it, never guess.
    """
    t = re.sub(r"\(\w+!?\)", "", schema_type)  # alias annotations: Tensor(a!) is a Tensor
    if t.endswith("?"):
        return value is None or value_matches(value, t[:-1])
    if m := re.fullmatch(r"(\w+)\[\d*\]", t):
        return isinstance(value, (list, tuple)) and all(value_matches(v, m[1]) for v in value)
    assert t in PY_TYPES, f"no Python type for schema type {t!r}: add it to PY_TYPES"
    return PY_TYPES[t](value)


class _Reached(Exception):
    """Raised by a scratch op's kernel: the dispatcher bound the call."""


@functools.cache
def _scratch_op(schema: str):
    """``schema`` defined in a test-only namespace whose kernel raises `_Reached` (where torch has no
    ``_check_schema_allow_fake_script_object``): the dispatcher parses the arguments first."""
    import hashlib

    def reached(*args, **kwargs):
        raise _Reached

    namespace, name = "wheelbind_" + hashlib.sha1(schema.encode()).hexdigest()[:16], schema.split("(")[0]
    lib = torch.library.Library(namespace, "DEF")  # noqa: TOR901  (test-only, kept by the cache)
    lib.define(schema)
    lib.impl(name, reached, "CompositeExplicitAutograd")
    return getattr(getattr(torch.ops, namespace), name), lib


def torch_binds(schema: str, args: tuple, kwargs: dict) -> str | None:
    """torch's verdict on binding the call to ``schema`` (as torch_npu's op would get it), or None."""
    try:
        if hasattr(torch._C, "_check_schema_allow_fake_script_object"):
            torch._C._check_schema_allow_fake_script_object(torch._C.parse_schema(schema), *args, **kwargs)
        else:
            _scratch_op(schema)[0](*args, **kwargs)
    except _Reached:
        pass
    except (RuntimeError, TypeError) as e:
        return str(e).split("\n")[0].split(". Declaration:")[0].split(". Schema:")[0]
    return None


def bind_error(schema: str, args: tuple, kwargs: dict) -> str | None:
    """Why the call does not bind to ``schema`` (torch's binding, then the strict value types), or None."""
    why = torch_binds(schema, args, kwargs)
    if why:
        return why
    arguments = schema_arguments(schema)
    passed = dict(zip([name for _, name, _ in arguments], args)) | kwargs
    for schema_type, name, _ in arguments:
        if name in passed and not value_matches(passed[name], schema_type):
            value = passed[name]
            return f"argument {name!r} is {schema_type} in the schema, the call passes {type(value).__name__} {value!r:.40}"
    return None


# -- the call sites: found in the source -----------------------------------------------------------
_NAMESPACES = ("torch.ops.npu", "torch.ops.mindiesd")


@dataclasses.dataclass(frozen=True)
class Site:
    """One call of a torch_npu / MindIE SD op in the package's source."""

    path: str
    function: str
    first: int
    last: int
    op: str  # the op's name, or the getattr() it comes from

    def __str__(self):
        return f"{self.path}:{self.first} {self.function}(): {self.op}"

    def holds(self, path: str, line: int) -> bool:
        return path == self.path and self.first <= line <= self.last


def _op_reference(node) -> str | None:
    """The op ``node`` names: ``<x>.npu_*``, ``torch.ops.npu.<op>``, ``torch.ops.mindiesd.<op>``,
    ``getattr(torch.ops.npu, <name>)``, ``getattr(<x>, "npu_*")``; None for anything else."""
    if isinstance(node, ast.Attribute) and (node.attr.startswith("npu_") or ast.unparse(node.value) in _NAMESPACES):
        return node.attr
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and len(node.args) >= 2:
        owner, name = node.args[0], node.args[1]
        if ast.unparse(owner) in _NAMESPACES:
            return ast.unparse(node)
        if isinstance(name, ast.Constant) and str(name.value).startswith("npu_"):
            return str(name.value)
    return None


def _scope(node, parents):
    """The function ``node`` is in (the module at top level)."""
    while node in parents and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node = parents[node]
    return node


@functools.cache
def op_call_sites(root: Path = ROOT) -> tuple[tuple[Site, ...], tuple[str, ...]]:
    """Every op call site in ascend_kernels and diffusers_ascend (under ``root``), and the op
    references the scan cannot follow (neither called where named, nor bound to a local name that
    is called, nor a ``.default._schema`` read)."""
    sites, unfollowed = [], []
    for path in sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")):
        rel = str(path.relative_to(root))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

        for node in ast.walk(tree):
            op = _op_reference(node)
            if op is None or _op_reference(parents.get(node)) is not None:
                continue  # the outer expression (torch.ops.npu.npu_x, not torch.ops.npu) is the reference
            scope = _scope(node, parents)
            function = getattr(scope, "name", "<module>")
            parent = parents.get(node)
            if isinstance(parent, ast.Attribute) and parent.attr == "default":
                node, parent = parent, parents.get(parent)  # torch.ops.npu.<op>.default(...)
            if isinstance(parent, ast.Call) and parent.func is node:
                sites.append(Site(rel, function, parent.lineno, parent.end_lineno, op))
            elif (
                isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name)
            ):
                name = parent.targets[0].id
                calls = [
                    c
                    for c in ast.walk(scope)
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == name
                ]
                sites += [Site(rel, function, c.lineno, c.end_lineno, op) for c in calls]
                if not calls:
                    unfollowed.append(f"{rel}:{node.lineno} {ast.unparse(parent)}")
            elif not (isinstance(parent, ast.Attribute) and parent.attr in ("_schema", "default")):  # schema reads
                unfollowed.append(f"{rel}:{node.lineno} {ast.unparse(parent)[:80]}")
    return tuple(sites), tuple(unfollowed)


# -- the call sites: driven through the package ----------------------------------------------------
# The torch_npu stacks the calls are bound against: the wheels, and the newest wheel with op-plugin
# 6.0.0's npu_rotary_mul (no rotary_mode: the rope provider gates to its other call) or 7.0.0's
# (rotary_mode, no rotate).
STACKS = (*WHEELS, "6.0.0", "7.0.0")
_ROPE_STACKS = (*WHEELS, "7.0.0")


def _randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def _rope(layout):
    cos, sin = torch.randn(13, 16, generator=torch.Generator().manual_seed(1)), torch.ones(13, 16)
    return ops.rope(_randn(1, 13, 2, 16), cos[None, :, None], sin[None, :, None], layout)


def _probe_fp32_gamma(mp):
    # The probe's one npu_rms_norm call, on the CPU (the stand-in refuses the fp32 gamma as the
    # wheel's doc does: the probe answers False).
    mp.setattr(torch, "npu", types.SimpleNamespace(is_available=lambda: True), raising=False)
    assert probe._ask_device_fp32_gamma(torch.bfloat16, device="cpu") is False


def _int8_args(bias: bool):
    # bf16 activations, an int8 (N, K) weight with its per-channel scale: what torchao's linears hand over
    x = _randn(2, 7, 64)
    w = torch.randint(-128, 128, (48, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    return (
        x,
        w,
        torch.rand(48, 1, generator=torch.Generator().manual_seed(1)) / 100 + 1e-3,
        _randn(48) if bias else None,
    )


@dataclasses.dataclass(frozen=True)
class Case:
    """One way the package reaches a torch_npu / MindIE SD op.

    Args:
        name: the case's id.
        run: drives the package (public op or provider), given a ``MonkeyPatch``.
        standin: `StandInTorchNpu` settings (SoC, FIA versions, ...).
        stacks: the stacks (`STACKS`) it runs on.
        mindiesd: with MindIE SD's stand-in (``torch.ops.mindiesd``) registered.
        quant: with the quantized matmuls' stand-ins (`npu_quant_standins.install_quant_ops`).
    """

    name: str
    run: Callable
    standin: dict = dataclasses.field(default_factory=dict)
    stacks: tuple = WHEELS
    mindiesd: bool = False
    quant: bool = False


CASES = (
    Case(
        "rms_norm, fp32 weight", lambda mp: ops.rms_norm(_randn(2, 13, 64), _randn(64, dtype=torch.float32), 1e-6, None)
    ),
    Case("rms_norm, no weight", lambda mp: ops.rms_norm(_randn(2, 13, 64), None, 1e-6, None)),
    Case("add_rms_norm", lambda mp: ops.add_rms_norm(_randn(2, 13, 64), _randn(2, 13, 64), _randn(64), 1e-6, None)),
    Case("probe: npu_rms_norm takes an fp32 gamma?", _probe_fp32_gamma),
    Case("rope, interleaved", lambda mp: _rope("interleaved"), stacks=_ROPE_STACKS),
    Case("rope, half", lambda mp: _rope("half"), stacks=_ROPE_STACKS),
    Case("rope, op-plugin 6.0.0 (no rotary_mode)", lambda mp: _rope("half"), stacks=("6.0.0",)),
    Case("gelu_tanh", lambda mp: ops.gelu_tanh(_randn(2, 13, 64))),
    Case("fast_gelu", lambda mp: ops.fast_gelu(_randn(2, 13, 64))),
    Case("swiglu, packed", lambda mp: ops.swiglu(_randn(2, 13, 64), None, -1)),
    Case("swiglu, separate up", lambda mp: ops.swiglu(_randn(2, 13, 32), _randn(2, 13, 32), -1)),
    Case(
        "FIA v2, lse",
        lambda mp: npu_attention.fia(_randn(1, 32, 2, 16), _randn(1, 32, 2, 16), _randn(1, 32, 2, 16), return_lse=True),
    ),
    Case(
        "FIA v1, bool mask",
        lambda mp: npu_attention.fia(
            _randn(1, 32, 2, 16),
            _randn(1, 32, 2, 16),
            _randn(1, 32, 2, 16),
            attn_mask=torch.ones(1, 1, 32, 32, dtype=torch.bool),
        ),
        standin={"fia": ("v1",)},
    ),
    Case(
        "npu_fusion_attention (FIA's exact fallback), causal",
        lambda mp: npu_attention.fallback(
            _randn(1, 32, 2, 16), _randn(1, 32, 2, 16), _randn(1, 32, 2, 16), is_causal=True
        ),
    ),
    Case(
        "adaln_modulate (MindIE SD)",
        lambda mp: ops.adaln_modulate(_randn(2, 13, 64), _randn(2, 64), _randn(2, 64), 1e-6, None, None, None),
        mindiesd=True,
    ),
    Case("int8_dynamic_linear (W8A8), bias", lambda mp: ops.int8_dynamic_linear(*_int8_args(True)), quant=True),
    Case("int8_weight_only_linear (W8A16)", lambda mp: ops.int8_weight_only_linear(*_int8_args(False)), quant=True),
)


@dataclasses.dataclass
class Call:
    """One recorded call: the op, its namespace (``torch_npu`` or ``mindiesd``), what it was passed
    and where in the package it came from."""

    case: str
    namespace: str
    op: str
    args: tuple
    kwargs: dict
    path: str
    line: int

    def __str__(self):
        return f"{self.path}:{self.line} {self.op} ({self.case})"


def _caller() -> tuple[str, int]:
    frame = sys._getframe(2)  # the frame that called the op (past the recording wrapper)
    path = Path(frame.f_code.co_filename).resolve()
    return (str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)), frame.f_lineno


def _recording(calls: list, case: str, namespace: str, op: str, fn):
    def call(*args, **kwargs):
        calls.append(Call(case, namespace, op, args, kwargs, *_caller()))
        return fn(*args, **kwargs)

    call.default = getattr(fn, "default", None)  # the stand-ins and the probe read the packet's schema
    return call


def _run_case(case: Case, stack: str, mp, op_names, calls: list) -> None:
    """Runs ``case`` on ``stack``'s stand-in, recording every call of the ops named ``op_names`` in ``calls``."""
    fake = install_torch_npu(mp, version=stack, **case.standin)
    if case.quant:
        install_quant_ops(fake)
    for op in op_names:
        if isinstance(getattr(fake, op, None), Callable):
            mp.setattr(fake, op, _recording(calls, case.name, "torch_npu", op, getattr(fake, op)))
        if hasattr(torch.ops.npu, op):
            mp.setattr(torch.ops.npu, op, _recording(calls, case.name, "torch_npu", op, getattr(torch.ops.npu, op)))
    with mindiesd_standin() if case.mindiesd else _nothing():
        for op in op_names if case.mindiesd else ():
            if hasattr(torch.ops.mindiesd, op):
                mp.setattr(
                    torch.ops.mindiesd,
                    op,
                    _recording(calls, case.name, "mindiesd", op, getattr(torch.ops.mindiesd, op)),
                )
        case.run(mp)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@functools.cache
def recorded(stack: str) -> tuple[tuple[Call, ...], tuple[str, ...]]:
    """Every call `CASES` make on ``stack`` (each case with a fresh stand-in), and the cases that
    raised (a stand-in refusing a call, e.g. a keyword its wheel's schema lacks); once per process."""
    names = (
        {site.op for site in op_call_sites()[0]}
        | {op for wheel in WHEELS for op in CONTRACTS["torch_npu"][wheel]["schemas"]}
        | set(MINDIESD["schemas"])
    )
    names = sorted(n for n in names if n.isidentifier())
    calls: list[Call] = []
    errors: list[str] = []
    try:
        for case in CASES:
            if stack in case.stacks:
                with pytest.MonkeyPatch.context() as mp:
                    try:
                        _run_case(case, stack, mp, names, calls)
                    except Exception as e:  # reported by the binding test, with the calls bound so far
                        errors.append(f"{case.name!r} on {stack}: {type(e).__name__}: {e}")
    finally:
        probe.cache_clear()  # the stand-in's answers must not outlive it
    return tuple(calls), tuple(errors)


def schemas_of(stack: str) -> dict[str, dict[str, str]]:
    """The schema strings ``stack`` ships, by namespace: the wheel's (op-plugin 6.0.0: the newest wheel's
    with its npu_rotary_mul) and MindIE SD 3.1.0's."""
    wheel = stack if stack in WHEELS else NEWEST
    return {
        "torch_npu": {**CONTRACTS["torch_npu"][wheel]["schemas"], **SCHEMAS[stack]},
        "mindiesd": MINDIESD["schemas"],
    }


def binding_failures(calls, schemas: dict[str, dict[str, str]]) -> list[str]:
    """The calls that do not bind to their op's schema in ``schemas``, each with its site and the reason."""
    bad = []
    for call in calls:
        schema = schemas[call.namespace].get(call.op)
        why = f"{call.namespace} has no {call.op}" if schema is None else bind_error(schema, call.args, call.kwargs)
        if why:
            bad.append(f"{call}: {why}")
    return bad


# -- the tests ----------------------------------------------------------------------------------------
def test_the_scan_finds_every_op_call_site():
    """The scan sees each call form the package uses (and follows or reports every op reference)."""
    sites, unfollowed = op_call_sites()
    assert unfollowed == (), "op references the scan cannot follow to a call: extend op_call_sites"
    found = {(s.path, s.function, s.op) for s in sites}
    assert {
        ("ascend_kernels/npu/kernels.py", "rms_norm", "npu_rms_norm"),
        ("ascend_kernels/npu/kernels.py", "add_rms_norm", "npu_add_rms_norm"),
        ("ascend_kernels/npu/kernels.py", "adaln", "adaln"),
        ("ascend_kernels/npu/attention.py", "_fusion_attention", "npu_fusion_attention"),
        ("ascend_kernels/npu/attention.py", "fia", "getattr(torch.ops.npu, name)"),
        ("ascend_kernels/npu/probe.py", "_ask_device_fp32_gamma", "npu_rms_norm"),
    } <= found
    assert sum(s.op == "npu_rotary_mul" for s in sites) == 2  # with and without rotary_mode


def undriven(sites, calls) -> list[str]:
    """The sites none of ``calls`` came from."""
    return [str(s) for s in sites if not any(s.holds(c.path, c.line) for c in calls)]


def test_a_call_site_added_later_is_found_and_fails_until_driven(tmp_path):
    """What another branch adds (an int8 op in a new file under ascend_kernels/npu/) is a site the
    scan finds, undriven until a Case drives it; an op reference the scan cannot follow is reported."""
    new = tmp_path / "ascend_kernels" / "npu" / "quant.py"
    new.parent.mkdir(parents=True)
    new.write_text(
        "import torch\n"
        "def quant_matmul(x, w, scale):\n"
        "    return _npu().npu_quant_matmul(x, w, scale, output_dtype=torch.bfloat16)\n"
        "def dynamic_quant(x):\n"
        "    op = torch.ops.npu.npu_dynamic_quant\n"
        "    return op(x)\n"
        "def escapes():\n"
        "    return [torch.ops.npu.npu_anti_quant]\n"
    )
    sites, unfollowed = op_call_sites(tmp_path)
    assert sorted((s.function, s.op, s.first) for s in sites) == [
        ("dynamic_quant", "npu_dynamic_quant", 6),
        ("quant_matmul", "npu_quant_matmul", 3),
    ]
    assert unfollowed == ("ascend_kernels/npu/quant.py:8 [torch.ops.npu.npu_anti_quant]",)
    calls = [c for stack in STACKS for c in recorded(stack)[0]]
    assert len(undriven(sites, calls)) == 2
    driven = Call("a new case", "torch_npu", "npu_quant_matmul", (), {}, "ascend_kernels/npu/quant.py", 3)
    assert undriven(sites, [*calls, driven]) == ["ascend_kernels/npu/quant.py:6 dynamic_quant(): npu_dynamic_quant"]


def test_every_op_call_site_is_driven():
    """Each call site the scan finds runs in some case (on some stack), and every recorded call comes
    from a site the scan found."""
    sites = op_call_sites()[0]
    calls = [c for stack in STACKS for c in recorded(stack)[0]]
    assert undriven(sites, calls) == [], "call sites no Case drives: add a Case"
    unscanned = sorted({str(c) for c in calls if not any(s.holds(c.path, c.line) for s in sites)})
    assert unscanned == [], "calls from sites op_call_sites() does not find"


@pytest.mark.parametrize("stack", STACKS)
def test_every_op_call_binds_to_its_wheel_schema(stack):
    """Every recorded call binds by name and type to the schema of the stack it ran on."""
    calls, errors = recorded(stack)
    assert calls
    assert binding_failures(calls, schemas_of(stack)) == []
    assert list(errors) == [], "cases the stand-in refused"


def _rename(schema: str, name: str) -> str:
    out = re.sub(rf"(?<= ){name}(?=[=,)])", f"{name}_renamed", schema, count=1)
    assert out != schema, (name, schema)
    return out


_WRONG_TYPE = {"Tensor": "int", "int": "str", "SymInt": "str", "float": "str", "bool": "str", "str": "int"}
_DEFAULT_OF = {"int": "0", "str": "''"}
_WRONG_VALUE = {
    "Tensor": 1.0,
    "int": "1",
    "SymInt": "1",
    "float": "1.0",
    "bool": "True",
    "str": 1,
    "ScalarType": "bf16",
}


def _retype(schema: str, name: str) -> str:
    """``schema`` with argument ``name`` of another type (``int`` for ``Tensor``, ``str`` for ``int``, ...)."""
    for schema_type, arg, default in schema_arguments(schema):
        if arg == name:
            base = re.sub(r"[?\[\]\d]", "", schema_type)
            wrong = _WRONG_TYPE[base] + ("?" if schema_type.endswith("?") else "")
            new_default = "" if default is None else "=" + ("None" if wrong.endswith("?") else _DEFAULT_OF[wrong])
            piece = f"{schema_type} {name}" + ("" if default is None else f"={default}")
            assert piece in schema, (piece, schema)
            return schema.replace(piece, f"{wrong} {name}{new_default}", 1)
    raise AssertionError(f"no argument {name} in {schema}")


def _passed(call: Call, schema: str) -> dict:
    names = [name for _, name, _ in schema_arguments(schema)]
    return dict(zip(names, call.args)) | call.kwargs


@pytest.mark.parametrize("wheel", WHEELS)
def test_a_renamed_argument_fails_its_call_site(wheel):
    """Mutation: in a copy of the wheel's contract, each keyword a call passes renamed -> that call
    site fails (npu_add_rms_norm's epsilon, npu_fusion_attention's atten_mask, FIA's, ...)."""
    calls, schemas = recorded(wheel)[0], schemas_of(wheel)
    tried = 0
    for call in calls:
        for keyword in call.kwargs:
            mutated = {ns: dict(table) for ns, table in schemas.items()}
            mutated[call.namespace][call.op] = _rename(schemas[call.namespace][call.op], keyword)
            failures = binding_failures([call], mutated)
            assert failures and keyword in failures[0], (str(call), keyword)
            tried += 1
    assert tried >= 10


@pytest.mark.parametrize("wheel", WHEELS)
def test_a_changed_type_fails_its_call_site(wheel):
    """Mutation: each argument a call passes, retyped in a copy of the wheel's contract, and given a
    value of another type in a copy of the call -> that call site fails."""
    calls, schemas = recorded(wheel)[0], schemas_of(wheel)
    ops_seen = set()
    for call in calls:
        schema = schemas[call.namespace][call.op]
        types_of = {name: t for t, name, _ in schema_arguments(schema)}
        for name, value in _passed(call, schema).items():
            if value is not None:  # None binds to any optional type
                mutated = {ns: dict(table) for ns, table in schemas.items()}
                mutated[call.namespace][call.op] = _retype(schema, name)
                assert binding_failures([call], mutated), f"{call}: {name} retyped: {mutated[call.namespace][call.op]}"
            base = re.sub(r"[?\[\]\d]", "", types_of[name])
            wrong = dataclasses.replace(call, args=tuple(call.args), kwargs=dict(call.kwargs))
            if name in call.kwargs:
                wrong.kwargs[name] = _WRONG_VALUE[base]
            else:
                i = [n for _, n, _ in schema_arguments(schema)].index(name)
                wrong.args = (*call.args[:i], _WRONG_VALUE[base], *call.args[i + 1 :])
            failures = binding_failures([wrong], schemas)
            assert failures and name in failures[0], f"{call}: {name}={_WRONG_VALUE[base]!r} bound"
        ops_seen.add(call.op)
    assert {"npu_add_rms_norm", "npu_fusion_attention", "npu_rms_norm", "adaln"} <= ops_seen


def test_the_strict_types_catch_what_torch_lets_through():
    """torch's parser takes a bool for an int (so would torch_npu's op); the strict check does not,
    and both refuse a str for an int, the mistake issue #41 names."""
    schema = CONTRACTS["torch_npu"][NEWEST]["schemas"]["npu_swiglu"]
    x = torch.ones(2, 4)
    assert torch_binds(schema, (x,), {"dim": True}) is None
    assert "'dim' is int in the schema, the call passes bool" in bind_error(schema, (x,), {"dim": True})
    assert "Expected a value of type 'int' for argument 'dim'" in bind_error(schema, (x,), {"dim": "-1"})
    assert bind_error(schema, (x,), {"dim": -1}) is None
    assert "Unknown keyword argument 'self'" in bind_error(
        CONTRACTS["torch_npu"][NEWEST]["schemas"]["npu_rms_norm"], (x,), {"self": x, "gamma": x}
    )
    with pytest.raises(AssertionError, match="no Python type for schema type 'Generator'"):
        value_matches(None, "Generator")


def test_the_registered_binder_agrees_with_torchs_check(monkeypatch):
    """Where torch lacks ``_check_schema_allow_fake_script_object``, a scratch op's dispatcher binds:
    the same verdicts on the recorded calls and on a wrong name and type."""
    schemas = schemas_of(NEWEST)
    calls = recorded(NEWEST)[0]
    direct = [torch_binds(schemas[c.namespace][c.op], c.args, c.kwargs) for c in calls]
    monkeypatch.delattr(torch._C, "_check_schema_allow_fake_script_object", raising=False)
    assert [torch_binds(schemas[c.namespace][c.op], c.args, c.kwargs) for c in calls] == direct == [None] * len(calls)
    schema = schemas["torch_npu"]["npu_add_rms_norm"]
    x = torch.ones(2, 4)
    assert "Unknown keyword argument 'eps'" in torch_binds(schema, (x, x, x), {"eps": 1e-6})
    assert "Expected a value of type 'float' for argument 'epsilon'" in torch_binds(schema, (x, x, x), {"epsilon": "1"})


@pytest.mark.parametrize("wheel", WHEELS)
def test_attention_standins_take_the_wheel_under_tests_schema(monkeypatch, wheel):
    """The FIA / npu_fusion_attention stand-ins carry the schema of the wheel they stand for: with an
    argument renamed in a copy of that wheel's contract, npu_fusion_attention refuses the provider's
    call, and FIA v2 refuses the name (the provider's probe sees the schema and takes v1 instead)."""
    schemas = CONTRACTS["torch_npu"][wheel]["schemas"]
    q = _randn(1, 32, 2, 16)
    v2 = "npu_fused_infer_attention_score_v2"
    try:
        with monkeypatch.context() as mp:
            for op, keyword in (("npu_fusion_attention", "atten_mask"), (v2, "num_query_heads")):
                mp.setitem(schemas, op, _rename(schemas[op], keyword))
            install_torch_npu(mp, version=wheel)
            for op in ("npu_fusion_attention", v2):
                registered = str(getattr(torch.ops.npu, op).default._schema)
                assert registered == str(torch._C.parse_schema(f"npu::{schemas[op]}"))
            with pytest.raises(RuntimeError, match="Unknown keyword argument 'atten_mask'"):
                npu_attention.fallback(q, q, q, is_causal=True)
            with pytest.raises(RuntimeError, match="Unknown keyword argument 'num_query_heads'"):
                torch.ops.npu.npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=2, input_layout="BSND")
            assert npu_attention.fia_op() == "npu_fused_infer_attention_score"
        install_torch_npu(monkeypatch, version=wheel)  # the wheel's own schemas again
        assert npu_attention.fallback(q, q, q, is_causal=True)[1] == "npu_fusion_attention"
        assert npu_attention.fia_op() == v2
    finally:
        npu_attention_ops()
        probe.cache_clear()


@pytest.mark.parametrize("wheel", WHEELS)
def test_binding_catches_a_wrong_keyword(wheel):
    """What an op-plugin page documents but the wheel names otherwise fails."""
    schemas = CONTRACTS["torch_npu"][wheel]["schemas"]
    x = torch.ones(2, 4)
    assert [name for _, name, _ in schema_arguments(schemas["npu_rms_norm"])] == ["input", "gamma", "epsilon"]
    assert "Unknown keyword argument 'self'" in bind_error(schemas["npu_rms_norm"], (x,), {"self": x, "gamma": x})
    assert bind_error(schemas["npu_gelu"], (x, "tanh"), {})  # approximate is keyword-only


def _meta(op: str, wheel: str):
    """The wheel's meta function of ``op`` (``_meta_registrations.py``, stored as source text)."""
    import math

    namespace: dict = {"torch": torch, "math": math}
    exec(CONTRACTS["torch_npu"][wheel]["meta"][op], namespace)  # noqa: S102  (the wheel's own meta source)
    return next(v for k, v in namespace.items() if k.endswith("_meta"))


@pytest.mark.parametrize("wheel", WHEELS)
def test_standin_outputs_have_the_wheel_meta_shapes(monkeypatch, wheel):
    """Each stand-in op returns what the wheel's meta function says (shapes and dtypes: e.g.
    npu_rms_norm's rstd fp32 ``[..., 1]``, npu_swiglu halving ``dim``), for the calls we make."""
    fake = install_torch_npu(monkeypatch, version=wheel)
    x = _randn(2, 13, 64)
    cases = {
        "npu_rms_norm": ((x, _randn(64)), {"epsilon": 1e-6}),
        "npu_rotary_mul": (
            (_randn(1, 13, 2, 16), _randn(1, 13, 1, 16), _randn(1, 13, 1, 16)),
            {"rotary_mode": "interleave"},
        ),
        "npu_gelu": ((x,), {"approximate": "tanh"}),
        "npu_fast_gelu": ((x,), {}),
        "npu_swiglu": ((x,), {"dim": -1}),
    }
    for op, (args, kwargs) in cases.items():
        out = getattr(fake, op)(*args, **kwargs)
        meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        rename = {"rotary_mode": "mode"}  # the meta function's own parameter names
        want = _meta(op, wheel)(*meta_args, **{rename.get(k, k): v for k, v in kwargs.items()})
        outs, wants = (out, want) if isinstance(out, tuple) else ((out,), (want,))
        assert [(tuple(o.shape), o.dtype) for o in outs] == [(tuple(w.shape), w.dtype) for w in wants], op


# -- torch.npu / torch_npu.npu calls outside the providers: bound from their call sites -------------
def _call_sites():
    """``torch.npu.<fn>(...)`` / ``npu.<fn>(...)`` / ``torch_npu.npu.<fn>(...)`` calls in the package:
    (file:line, fn, positional count, keyword names); ``getattr(torch, device).<fn>`` included."""
    sites = []
    for path in sorted(list((ROOT / "ascend_kernels").rglob("*.py")) + list((ROOT / "diffusers_ascend").rglob("*.py"))):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = ast.unparse(node.func.value)
            if owner in ("torch.npu", "npu", "_torch_npu().npu", "torch_npu.npu") or owner.startswith(
                "getattr(torch, "
            ):
                if owner == "npu" and node.func.attr not in CONTRACTS["torch_npu"][WHEELS[0]]["python_api"]:
                    continue  # a local named npu that is not torch.npu (e.g. the torch_npu module itself)
                if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                    continue
                sites.append(
                    (
                        f"{path.relative_to(ROOT)}:{node.lineno}",
                        node.func.attr,
                        len(node.args),
                        [k.arg for k in node.keywords],
                    )
                )
    return sites


def test_the_scan_finds_the_known_call_sites():
    found = {(site.split(":")[0], fn) for site, fn, _, _ in _call_sites()}
    assert ("diffusers_ascend/platform.py", "graph") in found and (
        "ascend_kernels/npu/probe.py",
        "get_soc_version",
    ) in found
    assert ("diffusers_ascend/platform.py", "is_available") in found


@pytest.mark.parametrize("wheel", WHEELS)
def test_every_torch_npu_api_call_site_binds(wheel):
    api = CONTRACTS["torch_npu"][wheel]["python_api"]
    bad, unknown = [], []
    for site, fn, n_pos, keywords in _call_sites():
        if fn not in api:
            unknown.append(f"{site}: {fn}")  # getattr(torch, device).<fn> for CUDA too, or not in the contract
            continue
        assert api[fn] is not None, f"torch_npu {wheel} has no torch_npu.npu.{fn} ({site})"
        try:
            api_signature(fn, wheel).bind(*range(n_pos), **{k: None for k in keywords})
        except TypeError as e:
            bad.append(f"{site}: {fn}: {e}")
    assert bad == []
    # every torch.npu-style name the package calls is in the contract (tools/npu_wheels.py TORCH_NPU_API)
    assert unknown == []


# -- item 5: the docs' SoC lists, torch_npu's library search ---------------------------------------
@pytest.mark.parametrize("wheel", WHEELS)
def test_probe_names_soc_families_as_the_wheel_does(wheel):
    """Every SocVersion of the wheel's enum gets the family the wheel's own SoC detection gives it
    (A2 = Ascend910B1.., A3 = Ascend910_93..; "Ascend910B" = 104 is the older Atlas training part)."""
    from .npu_standins import soc_family

    for name, value in CONTRACTS["torch_npu"][wheel]["soc_versions"].items():
        if value >= 0:
            assert probe.soc_family(value) == soc_family(value, wheel), name
    assert probe.soc_family(104) == "910" and probe.is_a2(221) and not probe.is_a2(250) and probe.is_a2_a3(250)


@pytest.mark.parametrize(
    "soc, rope, swiglu", [(221, True, True), (250, True, False), (260, False, False), (240, False, False)]
)
def test_rope_and_swiglu_gated_to_the_socs_their_docs_list(monkeypatch, soc, rope, swiglu):
    """npu_rotary_mul's aclnn path: A2/A3 (its doc); npu_swiglu: A2 only. Not "SoC >= 220": an A5
    (Ascend950) or a 310B part goes native, with the reason in the provider's description."""
    from ascend_kernels.npu import kernels
    from ascend_kernels.registry import select_provider

    install_torch_npu(monkeypatch, soc=soc)
    cos, sin = torch.randn(13, 16), torch.randn(13, 16)
    x = _randn(1, 13, 2, 16)
    assert (select_provider("rope", x, cos[None, :, None], sin[None, :, None], "interleaved").name == "npu") is rope
    assert (select_provider("swiglu", _randn(2, 13, 64), None, -1).name == "npu") is swiglu
    assert kernels.swiglu_kernel() is swiglu
    ops.rope(x, cos[None, :, None], sin[None, :, None], "half")  # the stand-in raises off its doc's SoCs
    ops.swiglu(_randn(2, 13, 64), None, -1)


@pytest.mark.parametrize("wheel", WHEELS)
def test_aclnn_probe_searches_the_libraries_torch_npu_searches(monkeypatch, tmp_path, wheel):
    """libtorch_npu.so looks aclnn symbols up in libcust_opapi.so (ASCEND_CUSTOM_OPP_PATH/op_api/lib
    first), libopapi.so and the libaclnn_*.so feature libraries; the probe must find a kernel in any."""
    import types

    wanted = CONTRACTS["torch_npu"][wheel]["aclnn_libraries"]
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(tmp_path / "vendor"))
    monkeypatch.delenv("ASCEND_OPP_PATH", raising=False)
    searched = probe._op_api_libraries()
    assert {Path(n).name for n in searched} >= set(wanted)
    assert searched[0] == str(tmp_path / "vendor" / "op_api" / "lib" / "libcust_opapi.so")
    for lib in wanted:
        has = types.SimpleNamespace(aclnnFoo=1, aclnnFooGetWorkspaceSize=1)
        monkeypatch.setattr(probe, "_open", lambda name, lib=lib, has=has: has if Path(name).name == lib else None)
        probe.aclnn_available.cache_clear()
        assert probe.aclnn_available("aclnnFoo"), lib
    probe.cache_clear()


# -- MindIE SD 3.1.0 under torch 2.14 ---------------------------------------------------------------
@pytest.fixture
def mindiesd_310(tmp_path, monkeypatch):
    """A stand-in ``mindiesd`` 3.1.0 distribution: its ``_torch_variants.py`` (the variants the wheel
    ships, from npu_contracts.json) and an ``__init__`` that raises as 3.1.0's does on an NPU host with
    a torch outside them (and, like it, touches ASCEND_CUSTOM_OPP_PATH first)."""
    from ascend_kernels import npu, registry

    pkg = tmp_path / "mindiesd"
    pkg.mkdir()
    (pkg / "_torch_variants.py").write_text(
        f"SUPPORTED_TORCH_PLUGIN_VARIANTS = {MINDIESD['torch_plugin_variants']!r}\n"
    )
    message = MINDIESD["unsupported_torch_error"].split(": ", 1)[1]
    (pkg / "__init__.py").write_text(
        "import os, torch\n"
        "os.environ['ASCEND_CUSTOM_OPP_PATH'] = 'mindiesd-vendors:' + os.environ.get('ASCEND_CUSTOM_OPP_PATH', '')\n"
        f"raise RuntimeError(f{message!r})\n"
    )
    dist = tmp_path / "mindiesd-3.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mindiesd\nVersion: 3.1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    caches = (npu._import_error, registry._imports, npu.mindiesd_torch_unsupported)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


@pytest.mark.parametrize("torch_version, supported", [("2.14.0", False), ("2.13.0+cpu", True)])
def test_mindiesd_310_on_torch_214_is_a_reason_and_a_fallback(
    monkeypatch, mindiesd_310, capsys, torch_version, supported
):
    """torch 2.14 (pinned): the reason names the torch releases MindIE SD 3.1.0 ships plugins for, the
    import (which raises and edits ASCEND_CUSTOM_OPP_PATH) never runs, adaln_modulate goes native."""
    import json
    import os

    from ascend_kernels.npu import mindiesd_unavailable_reason
    from diffusers_ascend.cli import main
    from diffusers_ascend.platform import override_platform

    install_torch_npu(monkeypatch)
    monkeypatch.setattr(torch, "__version__", torch_version)
    monkeypatch.delenv("ASCEND_CUSTOM_OPP_PATH", raising=False)
    why = mindiesd_unavailable_reason()
    if supported:  # a torch it ships: its import decides (here: it raises, reported as such)
        assert why.startswith("mindiesd 3.1.0 is installed but raised at import (RuntimeError: Unsupported torch")
        return
    assert why == (
        "mindiesd 3.1.0 has op plugins for torch 2.7, 2.9, 2.10, 2.11, 2.12, 2.13 only and this is torch "
        "2.14.0 (its import raises RuntimeError('Unsupported torch version')); install a torch it supports "
        "or a MindIE SD release built for this torch"
    )
    assert "mindiesd" not in sys.modules and "ASCEND_CUSTOM_OPP_PATH" not in os.environ
    with override_platform("cpu"):  # the stand-in's providers take CPU tensors; a CUDA host picks others
        assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["mindiesd"] == f"unavailable, because {why}"
    assert info["providers"]["adaln_modulate"] == "native" and why in info["provider_reasons"]["adaln_modulate"]
    # bench e2e's "mindiesd" variant (MindIE SD's compile backend) is skipped with the same reason
    from diffusers_ascend.benchmarks.bench_e2e import VARIANT_SPECS

    assert VARIANT_SPECS["mindiesd"][1]("npu") == why


@pytest.mark.npu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_fp32_gamma_settled_on_the_device(dtype):
    """On a 910B (``-m npu``): the probe's answer, and the provider's result within tolerance of native
    with an fp32 weight either way (uncast where the device took it, cast where it did not)."""
    from ascend_kernels.ops.rms_norm import rms_norm_native
    from ascend_kernels.testing import assert_close

    probe.cache_clear()
    takes = probe.rms_norm_fp32_gamma(dtype)
    print(f"npu_rms_norm takes an fp32 gamma with {dtype} input on {probe.soc_name()}: {takes}")
    x = torch.randn(4, 256, 3072, generator=torch.Generator().manual_seed(0)).to(dtype).to("npu")
    w = torch.rand(3072, generator=torch.Generator().manual_seed(1)).to("npu")
    assert_close(
        ops.rms_norm(x, w, 1e-6, None), rms_norm_native(x, w, 1e-6), msg=f"npu rms_norm, fp32 gamma taken: {takes}"
    )
