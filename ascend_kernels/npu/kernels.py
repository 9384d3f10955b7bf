"""The torch_npu / CANN calls behind the ``npu`` providers, each with the contract it relies on.

The contracts (schemas, limits, dtype rules, with their sources) are tabled in docs/npu-notes.md.
``*_supports`` return False outside a kernel's documented limits or where the installed stack
would take a failing path (see `probe`), so the registry falls back to the native provider. Where
a kernel needs one dtype, the provider runs it in the widest input dtype and casts the result.
"""

from __future__ import annotations

import functools

import torch

from ..ops.adaln import _as_modulation
from ..ops.mul_add import result_dtype
from . import probe

__all__ = [
    "adaln",
    "add_rms_norm",
    "add_rms_norm_supports",
    "adaln_supports",
    "fast_gelu",
    "gelu_supports",
    "gelu_tanh",
    "gelu_tanh_supports",
    "mul_add",
    "mul_add_supports",
    "rms_norm",
    "rms_norm_supports",
    "rope",
    "rope_modes",
    "rope_path",
    "rope_supports",
    "swiglu",
    "swiglu_kernel",
    "swiglu_supports",
]

_F32, _F16, _BF16 = torch.float32, torch.float16, torch.bfloat16
_DTYPES = (_F16, _BF16, _F32)


def _npu():
    from . import torch_npu  # lazy: only when a call runs on an NPU tensor

    return torch_npu()


def _dtype_ok(dtype: torch.dtype) -> bool:
    # bf16 needs an A2 or newer part (c10_npu::IsBF16Supported: SocVersion >= Ascend910B1).
    return dtype in _DTYPES and (dtype != _BF16 or probe.soc_version() >= probe.SOC_910B1)


