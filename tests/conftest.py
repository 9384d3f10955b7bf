"""Shared pytest setup: device markers skip cleanly where the device is absent; modules that take
platform decisions are marked ``platform_dependent``."""

import functools
import importlib.util
import os
import re

import pytest
import torch

# No self-check verdict from another run stands in for the checks a test breaks on purpose
# (passes/verdict.py); tests of the verdict cache point it at their own directory. Inherited by
# the tests' child processes.
os.environ.setdefault("DIFFUSERS_ASCEND_VERDICT_DIR", "")


def _has_npu() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch_npu  # noqa: F401

        return torch.npu.is_available()
    except Exception:
        return False


# A test module takes platform decisions when it names the platform (`override_platform`,
# `current_platform`, `platform_info`, DIFFUSERS_ASCEND_TEST_PLATFORM, a ``platform=`` argument),
# device graphs, or an ``"auto"`` choice (fusions, executor, attention and providers resolve per
# platform). CI runs these modules again as a CUDA host (`.ci/run`); the others cannot tell a CUDA
# host from this CPU, so running them twice proves nothing.
_PLATFORM_DECISIONS = re.compile(r'platform|graph_capture|"auto"')


@functools.cache
def _takes_platform_decisions(path) -> bool:
    try:
        return bool(_PLATFORM_DECISIONS.search(path.read_text()))
    except OSError:  # pragma: no cover - collected modules exist
        return True


# Tests whose platform the CUDA-host rerun cannot change: the simulated Ascend host pins "npu", and
# a test marked `own_process` runs the library in child processes, which take no test override.
_PINNED_FIXTURES = {"simulated_npu"}


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "platform_dependent: the test takes platform decisions the simulated platform reaches (set by "
        "tests/conftest.py from its module's source; `-m platform_dependent` selects what `.ci/run` reruns as a CUDA host)",
    )
    config.addinivalue_line(
        "markers",
        "own_process: the test runs the library in child processes (they see the real platform, never "
        "DIFFUSERS_ASCEND_TEST_PLATFORM's), so the CUDA-host rerun would repeat it unchanged",
    )


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    has_npu = None  # probed lazily: importing torch_npu is slow where it exists
    for item in items:
        if (
            _takes_platform_decisions(item.path)
            and "own_process" not in item.keywords
            and not _PINNED_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.platform_dependent)
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "npu" in item.keywords:
            if has_npu is None:
                has_npu = _has_npu()
            if not has_npu:
                item.add_marker(pytest.mark.skip(reason="needs an Ascend NPU with torch_npu"))


@pytest.fixture(autouse=True)
def _seeded():
    """Every test draws from the same seed, whichever worker runs it and in whatever order: a
    tolerance that one draw breaks fails every run, not one run in fifty."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _simulated_platform():
    """``DIFFUSERS_ASCEND_TEST_PLATFORM=cuda`` runs the suite as a CUDA host runs it (the tests'
    tensors are on the CPU there too): platform-dependent decisions take the CUDA branch, so a test
    that silently assumes a CPU machine fails here, on a CPU. Tests that depend on the platform pin
    it themselves with `override_platform` (inner, so it wins)."""
    import os

    simulated = os.environ.get("DIFFUSERS_ASCEND_TEST_PLATFORM")
    if not simulated:
        yield
        return
    from diffusers_ascend.platform import override_platform

    with override_platform(simulated):
        yield


@pytest.fixture
def simulated_npu(monkeypatch):
    """A simulated Ascend host (stand-ins of torch_npu, its FIA / npu_fusion_attention ops and
    torch.npu's NPUGraph API; platform "npu"): CONTRACT tests, not hardware. See tests/simulated_npu.py."""
    from .simulated_npu import simulated_npu_host

    with simulated_npu_host(monkeypatch) as host:
        yield host
