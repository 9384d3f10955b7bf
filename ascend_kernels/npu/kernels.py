"""The torch_npu / CANN calls behind the ``npu`` providers, each with the contract it relies on.

Contracts are read from the Ascend op-plugin sources and docs (``op_plugin/config/
op_plugin_functions.yaml``, ``op_plugin/ops/{opapi,aclops}/*.cpp``,
``docs/zh/custom_APIs/torch_npu/torch_npu-<op>.md``), CANN's op docs (hicann ops-nn / ops-math)
and MindIE SD (``csrc/plugin``); docs/npu-notes.md lists each with its source. ``*_supports``
return False for arguments outside a kernel's documented limits or where the installed stack would
take a path that fails (old schema, SoC, ``jit_compile=True``, a CANN without the aclnn kernel,
see `ascend_kernels.npu.probe`), so the registry falls back to the native provider instead.

Precision: every ``ascend_kernels`` op computes in fp32. Where a kernel needs all inputs in one
dtype and an input is wider than the others (fp32 rope tables or adaLN modulation with bf16 x), the
provider runs the kernel in the widest dtype (upcasting the narrower inputs, exact) and casts the
result: the eager Flux/Wan numerics, at the cost of the casts (counted in the docs).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from ..ops.adaln import _as_modulation
from ..ops.mul_add import result_dtype
from . import probe

__all__ = [
    "adaln",
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


def _widest(*dtypes: Optional[torch.dtype]) -> torch.dtype:
    """torch's promotion over fp16/bf16/fp32 (fp16 with bf16 gives fp32), without a dispatcher
    call (``torch.promote_types`` is an aten op: Python overhead on every fused call)."""
    present = {d for d in dtypes if d is not None}
    if len(present) == 1:
        return present.pop()
    return _F32 if present <= set(_DTYPES) else functools.reduce(torch.promote_types, present)


def _op_api(api: str) -> bool:
    """Whether torch_npu takes the aclnn (``op_api``) path for this op: jit compile off and the
    aclnn kernel present (else the ``acl_op`` fallback runs)."""
    return not probe.jit_compile() and probe.aclnn_available(api)


def _not_wider(out_dtype: Optional[torch.dtype], dtype: torch.dtype) -> bool:
    # The kernels return x's dtype; a wider requested dtype (bf16 in, fp32 out) would lose the
    # fp32 precision the op promises, so such calls go to the native provider.
    return out_dtype is None or (out_dtype.is_floating_point and _bits(out_dtype) <= _bits(dtype))


# ---------------------------------------------------------------------------------------------
# rms_norm


def _rms_gamma_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The gamma dtype npu_rms_norm accepts for this x.

    A2/A3 through aclnnRmsNorm (doc table of torch_npu-npu_rms_norm.md): (fp16|bf16 x, fp32 gamma)
    or gamma in x's dtype. So a weight of another dtype goes in as fp32 there (exact for fp32,
    bf16 and fp16 weights: the precision the native provider applies it in). Elsewhere (older
    parts, or ``jit_compile=True`` / no aclnnRmsNorm, where the acl_op ``RmsNorm`` runs): x's dtype.
    """
    if weight.dtype == x.dtype:
        return x.dtype
    if x.dtype in (_F16, _BF16) and probe.is_a2_a3() and _op_api("aclnnRmsNorm"):
        return _F32
    return x.dtype


