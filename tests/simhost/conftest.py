"""The simulated Ascend host as diffusers sees it: CONTRACT tests, not hardware.

These tests run in their own pytest process whose ``PYTHONPATH`` starts with tests/simhost/site,
where a stand-in torch_npu distribution lives (`tests.simhost.torch_npu_standin`), so diffusers
finds torch_npu at its import and takes its own NPU branches (``RMSNorm`` -> ``npu_rms_norm``,
``GEGLU`` -> ``npu_geglu``, ``_native_npu`` attention enabled, pipelines import torch_npu)::

    PYTHONPATH=tests/simhost/site python -m pytest -p no:xdist tests/simhost   # or: nox -s simhost-2.10

In any other process (the full suite) they are skipped with that reason: diffusers was imported
without torch_npu there, and its import-time checks cannot be redone.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
HERE = os.path.dirname(os.path.realpath(__file__))


def standin_active() -> bool:
    """Whether ``torch_npu`` resolves to the stand-in distribution in this process."""
    spec = importlib.util.find_spec("torch_npu")
    origin = getattr(spec, "origin", None)
    return origin is not None and os.path.realpath(origin).startswith(os.path.realpath(SITE) + os.sep)


ACTIVE = standin_active()
if ACTIVE:
    import torch_npu  # noqa: F401  (before diffusers, as on a host where the wheel is installed)
    from diffusers.utils import import_utils

    assert import_utils.is_torch_npu_available(), "diffusers did not find the stand-in torch_npu distribution"


def pytest_collection_modifyitems(config, items):
    if ACTIVE:
        return
    skip = pytest.mark.skip(
        reason="simulated-host process only: PYTHONPATH=tests/simhost/site python -m pytest "
        "tests/simhost (nox -s simhost-2.10)"
    )
    for item in items:
        if os.path.realpath(str(item.path)).startswith(HERE + os.sep):
            item.add_marker(skip)


@pytest.fixture
def simhost(monkeypatch):
    """The simulated Ascend host (tests/simulated_npu.py: platform ``"npu"``, torch.npu's graph
    stand-in, npu providers on CPU tensors) over the stand-in torch_npu DISTRIBUTION diffusers
    imported; yields a `tests.simulated_npu.SimulatedNpu` whose ``torch_npu`` is that module's
    stand-in (``torch_npu._standin``: its calls, SoC, compile mode, aclnn kernels)."""
    from ascend_kernels.npu import probe
    from tests.simulated_npu import SimulatedNpu, simulated_npu_host

    dist = sys.modules["torch_npu"]
    standin = dist._standin
    with simulated_npu_host(monkeypatch) as sim:
        # The helper put a fresh stand-in in sys.modules: the distribution's module is the one
        # diffusers holds, so it must be the one our providers call too.
        monkeypatch.setitem(sys.modules, "torch_npu", dist)
        monkeypatch.setattr(probe, "aclnn_available", lambda api: api in standin.aclnn)
        probe.cache_clear()
        standin.calls.clear()
        yield SimulatedNpu(standin, sim.npu)
    probe.cache_clear()
