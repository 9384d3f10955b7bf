"""Where the ``triton`` provider runs and which calls it takes; nothing here launches a kernel (runs
in the main suite, no interpreter needed).

- CUDA: only for an op recorded in `ascend_kernels.triton.measurements` as faster than Inductor's
  code at every recorded size, or when chosen with ``use_providers(op="triton")``; nothing is
  recorded, so ``fusions="auto"`` on CUDA picks no fusion (tests/test_config.py).
- NPU: when triton-ascend is installed (so ``adaln``/``mul_add`` join ``"auto"`` there).
- Calls outside a kernel's limits fall back to the native provider.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import ascend_kernels
import ascend_kernels.triton as tri
from ascend_kernels import registry
from ascend_kernels.registry import available_providers, select_provider, use_providers
from ascend_kernels.triton import limits, measurements
from ascend_kernels.triton.measurements import Measurement

KERNEL_OPS = ("rms_norm", "rope", "adaln_modulate", "mul_add")


def _row(op, kernel_ms, compiled_ms, size="flux"):
    return Measurement(
        op=op,
        device_type="cuda",
        device="NVIDIA H100 80GB HBM3",
        size=size,
        dtype="bf16",
        kernel_ms=kernel_ms,
        compiled_ms=compiled_ms,
        versions="torch 2.13.0, triton 3.9.0",
        date="2026-11-22",
    )


@pytest.fixture
def triton_installed(monkeypatch):
    monkeypatch.setattr(tri, "triton_available", lambda: True)


def test_triton_provider_registered_for_the_kernel_ops_only():
    for op in ascend_kernels.OPS:
        names = [p.name for p in registry.providers(op)]
        assert ("triton" in names) == (op in KERNEL_OPS), (op, names)


def test_cuda_needs_a_measurement_or_an_explicit_choice(triton_installed):
    for op in KERNEL_OPS:
        assert available_providers(op, "cuda") == ["native"]
        with use_providers(**{op: "triton"}):
            assert available_providers(op, "cuda") == ["triton", "native"]
        assert available_providers(op, "cuda") == ["native"]  # the choice is scoped


def test_explain_on_cuda_says_the_kernel_is_opt_in(triton_installed, monkeypatch):
    # On CUDA the triton provider declines by policy (not measured faster than Inductor), not for
    # lack of ability: `diffusers-ascend env` must say so and how to opt in, not that no kernel runs.
    monkeypatch.setattr(measurements, "MEASUREMENTS", ())
    for op in KERNEL_OPS:
        name, why = registry.explain(op, "cuda")
        assert name == "native"
        assert why.startswith("triton: installed, used only when chosen") and f"use_providers({op}='triton')" in why
    assert registry.explain("gelu_tanh", "cuda") == (
        "native",
        "the PyTorch reference composite (no kernel provider runs on 'cuda')",
    )
    # Not on a device type the kernels never run on, and not without triton.
    assert "triton" not in registry.explain("rms_norm", "cpu")[1]
    monkeypatch.setattr(tri, "triton_available", lambda: False)
    assert registry.explain("rms_norm", "cuda") == (
        "native",
        "the PyTorch reference composite (no kernel provider runs on 'cuda')",
    )


def test_measured_faster_at_every_size_runs_on_cuda(triton_installed, monkeypatch):
    monkeypatch.setattr(
        measurements,
        "MEASUREMENTS",
        (
            _row("adaln_modulate", 0.04, 0.069),
            _row("adaln_modulate", 0.05, 0.08, size="wan"),
            _row("rope", 0.05, 0.062),
            _row("rope", 0.09, 0.08, size="wan"),  # slower at one size
        ),
    )
    assert available_providers("adaln_modulate", "cuda") == ["triton", "native"]
    assert available_providers("rope", "cuda") == ["native"]
    assert available_providers("mul_add", "cuda") == ["native"]  # nothing recorded
    assert measurements.beats_compiler("adaln_modulate", "cuda")
    assert not measurements.beats_compiler("adaln_modulate", "npu")


def test_recorded_h100_rows_keep_auto_empty_on_cuda(triton_installed):
    """The H100 rows (`diffusers-ascend bench kernels`): every op has both model sizes recorded, and
    none beats Inductor's code at both, so on CUDA the provider runs only when chosen."""
    rows = measurements.MEASUREMENTS
    assert {m.op for m in rows} == set(tri.KERNELS) and all(m.device_type == "cuda" for m in rows)
    assert all({m.size.split("_")[0] for m in rows if m.op == op} == {"flux", "wan"} for op in tri.KERNELS)
    assert [m.size for m in rows if m.speedup > 1] == ["flux_rope", "flux_adaln"]
    for op in tri.KERNELS:
        assert not measurements.beats_compiler(op, "cuda")
        assert available_providers(op, "cuda") == ["native"]


