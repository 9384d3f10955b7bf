"""Platform detection, the context-local override, and the graph-capture facts per platform."""

import os
import threading

import pytest
import torch

from diffusers_ascend import platform as P
from diffusers_ascend.config import AscendConfig


def test_detected_platform_on_this_machine():
    # Detection itself: meaningless while tests/conftest.py simulates another platform.
    if os.environ.get("DIFFUSERS_ASCEND_TEST_PLATFORM"):
        pytest.skip("the platform is simulated (DIFFUSERS_ASCEND_TEST_PLATFORM)")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert P.current_platform() == expected
    info = P.platform_info()
    assert info["platform"] == expected and info["detected"] == expected and not info["overridden"]
    assert info["graph_capture_supported"] is (expected != "cpu")


def test_override_is_scoped_and_context_local():
    before = P.current_platform()
    seen_in_thread = []
    with P.override_platform("npu"):
        assert P.current_platform() == "npu"
        assert P.platform_info()["overridden"] is True
        assert AscendConfig().resolved_executor() == "eager"
        t = threading.Thread(target=lambda: seen_in_thread.append(P.current_platform()))
        t.start()
        t.join()
        with P.override_platform("cuda"):
            assert P.current_platform() == "cuda"
        assert P.current_platform() == "npu"
    assert P.current_platform() == before
    assert seen_in_thread == [P.platform_info()["detected"]]  # another thread does not see this context's override


def test_override_rejects_unknown_platform():
    before = P.platform_info()["overridden"]
    with pytest.raises(ValueError, match=r"'tpu'.*'npu', 'cuda', 'cpu'"):
        with P.override_platform("tpu"):
            pass
    assert P.platform_info()["overridden"] is before


def test_graph_capture_and_graph_class():
    assert P.graph_capture_supported("npu") and P.graph_capture_supported("cuda")
    assert not P.graph_capture_supported("cpu")
    assert P.graph_class("cpu") is None
    assert P.graph_class("cuda") is torch.cuda.CUDAGraph
    with pytest.raises(ValueError, match="valid"):
        P.graph_capture_supported("gpu")


def test_broken_torch_npu_is_reported_not_raised(tmp_path, monkeypatch):
    """A torch_npu that raises on import (broken CANN) must leave detection at cuda/cpu and say why."""
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text(
        "raise OSError('libascendcl.so: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    P._detect.cache_clear()
    try:
        info = P.platform_info()
        assert info["platform"] in ("cpu", "cuda")
        assert info["torch_npu_installed"] is True
        assert "libascendcl.so" in info["torch_npu_error"] and info["torch_npu_error"].startswith("OSError")
    finally:
        P._detect.cache_clear()
        import sys

        sys.modules.pop("torch_npu", None)
