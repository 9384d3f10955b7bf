"""The compiled Triton kernels on a real CUDA GPU (``pytest -m cuda tests/triton``; skipped without
one and under TRITON_INTERPRET=1): every case of `cases` plus model sizes against the native op on
the same GPU, inside ``torch.compile`` (Inductor checks the output strides of custom ops) and
under CUDA-graph capture. The provider is chosen explicitly: on CUDA it is otherwise used only for
ops recorded faster than Inductor (`ascend_kernels.triton.measurements`)."""

from __future__ import annotations

import pytest
import torch

import ascend_kernels  # noqa: F401
from ascend_kernels.registry import use_providers
from ascend_kernels.testing import assert_close

from .cases import CASES, ROW_REDUCTION_CASES, ascend_tiling, check_forced, rows_in_chunks
from .conftest import randn

pytestmark = pytest.mark.cuda

ops = torch.ops.ascend_kernels
ALL_TRITON = dict(rms_norm="triton", rope="triton", adaln_modulate="triton", mul_add="triton")


@pytest.mark.parametrize("op,case", [(op, c) for op in CASES for c in CASES[op]])
def test_cases(op, case, dtype):
    args = CASES[op][case](dtype, "cuda")
    layouts = ("interleaved", "half") if op == "rope" else (None,)
    for layout in layouts:
        check_forced(op, args + ((layout,) if layout else ()), f"{op} {case} {layout or ''}")


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("case", list(CASES["rope"]))
def test_rope_token_tiles_compiled(case, layout, dtype):
    """Ascend's rope tiling (token tiles), compiled and run by the GPU's Triton: the interpreter
    tests check its semantics, this checks the compiled code (CUDA itself plans row tiles)."""
    with ascend_tiling("cuda"):
        check_forced("rope", CASES["rope"][case](dtype, "cuda") + (layout,), f"rope {case} {layout} (token tiles)")


@pytest.mark.parametrize("batch", [1, 2])  # 2: two images a prompt, one table for the batch
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_token_tiles_at_flux_size(layout, batch):
    q = randn(batch, 4608, 24, 128, dtype=torch.bfloat16, device="cuda")
    cos, sin = randn(1, 4608, 1, 128, device="cuda", seed=1), randn(1, 4608, 1, 128, device="cuda", seed=2)
    with ascend_tiling("cuda"):
        check_forced("rope", (q, cos, sin, layout), f"flux-size rope {layout} (token tiles)")


@pytest.mark.parametrize("case", list(CASES["rms_norm"]))
def test_rms_norm_token_tiles_compiled(case, dtype):
    """Ascend's rms_norm tiling (token tiles where x's rows are not evenly spaced), compiled and run
    by the GPU's Triton (CUDA itself plans row tiles)."""
    with ascend_tiling("cuda"):
        check_forced("rms_norm", CASES["rms_norm"][case](dtype, "cuda"), f"rms_norm {case} (token tiles)")


@pytest.mark.parametrize("tiles", ["row_tiles", "token_tiles"])
def test_rms_norm_of_fused_qkv_at_flux_size(tiles):
    """Flux's q norm after ``fuse_qkv_projections``: a chunk of to_qkv's output, batch 2."""
    from ascend_kernels.triton.rms_norm import plan_rms_norm

    bf = torch.bfloat16
    q = randn(2, 4096, 3 * 3072, dtype=bf, device="cuda").chunk(3, dim=-1)[0].unflatten(-1, (24, 128))
    args = (q, randn(128, dtype=bf, device="cuda", seed=1), 1e-6, None)
    with ascend_tiling(*(("cuda",) if tiles == "token_tiles" else ())):
        kernel = plan_rms_norm(*args)[1].kernel.__name__
        assert kernel == ("_rms_norm_tokens_kernel" if tiles == "token_tiles" else "_rms_norm_kernel")
        check_forced("rms_norm", args, f"flux-size fused-QKV q norm ({tiles})")


