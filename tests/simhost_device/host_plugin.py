"""pytest plugin: the whole session is a simulated Ascend host on the ``npu`` device.

``-p tests.simhost_device.host_plugin`` installs the device (`npu_device.install`) and the
stand-in torch_npu on it (`npu_device.npu_device_host`) before collection, so that
``tests/conftest.py`` finds an NPU and the tests marked ``npu`` (written for a 910B) run here::

    python -m pytest -p no:xdist -p tests.simhost_device.host_plugin -m npu \\
        tests/compilation/test_graph_capture_npu.py tests/integration/test_npu_pipelines.py

CONTRACT tests only (see docs/simulated-npu-device.md). Process-global and irreversible: a
session of its own, never the main one.
"""

from __future__ import annotations

_HOST = []


def pytest_configure(config):
    from _pytest.monkeypatch import MonkeyPatch

    from .npu_device import install, npu_device_host

    install()
    mp = MonkeyPatch()
    host = npu_device_host(mp)
    host.__enter__()
    _HOST.append((mp, host))


def pytest_unconfigure(config):
    while _HOST:
        mp, host = _HOST.pop()
        host.__exit__(None, None, None)
        mp.undo()
