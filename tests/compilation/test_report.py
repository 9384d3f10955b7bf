"""FusionReport, graph logs, and the cache identity (uuid) of a fusion set."""

from __future__ import annotations

import json
import os

import torch

from diffusers_ascend.compilation import AscendBackend, Fallback, FusionReport, GraphEntry
from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks

from .conftest import EXPECTED_BLOCK_COUNTS


def test_report_records_merges_and_serializes():
    r = FusionReport(matches={"rms_norm": 0, "rope": 0})
    r.add_graph("g000", {"rms_norm": 2, "rope": 1}, ops_before=40, ops_after=15, executor="eager")
    r.add_fallback("blocks.3", "compile failed: boom")
    r.record_swaps({"RMSNorm": 4})
    r.record_swaps({"RMSNorm": 1, "GELU": 2})
    assert r.matches == {"rms_norm": 2, "rope": 1} and r.total_matches == 3
    assert (r.ops_before, r.ops_after, r.graphs_compiled) == (40, 15, 1)
    assert r.ops_ratio == 15 / 40
    assert r.fallbacks == [Fallback("blocks.3", "compile failed: boom")]
    assert r.swaps == {"RMSNorm": 5, "GELU": 2}

    d = r.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert FusionReport.from_dict(d).to_dict() == d

    other = FusionReport(matches={"rope": 2, "mul_add": 3}, ops_before=10, ops_after=5, graphs_compiled=1)
    merged = FusionReport.merge([r, other])
    assert merged.matches == {"rms_norm": 2, "rope": 3, "mul_add": 3}
    assert (merged.ops_before, merged.ops_after, merged.graphs_compiled) == (50, 20, 2)
    assert merged.fallbacks == r.fallbacks and merged.swaps == r.swaps
    assert r.matches == {"rms_norm": 2, "rope": 1}  # inputs untouched

    text = str(r)
    assert "g000" in text and "rms_norm" in text and "40 -> 15" in text and "blocks.3" in text and "RMSNorm=5" in text


def test_backend_report_and_graph_logs(tmp_path):
    _, single = tiny_flux_blocks()
    log_dir = tmp_path / "graphs"
    backend = AscendBackend(fusions="all", executor="eager", graph_log_dir=str(log_dir))
    with torch.no_grad():
        torch.compile(single, backend=backend, fullgraph=True)(**flux_block_inputs())
    report = backend.report
    assert report.matches == EXPECTED_BLOCK_COUNTS["flux_single"]
    (graph,) = report.graphs
    assert graph["matches"] == report.matches and graph["ops_before"] > graph["ops_after"] > 0
    assert json.loads(json.dumps(report.to_dict()))["graphs"][0]["executor"] == "eager"

    files = sorted(os.listdir(log_dir))
    stages = [f.split(".")[-2] for f in files]
    assert all(f.startswith("g000_0_0.") for f in files)  # graph name, then the step number
    # the passes, then the merge of repeated pure calls and, since it merged some, a second round
    assert stages == ["input", "noop_elimination", "rms_norm", "rope", "gelu_tanh", "adaln", "swiglu", "mul_add", "cse",
                      "after_cse"]
    texts = dict(zip(stages, ((log_dir / f).read_text() for f in files)))
    assert "ascend_kernels.rms_norm" not in texts["noop_elimination"] and "ascend_kernels.rms_norm" in texts["rms_norm"]
    assert "ascend_kernels.mul_add" in texts["mul_add"] and "ascend_kernels.mul_add" not in texts["swiglu"]
    assert texts["cse"] != texts["mul_add"]


def test_uuid_follows_the_fusion_set():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    from diffusers_ascend.compilation.passes.manager import FusionPassManager

    a = FusionPassManager(["rms_norm", "rope"])
    assert isinstance(a, CustomGraphPass)
    assert a.uuid() == FusionPassManager(["rope", "rms_norm"]).uuid()
    assert a.uuid() != FusionPassManager(["rms_norm"]).uuid()
    assert a.uuid() != FusionPassManager(["rms_norm", "rope", "mul_add"]).uuid()
    assert FusionPassManager(["gelu_tanh"]).uuid() != FusionPassManager(["fast_gelu"]).uuid()
    b = AscendBackend(fusions=["rms_norm", "rope"], executor="eager")
    assert b.manager.uuid() == a.uuid()


def test_report_keeps_diffusers_own_fusions_apart():
    # fused by diffusers itself (its NPU branches): merged, serialized and printed, never a match or a swap
    r = FusionReport(matches={"rms_norm": 0})
    r.record_upstream_fused({"npu_rms_norm": 9})
    r.record_upstream_fused({"npu_rms_norm": 1, "npu_geglu": 2})
    merged = FusionReport.merge([r, FusionReport.from_dict(r.to_dict())])
    assert merged.upstream_fused == {"npu_rms_norm": 20, "npu_geglu": 4}
    assert merged.matches == {"rms_norm": 0} and merged.swaps == {}
    assert "fused by diffusers: npu_rms_norm=20, npu_geglu=4" in str(merged)
