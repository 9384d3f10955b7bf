"""Contract tests of the int8 linears' ``npu`` providers (``ascend_kernels/npu/quant.py``) against
stand-ins of torch_npu's quantized matmuls (``npu_quant_standins.py``: the schemas and documented limits
of the torch_npu 2.10.0.post6 and 2.14.0 wheels). Not hardware: argument mapping, dtypes, SoC gates,
the fallback to native outside the documented limits, the int8 activations equal to torchao's, and
each call bound by name against each wheel's schema."""

from __future__ import annotations

import pytest
import torch

import ascend_kernels  # noqa: F401
from ascend_kernels.npu import probe
from ascend_kernels.ops.int8_dynamic_linear import int8_dynamic_linear_native, quantize_per_token
from ascend_kernels.ops.int8_weight_only_linear import int8_weight_only_linear_native
from ascend_kernels.registry import auto_provider, select_provider

from .npu_quant_standins import install_quant_ops
from .npu_standins import A2_SOC, A3_SOC, CONTRACTS, WHEELS, install_torch_npu

ops = torch.ops.ascend_kernels
OLD_SOC = 102  # Ascend910A: before A2
P310_SOC = CONTRACTS["torch_npu"][WHEELS[-1]]["soc_versions"]["Ascend310P3"]


@pytest.fixture
def npu(monkeypatch):
    def make(**kw):
        return install_quant_ops(install_torch_npu(monkeypatch, **kw))

    yield make
    probe.cache_clear()


def _no_less_accurate(actual, reference, exact, dtype):
    """The kernels dequantize in one fp32 epilogue where torchao rounds to x's dtype in between: their
    results differ by about an ulp. Asserted as: no farther from the exact (fp64) result than torchao's
    own path, plus one ulp at the output's scale."""
    err, ref_err = (actual.double() - exact).abs().max(), (reference.double() - exact).abs().max()
    assert err <= ref_err + torch.finfo(dtype).eps * exact.abs().max(), (float(err), float(ref_err))


def _args(dtype, bias=True, m=(2, 7), k=64, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*m, k, generator=g) * 3).to(dtype)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    scale = torch.rand(n, 1, generator=g) / 100 + 1e-3
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w, scale, b


@pytest.mark.parametrize("wheel", WHEELS)
@pytest.mark.parametrize("soc", [A2_SOC, A3_SOC], ids=["A2", "A3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_dynamic_linear_calls_npu_quant_matmul_with_torchaos_int8_activations(npu, wheel, soc, dtype, bias):
    fake = npu(version=wheel, soc=soc)
    x, w, scale, b = _args(dtype, bias)
    assert select_provider("int8_dynamic_linear", x, w, scale, b).name == "npu"
    y = ops.int8_dynamic_linear(x, w, scale, b)
    ((name, call),) = fake.calls
    assert name == "npu_quant_matmul"
    q, x_scale = quantize_per_token(x)
    assert torch.equal(call["x1"], q.reshape(-1, 64))  # torchao's int8 values (npu_dynamic_quant's are another scheme)
    assert torch.equal(call["x2"], w.t()) and torch.equal(call["pertoken_scale"], x_scale.reshape(-1))
    assert call["scale"].dtype == torch.float32 and torch.equal(call["scale"], scale.reshape(-1))
    assert call["output_dtype"] == dtype and (call["bias"] is b)
    assert y.shape == (2, 7, 48) and y.dtype == dtype
    exact = (q.double() @ w.double().t()) * x_scale.double() * scale.double().reshape(-1)
    exact = exact if b is None else exact + b.double()
    _no_less_accurate(y, int8_dynamic_linear_native(x, w, scale, b), exact, dtype)


@pytest.mark.parametrize("wheel", WHEELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_weight_only_linear_calls_npu_weight_quant_batchmatmul(npu, wheel, dtype, bias):
    fake = npu(version=wheel)
    x, w, scale, b = _args(dtype, bias)
    y = ops.int8_weight_only_linear(x, w, scale, b)
    ((name, call),) = fake.calls
    assert name == "npu_weight_quant_batchmatmul"
    assert tuple(call["x"].shape) == (14, 64) and torch.equal(call["weight"], w.t())
    assert call["antiquant_scale"].dtype == dtype and call["bias"] is None  # bias added after, as torchao does
    assert y.shape == (2, 7, 48) and y.dtype == dtype
    exact = x.double() @ (w.double() * scale.double()).t()
    exact = exact if b is None else exact + b.double()
    _no_less_accurate(y, int8_weight_only_linear_native(x, w, scale, b), exact, dtype)


@pytest.mark.parametrize("op", ["int8_dynamic_linear", "int8_weight_only_linear"])
@pytest.mark.parametrize(
    ("case", "soc"),
    [
        ("fp32", A2_SOC),  # npu_quant_matmul has no fp32 output; the W8A16 kernel takes fp16/bf16
        ("old_soc", OLD_SOC),  # the per-token rows are in the A2/A3 table only
        ("310p", P310_SOC),
        ("k_too_large", A2_SOC),  # last dims <= 65535
        ("fp64_bias", A2_SOC),
    ],
)
def test_outside_the_documented_limits_runs_native(npu, op, case, soc):
    fake = npu(soc=soc)
    if case == "k_too_large":
        x = torch.empty(1, 65536, dtype=torch.bfloat16, device="meta")
        w = torch.empty(8, 65536, dtype=torch.int8, device="meta")
        args = (x, w, torch.empty(8, 1, device="meta"), None)
        assert select_provider(op, *args).name == "native"  # decided from shapes: no 65536-wide tensor built
        return
    x, w, scale, b = _args(torch.float32 if case == "fp32" else torch.bfloat16)
    if case == "fp64_bias":
        b = b.double()
        if op == "int8_weight_only_linear":
            pytest.skip("the W8A16 provider adds the bias in torch: any dtype")
    assert select_provider(op, x, w, scale, b).name == "native"
    native = {
        "int8_dynamic_linear": int8_dynamic_linear_native,
        "int8_weight_only_linear": int8_weight_only_linear_native,
    }
    assert torch.equal(getattr(ops, op)(x, w, scale, b), native[op](x, w, scale, b)) and fake.calls == []


# The calls' binding by name and type against each wheel's schema: their Cases in
# test_npu_wheel_bindings.py (the source scan fails on a call site no Case drives).


def test_auto_on_npu_includes_the_int8_fusions(npu):
    from diffusers_ascend.config import AscendConfig

    npu()
    for op in ("int8_dynamic_linear", "int8_weight_only_linear"):
        assert auto_provider(op, "npu").name == "npu"
    resolved = AscendConfig().resolved_fusions("npu")
    assert "int8_dynamic_linear" in resolved and "int8_weight_only_linear" in resolved


def test_auto_on_a_non_a2_a3_npu_leaves_them_out(npu):
    npu(soc=OLD_SOC)
    assert auto_provider("int8_dynamic_linear", "npu") is None
