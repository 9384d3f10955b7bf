"""``bench kernels`` and ``bench blocks`` without a GPU: they refuse clearly, the rows the kernel
benchmark prints load as `Measurement` records, and the block benchmark's plumbing runs at tiny
size on CPU (eager only: nothing is timed that matters). ``bench host_path`` runs on CPU (it
launches no kernel) and refuses without triton."""

from __future__ import annotations

import importlib
import importlib.util
import json

import pytest
import torch

from ascend_kernels.triton.measurements import Measurement
from diffusers_ascend.cli import main


def _load(name):
    return importlib.import_module(f"diffusers_ascend.benchmarks.bench_{name}")


@pytest.mark.parametrize("name,argv", [("kernels", []), ("blocks", [])])
def test_refuses_without_cuda(monkeypatch, capsys, name, argv):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", name, *argv]) == 2
    err = capsys.readouterr().err
    assert "CUDA GPU" in err and "none is available" in err


def test_measurement_rows_load_as_records():
    kernels = _load("kernels")
    result = dict(
        device="NVIDIA H100 80GB HBM3",
        versions="torch 2.13.0, triton 3.9.0",
        rows=[
            dict(op="rope", case="flux_rope", kernel_dev_ms=0.041234, compiled_dev_ms=0.062),
            dict(op="mul_add", case="wan_gate", kernel_dev_ms=0.5, compiled_dev_ms=0.4),
        ],
    )
    rows = [eval(line.rstrip(","), {"Measurement": Measurement}) for line in kernels.measurement_rows(result)]
    assert [(m.op, m.size, m.device_type, m.kernel_ms) for m in rows] == [
        ("rope", "flux_rope", "cuda", 0.0412),
        ("mul_add", "wan_gate", "cuda", 0.5),
    ]
    assert rows[0].speedup > 1 > rows[1].speedup


def test_kernel_cases_cover_every_kernel_at_flux_and_wan_sizes():
    kernels = _load("kernels")
    names = {c.name: c for c in kernels._cases()}
    assert {c.op for c in names.values()} == {"rms_norm", "rope", "adaln_modulate", "mul_add"}
    assert names["flux_rope"].shape == "1x4608x24x128" and names["flux_adaln"].shape == "1x4096x3072"
    assert names["wan_adaln"].shape == "1x75600x5120"
    # and the forms Ascend tiles differently, timed in both tilings
    assert {"flux_qkv_q_norm", "flux_rope_batch2", "sd3_adaln_batch2", "sd3_gate_batch2"} <= set(names)


def test_blocks_tiny_plumbing():
    blocks = _load("blocks")
    result = blocks.run(tiny=True, variants=["eager"])
    assert [(r["block"], r["variant"]) for r in result["rows"]] == [("flux_double", "eager"), ("flux_single", "eager")]
    assert all(r["max_abs_diff"] == 0 and r["median_ms"] > 0 for r in result["rows"])
    cuda = blocks._variants("cuda")
    all4 = (
        ["rms_norm", "rope", "adaln", "mul_add"],
        dict(rms_norm="triton", rope="triton", adaln_modulate="triton", mul_add="triton"),
    )
    assert cuda["triton_all4"] == (*all4, False) and cuda["triton_all4_capture"] == (*all4, True)
    assert cuda["inductor_cudagraphs"] == ("inductor_cudagraphs", {}, False)
    cpu = blocks._variants("cpu")
    assert cpu["triton_rope"] == (["rope"], {}, False)  # the kernels do not run on CPU
    assert not any(capture for _, _, capture in cpu.values())  # nor do CUDA graphs


def test_host_path_times_every_layer_of_every_kernel_op(capsys, tmp_path):
    pytest.importorskip("triton", reason="the triton provider's plans import triton")
    assert main(["bench", "host_path", "--calls", "20", "--repeat", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "host_path.json").read_text())
    # every kernel op, then the batch-2 forms and fused QKV's q; each planned as Ascend plans it, too
    assert [(r["op"], r["ascend_kernel"]) for r in result["rows"]] == [
        ("rms_norm", "_rms_norm_kernel"),
        ("rope", "_rope_tokens_kernel"),
        ("adaln_modulate", "_adaln_kernel"),
        ("mul_add", "_mul_add_kernel"),
        ("rope", "_rope_tokens_kernel"),
        ("adaln_modulate", "_adaln_batches_kernel"),
        ("mul_add", "_mul_add_batches_kernel"),
        ("rms_norm", "_rms_norm_tokens_kernel"),
    ]
    assert all(r["plan_us"] > 0 and r["ascend_plan_us"] > 0 for r in result["rows"])
    for row in result["rows"]:
        assert all(row[k] > 0 for k in ("native_us", "op_us", "supports_us", "plan_us")), row
        assert row["triton_python_us"] == row["supports_us"] + row["plan_us"]
    assert "triton plan us" in capsys.readouterr().out


