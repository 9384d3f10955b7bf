"""``npu`` providers of the int8 linears: torch_npu's quantized matmuls, each call annotated with the
contract of the torch_npu 2.10.0.post6 / 2.14.0 wheels (same schema and doc in both; the schemas are
in tests/kernels/npu_contracts.json, the docs in the wheels' ``_op_plugin_docs.py``).

The activations are quantized with torchao's scheme in plain torch ops (``max|x| / 127.5``, round
half to even, clamp to [-128, 127]) and NOT with ``npu_dynamic_quant``: its doc gives an asymmetric
per-token formula (``(rowMax - rowMin) / 255`` and an offset), CANN's symmetric mode ``max|x| / 127``:
other int8 values either way, another scheme. The matmul kernels dequantize in one fp32
epilogue where torchao rounds to x's dtype in between: docs/quantization.md says by how much that
differs. Registered from ``npu/__init__.py``; torch_npu is imported only when a call runs.
"""

from __future__ import annotations

import torch

from ..ops.int8_dynamic_linear import quantize_per_token
from . import probe

__all__ = [
    "int8_dynamic_linear",
    "int8_dynamic_linear_supports",
    "int8_weight_only_linear",
    "int8_weight_only_linear_supports",
]

_HALF = (torch.float16, torch.bfloat16)
# npu_quant_matmul: "x1与x2最后一维的shape大小不能超过65535"; npu_weight_quant_batchmatmul: "K、N的范围为[1, 65535]".
_MAX_DIM = 65535


def _npu():
    from . import torch_npu  # lazy: only when a call runs on an NPU tensor

    return torch_npu()


def _linear_ok(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias) -> bool:
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    return (
        x.dtype in _HALF
        and weight.dtype == torch.int8
        and weight.dim() == 2
        and x.dim() >= 1
        and x.shape[-1] == k
        and 1 <= k <= _MAX_DIM
        and 1 <= n <= _MAX_DIM
        and x.numel() > 0
        and weight_scale.is_floating_point()
        and weight_scale.numel() == n
        and (bias is None or tuple(bias.shape) == (n,))
        # bf16 needs an A2 or newer part; both kernels' per-token / W8A16 modes are documented for A2/A3.
        and probe.is_a2_a3()
    )


def int8_dynamic_linear_supports(x, weight, weight_scale, bias=None) -> bool:
    # npu_quant_matmul's A2/A3 table: output bf16 with scale fp32/bf16 and bias int32/bf16/fp32, or
    # output fp16 with scale fp32 and bias int32/fp16/fp32; pertoken_scale fp32 in both. No fp32 output.
    return _linear_ok(x, weight, weight_scale, bias) and (bias is None or bias.dtype in (x.dtype, torch.float32))


def int8_dynamic_linear(x, weight, weight_scale, bias=None) -> torch.Tensor:
    n, k = weight.shape
    q, x_scale = quantize_per_token(x)  # torchao's int8 values and fp32 scale, in aten ops (not npu_dynamic_quant)
    # npu_quant_matmul(x1 int8 (M, K), x2 int8 (K, N) [a transposed view: ND, transpose taken by the
    # kernel], scale (N,) fp32, pertoken_scale (M,) fp32, bias (N,), output_dtype) ->
    # (x1 @ x2) * scale * pertoken_scale + bias in fp32, rounded once to output_dtype.
    y = _npu().npu_quant_matmul(
        q.reshape(-1, k),
        weight.t(),
        weight_scale.reshape(n).to(torch.float32),
        pertoken_scale=x_scale.reshape(-1),
        bias=bias,
        output_dtype=x.dtype,
    )
    return y.reshape(*x.shape[:-1], n)


def int8_weight_only_linear_supports(x, weight, weight_scale, bias=None) -> bool:
    return _linear_ok(x, weight, weight_scale, bias)


def int8_weight_only_linear(x, weight, weight_scale, bias=None) -> torch.Tensor:
    n, k = weight.shape
    # npu_weight_quant_batchmatmul(x (M, K), weight (K, N) int8 [transposed view allowed: "支持带transpose
    # 的非连续的Tensor"], antiquant_scale (N,) in x's dtype) -> x @ (weight * antiquant_scale) in x's dtype
    # (per-channel: antiquant_group_size=0). The bias is added after, in torch, as torchao adds it (the
    # doc states no bias dtype for bf16 x).
    y = _npu().npu_weight_quant_batchmatmul(x.reshape(-1, k), weight.t(), weight_scale.reshape(n).to(x.dtype))
    y = y.reshape(*x.shape[:-1], n)
    return y if bias is None else (y + bias).to(x.dtype)


def describe_dynamic() -> str:
    return (
        "torchao's per-token int8 quantization in aten ops + torch_npu.npu_quant_matmul (int8 x int8, "
        f"per-channel scale and pertoken_scale, one fp32 dequant epilogue; SoC {probe.soc_name()})"
    )


def describe_weight_only() -> str:
    return f"torch_npu.npu_weight_quant_batchmatmul (W8A16, per-channel antiquant_scale; SoC {probe.soc_name()})"
