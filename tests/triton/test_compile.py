"""Every kernel launch, planned for the model sizes (meta tensors: no memory, no GPU), compiles to a
cubin for NVIDIA sm_90 (H100) and sm_80 (A100) with Triton's own toolchain (ptxas ships in the
triton wheel). The interpreter accepts code the compiler rejects (types, layouts, constexpr
branches); this catches that. It checks neither numerics (the interpreter tests do) nor speed.
Skipped without triton and under TRITON_INTERPRET=1 (the kernels are interpreter functions then)."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from .cases import CASES, ROW_REDUCTION_CASES, arg_type, ascend_tiling, model_plans, rows_in_chunks

# The plans are built at collection (they import the kernel modules, hence triton): skip the module.
pytest.importorskip("triton", reason="needs triton")
pytestmark = [
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="kernels are interpreted under TRITON_INTERPRET=1"
    ),
]


def _compile(launch, arch: int, specialize: bool = False):
    """``triton.compile`` of the planned launch; ``specialize``: as the JIT specializes a real launch
    (integers equal to 1 become constants; pointers (allocations are 16-byte aligned) and integers
    divisible by 16 carry that divisibility)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = launch.kernel.arg_names
    sig, const, attrs = {}, {}, {}
    for i, (name, value) in enumerate(zip(names, launch.args)):
        sig[name] = arg_type(value)
        if not specialize or isinstance(value, float):
            continue
        if not isinstance(value, torch.Tensor) and value == 1:
            sig[name], const[(i,)] = "constexpr", 1
        elif isinstance(value, torch.Tensor) or value % 16 == 0:
            attrs[(i,)] = [["tt.divisibility", 16]]
    for name, value in launch.constexprs.items():
        sig[name] = "constexpr"
        const[(names.index(name),)] = value
    assert set(sig) == set(names), "a kernel argument was not planned"
    target = GPUTarget("cuda", arch, 32)
    options = {"num_warps": launch.num_warps, "enable_fp_fusion": True}
    if "constexprs" in inspect.signature(ASTSource.__init__).parameters:  # triton >= 3.3
        return triton.compile(
            ASTSource(fn=launch.kernel, signature=sig, constexprs=const, attrs=attrs), target=target, options=options
        )
    return triton.compile(_ast_source_3_2(launch, specialize, target), target=target, options=options)


def _ast_source_3_2(launch, specialize: bool, target):
    """Triton 3.2's (torch 2.6's) form, as its JIT builds it: constexprs (and integers equal to 1)
    in ``constants`` by name, out of the signature; divisibility in an ``AttrsDescriptor``."""
    from triton.backends.compiler import AttrsDescriptor
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    params, values = (
        launch.kernel.params,
        [*launch.args, *(launch.constexprs[p.name] for p in launch.kernel.params if p.is_constexpr)],
    )
    attrs = make_backend(target).get_attrs_descriptor(params, values) if specialize else AttrsDescriptor()
    equal_to_1 = attrs.get_constants()
    constants = {p.name: v for p, v in zip(params, values) if p.is_constexpr or p.num in equal_to_1}
    sig = {p.name: arg_type(v) for p, v in zip(params, values) if p.name not in constants}
    return ASTSource(launch.kernel, sig, constants, attrs)


@pytest.mark.parametrize("arch", [90, 80], ids=lambda a: f"sm_{a}")
@pytest.mark.parametrize("case", list(model_plans()))
def test_launch_compiles_for_cuda(case, arch):
    out, launch = model_plans()[case]()
    assert out.device.type == "meta" and launch.grid[0] <= 65535
    compiled = _compile(launch, arch)
    assert compiled.asm["cubin"], case
    assert compiled.metadata.num_warps == launch.num_warps


