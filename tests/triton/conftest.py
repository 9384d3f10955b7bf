"""Tests of the ``triton`` provider.

Kernel tests run the Triton kernels in Triton's interpreter on CPU tensors (no GPU needed). The
interpreter is chosen when ``triton`` is first imported, from the environment, so it must be on
before the process starts; the main suite (``python -m pytest -q -n 2 tests``) does not set it and
skips those tests (Inductor, which other tests run, imports triton itself, and the setting is
process-wide). Run them with::

    TRITON_INTERPRET=1 python -m pytest -q -p no:xdist tests/triton      # or: nox -s triton-interpret

The provider-selection and benchmark-script tests (no kernel launched) run in both; the
ahead-of-time compile tests (``test_compile.py``: each launch compiled for sm_90/sm_80, no GPU)
run without the interpreter; ``cuda``-marked tests run the compiled kernels on a real GPU and
``npu``-marked ones on an Ascend NPU with triton-ascend (skipped without one, and under the
interpreter).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _missing() -> list[str]:
    return [m for m in ("triton", "numpy") if importlib.util.find_spec(m) is None]


@pytest.fixture
def interpreter(monkeypatch):
    """The triton provider on CPU tensors through Triton's interpreter, for this test only.

    Widens ``ascend_kernels.triton.DEVICE_TYPES`` to ``"cpu"`` (as the npu contract tests widen
    the npu providers' list); the product path stays CUDA/NPU only.
    """
    if not INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1 in the environment: TRITON_INTERPRET=1 python -m pytest tests/triton")
    if _missing():
        pytest.skip(f"needs {' and '.join(_missing())} (pip install triton numpy)")
    import ascend_kernels.triton as tri

    monkeypatch.setattr(tri, "DEVICE_TYPES", (*tri.DEVICE_TYPES, "cpu"))
    return tri


def pytest_collection_modifyitems(config, items):
    if not INTERPRET:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if ("cuda" in item.keywords or "npu" in item.keywords) and str(item.path).startswith(here):
            item.add_marker(pytest.mark.skip(reason="compiled kernels: not under TRITON_INTERPRET=1"))


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def dtype(request):
    return request.param


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)
