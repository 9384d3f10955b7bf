"""FusionReport, graph logs, and the cache identity (uuid) of a fusion set."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from diffusers_ascend.compilation import AscendBackend, Fallback, FusionReport, GraphEntry
from diffusers_ascend.fusions import PASS_ORDER
from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks

from .conftest import ALL, EXPECTED_BLOCK_COUNTS


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
    # the passes of fusions="all" in the table's pass order, then the merge of repeated pure calls
    # and, since it merged some, a second round
    passes = [f for f in PASS_ORDER if f in ALL]
    assert stages == ["input", "noop_elimination", *passes, "cse", "after_cse"]
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


def _documented(cls) -> list[str]:
    """The fields of `cls` its docstring's ``Attributes:`` section leaves out."""
    doc = cls.__doc__.split("Attributes:")[1]
    return [
        f.name
        for f in dataclasses.fields(cls)
        if not any(
            line.strip().startswith((f"{f.name}:", f"{f.name} /")) or f"/ {f.name}:" in line
            for line in doc.splitlines()
        )
    ]


def test_every_record_field_is_documented():
    from diffusers_ascend.warm_start import LoadedCache, LoadedPackage

    for cls in (GraphEntry, Fallback, LoadedPackage, LoadedCache):
        assert _documented(cls) == [], cls.__name__
    assert "GraphEntry" in FusionReport.__doc__ and "Fallback" in FusionReport.__doc__


def test_graph_entries_carry_their_compile_id_and_read_like_their_json():
    backend = AscendBackend(fusions=["rms_norm"], executor="eager")
    with torch.no_grad():
        torch.compile(torch.nn.RMSNorm(8), backend=backend)(torch.randn(2, 8))
    (g,) = backend.report.graphs
    assert isinstance(g, GraphEntry) and g.compile_id == "0/0" and g.name == "g000[0/0]"
    assert g.to_dict() == {
        "name": "g000[0/0]",
        "matches": {"rms_norm": 1},
        "ops_before": g.ops_before,
        "ops_after": g.ops_after,
        "executor": "eager",
        "training": False,
        "dynamic": False,
        "compile_id": "0/0",
        "bound_providers": g.bound_providers,
    }
    assert backend.report.to_dict()["graphs"] == [g.to_dict()]
    # Read by key as the dict entries were (docs/troubleshooting.md): unset optional keys are absent.
    assert g["compile_id"] == "0/0" and g.get("fell_back") is None and g.get("package", "-") == "-"
    with pytest.raises(KeyError):
        g["frozen_params"]
    backend.report.discard_graphs(0)
    assert g.fell_back and g["fell_back"] is True and backend.report.matches == {"rms_norm": 0}


def test_fallbacks_are_frozen_records():
    r = FusionReport()
    r.add_fallback("blocks.0", "compile failed", {"rope": 2, "adaln": 0})
    r.add_fallback("blocks.1", "compile failed")
    a, b = r.fallbacks
    assert (a.module, a.lost, b.lost) == ("blocks.0", {"rope": 2}, {})
    assert [f.to_dict() for f in r.fallbacks] == [
        {"module": "blocks.0", "reason": "compile failed", "lost": {"rope": 2}},
        {"module": "blocks.1", "reason": "compile failed"},
    ]
    assert a["module"] == "blocks.0" and "lost" not in b.to_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.reason = "other"
    merged = FusionReport.merge([r])
    assert merged.fallbacks == r.fallbacks and merged.fallbacks is not r.fallbacks


def test_report_from_json_builds_records_and_refuses_unknown_keys():
    d = {
        "matches": {"rope": 1},
        "graphs": [
            {
                "name": "g000",
                "matches": {"rope": 1},
                "ops_before": 3,
                "ops_after": 2,
                "executor": "eager",
                "package": "ascend_export_0.json",
            }
        ],
        "fallbacks": [{"module": "m", "reason": "r", "lost": {"rope": 1}}],
    }
    r = FusionReport.from_dict(d)
    assert isinstance(r.graphs[0], GraphEntry) and r.graphs[0].package == "ascend_export_0.json"
    assert r.fallbacks == [Fallback("m", "r", {"rope": 1})]
    with pytest.raises(ValueError, match=r"unknown graph entry key\(s\) \['colour'\]; valid: \['name'"):
        FusionReport.from_dict({"graphs": [{**d["graphs"][0], "colour": "red"}]})