@pytest.mark.parametrize(
    "op,case,layout",
    [
        (op, case, layout)
        for op in ("rms_norm", "rope", "adaln_modulate", "mul_add")
        for case in CASES[op]
        for layout in (("interleaved", "half") if op == "rope" else (None,))
    ],
)
def test_ascend_tiles_of_every_case_compile_for_cuda(op, case, layout):
    """The odd shapes of the interpreter cases, as Ascend plans them (token and batch tiles), compile
    for sm_90 too: the ``cuda`` tests run those plans on a GPU (the H100 has run the row tiles)."""
    from ascend_kernels.triton import planner

    args = CASES[op][case](torch.bfloat16, "cpu") + ((layout,) if layout else ())
    with ascend_tiling("cpu"):
        _, launch = planner(op)(*args)
    assert _compile(launch, 90).asm["cubin"], case


@pytest.mark.parametrize("op,case", ROW_REDUCTION_CASES)
def test_row_chunks_of_every_case_compile_for_cuda(op, case, monkeypatch):
    """rms_norm's and adaLN's chunked reductions (Ascend's plan for rows wider than one tile; every
    case takes it with a limit of half its row) compile for sm_90, for the ``cuda`` tests to run."""
    from ascend_kernels.triton import planner

    args = CASES[op][case](torch.bfloat16, "cpu")
    rows_in_chunks(monkeypatch, args)
    _, launch = planner(op)(*args)
    assert launch.kernel.__name__.endswith("_chunks_kernel")
    assert _compile(launch, 90).asm["cubin"], case


# CUDA's plans only: token and batch tiles and row chunks are Ascend's (`_common.ascend_tiling`);
# compiled for sm_90 the rope token tiles' (4, 128) table tiles, over 256 threads, load 64 or 32
# bits per thread.
@pytest.mark.parametrize(
    "case",
    [c for c in model_plans() if ("flux" in c or "wan" in c) and not c.endswith(("_tokens", "_batches", "_chunks"))],
)
def test_model_size_accesses_are_128_bit(case):
    """At the model sizes every global load and store is a 128-bit vector access (``v4.b32``): the
    in-register pair split of the interleaved rope and the broadcast reads keep rows contiguous.
    A static property of the generated code, not a bandwidth measurement."""
    import re

    _, launch = model_plans()[case]()
    ptx = _compile(launch, 90, specialize=True).asm["ptx"]
    accesses = re.findall(r"\b(?:ld|st)\.global(?:\.\w+)*", ptx)
    assert accesses and all(".v4." in a for a in accesses), sorted(set(accesses))


# Not the row chunks: an Ascend plan only (CUDA keeps whole rows), where num_warps means nothing;
# compiled for sm_90 by Triton 3.6, the adaLN chunk loop spills 4 bytes at 4 warps (none at 2 or 8
# warps, nor at 4 with Triton 3.2, 3.4, 3.8 or 3.9).
@pytest.mark.parametrize(
    "case", [c for c in model_plans() if ("flux" in c or "wan" in c) and not c.endswith("_chunks")]
)
def test_model_size_kernels_do_not_spill(case, tmp_path):
    """ptxas (the one triton uses for sm_90) reports no register spills at the model sizes: the
    tiles and warps of `_common` fit the register file. Static, not a speed measurement."""
    import re
    import subprocess

    try:
        from triton.backends.nvidia import compiler

        if not hasattr(compiler, "get_ptxas"):  # 3.2 (torch 2.6's)
            ptxas = compiler._path_to_binary("ptxas")[0]
        else:
            try:
                ptxas = compiler.get_ptxas(90).path  # 3.5+: per architecture
            except TypeError:
                ptxas = compiler.get_ptxas().path  # 3.4 (torch 2.8's)
    except Exception as e:  # the helper moved again
        pytest.skip(f"no ptxas path from this triton ({type(e).__name__}: {e})")
    _, launch = model_plans()[case]()
    ptx = tmp_path / f"{case}.ptx"
    ptx.write_text(_compile(launch, 90, specialize=True).asm["ptx"])
    res = subprocess.run(
        [ptxas, "-arch=sm_90a", "-v", str(ptx), "-o", str(tmp_path / "out.cubin")],
        capture_output=True,
        text=True,
        check=True,
    )
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", res.stderr)]
    assert spills and not any(spills), res.stderr
