"""Provider selection: native on CPU, explicit choice via ``use_providers`` (context-local),
errors that list the valid choices. (The npu kernels' ``supports_args`` limits depend on the
installed torch_npu: they are tested with the stand-in in ``test_npu_contract.py``.)"""

from __future__ import annotations

import contextvars
import threading

import pytest
import torch

import ascend_kernels
from ascend_kernels import registry
from ascend_kernels.registry import Provider, available_providers, select_provider, use_providers

ops = torch.ops.ascend_kernels


@pytest.fixture
def spy(monkeypatch):
    """A 'spy' provider of rms_norm (any device) that records its calls; removed after the test."""
    calls = []

    def impl(x, weight, eps, out_dtype=None):
        calls.append((tuple(x.shape), eps))
        return torch.zeros_like(x)

    monkeypatch.setitem(registry._REGISTRY["rms_norm"], "spy", Provider("rms_norm", "spy", impl))
    return calls


@pytest.mark.parametrize("op", ascend_kernels.OPS)
def test_native_only_on_cpu(op):
    assert available_providers(op, "cpu") == ["native"]
    assert [p.name for p in registry.providers(op)][-1] == "native"


def test_cpu_call_runs_native():
    x = torch.randn(2, 8)
    assert select_provider("rms_norm", x, None, 1e-6, None).name == "native"


def test_use_providers_overrides_and_is_scoped(spy):
    x = torch.randn(2, 8)
    # The spy ranks before native, so it would win by default too: pin native explicitly first.
    with use_providers(rms_norm="native"):
        assert torch.equal(ops.rms_norm(x, None, 1e-6), ascend_kernels.ops.rms_norm.rms_norm_native(x, None, 1e-6))
        with use_providers(rms_norm="spy"):
            assert torch.equal(ops.rms_norm(x, None, 1e-6), torch.zeros_like(x))
        assert select_provider("rms_norm", x, None, 1e-6, None).name == "native"
    assert spy == [((2, 8), 1e-6)]


def test_use_providers_does_not_leak_to_other_threads_or_contexts(spy):
    x = torch.randn(2, 8)
    seen = {}

    def other():
        seen["thread"] = select_provider("rms_norm", x, None, 1e-6, None).name

    with use_providers(rms_norm="native"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        seen["copied_context"] = contextvars.copy_context().run(
            lambda: select_provider("rms_norm", x, None, 1e-6, None).name
        )
    assert seen["copied_context"] == "native"  # a copy of this context sees the choice ...
    assert seen["thread"] == "spy"  # ... a new thread does not (default order: spy before native)


def test_unknown_op_and_provider_errors_list_valid_choices():
    with pytest.raises(ValueError, match=r"unknown ascend_kernels op 'layer_norm'; valid ops: .*rms_norm, .*rope"):
        with use_providers(layer_norm="native"):
            pass
    with pytest.raises(
        ValueError, match=r"unknown provider 'cuda' for op 'rope'; valid providers: npu, triton, native"
    ):
        with use_providers(rope="cuda"):
            pass
    with pytest.raises(ValueError, match="valid ops"):
        available_providers("gelu", "cpu")


def test_bad_choice_changes_nothing():
    with pytest.raises(ValueError):
        with use_providers(rms_norm="native", rope="bogus"):
            pass
    assert registry._CHOICE.get() == {}


def test_explicit_provider_that_cannot_run_raises():
    x = torch.randn(1, 4, 2, 8)
    with use_providers(rope="npu"):
        with pytest.raises(RuntimeError, match=r"'npu' .* does not run on device type 'cpu'.*available: native"):
            ops.rope(x, x[:, :, :1], x[:, :, :1], "interleaved")
