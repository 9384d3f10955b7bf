"""The public entry points of `diffusers_ascend.integration` are fully annotated (parameters and return)."""

from __future__ import annotations

import inspect

import pytest

import diffusers_ascend
from diffusers_ascend import integration

ENTRY_POINTS = (
    "enable_ascend_compile",
    "disable_ascend_compile",
    "ascend_report",
    "save_ascend_cache",
    "package_counters",
    "enabled_models",
)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_points_are_annotated(name):
    fn = getattr(integration, name)
    sig = inspect.signature(fn)
    assert sig.return_annotation is not inspect.Signature.empty, name
    assert [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty] == []
    assert fn.__doc__ and ">>>" in fn.__doc__  # an example tests/test_docstrings.py runs


def test_the_top_level_names_are_the_integration_functions():
    for name in ("enable_ascend_compile", "disable_ascend_compile", "ascend_report", "save_ascend_cache"):
        assert getattr(diffusers_ascend, name) is getattr(integration, name)
