"""The fusion table (diffusers_ascend/fusions.py) agrees with the op files, the pass files, the
Triton kernel files and every name that lists fusions."""

from __future__ import annotations

import ast
import pathlib
import pkgutil

import torch

import ascend_kernels
from ascend_kernels import triton as triton_kernels
from diffusers_ascend import config, fusions
from diffusers_ascend.compilation import passes
from diffusers_ascend.compilation.passes.base import FusionPass

# Modules of compilation/passes that are machinery, not one fusion's pass.
PASS_MACHINERY = {"base", "manager", "normalize", "verdict", "pretraced"}  # verdict, pretraced: the caches


def test_every_row_op_is_registered_and_every_op_has_a_row():
    ops = {row.op for row in fusions.TABLE.values()}
    assert ops == set(ascend_kernels.OPS)
    for op in ops:
        assert hasattr(torch.ops.ascend_kernels, op)


def test_ops_are_the_op_files_registrations():
    # every op is defined by the native provider of a module of ascend_kernels/ops, and each such
    # module defines at least one
    modules = {m.name for m in pkgutil.iter_modules(ascend_kernels.ops.__path__) if not m.name.startswith("_")}
    defined_in = {op: ascend_kernels.registry._REGISTRY[op]["native"].impl.__module__ for op in ascend_kernels.OPS}
    assert {m.rpartition(".")[2] for m in defined_in.values()} == modules
    assert all(m.startswith("ascend_kernels.ops.") for m in defined_in.values())


def test_every_row_has_its_pass_and_every_pass_file_a_row():
    files = {p.stem for p in pathlib.Path(passes.__file__).parent.glob("*.py")} - PASS_MACHINERY - {"__init__"}
    assert {row.pass_class.split(":")[0] for row in fusions.TABLE.values()} == files
    for name in fusions.FUSIONS:
        cls = passes.get_pass_class(name)
        assert issubclass(cls, FusionPass) and cls.fusion == name


def test_every_consumer_reads_the_table_order():
    assert config.FUSIONS is fusions.FUSIONS and config.FUSION_TO_OP is fusions.FUSION_TO_OP
    assert config.FUSIONS == (
        "rms_norm",
        "rope",
        "gelu_tanh",
        "fast_gelu",
        "adaln",
        "mul_add",
        "swiglu",
        "add_rms_norm",
        "int8_dynamic_linear",
        "int8_weight_only_linear",
    )  # public
    assert passes.PASS_ORDER is fusions.PASS_ORDER and tuple(passes.FUSION_PASSES) == fusions.PASS_ORDER
    # every fusion runs exactly once: a row missing from PASS_ORDER (or listed twice) fails here
    assert sorted(fusions.PASS_ORDER) == sorted(fusions.FUSIONS), (fusions.PASS_ORDER, fusions.FUSIONS)
    order = fusions.PASS_ORDER
    assert order[-1] == "mul_add"  # the greedy residual gate last
    assert order.index("swiglu") < order.index("mul_add")
    assert order.index("fast_gelu") < order.index("gelu_tanh")
    assert order.index("add_rms_norm") < order.index("rms_norm")  # it matches the norm before it is one op
    kept = fusions.default_fusions()
    assert (
        config.AscendConfig(fusions=list(reversed(kept))).fusions
        == kept
        == tuple(f for f in fusions.FUSIONS if f in kept)
    )
    assert config.AscendConfig(fusions="all").resolved_fusions("cpu") == fusions.default_fusions()
    assert "fast_gelu" not in fusions.default_fusions()
    assert "add_rms_norm" not in fusions.default_fusions()  # opt-in: it takes mul_add's add


def test_triton_kernels_come_from_their_files():
    # KERNELS names every kernel file once, and each file exports the launcher and planner it names
    # (read from the source: importing a kernel module imports triton).
    folder = pathlib.Path(triton_kernels.__file__).parent
    kernel_files = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")} - {"limits", "measurements"}
    assert {module for module, _, _ in triton_kernels.KERNELS.values()} == kernel_files
    for op, (module, launcher, supports) in triton_kernels.KERNELS.items():
        tree = ast.parse((folder / f"{module}.py").read_text())
        exported = next(
            ast.literal_eval(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
        )
        assert {launcher, f"plan_{launcher}"} <= set(exported), (op, module, exported)
        assert supports is getattr(triton_kernels.limits, f"{op}_supports")
    assert set(triton_kernels.KERNELS) <= set(ascend_kernels.OPS)
    assert fusions.triton_fusions() == tuple(
        f for f in fusions.FUSIONS if fusions.FUSION_TO_OP[f] in triton_kernels.KERNELS
    )
