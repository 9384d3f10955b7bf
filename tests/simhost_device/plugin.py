"""pytest plugin of the simulated ``npu`` device session (``-p tests.simhost_device.plugin``).

Registers the device (`npu_device.install`: PrivateUse1 renamed, for the whole process) before
any test is collected, so it must only load in a process of its own; `test_npu_device.py` starts
one. Never add it to the main test session.
"""

from __future__ import annotations


def pytest_configure(config):
    from .npu_device import install

    install()