@pytest.mark.parametrize("case", list(CASES["adaln_modulate"]))
def test_adaln_batch_tiles_compiled(case, dtype):
    """Ascend's adaLN tiling (batch tiles where the modulation is per batch), compiled and run by
    the GPU's Triton (CUDA itself plans row tiles)."""
    with ascend_tiling("cuda"):
        check_forced("adaln_modulate", CASES["adaln_modulate"][case](dtype, "cuda"), f"adaln {case} (batch tiles)")


@pytest.mark.parametrize("op,case", ROW_REDUCTION_CASES)
def test_row_chunks_compiled(op, case, dtype, monkeypatch):
    """Ascend's chunked reductions of wide rows, compiled and run by the GPU's Triton, every case in
    chunks (a limit of half its row; Ascend's is 4096, and CUDA keeps whole rows)."""
    args = CASES[op][case](dtype, "cuda")
    rows_in_chunks(monkeypatch, args)
    check_forced(op, args, f"{op} {case} (row chunks)")


def test_row_chunks_at_wan_width():
    """Wan 14B's 5120-wide rows as Ascend plans them (1024-wide chunks): adaLN with its fp32
    modulation, and the q/k norm over all channels."""
    from ascend_kernels.triton import planner

    bf = torch.bfloat16
    h = randn(1, 75600 // 16, 5120, dtype=bf, device="cuda")
    cases = {
        "adaln_modulate": (
            h,
            randn(1, 1, 5120, device="cuda", seed=1),
            randn(1, 1, 5120, device="cuda", seed=2),
            1e-6,
            None,
            None,
            bf,
        ),
        "rms_norm": (h, randn(5120, dtype=bf, device="cuda", seed=3), 1e-6, None),
    }
    with ascend_tiling("cuda"):
        for op, args in cases.items():
            assert planner(op)(*args)[1].kernel.__name__.endswith("_chunks_kernel"), op
            check_forced(op, args, f"wan-width {op} (row chunks)")


@pytest.mark.parametrize("case", list(CASES["mul_add"]))
def test_mul_add_batch_tiles_compiled(case, dtype):
    """Ascend's mul_add tiling (batch tiles where an operand is per batch), compiled and run by the
    GPU's Triton (CUDA itself plans row tiles)."""
    with ascend_tiling("cuda"):
        check_forced("mul_add", CASES["mul_add"][case](dtype, "cuda"), f"mul_add {case} (batch tiles)")


def test_adaln_batch_tiles_at_sd3_size():
    bf = torch.bfloat16
    h, mod = randn(2, 4096, 1536, dtype=bf, device="cuda"), randn(2, 6 * 1536, dtype=bf, device="cuda", seed=1)
    from ascend_kernels.triton.adaln import plan_adaln_modulate

    args = (h, mod[:, :1536], mod[:, 1536:3072], 1e-6)
    with ascend_tiling("cuda"):
        assert plan_adaln_modulate(*args)[1].kernel.__name__ == "_adaln_batches_kernel"
        check_forced("adaln_modulate", args, "sd3-size adaln (batch tiles)")
        check_forced("mul_add", (mod[:, None, 3072:4608], h, h), "sd3-size gate (batch tiles)")


def test_model_sizes_bf16():
    bf = torch.bfloat16
    q = randn(1, 4608, 24, 128, dtype=bf, device="cuda")
    cos, sin = randn(1, 4608, 1, 128, device="cuda", seed=1), randn(1, 4608, 1, 128, device="cuda", seed=2)
    check_forced("rms_norm", (q, randn(128, dtype=bf, device="cuda"), 1e-6, None), "flux q norm")
    check_forced("rope", (q, cos, sin, "interleaved"), "flux rope")
    h = randn(1, 4096, 3072, dtype=bf, device="cuda")
    mod = randn(1, 3072, dtype=bf, device="cuda", seed=3)
    check_forced("adaln_modulate", (h, mod, mod, 1e-6), "flux adaln")
    check_forced("mul_add", (mod[:, None], h, h), "flux gate")
    w = randn(1, 75600 // 16, 5120, dtype=bf, device="cuda")  # a slab of Wan 14B's 75600 tokens
    g = randn(1, 1, 5120, device="cuda", seed=4)
    check_forced("adaln_modulate", (w, g, g, 1e-6, None, None, torch.float32), "wan adaln fp32 out")
    check_forced("mul_add", (w, g, w.float()), "wan gate (fp32 out)")


def test_under_torch_compile_and_cuda_graphs():
    def f(x, w, cos, sin, scale, shift, gate):
        q = ops.rope(ops.rms_norm(x, w, 1e-6), cos, sin, "interleaved")
        h = ops.adaln_modulate(q.flatten(2), scale, shift, 1e-6)
        return ops.mul_add(gate, h, h)

    args = (
        randn(2, 33, 3, 64, dtype=torch.bfloat16, device="cuda"),
        randn(64, device="cuda"),
        randn(1, 33, 1, 64, device="cuda"),
        randn(1, 33, 1, 64, device="cuda", seed=1),
        randn(2, 192, device="cuda", seed=2),
        randn(2, 1, 192, device="cuda", seed=3),
        randn(2, 1, 192, device="cuda", seed=4),
    )
    with use_providers(**{op: "native" for op in ALL_TRITON}):
        expected = f(*args)
    with use_providers(**ALL_TRITON):
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True)(*args)
        graph = torch.cuda.CUDAGraph()
        f(*args)  # warm-up launches (compiles the kernels) outside capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            captured = f(*args)
        graph.replay()
        torch.cuda.synchronize()
    torch._dynamo.reset()
    assert_close(compiled, expected, torch.bfloat16)
    assert_close(captured, expected, torch.bfloat16)


def test_inductor_executor_launches_the_kernels_from_its_own_code():
    """With the triton provider chosen, the inductor executor binds each fused node of a Flux double
    block to the kernel's triton_op: Inductor's generated code launches the four kernels itself and
    calls no fused op through the dispatcher (only gelu_tanh, which has no kernel, stays an op)."""
    from torch._inductor.utils import run_and_get_code
    from torch.utils._pytree import tree_map

    from diffusers_ascend.compilation import AscendBackend
    from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks

    double, _ = tiny_flux_blocks(dtype=torch.bfloat16)
    double = double.to("cuda")
    inputs = tree_map(
        lambda t: t.to("cuda") if isinstance(t, torch.Tensor) else t, flux_block_inputs(dtype=torch.bfloat16)
    )
    backend = AscendBackend(fusions="all", executor="inductor", on_error="raise")
    torch._dynamo.reset()
    try:
        with torch.no_grad(), use_providers(**ALL_TRITON):
            out, codes = run_and_get_code(torch.compile(double, backend=backend, fullgraph=True), **inputs)
            ref = double(**inputs)
    finally:
        torch._dynamo.reset()
    (graph,) = backend.report.graphs
    assert list(graph["bound_providers"].values()) == ["triton"] * (4 + 2 + 4 + 4), graph["bound_providers"]
    code = "\n".join(codes)
    for name in ("_rms_norm_kernel", "_rope_kernel", "_adaln_kernel", "_mul_add_kernel"):
        assert name in code, f"{name} is not launched by Inductor's code"
    for op in ("rms_norm", "rope", "adaln_modulate", "mul_add"):  # no call through the dispatcher
        assert f"torch.ops.ascend_kernels.{op}.default(" not in code, op
        assert f"torch.ops.ascend_kernels_triton.{op}.default(" not in code, op
    for o, r in zip(out, ref):
        assert_close(o, r, torch.bfloat16, atol=0.1, rtol=0.05, msg="flux double block")
