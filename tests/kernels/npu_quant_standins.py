"""Stand-ins for torch_npu's quantized matmuls (CONTRACT tests: no Ascend device exists here).

`install_quant_ops` adds ``npu_quant_matmul`` and ``npu_weight_quant_batchmatmul`` to a
`StandInTorchNpu`, each an ``OpOverloadPacket``-like callable carrying the schema of the wheel it stands
for (verbatim from its ``libtorch_npu.so``, via npu_contracts.json) and enforcing what the wheel's doc
(``_op_plugin_docs.py``) states for the calls we make:

- ``npu_quant_matmul``: x1/x2 int8, 2-6 dims, last dims <= 65535; the A2/A3 table's rows with
  ``pertoken_scale`` (fp32): output bf16 with scale fp32/bf16 and bias int32/bf16/fp32, or output fp16
  with scale fp32 and bias int32/fp16/fp32 (no fp32 output); the SoC families its doc lists (the
  ``pertoken_scale`` rows are in the A2/A3 table only). ``output_dtype`` arrives as the ScalarType
  number the dispatcher makes of a ``torch.dtype`` (the schema says ``int?``). Result: the int32
  product times ``scale * pertoken_scale`` plus bias, in fp32, rounded once to ``output_dtype``.
- ``npu_weight_quant_batchmatmul``: x (M, K) fp16/bf16, weight (K, N) int8 (a transposed view allowed),
  K and N in [1, 65535], per-channel ``antiquant_scale`` (N,) or (1, N) in x's dtype, no group size.
  The wheel's doc lists no products: the stand-in takes A2/A3, the providers' gate. Result (assumed,
  the doc gives no formula): ``x @ (weight * antiquant_scale)`` with the dequantized weight in x's dtype,
  accumulated in fp32.

Not hardware: these prove the calls' arguments, never the kernels' speed or exact rounding.
"""

from __future__ import annotations

import torch

from .npu_standins import CONTRACTS, StandInTorchNpu, _Packet, documented_families

__all__ = ["QUANT_OPS", "SCALAR_TYPE", "install_quant_ops"]

QUANT_OPS = ("npu_quant_matmul", "npu_weight_quant_batchmatmul")
# c10::ScalarType numbers: what a torch.dtype becomes in an ``int?`` schema argument.
SCALAR_TYPE = {torch.int8: 1, torch.int32: 3, torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}
_FROM_NUMBER = {v: k for k, v in SCALAR_TYPE.items()}


def _as_dtype(value) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    return _FROM_NUMBER[int(value)]


def _quant_matmul(fake: StandInTorchNpu):
    def impl(
        x1,
        x2,
        scale,
        offset,
        pertoken_scale,
        bias,
        output_dtype,
        x1_dtype,
        x2_dtype,
        pertoken_scale_dtype,
        scale_dtype,
        group_sizes,
        y_scale,
    ):
        families = documented_families("npu_quant_matmul", wheel=fake.wheel)
        assert fake.family in families, f"npu_quant_matmul is documented for {families}, not {fake.family}"
        assert x1.dtype == torch.int8 and x2.dtype == torch.int8, "int8 x int8 only in these calls"
        assert 2 <= x1.dim() <= 6 and 2 <= x2.dim() <= 6, "x1/x2: 2-6 dims"
        assert x1.shape[-1] == x2.shape[-2], f"K of x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} differ"
        assert x1.shape[-1] <= 65535 and x2.shape[-1] <= 65535, "last dims of x1/x2 <= 65535"
        assert offset is None and group_sizes is None and y_scale is None
        assert all(v is None for v in (x1_dtype, x2_dtype, pertoken_scale_dtype, scale_dtype))
        out = _as_dtype(output_dtype) or torch.int8
        n = x2.shape[-1]
        assert scale.dim() == 1 and scale.shape[0] in (1, n), f"scale (1,) or ({n},), got {tuple(scale.shape)}"
        assert pertoken_scale is not None, "our calls always pass pertoken_scale"
        assert fake.family in ("A2", "A3"), "pertoken_scale rows are in the A2/A3 table only"
        assert pertoken_scale.dtype == torch.float32 and tuple(pertoken_scale.shape) == (x1.shape[0],)
        if out == torch.bfloat16:
            assert scale.dtype in (torch.float32, torch.bfloat16), scale.dtype
            assert bias is None or bias.dtype in (torch.int32, torch.bfloat16, torch.float32), bias.dtype
        elif out == torch.float16:
            assert scale.dtype == torch.float32, scale.dtype
            assert bias is None or bias.dtype in (torch.int32, torch.float16, torch.float32), bias.dtype
        else:
            raise AssertionError(f"output_dtype {out} with pertoken_scale: the A2/A3 table has bf16 and fp16 only")
        assert bias is None or tuple(bias.shape) == (n,), "bias (n,)"
        acc = torch._int_mm(x1.contiguous(), x2.contiguous()).float()
        y = acc * scale.float() * pertoken_scale[:, None]
        return (y if bias is None else y + bias.float()).to(out)

    return impl


def _weight_quant_batchmatmul(fake: StandInTorchNpu):
    def impl(
        x,
        weight,
        antiquant_scale,
        antiquant_offset,
        quant_scale,
        quant_offset,
        bias,
        antiquant_group_size,
        inner_precise,
        weight_dtype,
    ):
        assert fake.family in ("A2", "A3"), (
            f"npu_weight_quant_batchmatmul: A2/A3 (the providers' gate), not {fake.family}"
        )
        assert x.dtype in (torch.float16, torch.bfloat16) and x.dim() == 2, "x: (M, K) fp16/bf16"
        assert weight.dtype == torch.int8 and weight.dim() == 2, "weight: (K, N) int8"
        k, n = weight.shape
        assert x.shape[1] == k and 1 <= k <= 65535 and 1 <= n <= 65535, "K, N in [1, 65535]"
        assert antiquant_scale.dtype == x.dtype, f"antiquant_scale {antiquant_scale.dtype} in x's dtype {x.dtype}"
        assert tuple(antiquant_scale.shape) in ((n,), (1, n)), "per-channel antiquant_scale (N,) or (1, N)"
        assert antiquant_offset is None and quant_scale is None and quant_offset is None
        assert antiquant_group_size == 0 and inner_precise == 0 and weight_dtype is None
        assert bias is None or (bias.is_contiguous() and tuple(bias.shape) in ((n,), (1, n)))
        w = weight.to(x.dtype) * antiquant_scale.reshape(1, n)
        y = x.float() @ w.float()
        return (y if bias is None else y + bias.float()).to(x.dtype)

    return impl


def install_quant_ops(fake: StandInTorchNpu) -> StandInTorchNpu:
    """Adds the quantized matmuls, with the schemas of ``fake``'s wheel, to ``fake``."""
    schemas = CONTRACTS["torch_npu"][fake.wheel]["schemas"]
    for name, make in (
        ("npu_quant_matmul", _quant_matmul),
        ("npu_weight_quant_batchmatmul", _weight_quant_batchmatmul),
    ):
        setattr(fake, name, _Packet(fake, schemas[name], make(fake)))
    return fake
