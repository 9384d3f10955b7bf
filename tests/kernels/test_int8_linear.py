"""The int8 linear ops against torchao's own eager path (their native providers ARE torchao 0.18's
math: the comparison is bit-exact), their refusals of other schemes, and opcheck."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import ascend_kernels  # noqa: F401
from ascend_kernels.ops.int8_dynamic_linear import int_mm, int_mm_blocked, quantize_per_token

from .conftest import DTYPES

torchao = pytest.importorskip("torchao")
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_  # noqa: E402

ops = torch.ops.ascend_kernels
SCHEMES = {
    "int8_dynamic_linear": Int8DynamicActivationInt8WeightConfig,
    "int8_weight_only_linear": Int8WeightOnlyConfig,
}


def _quantized_linear(scheme: str, dtype: torch.dtype, bias: bool, k: int = 40, n: int = 24, seed: int = 0):
    torch.manual_seed(seed)  # nn.Linear's init draws from the global RNG; tests run in their own order
    lin = torch.nn.Linear(k, n, bias=bias).to(dtype)
    quantize_(lin, SCHEMES[scheme](set_inductor_config=False))
    return lin


@pytest.fixture(params=["s8s8", "u8s8"])
def cpu_int_mm_branch(request, monkeypatch):
    """torchao's CPU matmul takes a u8s8 (VNNI without AMX) or s8s8 branch by the CPU's features:
    pin each, so that the result does not depend on the machine."""
    import torchao.kernel.intmm as intmm

    monkeypatch.setattr(intmm, "_cpu_is_amx_tile_supported", lambda: request.param == "s8s8")
    monkeypatch.setattr(intmm, "_cpu_is_vnni_supported", lambda: request.param == "u8s8")
    return request.param


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("shape", [(2, 5, 40), (1, 40), (3, 7, 2, 40), (17, 40)], ids=str)
def test_equals_torchao_eager_bit_exact(scheme, dtype, bias, shape, cpu_int_mm_branch):
    lin = _quantized_linear(scheme, dtype, bias)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(shape, generator=g) * 4).to(dtype)
    x[..., 0] = 0  # a zero column and (below) an all-zero token: the scale's eps clamp
    if x.dim() > 1:
        x.view(-1, 40)[0] = 0
    with torch.no_grad():
        expected = lin(x)
    w = lin.weight
    actual = getattr(ops, scheme)(x, w.qdata, w.scale, lin.bias)
    assert actual.dtype == expected.dtype == dtype and actual.shape == expected.shape
    assert torch.equal(actual, expected), (actual.float() - expected.float()).abs().max()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_per_token_quantization_is_torchaos(dtype):
    from torchao.quantization import PerRow
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor

    x = (torch.randn(4, 3, 64, generator=torch.Generator().manual_seed(2)) * 10).to(dtype)
    ref = Int8Tensor.from_hp(x, PerRow())
    q, scale = quantize_per_token(x)
    assert torch.equal(q, ref.qdata) and torch.equal(scale, ref.scale) and scale.dtype == torch.float32


def test_blocked_int_mm_is_exact_beyond_fp32_mantissa():
    # K = 2501 at the int8 extremes: 127 * 127 * 2501 = 40_338_629 is odd and above 2**25, which one
    # fp32 matmul cannot hold; the 1024-blocks every non-CPU device takes sum it exactly.
    k = 2501
    a = torch.full((3, k), -128, dtype=torch.int8)
    a[1] = 127
    a[2] = torch.randint(-128, 128, (k,), dtype=torch.int8, generator=torch.Generator().manual_seed(3))
    b = torch.full((k, 5), 127, dtype=torch.int8)
    expected = torch._int_mm(a, b)
    assert torch.equal(int_mm_blocked(a, b), expected)
    assert (a.float() @ b.float()).to(torch.int32).ne(expected).any()  # one fp32 matmul is not exact
    assert int_mm(a.to("meta"), b.to("meta")).shape == expected.shape  # the non-CPU path


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (lambda: (torch.randn(2, 8).double(), torch.zeros(4, 8, dtype=torch.int8), torch.ones(4, 1), None), "float16"),
        (lambda: (torch.randn(2, 8), torch.zeros(4, 8), torch.ones(4, 1), None), "int8"),
        (lambda: (torch.randn(2, 7), torch.zeros(4, 8, dtype=torch.int8), torch.ones(4, 1), None), "in_features=8"),
        (lambda: (torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.int8), torch.ones(4, 2), None), "per-group"),
        (lambda: (torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.int8), torch.ones(1), None), r"\(4, 1\)"),
        (lambda: (torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.int8), torch.ones(4), torch.ones(5)), "bias"),
    ],
    ids=["x_dtype", "weight_dtype", "k", "group_scale", "tensor_scale", "bias_shape"],
)
def test_refuses_other_schemes_clearly(scheme, args, message):
    with pytest.raises(ValueError, match=message):
        getattr(ops, scheme)(*args())


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("bias", [True, False])
def test_opcheck(scheme, bias):
    g = torch.Generator().manual_seed(4)
    w = torch.randint(-128, 128, (6, 8), dtype=torch.int8, generator=g)
    b = torch.randn(6, generator=g) if bias else None
    torch.library.opcheck(getattr(ops, scheme), (torch.randn(2, 3, 8, generator=g), w, torch.rand(6, 1), b))


def test_importing_the_ops_imports_no_torchao():
    code = "import sys, ascend_kernels, diffusers_ascend; print([m for m in sys.modules if m.startswith('torchao')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_grad_is_the_native_maths(scheme, bias):
    from ascend_kernels.registry import _REGISTRY

    native = _REGISTRY[scheme]["native"].impl
    g = torch.Generator().manual_seed(5)
    w = torch.randint(-128, 128, (6, 8), dtype=torch.int8, generator=g)
    args = [torch.randn(2, 3, 8, generator=g), torch.rand(6, 1, generator=g), torch.randn(6, generator=g)]
    args = [a.requires_grad_() for a in args[: 3 if bias else 2]]
    fused = torch.autograd.grad(getattr(ops, scheme)(args[0], w, *args[1:], *([] if bias else [None])).sum(), args)
    ref = torch.autograd.grad(native(args[0], w, *args[1:], *([] if bias else [None])).sum(), args)
    assert all(torch.equal(a, b) for a, b in zip(fused, ref))
    assert fused[1].abs().sum() > 0  # the scale's gradient is not vacuous