def test_npu_needs_triton_ascend(triton_installed, monkeypatch):
    assert available_providers("mul_add", "npu") == ["native"]  # community triton is not enough
    monkeypatch.setattr(tri, "triton_ascend_available", lambda: True)
    assert available_providers("mul_add", "npu") == ["triton", "native"]


def test_nothing_without_triton(monkeypatch):
    monkeypatch.setattr(tri, "triton_available", lambda: False)
    monkeypatch.setattr(tri, "triton_ascend_available", lambda: False)
    with use_providers(rms_norm="triton"):
        assert available_providers("rms_norm", "cuda") == ["native"]
        with pytest.raises(
            RuntimeError, match="'triton' chosen for ascend_kernels.rms_norm does not run on device type 'cpu'"
        ):
            torch.ops.ascend_kernels.rms_norm(torch.randn(2, 8), None, 1e-6)


def test_calls_outside_the_limits_fall_back_to_native(triton_installed, monkeypatch):
    monkeypatch.setattr(tri, "DEVICE_TYPES", (*tri.DEVICE_TYPES, "cpu"))  # selection only: no launch
    bf = torch.bfloat16
    x = torch.empty(2, 5, 3, 16, dtype=bf)
    cos = torch.empty(1, 5, 1, 16)
    assert select_provider("rms_norm", x, None, 1e-6, None).name == "triton"
    assert select_provider("rms_norm", x.double(), None, 1e-6, None).name == "native"  # fp64
    assert select_provider("rms_norm", x.transpose(1, 2), None, 1e-6, None).name == "native"  # permuted
    assert select_provider("rms_norm", torch.empty(2, 1, 1, 1, 16, dtype=bf), None, 1e-6, None).name == "native"  # 5-D
    assert select_provider("rope", x, cos, cos, "interleaved").name == "triton"
    assert (
        select_provider("rope", torch.empty(2, 5, 3, 15, dtype=bf), cos[..., :15], cos[..., :15], "half").name
        == "native"
    )
    assert select_provider("mul_add", x, x, torch.empty(16, dtype=torch.int32)).name == "native"  # int
    with use_providers(rms_norm="triton"):
        with pytest.raises(RuntimeError, match="does not support these arguments"):
            select_provider("rms_norm", x.double(), None, 1e-6, None)


def test_supports_args_limits():
    bf = torch.bfloat16
    x = torch.empty(2, 13, 3072, dtype=bf)
    assert limits.rms_norm_supports(x, torch.empty(3072), 1e-6, torch.float32)
    assert limits.rms_norm_supports(x, torch.empty(3072, dtype=bf), 1e-6, None)  # low-precision weight
    assert not limits.rms_norm_supports(x, torch.empty(2, 3072), 1e-6, None)
    assert not limits.rms_norm_supports(torch.empty(2, 0, 8), None, 1e-6, None)  # empty
    assert not limits.rms_norm_supports(x, None, 1e-6, torch.float64)
    wide = torch.empty(1, 2, 16385, dtype=bf)
    assert not limits.rms_norm_supports(wide, None, 1e-6, None)  # row longer than one tile
    assert limits.max_row("npu") == 8192 and limits.max_row("cuda") == 16384
    # adaLN: Flux (B, D) and Wan (B, 1, D); scale that would enlarge x is refused (native raises)
    assert limits.adaln_modulate_supports(x, torch.empty(2, 3072), torch.empty(2, 1, 3072), 1e-6)
    assert not limits.adaln_modulate_supports(x, torch.empty(3, 3072), torch.empty(3, 3072), 1e-6)
    assert not limits.adaln_modulate_supports(x[:, :1], torch.empty(2, 13, 3072), torch.empty(2, 3072), 1e-6)
    assert not limits.adaln_modulate_supports(x, torch.empty(2, 3072), torch.empty(2, 3072), 1e-6, torch.empty(7))
    # rope: even D, tables broadcast to x without enlarging it, head dim up to 1024
    q = torch.empty(1, 13, 24, 128, dtype=bf)
    assert limits.rope_supports(q, torch.empty(1, 13, 1, 128), torch.empty(1, 13, 1, 128), "half")
    assert not limits.rope_supports(q, torch.empty(2, 13, 1, 128), torch.empty(2, 13, 1, 128), "half")
    assert not limits.rope_supports(q, torch.empty(1, 1, 13, 1, 128), torch.empty(1, 1, 13, 1, 128), "half")
    assert not limits.rope_supports(q, torch.empty(1, 13, 1, 128), torch.empty(1, 13, 1, 128), "neox")
    assert not limits.rope_supports(torch.empty(1, 2, 2, 2048, dtype=bf), torch.empty(2048), torch.empty(2048), "half")
    # mul_add: broadcasting, expanded (stride-0) operands fine, permuted ones and >4 dims not
    g = torch.empty(2, 1, 3072)
    assert limits.mul_add_supports(g, x, x)
    assert limits.mul_add_supports(g.expand(2, 13, 3072), x, x)
    assert not limits.mul_add_supports(g, x.transpose(0, 1), x.transpose(0, 1))
    assert not limits.mul_add_supports(torch.empty((1,) * 5), x, x)
    assert not limits.mul_add_supports(torch.empty(()), torch.empty(()), torch.empty(()))  # 0-dim result
    assert not limits.mul_add_supports(g.to("meta"), x, x)  # operands on two devices