def rms_norm_supports(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, out_dtype=None) -> bool:
    return (
        _dtype_ok(x.dtype)
        and 2 <= x.dim() <= 8
        and (weight is None or (tuple(weight.shape) == (x.shape[-1],) and weight.dtype in _DTYPES))
        and _not_wider(out_dtype, x.dtype)
    )


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, out_dtype=None) -> torch.Tensor:
    if weight is None:
        gamma = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    else:
        gamma = weight.to(_rms_gamma_dtype(x, weight))  # no copy when the dtype already fits
    # torch_npu.npu_rms_norm(self, gamma, epsilon=1e-06) -> (y, rstd)   [op-plugin, all versions]
    #   y = self / sqrt(mean(self**2, -1) + epsilon) * gamma (fp32 inside), dtype of self;
    #   rstd fp32 (for the backward). self 2-8 dims; gamma = self.shape[n:], here (D,).
    #   gamma dtype: A2/A3 (aclnnRmsNorm): fp32 with fp16/bf16 self, or self's dtype.
    y = _npu().npu_rms_norm(x, gamma, epsilon=eps)[0]
    return y if out_dtype is None or out_dtype == y.dtype else y.to(out_dtype)


# ---------------------------------------------------------------------------------------------
# rope

_ROTARY_MODE = {"interleaved": "interleave", "half": "half"}


def rope_path() -> str:
    """Which torch_npu implementation ``npu_rotary_mul`` runs here: ``"aclnn"`` or ``"acl_op"``.

    op_api ``npu_rotary_mul`` (RotaryMulKernelNpuOpApi.cpp) calls aclnnRotaryPositionEmbedding on
    SoC >= Ascend910B1 when the symbol exists; older SoCs, ``jit_compile=True`` or a CANN without
    it run ``acl_op::npu_rotary_mul`` (RotaryMulKernelNpu.cpp), which accepts only ``"half"``.
    """
    if probe.soc_version() >= probe.SOC_910B1 and _op_api("aclnnRotaryPositionEmbedding"):
        return "aclnn"
    return "acl_op"


def rope_modes() -> tuple[str, ...]:
    """The ``ascend_kernels.rope`` layouts the installed torch_npu runs as one kernel here."""
    args = probe.op_arguments("npu_rotary_mul")
    if args is None:
        return ()
    if "rotary_mode" in args and rope_path() == "aclnn":  # keyword: op-plugin >= 7.0.0
        return ("interleaved", "half")
    return ("half",)


def _rope_layout(x: torch.Tensor, cos4: tuple, layout: str) -> Optional[tuple[int, int]]:
    """(B, N) of x if cos (padded to 4-D) has a cos/sin layout npu_rotary_mul accepts, else None."""
    d0, d1, d2, d3 = x.shape
    if cos4[3] != d3:
        return None
    # (x layout, its (B, N), cos layouts accepted). interleave mode: 1S1D / 11SD / S11D only;
    # half mode also accepts the per-batch forms BS1D / B1SD / SB1D.
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
        # jit_compile=True doc (A2 and older): half only, 4-D, B and N <= 1000, D == 128, the
        # broadcast axes of r1/r2 at most 1024 elements in total; dtypes: fp16/fp32 (no bf16
        # kernel documented there).
        broadcast = 1
        for xs, cs in zip(x.shape, cos4):
            broadcast *= xs if cs == 1 else 1
        return d == 128 and b <= 1000 and n <= 1000 and broadcast <= 1024 and _widest(x.dtype, cos.dtype, sin.dtype) != _BF16
    # jit_compile=False doc (A2/A3, aclnnRotaryPositionEmbedding): D even and < 896;
    # half: B, N < 1000; interleave: B * N < 1000.
    if d % 2 != 0 or d >= 896:
        return False
    return b * n < 1000 if layout == "interleaved" else (b < 1000 and n < 1000)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    shape4 = (1,) * (4 - cos.dim()) + tuple(cos.shape)
    # One dtype for the kernel: the widest of x, cos, sin. op_api npu_rotary_mul casts mixed r1/r2
    # to self's dtype itself (isRotaryMulMixDtypeSupport), which would round fp32 cos/sin tables to
    # bf16 (max error at Flux size 0.025 instead of eager's 0.016): with fp32 tables and bf16 x the
    # kernel runs in fp32 on an upcast x, which reproduces the eager Flux/Wan numerics.
    cdt = _widest(x.dtype, cos.dtype, sin.dtype)
    r1, r2 = cos.reshape(shape4).to(cdt), sin.reshape(shape4).to(cdt)
    xk = x.to(cdt)
    npu = _npu()
    # torch_npu.npu_rotary_mul(self, r1, r2, rotary_mode='half'[, rotate=None]) -> Tensor
    #   out = r1 * self + r2 * rotate(self); 'half': rotate = cat(-x2, x1) of chunk(2, -1);
    #   'interleave': rotate = stack(-x[..., 1::2], x[..., ::2], -1) flattened (pairs).
    #   rotary_mode exists from op-plugin 7.0.0; before, the schema is (self, r1, r2), half only.
    #   Limits: see rope_supports. Output: shape and dtype of self.
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
    # torch_npu.npu_gelu(self, *, approximate='none'|'tanh') -> Tensor   [aclnnGeluV2]
    #   'tanh' is the tanh approximation, as F.gelu(approximate="tanh"); fp16/fp32 (+bf16 on A2),
    #   ND, at most 8 dims; output: shape and dtype of input. The unfused aten.gelu is one kernel
    #   on NPU too (the doc: torch's gelu ignores `approximate` there and runs tanh), so this
    #   provider is not faster_than_unfused.
    return _npu().npu_gelu(x, approximate="tanh")


