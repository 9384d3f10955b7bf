"""A model enabled with ``compile="blocks"`` and then run through ``torch.compile(model)`` (the
model itself wrapped, not a pipeline's attribute): that dynamo traces the blocks into its own
graph with its own backend, so ours compiles nothing. The report says so from what it can see:
the model ran (a hook on it) and none of its compiled blocks' calls did."""

from __future__ import annotations

import warnings

import pytest
import torch

import diffusers_ascend
from ascend_kernels.testing import assert_close
from diffusers_ascend.tiny import flux_model_inputs, tiny_flux_transformer

NEEDLE = "it ran, but none of its compiled modules' calls did"
FAST = dict(fusions="all", executor="eager")


def _run(model):
    with torch.no_grad():
        return model(**flux_model_inputs(4, 4))[0]


def test_a_model_level_torch_compile_after_enabling_is_reported():
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    ref = _run(model)
    diffusers_ascend.enable_ascend_compile(model, **FAST)
    compiled = torch.compile(model, backend="eager")  # the user keeps `model` and asks it for the report
    with pytest.warns(UserWarning, match=NEEDLE):
        out = _run(compiled)
        report = diffusers_ascend.ascend_report(model)
    assert_close(out, ref, dtype=torch.float32)
    assert report.graphs_compiled == 0  # our backend never ran
    assert [fb["module"] for fb in report.fallbacks] == ["FluxTransformer2DModel"]
    assert NEEDLE in report.fallbacks[0]["reason"] and "torch.compile(model)" in report.fallbacks[0]["reason"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: a second report repeats the entry, not the warning
        _run(compiled)
        assert len(diffusers_ascend.ascend_report(model).fallbacks) == 1


def test_a_model_that_ran_its_compiled_blocks_reports_nothing():
    # no false alarm: run plain; then enabled again with the same config, the graphs are cache hits
    # (nothing compiles) and the blocks' calls still ran
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for _ in range(2):
            diffusers_ascend.enable_ascend_compile(model, **FAST)
            _run(model)
            report = diffusers_ascend.ascend_report(model)
            assert report.graphs_compiled == 2 and report.fallbacks == []
            diffusers_ascend.disable_ascend_compile(model)


def test_a_model_that_did_not_run_reports_nothing_and_disable_removes_the_hook():
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    hooks = dict(model._forward_pre_hooks)
    diffusers_ascend.enable_ascend_compile(model, **FAST)
    torch.compile(model, backend="eager")  # wrapped, never called
    assert diffusers_ascend.ascend_report(model).fallbacks == []
    diffusers_ascend.disable_ascend_compile(model)
    assert dict(model._forward_pre_hooks) == hooks
