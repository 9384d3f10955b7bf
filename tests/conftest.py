"""Shared pytest setup: device markers skip cleanly where the device is absent."""

import importlib.util

import pytest
import torch


def _has_npu() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch_npu  # noqa: F401

        return torch.npu.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    has_npu = None  # probed lazily: importing torch_npu is slow where it exists
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "npu" in item.keywords:
            if has_npu is None:
                has_npu = _has_npu()
            if not has_npu:
                item.add_marker(pytest.mark.skip(reason="needs an Ascend NPU with torch_npu"))
