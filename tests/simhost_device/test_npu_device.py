"""The user's path on a device named ``npu``, run in a process of its own: CONTRACT tests, not hardware.

Renaming PrivateUse1 is process-global and irreversible, so this test process never does it: one
child pytest process loads the simulated device (``-p tests.simhost_device.plugin``, see
npu_device.py) and runs npu_path_cases.py; each case of it is one test here, which passes when
the child's case passed and otherwise fails with the child's message. The child builds the C++
backend on its first run (torch.utils.cpp_extension: a C++ compiler and ninja).
"""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from . import npu_path_cases

# The child sets up its own host: the CUDA-host rerun (tests/conftest.py) would repeat it unchanged.
pytestmark = pytest.mark.own_process

CASES = sorted(n for n, f in inspect.getmembers(npu_path_cases, inspect.isfunction) if n.startswith("test_"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 1500  # measured: about 3 minutes on a 2-core CPU, plus the first build of the backend


@functools.lru_cache(maxsize=1)
def _run_child(xml_path: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    env.pop("DIFFUSERS_ASCEND_TEST_PLATFORM", None)  # the child detects its platform: the simulated npu
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "-p",
        "tests.simhost_device.plugin",
        os.path.join(ROOT, "tests", "simhost_device", "npu_path_cases.py"),
        f"--junitxml={xml_path}",
        "-o",
        "junit_family=xunit1",
    ]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    return r.returncode, (r.stdout + r.stderr)[-6000:]


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    missing = [tool for tool in ("ninja", os.environ.get("CXX", "c++")) if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"building the simulated npu backend needs {' and '.join(missing)} (torch.utils.cpp_extension)")
    xml_path = str(tmp_path_factory.mktemp("npu_device") / "cases.xml")
    rc, tail = _run_child(xml_path)
    if not os.path.exists(xml_path):
        pytest.fail(f"the simulated npu child process wrote no results (exit {rc}):\n{tail}")
    results = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        results[case.get("name")] = (
            (outcome.tag, (outcome.get("message") or "") + "\n" + (outcome.text or ""))
            if outcome is not None
            else ("passed", "")
        )
    return results, tail


def test_every_case_reported(child):
    results, tail = child
    assert sorted(results) == CASES, tail


@pytest.mark.parametrize("case", CASES)
def test_case_on_npu_device(child, case):
    results, tail = child
    outcome, text = results.get(case, ("missing", tail))
    if outcome != "passed":  # a skip counts as a failure: the child has the device
        pytest.fail(f"{case} {outcome} on the simulated npu device:\n{text[-4000:]}")