def test_host_path_refuses_without_triton(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert main(["bench", "host_path"]) == 2
    assert "needs triton" in capsys.readouterr().err


def test_kernel_benchmark_reports_a_failing_path_and_measures_the_others():
    # What a GPU session needs when one path breaks (say Inductor's launch of the triton_op): the
    # other numbers, the error named per path, no Measurement row without both device times.
    kernels = _load("kernels")
    x = torch.ones(4, 8)

    def broken(t):
        raise RuntimeError("no kernel image\nsecond line")

    paths = dict(
        eager=lambda t: t * 2, compiled=lambda t: t * 2, kernel=lambda t: t * 2 + 1, op=lambda t: t * 2, traced=broken
    )
    times, outs, errors = kernels.measure(paths, (x,), host_ms=lambda fn: 2.0, dev_ms=lambda fn: 0.5)
    assert errors == {"traced": "RuntimeError: no kernel image"}
    assert set(outs) == {"eager", "compiled", "kernel", "op"}
    assert times == dict(
        eager_ms=2.0,
        eager_dev_ms=0.5,
        compiled_ms=2.0,
        compiled_dev_ms=0.5,
        kernel_ms=2.0,
        kernel_dev_ms=0.5,
        op_ms=2.0,
    )  # the op's device time is the kernel's
    row = kernels.summarize("flux_rope", "rope", "4x8", 1_000_000, 4.0, times, outs, errors, copy_ms=0.4)
    assert row["kernel_gbs"] == 2.0 and row["kernel_pct_copy"] == 50.0 and row["kernel_vs_compiled"] == 1.0
    assert row["kernel_pct_same_size_copy"] == 80.0 and row["traced_pct_same_size_copy"] is None
    assert row["ceiling_vs_compiled"] == 1.25  # Inductor's 0.5 ms against a 0.4 ms copy of the bytes
    assert "traced_dev_ms" not in row and "traced_ms" not in row
    assert row["traced_gbs"] is None and row["traced_vs_compiled"] is None and row["host_traced_vs_compiled"] is None
    assert row["kernel_max_abs_diff"] == 1.0 and row["op_max_abs_diff"] == 0.0 and row["traced_max_abs_diff"] is None
    assert row["errors"] == errors
    result = dict(
        device="NVIDIA H100 80GB HBM3",
        versions="torch 2.13.0, triton 3.9.0",
        rows=[row, dict(row, case="wan_rope", compiled_dev_ms=None)],
    )
    assert [line.split(", ")[3] for line in kernels.measurement_rows(result)] == ["'flux_rope'"]


def test_kernel_benchmark_times_ascends_tiling_where_it_differs():
    """The ``ascend_tiles`` path (Ascend's tiling timed on the GPU, only where it differs from the
    row tiles): device-timed, compared with the row tiles, checked against eager."""
    kernels = _load("kernels")
    x = torch.ones(4, 8)
    dev = iter([0.5, 0.4])
    paths = dict(eager=lambda t: t * 2, kernel=lambda t: t * 2, ascend_tiles=lambda t: t * 2 + 0.5)
    times, outs, errors = kernels.measure(paths, (x,), host_ms=lambda fn: 2.0, dev_ms=lambda fn: next(dev, 1.0))
    assert errors == {} and times["kernel_dev_ms"] == 0.4 and times["ascend_tiles_dev_ms"] == 1.0
    row = kernels.summarize("sd3_adaln_batch2", "adaln_modulate", "4x8", 1_000_000, 4.0, times, outs, errors)
    assert row["ascend_tiles_vs_kernel"] == 0.4 and row["ascend_tiles_gbs"] == 1.0
    assert row["ascend_tiles_max_abs_diff"] == 0.5
    assert (
        kernels.summarize("flux_rope", "rope", "4x8", 1, 4.0, dict(kernel_dev_ms=0.4), {}, {})["ascend_tiles_vs_kernel"]
        is None
    )  # not timed where the tilings are the same


def test_ascend_tiles_path_plans_inside_the_switch():
    pytest.importorskip("triton", reason="the switch lives in the triton package")
    from ascend_kernels.triton import _common

    kernels = _load("kernels")
    seen = []
    call = kernels._with_ascend_tiles(lambda *a: seen.append(_common.AFFINE_TILE_DEVICES) or a)
    assert call(1, 2) == (1, 2)
    assert seen == [(*_common.AFFINE_TILE_DEVICES, "cuda")] and "cuda" not in _common.AFFINE_TILE_DEVICES


def test_block_benchmark_reports_a_failing_variant_and_runs_the_others(monkeypatch, capsys):
    blocks = _load("blocks")
    real = blocks._measure

    def measure(block, inputs, ref, fusions, *args):
        if fusions == ["rope"]:
            raise RuntimeError("Inductor failed on the bound graph")
        return real(block, inputs, ref, fusions, *args)

    monkeypatch.setattr(blocks, "_measure", measure)
    assert main(["bench", "blocks", "--tiny", "--variant", "triton_rope", "--variant", "triton_adaln"]) == 1
    captured = capsys.readouterr()
    assert "FAILED flux_double triton_rope: RuntimeError: Inductor failed on the bound graph" in captured.err
    assert "FAILED flux_single triton_rope" in captured.err
    result = blocks.run(tiny=True, variants=["triton_rope", "triton_adaln"])
    rows = {(r["block"], r["variant"]): r for r in result["rows"]}
    assert (
        rows["flux_double", "triton_rope"]["median_ms"] is None
        and rows["flux_double", "triton_rope"]["vs_eager"] is None
    )
    assert [rows[b, "triton_adaln"]["matches"] for b in ("flux_double", "flux_single")] == [{"adaln": 4}, {"adaln": 1}]
    for b in ("flux_double", "flux_single"):
        adaln = rows[b, "triton_adaln"]
        assert "error" not in adaln and adaln["median_ms"] > 0 and adaln["vs_eager"] > 0
        assert adaln["triton_ops"] == 0  # no kernel on CPU: every fused op keeps its native provider
