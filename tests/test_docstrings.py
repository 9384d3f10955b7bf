"""Every `>>>` example in the public modules runs and prints what it says (doctest)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ascend_kernels
import diffusers_ascend

SKIP = ("diffusers_ascend.benchmarks",)  # examples there run whole benchmarks: covered by tests/test_benchmarks.py
# Optional dependencies some modules import (the Triton kernel modules): skipped where not installed.
OPTIONAL = ("triton",)


def _modules():
    for pkg in (ascend_kernels, diffusers_ascend):
        yield pkg.__name__
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if not info.name.startswith(SKIP) and not info.name.split(".")[-1].startswith("__"):
                yield info.name


@pytest.mark.parametrize("name", sorted(set(_modules())))
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name not in OPTIONAL:
            raise
        pytest.skip(f"{name} needs the optional package {e.name!r}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} examples failed in {name} (run: python -m doctest -v)"
    )
