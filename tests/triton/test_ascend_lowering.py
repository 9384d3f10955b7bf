"""Every kernel launch, planned at the model sizes and at the interpreter tests' odd shapes, lowered
the way triton-ascend lowers it for an Ascend 910B (A2/A3): Triton's frontend and the Ascend
backend's TTIR passes, then triton-ascend's ``triton-adapter-opt`` (TTIR to annotated HIVM / HFusion
/ linalg), the input of CANN's ``bishengir-compile``. Neither an NPU nor CANN is needed, and neither
is used: the last step, the NPU binary, is not built. What this checks is that the installed
triton-ascend accepts the kernels' Triton (``tl.split`` / ``tl.join`` / ``tl.reshape``, the
persistent loop with a dynamic step, masked loads through per-row strides), lowers every Triton op,
and reads the output as the only tensor the kernel writes. The adapter is permissive (it passes CUDA
inline assembly through, for one), so ``bishengir-compile`` may still reject what it accepts. Not
numerics, not speed.

Runs in the ``triton-ascend`` nox session, where triton-ascend is installed (it installs as the
``triton`` module); skipped wherever it is not.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import torch

from ascend_kernels.triton import triton_ascend_available

from .cases import CASES, arg_type, ascend_tiling, model_plans

# The plans are built at collection (they import the kernel modules, hence triton): skip the module.
pytest.importorskip("triton", reason="needs triton-ascend (nox -s triton-ascend)")
pytestmark = pytest.mark.skipif(not triton_ascend_available(), reason="needs triton-ascend (nox -s triton-ascend)")

# 910B: the Atlas A2 training series (Ascend910B1-B4), whose vector cores run these kernels.
ARCH = "Ascend910B3"


def lower(launch) -> str:
    """The linalg that triton-adapter-opt makes of ``launch`` for `ARCH` (triton-ascend 3.2's API)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    names = launch.kernel.arg_names
    signature, constants = {}, dict(launch.constexprs)
    for name, value in zip(names, launch.args):
        signature[name] = arg_type(value)
    signature.update({name: "constexpr" for name in constants})
    assert set(signature) == set(names), "a kernel argument was not planned"

    target = GPUTarget("npu", ARCH, 0)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": launch.num_warps, **launch.options})  # as a launch passes them
    stages: dict = {}
    backend.add_stages(stages, options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(fn=launch.kernel, signature=signature, constants=constants)

    def run() -> str:
        metadata = {"target": target, **options.__dict__}
        module = source.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
        return stages["ttadapter"](stages["ttir"](module, metadata), metadata)

    try:
        return run()
    except subprocess.CalledProcessError as e:
        # triton-ascend 3.2.0's triton-adapter-opt once died by SIGSEGV on a kernel it lowers on the
        # next try (CI, fresh environment): a crash of that binary by a signal gets one more try; an
        # error exit (a kernel it refuses) never does, and a second crash fails the test.
        if e.returncode >= 0:
            raise
        return run()


@pytest.mark.parametrize("case", list(model_plans()))
def test_lowers_for_ascend_910b(case):
    _, launch = model_plans()[case]()
    linalg = lower(launch)
    assert f"func.func @{launch.kernel.__name__}(" in linalg
    # Every Triton op lowered (tt.tensor_kind is an argument attribute, not an op).
    assert sorted(set(re.findall(r"\btt\.[a-z_]+", linalg)) - {"tt.tensor_kind"}) == []
    # The adapter's reading of each pointer argument: 0 read, 1 written. Only the output is written
    # (unused optional pointers, e.g. adaLN's absent weight, get no mark).
    assert re.findall(r"tt\.tensor_kind = (\d)", linalg).count("1") == 1


@pytest.mark.parametrize("case", list(model_plans()))
def test_flat_rows_move_as_blocks(case):
    """Where every operand's rows are evenly spaced (`_common.row_strides`), the adapter sees affine
    addresses and moves each tile as one block; an operand addressed through computed row indices
    (rope's tables, broadcast over the heads; a per-batch modulation row) is split into one DMA per
    row, which the adapter marks ``DiscreteMemAccess``. Both halves are asserted, so the flag is
    shown to be what decides it."""
    _, launch = model_plans()[case]()
    flags = {k: v for k, v in launch.constexprs.items() if k.endswith("_FLAT")}
    discrete = lower(launch).count("DiscreteMemAccess")
    if all(flags.values()):
        assert discrete == 0, flags
    else:
        assert discrete > 0, flags


# The interpreter cases whose Ascend plan still moves an operand one DMA per row: an operand shared
# by the batch whose rows vary within it (its rows wrap every batch), so neither a batch nor a
# token split makes every address affine. No diffusers model calls these forms; the row kernels
# compute them correctly, one DMA per row.
DISCRETE_ON_ASCEND = {("adaln_modulate", "mod_shared_by_batch"), ("mul_add", "shared_by_batch_per_token")}


@pytest.mark.parametrize(
    "op,case,layout",
    [
        (op, case, layout)
        for op in CASES
        for case in CASES[op]
        for layout in (("interleaved", "half") if op == "rope" else (None,))
    ],
)
def test_ascend_plans_of_the_odd_shapes(op, case, layout):
    """Every odd shape of the interpreter tests (slices, gaps, broadcasts, batch 3, one token), as
    Ascend plans it: no DMA per row, except `DISCRETE_ON_ASCEND`, where the row kernel's flag says
    which operand is not flat."""
    from ascend_kernels.triton import planner

    args = CASES[op][case](torch.bfloat16, "cpu") + ((layout,) if layout else ())
    with ascend_tiling("cpu"):
        _, launch = planner(op)(*args)
    discrete = lower(launch).count("DiscreteMemAccess")
    if (op, case) in DISCRETE_ON_ASCEND:
        assert discrete > 0 and not all(v for k, v in launch.constexprs.items() if k.endswith("_FLAT")), launch.kernel
    else:
        assert discrete == 0, (launch.kernel.__name__, launch.constexprs)
