"""Provider selection: native on CPU, explicit choice via ``use_providers`` (context-local),
errors that list the valid choices, ``supports_args`` limits of the npu kernels."""

from __future__ import annotations

import contextvars
import threading

import pytest
import torch

import ascend_kernels
from ascend_kernels import registry
from ascend_kernels.npu import kernels as npu_kernels
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
            lambda: select_provider("rms_norm", x, None, 1e-6, None).name)
    assert seen["copied_context"] == "native"  # a copy of this context sees the choice ...
    assert seen["thread"] == "spy"  # ... a new thread does not (default order: spy before native)


def test_unknown_op_and_provider_errors_list_valid_choices():
    with pytest.raises(ValueError, match=r"unknown ascend_kernels op 'layer_norm'; valid ops: rms_norm, rope"):
        with use_providers(layer_norm="native"):
            pass
    with pytest.raises(ValueError, match=r"unknown provider 'cuda' for op 'rope'; valid providers: npu, triton, native"):
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


def _rope_args(b, s, n, d, dtype=torch.bfloat16):
    return torch.empty(b, s, n, d, dtype=dtype), torch.empty(1, s, 1, d), torch.empty(1, s, 1, d)


def test_npu_rope_supports_args_limits():
    ok = _rope_args(2, 13, 24, 128)
    assert npu_kernels.rope_supports(*ok, "interleaved") and npu_kernels.rope_supports(*ok, "half")
    # cos/sin given as (S, D) pad to 1S1D; BNSD with 11SD too.
    assert npu_kernels.rope_supports(ok[0], torch.empty(13, 1, 128), torch.empty(13, 1, 128), "interleaved")
    assert npu_kernels.rope_supports(torch.empty(2, 24, 13, 128), torch.empty(13, 128), torch.empty(13, 128), "interleaved")
    assert not npu_kernels.rope_supports(*_rope_args(2, 13, 24, 77), "interleaved")  # odd D
    assert not npu_kernels.rope_supports(*_rope_args(2, 13, 24, 896), "interleaved")  # D >= 896
    assert not npu_kernels.rope_supports(*_rope_args(40, 13, 25, 64), "interleaved")  # B*N = 1000
    assert npu_kernels.rope_supports(*_rope_args(40, 13, 25, 64), "half")  # half: B, N < 1000 each
    assert not npu_kernels.rope_supports(*_rope_args(2, 13, 24, 64, torch.float64), "half")  # fp64
    x3 = torch.empty(13, 24, 64)
    assert not npu_kernels.rope_supports(x3, torch.empty(13, 1, 64), torch.empty(13, 1, 64), "half")  # 3-D x
    # Per-batch cos (BS1D) only in half mode.
    bs1d = (torch.empty(2, 13, 24, 64), torch.empty(2, 13, 1, 64), torch.empty(2, 13, 1, 64))
    assert npu_kernels.rope_supports(*bs1d, "half") and not npu_kernels.rope_supports(*bs1d, "interleaved")


def test_npu_rms_norm_and_gelu_supports_args_limits():
    x = torch.empty(2, 13, 77, dtype=torch.bfloat16)
    assert npu_kernels.rms_norm_supports(x, torch.empty(77), 1e-6, None)
    assert npu_kernels.rms_norm_supports(x, None, 1e-6, torch.bfloat16)
    assert not npu_kernels.rms_norm_supports(x, None, 1e-6, torch.float32)  # wider out_dtype
    assert not npu_kernels.rms_norm_supports(torch.empty(77), None, 1e-6, None)  # 1-D: kernel needs 2-8 dims
    assert not npu_kernels.rms_norm_supports(x.double(), None, 1e-6, None)
    assert not npu_kernels.rms_norm_supports(x, torch.empty(2, 77), 1e-6, None)
    assert npu_kernels.gelu_supports(x) and not npu_kernels.gelu_supports(x.double())
    assert not npu_kernels.gelu_supports(torch.empty((1,) * 9))