def _bits(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits


def _widest(*dtypes: torch.dtype | None) -> torch.dtype:
    """torch's promotion over fp16/bf16/fp32 without a dispatcher call (on every fused call)."""
    present = {d for d in dtypes if d is not None}
    if len(present) == 1:
        return present.pop()
    return _F32 if present <= set(_DTYPES) else functools.reduce(torch.promote_types, present)


def _op_api(api: str) -> bool:
    """Whether torch_npu takes the aclnn path for ``api`` (else the acl_op fallback runs)."""
    return not probe.jit_compile() and probe.aclnn_available(api)


def _not_wider(out_dtype: torch.dtype | None, dtype: torch.dtype) -> bool:
    # The kernels return x's dtype: a wider out_dtype would lose the fp32 precision the op promises.
    return out_dtype is None or (out_dtype.is_floating_point and _bits(out_dtype) <= _bits(dtype))


# ---------------------------------------------------------------------------------------------
# rms_norm


def _rms_exact_gamma(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether npu_rms_norm can take ``weight`` with x as it is and keep the op's numerics (weight
    applied in fp32). The installed torch_npu's doc wants gamma in x's dtype: exact when the weights
    already are, or when x is fp32 (a widening cast). An fp32 gamma with fp16/bf16 x only where this
    device was probed to take it; any other mix narrows the weights (MindIE SD casts them: numerics
    that are not the op's), so the caller runs the kernel in fp32 instead."""
    if weight.dtype == x.dtype or x.dtype == _F32:
        return True
    return (
        weight.dtype == _F32
        and x.dtype in (_F16, _BF16)
        and _op_api("aclnnRmsNorm")
        and probe.rms_norm_fp32_gamma(x.dtype)
    )


def rms_norm_supports(x: torch.Tensor, weight: torch.Tensor | None, eps: float, out_dtype=None) -> bool:
    return (
        _dtype_ok(x.dtype)
        and 2 <= x.dim() <= 8
        and (weight is None or (tuple(weight.shape) == (x.shape[-1],) and weight.dtype in _DTYPES))
        and _not_wider(out_dtype, x.dtype)
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, out_dtype=None) -> torch.Tensor:
    out = out_dtype or x.dtype
    if weight is None:
        gamma = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    elif _rms_exact_gamma(x, weight):
        gamma = weight if weight.dtype == _F32 and x.dtype != _F32 else weight.to(x.dtype)
    else:
        # Two casts cost less than a result the unfused ops would not give.
        x, gamma = x.float(), weight.float()
    # npu_rms_norm -> (y, rstd); y in x's dtype, computed in fp32.
    y = _npu().npu_rms_norm(x, gamma, epsilon=eps)[0]
    return y if out == y.dtype else y.to(out)


# ---------------------------------------------------------------------------------------------
# add_rms_norm


def add_rms_norm_supports(x1, x2, weight, eps, out_dtype=None) -> bool:
    # npu_add_rms_norm(x1, x2, gamma, epsilon) -> (y, rstd, x): y and x in x1's dtype (the wheel's
    # meta function); no broadcasting of x2 and one dtype for x1, x2, gamma (weights in another
    # dtype: the kernel only where x is fp32, a widening cast of the weights).
    return (
        _dtype_ok(x1.dtype)
        and x2.dtype == x1.dtype
        and tuple(x2.shape) == tuple(x1.shape)
        and 2 <= x1.dim() <= 8
        and (
            weight is None
            or (
                tuple(weight.shape) == (x1.shape[-1],)
                and (weight.dtype == x1.dtype or (x1.dtype == _F32 and weight.dtype in _DTYPES))
            )
        )
        and _not_wider(out_dtype, x1.dtype)
    )


def add_rms_norm(x1, x2, weight, eps, out_dtype=None):
    gamma = torch.ones(x1.shape[-1], dtype=x1.dtype, device=x1.device) if weight is None else weight.to(x1.dtype)
    # npu_add_rms_norm -> (y, rstd, x): y = rms_norm(x1 + x2) * gamma, x = x1 + x2, both in x1's dtype.
    y, _, s = _npu().npu_add_rms_norm(x1, x2, gamma, epsilon=eps)
    out = out_dtype or x1.dtype
    return (y if out == y.dtype else y.to(out)), s


# ---------------------------------------------------------------------------------------------
# rope

_ROTARY_MODE = {"interleaved": "interleave", "half": "half"}
# The SoC families npu_rotary_mul's doc lists (torch_npu 2.10.0.post6 / 2.14.0), per path:
# jit_compile=False (aclnn): Atlas A2/A3 training; jit_compile=True (acl_op): Atlas training, A2, inference.
ROPE_SOCS = {"aclnn": ("A2", "A3"), "acl_op": ("910", "A2", "310P")}


def rope_path() -> str | None:
    """Which torch_npu implementation ``npu_rotary_mul`` runs here (``"aclnn"`` or ``"acl_op"``), or
    None where the SoC is not among those its doc lists for that path."""
    if probe.soc_version() >= probe.SOC_910B1 and _op_api("aclnnRotaryPositionEmbedding"):
        path = "aclnn"  # torch_npu's dispatch
    else:
        path = "acl_op"
    return path if probe.soc_family() in ROPE_SOCS[path] else None


def rope_modes() -> tuple[str, ...]:
    """The ``ascend_kernels.rope`` layouts the installed torch_npu runs as one kernel here."""
    args = probe.op_arguments("npu_rotary_mul")
    if args is None or rope_path() is None:
        return ()
    if "rotary_mode" in args and rope_path() == "aclnn":  # keyword: op-plugin >= 7.0.0
        return ("interleaved", "half")
    return ("half",)


def _rope_layout(x: torch.Tensor, cos4: tuple, layout: str) -> tuple[int, int] | None:
    """(B, N) of x if cos (padded to 4-D) has a cos/sin layout npu_rotary_mul accepts, else None."""
    d0, d1, d2, d3 = x.shape
    if cos4[3] != d3:
        return None
    # (x's (B, N), accepted cos layouts) per x layout; half mode also takes per-batch forms.
    forms = (
        ((d0, d2), [(1, d1, 1, d3)] + ([(d0, d1, 1, d3)] if layout == "half" else [])),  # x BSND
        ((d0, d1), [(1, 1, d2, d3)] + ([(d0, 1, d2, d3)] if layout == "half" else [])),  # x BNSD
        ((d1, d2), [(d0, 1, 1, d3)] + ([(d0, d1, 1, d3)] if layout == "half" else [])),  # x SBND
    )
    for bn, accepted in forms:
        if tuple(cos4) in [tuple(a) for a in accepted]:
            return bn
    return None


def rope_supports(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> bool:
    if layout not in _ROTARY_MODE or x.dim() != 4 or cos.shape != sin.shape or cos.dim() > 4:
        return False
    if not all(_dtype_ok(t.dtype) for t in (x, cos, sin)) or layout not in rope_modes():
        return False
    cos4 = (1,) * (4 - cos.dim()) + tuple(cos.shape)
    bn = _rope_layout(x, cos4, layout)
    if bn is None:
        return False
    b, n = bn
    d = x.shape[-1]
    if rope_path() == "acl_op":
        # acl_op path: half only, D == 128, B and N <= 1000, broadcast axes <= 1024 elements, no bf16.
        broadcast = 1
        for xs, cs in zip(x.shape, cos4):
            broadcast *= xs if cs == 1 else 1
        return (
            d == 128
            and b <= 1000
            and n <= 1000
            and broadcast <= 1024
            and _widest(x.dtype, cos.dtype, sin.dtype) != _BF16
        )
    # aclnn path: D even and < 896; half: B, N < 1000; interleave: B * N < 1000.
    if d % 2 != 0 or d >= 896:
        return False
    return b * n < 1000 if layout == "interleaved" else (b < 1000 and n < 1000)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    shape4 = (1,) * (4 - cos.dim()) + tuple(cos.shape)
    # torch_npu casts mixed tables to x's dtype, rounding fp32 tables to bf16: upcast x instead
    # to keep eager's numerics.
    cdt = _widest(x.dtype, cos.dtype, sin.dtype)
    r1, r2 = cos.reshape(shape4).to(cdt), sin.reshape(shape4).to(cdt)
    xk = x.to(cdt)
    npu = _npu()
    # rotary_mode exists from op-plugin 7.0.0; before, half mode only.
    if "rotary_mode" in (probe.op_arguments("npu_rotary_mul") or ()):
        out = npu.npu_rotary_mul(xk, r1, r2, rotary_mode=_ROTARY_MODE[layout])
    else:
        out = npu.npu_rotary_mul(xk, r1, r2)
    return out if out.dtype == x.dtype else out.to(x.dtype)


# ---------------------------------------------------------------------------------------------
# gelu_tanh / fast_gelu


def gelu_supports(x: torch.Tensor) -> bool:
    return _dtype_ok(x.dtype) and x.dim() <= 8


def gelu_tanh_supports(x: torch.Tensor) -> bool:
    return gelu_supports(x) and probe.has_op("npu_gelu")  # npu_gelu: op-plugin >= 6.0.0


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    # Same function as F.gelu(approximate='tanh'); aten.gelu is one kernel on NPU too, so no speedup.
    return _npu().npu_gelu(x, approximate="tanh")


def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    # A2/A3: x * sigmoid(1.702 x), not the tanh GELU.
    return _npu().npu_fast_gelu(x)


# ---------------------------------------------------------------------------------------------
# mul_add


def _broadcast_shape(*tensors: torch.Tensor) -> torch.Size | None:
    try:
        return torch.broadcast_shapes(*(t.shape for t in tensors))
    except RuntimeError:
        return None


def mul_add_supports(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> bool:
    tensors = (x, y, z)
    if not all(isinstance(t, torch.Tensor) and 1 <= t.dim() <= 8 and _dtype_ok(t.dtype) for t in tensors):
        return False  # zero-dim operands promote differently in aclnnAddcmul than in eager x*y+z
    if _broadcast_shape(*tensors) is None:
        return False
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) == 1:
        return True
    # Mixed dtypes (Wan's bf16 * fp32 gate + fp32): only aclnnAddcmul promotes as eager does.
    if dtypes not in ({_F32, _BF16}, {_F32, _F16}) or not _op_api("aclnnAddcmul"):
        return False
    joint = _widest(*dtypes)
    return joint == result_dtype(x, y, z)  # eager's (x*y)+z promotion, step by step


def mul_add(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    # One aclnnAddcmul call; the full-shape factor goes in as tensor2 so A2/A3 can use AxpyV2.
    out_shape = _broadcast_shape(x, y, z)
    t1, t2 = (y, x) if (x.shape == out_shape and y.shape != out_shape) else (x, y)
    return torch.addcmul(z, t1, t2)


# ---------------------------------------------------------------------------------------------
# adaln_modulate (MindIE SD's AdaLayerNorm)


def _modulation_ok(t: torch.Tensor, x: torch.Tensor) -> bool:
    lead, h = tuple(x.shape[:-2]), x.shape[-1]
    return tuple(t.shape) in (lead + (h,), lead + (1, h)) and _dtype_ok(t.dtype)


def _per_token_ok(t: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``t`` modulates x as the op reads it (``[B.., H]`` as ``[B.., 1, H]``, else
    broadcast) without enlarging x: then it can be laid out as one row per token of x."""
    try:
        return torch.broadcast_shapes(_as_modulation(t, x).shape, x.shape) == x.shape and _dtype_ok(t.dtype)
    except RuntimeError:
        return False


def adaln_supports(x, scale, shift, eps, weight=None, bias=None, out_dtype=None) -> bool:
    # aclnnAdaLayerNorm: A2/A3 only, 2-8 dims, non-empty; per-token modulation runs row by row.
    if not probe.is_a2_a3() or not 2 <= x.dim() <= 8 or x.numel() == 0 or not _dtype_ok(x.dtype):
        return False
    if not all(_modulation_ok(t, x) or _per_token_ok(t, x) for t in (scale, shift)):
        return False
    for t in (weight, bias):
        if t is not None and (tuple(t.shape) != (x.shape[-1],) or not _dtype_ok(t.dtype)):
            return False
    return out_dtype is None or _dtype_ok(out_dtype)


def adaln(x, scale, shift, eps, weight=None, bias=None, out_dtype=None) -> torch.Tensor:
    """``ascend_kernels.adaln_modulate`` (same signature) through MindIE SD's AdaLayerNorm."""
    if not (_modulation_ok(scale, x) and _modulation_ok(shift, x)):
        # Per-token modulation: every token becomes a batch entry of one token ([N, 1, H]); the
        # norm is over H only, so the rows are independent.
        h = x.shape[-1]
        rows = lambda t: _as_modulation(t, x).expand(x.shape).reshape(-1, h)  # noqa: E731
        return adaln(x.reshape(-1, 1, h), rows(scale), rows(shift), eps, weight, bias, out_dtype).reshape(x.shape)
    # The kernel wants one dtype: run in the widest input/output dtype (Wan: fp32 modulation) and cast.
    cdt = _widest(x.dtype, scale.dtype, shift.dtype, *(t.dtype for t in (weight, bias) if t is not None), out_dtype)
    cast = lambda t: None if t is None else t.to(cdt)  # noqa: E731  (no copy when already cdt)
    # mindiesd.adaln -> aclnnAdaLayerNorm: LayerNorm(x) * (1 + scale) + shift.
    out = torch.ops.mindiesd.adaln(  # registered when mindiesd is imported (available())
        x=cast(x), scale=cast(scale), shift=cast(shift), weight=cast(weight), bias=cast(bias), epsilon=eps
    )
    want = out_dtype or x.dtype
    return out if out.dtype == want else out.to(want)


# ---------------------------------------------------------------------------------------------
# swiglu


def swiglu_kernel() -> bool:
    """Whether ``npu_swiglu`` runs here: it has no acl_op fallback, so it needs aclnnSwiGlu, and its doc
    lists Atlas A2 only."""
    return probe.is_a2() and probe.has_op("npu_swiglu") and probe.aclnn_available("aclnnSwiGlu")


def swiglu_supports(x: torch.Tensor, up: torch.Tensor | None = None, dim: int = -1) -> bool:
    if not swiglu_kernel():
        return False
    if not (1 <= x.dim() <= 8 and x.numel() > 0 and _dtype_ok(x.dtype)):
        return False
    if up is None:
        return -x.dim() <= dim < x.dim() and x.shape[dim] % 2 == 0
    # Two tensors are concatenated first (a copy): worth it in bf16/fp16, where the composite
    # casts; in fp32 the composite is two launches with no copy.
    return dim == -1 and up.shape == x.shape and up.dtype == x.dtype and x.dtype != _F32


def swiglu(x: torch.Tensor, up: torch.Tensor | None = None, dim: int = -1) -> torch.Tensor:
    """``ascend_kernels.swiglu`` (same signature) through one ``npu_swiglu`` call."""
    if up is not None:
        x, dim = torch.cat((x, up), dim=-1), -1  # [gate, up]: the layout the kernel reads
    # npu_swiglu: silu(first half) * second half along dim; needs a contiguous input.
    return _npu().npu_swiglu(x.contiguous(), dim=dim)