def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    # torch_npu.npu_fast_gelu(self) -> Tensor
    #   A2/A3: x / (1 + exp(-1.702 x)) = x * sigmoid(1.702 x) (older Atlas training/inference
    #   products use a different formula); fp16/fp32/bf16 on A2/A3, ND, at most 8 dims.
    return _npu().npu_fast_gelu(x)


# ---------------------------------------------------------------------------------------------
# mul_add


def _broadcast_shape(*tensors: torch.Tensor) -> Optional[torch.Size]:
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
    # Mixed dtypes (Wan: bf16 y times fp32 gate plus fp32 residual): only aclnnAddcmul promotes
    # them (op_api addcmul: out dtype = at::native::result_type({self, t1, t2}), the inputs cast
    # to it inside aclnnAddcmul); acl_op addcmul returns self's dtype. An fp16 x bf16 mix is not
    # documented on either side: native.
    if dtypes not in ({_F32, _BF16}, {_F32, _F16}) or not _op_api("aclnnAddcmul"):
        return False
    joint = _widest(*dtypes)
    return joint == result_dtype(x, y, z)  # eager's (x*y)+z promotion, step by step


def mul_add(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    # torch.addcmul(self, tensor1, tensor2, *, value=1) = self + tensor1 * tensor2: one aclnnAddcmul
    #   call (hicann ops-math math/addcmul/op_api/aclnn_addcmul.cpp). Inside it an input whose
    #   dtype differs from the promoted one gets an l0 Cast, then one Addcmul kernel, or AxpyV2
    #   when value == 1 on A2/A3 and tensor2 broadcasts to self. So the full-shape factor goes in
    #   as tensor2 (x * y == y * x exactly). Computed in fp32 for bf16/fp16 (one rounding).
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
    # aclnnAdaLayerNorm (hicann ops-nn norm/ada_layer_norm): Atlas A2/A3 only; x [B.., S, H] with
    # 0-6 batch dims (2-8 dims), no empty tensors; scale/shift [B.., H] or [B.., 1, H] with x's
    # batch dims; weight/bias [H]; all in one dtype of fp32/fp16/bf16 (the provider casts up).
    # Per-token modulation ([B, S, H]: Wan 2.2 TI2V, Qwen-Image-Edit) fits as one row per token.
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
        # Per-token modulation: the kernel takes one (scale, shift) row per batch entry, so every
        # token becomes a batch entry of one token: x [B.., S, H] -> [N, 1, H], scale/shift ->
        # [N, H] (N = B..*S rows; a view for contiguous tensors, a copy for one that broadcasts).
        # LayerNorm is over H only, so the rows are independent and the result is x's, reshaped.
        h = x.shape[-1]
        rows = lambda t: _as_modulation(t, x).expand(x.shape).reshape(-1, h)  # noqa: E731
        return adaln(x.reshape(-1, 1, h), rows(scale), rows(shift), eps, weight, bias, out_dtype).reshape(x.shape)
    # The kernel needs every tensor in x's dtype and returns x's dtype. Run it in the widest dtype
    # of the inputs and of the requested output: Flux (all bf16) is one call; Wan (bf16 x, fp32
    # scale/shift, computed in fp32 by the eager code) upcasts x, runs in fp32, casts the result.
    cdt = _widest(x.dtype, scale.dtype, shift.dtype, *(t.dtype for t in (weight, bias) if t is not None), out_dtype)
    cast = lambda t: None if t is None else t.to(cdt)  # noqa: E731  (no copy when already cdt)
    # torch.ops.mindiesd.adaln(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None,
    #   Tensor? bias=None, float? epsilon=1e-5) -> Tensor    [MindIE SD csrc/plugin/register_ops.cpp,
    #   adalayernorm.cpp: EXEC_NPU_CMD aclnnAdaLayerNorm; out = LayerNorm(x) * (1 + scale) + shift]
    out = torch.ops.mindiesd.adaln(  # registered when mindiesd is imported (available())
        x=cast(x), scale=cast(scale), shift=cast(shift), weight=cast(weight), bias=cast(bias), epsilon=eps
    )
    want = out_dtype or x.dtype
    return out if out.dtype == want else out.to(want)


# ---------------------------------------------------------------------------------------------
# swiglu


def swiglu_kernel() -> bool:
    """Whether ``npu_swiglu`` runs here: the op in torch_npu, aclnnSwiGlu in CANN (op-plugin has
    only the op_api implementation, SwigluKernelNpuOpApi.cpp: no acl_op kernel to fall back to,
    whatever jit_compile says) and an Atlas A2/A3 part (the SoCs its docs list with bf16)."""
    return probe.is_a2_a3() and probe.has_op("npu_swiglu") and probe.aclnn_available("aclnnSwiGlu")


def swiglu_supports(x: torch.Tensor, up: Optional[torch.Tensor] = None, dim: int = -1) -> bool:
    # aclnnSwiGlu: x 1-8 dims, non-empty, even along dim; fp16/bf16/fp32.
    if not swiglu_kernel():
        return False
    if not (1 <= x.dim() <= 8 and x.numel() > 0 and _dtype_ok(x.dtype)):
        return False
    if up is None:
        return -x.dim() <= dim < x.dim() and x.shape[dim] % 2 == 0
    # Two tensors (a separate up projection, or diffusers' SwiGLU whose gate is the second half):
    # the kernel gates the first half of ONE tensor, so they are concatenated first (a copy).
    # In bf16/fp16 that copy and the kernel are 2 launches where the fp32 reference composite
    # needs 5 (two upcasts, silu, mul, cast back); in fp32 the composite is silu and mul on the
    # inputs as they are (2 launches, no copy): native.
    return dim == -1 and up.shape == x.shape and up.dtype == x.dtype and x.dtype != _F32


def swiglu(x: torch.Tensor, up: Optional[torch.Tensor] = None, dim: int = -1) -> torch.Tensor:
    """``ascend_kernels.swiglu`` (same signature) through one ``npu_swiglu`` call."""
    if up is not None:
        x, dim = torch.cat((x, up), dim=-1), -1  # [gate, up]: the layout the kernel reads
    # torch_npu.npu_swiglu(Tensor self, int dim=-1) -> Tensor    [aclnnSwiGlu]
    #   out = silu(A) * B, A the FIRST and B the second half of self along dim (torch_npu-npu_swiglu.md,
    #   aclnnSwiGlu.md); self 1-8 dims, size along dim even, contiguous, not empty; fp16/bf16/fp32
    #   on A2/A3. Output: self's dtype, self's shape with dim halved.
    return _npu().npu_swiglu(x.contiguous(), dim=dim)