def test_supports_args_on_fake_tensors():
    """The eager executor binds providers from fake tensors (`bind_providers`): limits read only
    metadata."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 13, 3072, dtype=torch.bfloat16)
        assert limits.adaln_modulate_supports(x, torch.empty(2, 3072), torch.empty(2, 3072), 1e-6)
        assert limits.mul_add_supports(torch.empty(2, 1, 3072), x, x)


def test_selection_imports_no_triton():
    code = (
        "import json, sys, torch, ascend_kernels\n"
        "from ascend_kernels.registry import available_providers, use_providers\n"
        "with use_providers(rope='triton'):\n"
        "    names = [available_providers(op, d) for op in ascend_kernels.OPS for d in ('cpu', 'cuda', 'npu')]\n"
        "print(json.dumps('triton' in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(res.stdout.strip().splitlines()[-1]) is False


SHAPES = [(), (1,), (5,), (0,), (2, 1, 8), (5, 8), (1, 8), (3, 1), (2, 5, 8), (4,), (1, 0), (2, 1, 1, 8)]


@pytest.mark.parametrize("a", SHAPES, ids=str)
def test_broadcast_shape_is_torchs(a):
    # The host-path broadcast of the limits and the mul_add plan: torch's rules, None where torch raises.
    for b in SHAPES:
        for c in ((), (1,), (8,)):
            try:
                expected = tuple(torch.broadcast_shapes(a, b, c))
            except RuntimeError:
                expected = None
            assert limits.broadcast_shape(a, b, c) == expected, (a, b, c)


def test_broadcast_strides_are_expands():
    pytest.importorskip("triton", reason="the launch helpers import triton")
    from ascend_kernels.triton._common import lead3, strides_as

    base = torch.empty(4, 6, 9)
    cases = [
        (base[:1, :, :8], (4, 6, 8)),
        (base[:, :1, :8], (4, 6, 8)),
        (base.new_empty(8), (2, 4, 6, 8)),
        (base[0, :1, :8], (2, 4, 6, 8)),
        (base[:, 2:5, :8], (4, 3, 8)),
        (base[:1, :1, :1], (1, 1, 1)),
    ]
    for t, shape in cases:
        full = t.expand(shape).stride()
        assert strides_as(t, shape) == (lead3(shape, full)[1], full[-1]), (tuple(t.shape), shape)


def test_flat_rows_address_every_row_as_the_general_form():
    # row_strides may rewrite a size-1 dim's stride and flag an operand flat; the kernels then take
    # `row * s2` for `i0 * s0 + i1 * s1 + i2 * s2`. Checked against the offsets of every row of
    # contiguous, sliced, broadcast and permuted-to-row-major operands, flat or not.
    pytest.importorskip("triton", reason="the launch helpers import triton")
    from ascend_kernels.triton._common import lead3, row_strides, strides_as

    base = torch.empty(4, 6, 9)
    cases = {  # (operand, output shape) -> flat?
        (base[..., :8], (4, 6, 8)): True,  # last-dim slice: rows 9 apart
        (base.new_empty(4, 6, 8), (4, 6, 8)): True,  # contiguous
        (base.new_empty(1, 1, 8), (4, 6, 8)): True,  # one row for every row (stride 0)
        (base.new_empty(6, 1, 8).squeeze(1), (1, 6, 8)): True,
        (base.new_empty(3, 1, 8)[:, 0], (3, 1, 1, 8)): True,  # moving dim outermost
        (base[:, 2:5, :8], (4, 3, 8)): False,  # middle slice: rows 9 apart, blocks 54
        (base.new_empty(6, 1, 8), (6, 5, 8)): False,  # a table broadcast over the inner dim
        (base.new_empty(4, 1, 8), (4, 6, 8)): False,  # (B, 1, D) modulation, B > 1
        (base.new_empty(1, 6, 8), (4, 6, 8)): False,  # broadcast over the outer dim
    }
    for (t, shape), expect_flat in cases.items():
        sizes, _ = lead3(shape, [0] * len(shape))
        lead, _ = strides_as(t, shape)
        s, flat = row_strides(sizes, lead)
        assert flat is expect_flat, (tuple(t.shape), tuple(t.stride()), shape)
        rows = [(i0, i1, i2) for i0 in range(sizes[0]) for i1 in range(sizes[1]) for i2 in range(sizes[2])]
        general = [i0 * a + i1 * b + i2 * c for (i0, i1, i2) in rows for a, b, c in [lead]]
        assert [i0 * s[0] + i1 * s[1] + i2 * s[2] for (i0, i1, i2) in rows] == general
        if flat:
            assert [r * s[2] for r in range(len(rows))] == general
