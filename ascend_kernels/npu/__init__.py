"""``npu`` providers: the ``ascend_kernels`` ops on Ascend NPUs through torch_npu / CANN kernels.

torch_npu and mindiesd are imported lazily, only when an op runs on an NPU tensor. Each provider's
``supports_args`` encodes the kernel's documented limits and what the install offers (`probe`);
other calls fall back to the native provider. The op -> kernel table is in docs/npu-notes.md.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from types import ModuleType

from ..registry import Provider, register_provider
from . import kernels, probe, quant

__all__ = [
    "DEVICE_TYPES",
    "mindiesd_available",
    "mindiesd_torch_unsupported",
    "mindiesd_unavailable_reason",
    "runs_on",
    "torch_npu_available",
]

# Device types the torch_npu kernels run on (contract tests widen it to "cpu" with a stand-in torch_npu).
DEVICE_TYPES: tuple[str, ...] = ("npu",)


def runs_on(device_type: str) -> bool:
    """Whether the torch_npu providers can take tensors of ``device_type``."""
    return device_type in DEVICE_TYPES


@functools.cache
def _import_error(name: str) -> str | None:
    """None when `name` imports; else why not: ``"not installed"`` or what its import raised."""
    if importlib.util.find_spec(name) is None:
        return "not installed"
    try:
        importlib.import_module(name)
    except Exception as e:  # a broken install is "not available", never an import-time error
        return f"{type(e).__name__}: {e}"
    return None


def _importable(name: str) -> bool:
    return _import_error(name) is None


def torch_npu_available() -> bool:
    """Whether torch_npu is (or can be) imported; imports it on first call if installed."""
    return sys.modules.get("torch_npu") is not None or _importable("torch_npu")


def torch_npu() -> ModuleType:
    """The torch_npu module (imported on first use)."""
    return importlib.import_module("torch_npu")


def _mindiesd_adaln_registered() -> bool:
    import torch

    try:
        schema = torch.ops.mindiesd.adaln.default._schema
    except (AttributeError, RuntimeError):
        return False
    # The signature kernels.adaln calls with (MindIE SD csrc/plugin/register_ops.cpp).
    return [a.name for a in schema.arguments] == ["x", "scale", "shift", "weight", "bias", "epsilon"]


def mindiesd_unavailable_reason() -> str | None:
    """Why MindIE SD's ``torch.ops.mindiesd.adaln`` cannot be used here, or None when it can.

    MindIE SD's op plugin is built against one torch / torch_npu release, so importing it elsewhere
    raises: a reason reported by ``diffusers-ascend env``, never an error. Importing it prepends its
    kernel directories to ``ASCEND_CUSTOM_OPP_PATH`` (its own design).

    >>> from ascend_kernels.npu import mindiesd_unavailable_reason
    >>> why = mindiesd_unavailable_reason()  # 'torch_npu not installed' on a machine without NPU
    >>> why is None or why.startswith(("torch_npu", "mindiesd"))
    True
    """
    if not torch_npu_available():
        return "torch_npu not installed"
    if sys.modules.get("mindiesd") is None:
        unsupported = mindiesd_torch_unsupported()
        if unsupported is not None:
            return unsupported
        error = _import_error("mindiesd")
        if error == "not installed":
            return "mindiesd not installed (pip install diffusers-ascend[mindiesd])"
        if error is not None:
            import torch

            return (
                f"mindiesd {_dist_version('mindiesd') or '(version unknown)'} is installed but raised at import "
                f"({error}): its op plugin is built for some torch releases only and this is torch "
                f"{torch.__version__}; install the MindIE SD build for this torch"
            )
    if not _mindiesd_adaln_registered():
        return "mindiesd registered no torch.ops.mindiesd.adaln(x, scale, shift, weight, bias, epsilon)"
    return None


@functools.cache
def mindiesd_torch_unsupported() -> str | None:
    """Why the installed MindIE SD cannot load on this torch, or None (not installed, or it can).

    Read from its ``_torch_variants.py`` without importing it: its import edits
    ``ASCEND_CUSTOM_OPP_PATH`` and, on an NPU host, raises ``RuntimeError("Unsupported torch
    version ...")`` outside its plugin variants (3.1.0 ships torch 2.7 and 2.9-2.13). Cached per process.

    Returns:
        the reason, naming the torch releases it supports and this one; None otherwise.

    >>> from ascend_kernels.npu import mindiesd_torch_unsupported
    >>> mindiesd_torch_unsupported() is None  # no mindiesd installed here
    True
    """
    import ast

    import torch

    spec = importlib.util.find_spec("mindiesd")
    origin = getattr(spec, "origin", None)
    if not origin:
        return None
    path = os.path.join(os.path.dirname(origin), "_torch_variants.py")
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
        variants = next(
            ast.literal_eval(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "SUPPORTED_TORCH_PLUGIN_VARIANTS"
        )
    except (OSError, SyntaxError, ValueError, StopIteration):
        return None  # an older MindIE SD without variants: its import decides
    torch_mm = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if torch_mm in variants:
        return None
    listed = ", ".join(sorted(variants, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit())))
    return (
        f"mindiesd {_dist_version('mindiesd') or '(version unknown)'} has op plugins for torch {listed} "
        f"only and this is torch {torch.__version__} (its import raises RuntimeError('Unsupported torch version')); "
        "install a torch it supports or a MindIE SD release built for this torch"
    )


def mindiesd_available() -> bool:
    """Whether MindIE SD is importable and registered ``torch.ops.mindiesd.adaln``."""
    return mindiesd_unavailable_reason() is None


def _dist_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _desc_rms_norm() -> str:
    if not torch_npu_available():
        return "torch_npu not installed"
    import torch

    fp32 = kernels._op_api("aclnnRmsNorm") and probe.rms_norm_fp32_gamma(torch.bfloat16)
    mixed = (
        "fp32 gamma taken with bf16/fp16 x (probed on this device)"
        if fp32
        else "gamma in x's dtype (torch_npu's doc; other weights: kernel in fp32)"
    )
    return f"torch_npu.npu_rms_norm ({_stack()}; {mixed})"


def _desc_add_rms_norm() -> str:
    if not torch_npu_available():
        return "torch_npu not installed"
    if not probe.has_op("npu_add_rms_norm"):
        return "torch_npu has no npu_add_rms_norm"
    return f"torch_npu.npu_add_rms_norm (aclnnAddRmsNorm: residual sum and its RMSNorm in one kernel; {_stack()})"


def _desc_rope() -> str:
    if not torch_npu_available():
        return "torch_npu not installed"
    args = probe.op_arguments("npu_rotary_mul")
    if args is None:
        return "torch_npu has no npu_rotary_mul"
    schema = "rotary_mode keyword" if "rotary_mode" in args else "no rotary_mode keyword (op-plugin < 7.0.0)"
    if kernels.rope_path() is None:
        return (
            f"SoC {probe.soc_name()} ({probe.soc_family()}) is not among the SoCs npu_rotary_mul's doc lists "
            f"({_stack()}): native"
        )
    modes = kernels.rope_modes()
    tail = "" if "interleaved" in modes else "; interleaved (Flux/Wan) falls back to native"
    return f"torch_npu.npu_rotary_mul, {'/'.join(modes) or 'no'} mode(s) via {kernels.rope_path()} ({schema}; {_stack()}){tail}"


def _desc_gelu_tanh() -> str:
    if not torch_npu_available():
        return "torch_npu not installed"
    if not probe.has_op("npu_gelu"):
        return "torch_npu has no npu_gelu (op-plugin < 6.0.0)"
    return "torch_npu.npu_gelu(approximate='tanh'); the unfused aten.gelu is already one aclnnGelu kernel on NPU"


def _desc_fast_gelu() -> str:
    if not torch_npu_available():
        return "torch_npu not installed"
    return "torch_npu.npu_fast_gelu (x*sigmoid(1.702x): changes numerics, applied only when named)"


def _desc_mul_add() -> str:
    if not torch_npu_available():
        return "torch_npu not installed"
    mixed = (
        "bf16/fp16 with fp32 promoted in the call"
        if kernels._op_api("aclnnAddcmul")
        else "one dtype only (acl_op addcmul)"
    )
    return f"torch.addcmul, one aclnnAddcmul call ({mixed})"


def _desc_adaln() -> str:
    if not torch_npu_available():
        return "torch_npu not installed"
    why = mindiesd_unavailable_reason()
    if why is not None:
        return f"unavailable, because {why}"
    soc = "" if probe.is_a2_a3() else f"; SoC {probe.soc_name()} is not A2/A3: native"
    return f"torch.ops.mindiesd.adaln (CANN aclnnAdaLayerNorm via MindIE SD){soc}"


def _desc_swiglu() -> str:
    if not torch_npu_available():
        return "torch_npu not installed"
    if not probe.has_op("npu_swiglu"):
        return "torch_npu has no npu_swiglu"
    if not probe.aclnn_available("aclnnSwiGlu"):
        return "CANN has no aclnnSwiGlu: native"
    if not probe.is_a2():
        return f"SoC {probe.soc_name()} is not Atlas A2, the only SoC npu_swiglu's doc lists: native"
    return (
        "torch_npu.npu_swiglu (aclnnSwiGlu; packed [gate, up] halves in one call, a separate gate "
        "and up concatenated first in bf16/fp16)"
    )


def _stack() -> str:
    return f"SoC {probe.soc_name()}, jit_compile={probe.jit_compile()}"


def _provider(op, impl, supports, describe, available=torch_npu_available, **kw) -> Provider:
    return Provider(
        op, "npu", impl, runs_on=runs_on, available=available, supports_args=supports, describe=describe, **kw
    )


def _aclnn(api: str):
    """`Provider.capturable`: NPU graphs capture aclnn kernels only, not the acl_op fallback."""
    return lambda *args: kernels._op_api(api)


for _p in (
    _provider(
        "rms_norm", kernels.rms_norm, kernels.rms_norm_supports, _desc_rms_norm, capturable=_aclnn("aclnnRmsNorm")
    ),
    _provider(
        "add_rms_norm",
        kernels.add_rms_norm,
        kernels.add_rms_norm_supports,
        _desc_add_rms_norm,
        available=lambda: torch_npu_available() and probe.has_op("npu_add_rms_norm"),
        capturable=_aclnn("aclnnAddRmsNorm"),
    ),
    # Flux and Wan use the interleaved layout: without it the fusion gains nothing, so "auto" skips it.
    _provider(
        "rope",
        kernels.rope,
        kernels.rope_supports,
        _desc_rope,
        faster_than_unfused=lambda: "interleaved" in kernels.rope_modes(),
        capturable=lambda *args: kernels.rope_path() == "aclnn",
    ),
    _provider(
        "gelu_tanh",
        kernels.gelu_tanh,
        kernels.gelu_tanh_supports,
        _desc_gelu_tanh,
        faster_than_unfused=False,
        capturable=lambda *args: not probe.jit_compile(),
    ),
    _provider(
        "fast_gelu",
        kernels.fast_gelu,
        kernels.gelu_supports,
        _desc_fast_gelu,
        capturable=lambda *args: not probe.jit_compile(),
    ),
    _provider("mul_add", kernels.mul_add, kernels.mul_add_supports, _desc_mul_add, capturable=_aclnn("aclnnAddcmul")),
    # The packed SwiGLU is one kernel for silu and mul, and reads x once.
    _provider(
        "swiglu",
        kernels.swiglu,
        kernels.swiglu_supports,
        _desc_swiglu,
        faster_than_unfused=kernels.swiglu_kernel,
        capturable=_aclnn("aclnnSwiGlu"),
    ),
    _provider(
        "adaln_modulate",
        kernels.adaln,
        kernels.adaln_supports,
        _desc_adaln,
        available=mindiesd_available,
        extras=("mindiesd",),
        faster_than_unfused=probe.is_a2_a3,  # aclnnAdaLayerNorm: A2/A3 only
    ),
    # torchao's int8 linears (#44): the quantized matmul kernels, documented for A2/A3, op_api only.
    _provider(
        "int8_dynamic_linear",
        quant.int8_dynamic_linear,
        quant.int8_dynamic_linear_supports,
        quant.describe_dynamic,
        available=lambda: torch_npu_available() and probe.has_op("npu_quant_matmul"),
        faster_than_unfused=probe.is_a2_a3,
        capturable=lambda *args: not probe.jit_compile(),
    ),
    _provider(
        "int8_weight_only_linear",
        quant.int8_weight_only_linear,
        quant.int8_weight_only_linear_supports,
        quant.describe_weight_only,
        available=lambda: torch_npu_available() and probe.has_op("npu_weight_quant_batchmatmul"),
        faster_than_unfused=probe.is_a2_a3,
        capturable=lambda *args: not probe.jit_compile(),
    ),
):
    register_provider(_p)
