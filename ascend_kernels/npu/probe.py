"""What the installed Ascend stack offers: torch_npu op schemas, SoC, compile mode, aclnn symbols.

The npu providers' ``supports_args`` ask these so that a call goes to the native provider where
the torch_npu call would fail or run out of contract. Everything is read from the install, never
from version numbers (they do not name the op-plugin release); docs/npu-notes.md says where each
fact comes from. SoC, schemas and symbols are cached per process (`cache_clear` drops them); the
compile mode can change at run time and is read on every call.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib
import os

__all__ = [
    "SOC_910B1",
    "aclnn_available",
    "cache_clear",
    "has_op",
    "is_a2",
    "is_a2_a3",
    "jit_compile",
    "op_arguments",
    "rms_norm_fp32_gamma",
    "soc_family",
    "soc_name",
    "soc_version",
]

# c10_npu::SocVersion values (torch_npu/include/.../NpuVariables.h in the wheels). The families the
# op docs name are the wheels' own SoC detection (torch_npu's Inductor `Soc`: A2 = [220, 240),
# A3 = [250, 260), A5 >= 260); Ascend910B1.. are A2 ("Ascend910B" = 104 is the older Atlas training part).
SOC_910B1 = 220  # first Atlas A2 part; op_api kernels of npu_rotary_mul need >= this
_FAMILIES = (  # [first, end) SocVersion -> the product family the docs name
    (100, 200, "910"),  # Ascend910PremiumA .. Ascend910B: Atlas training series
    (200, 220, "310P"),  # Atlas inference series
    (220, 240, "A2"),  # Ascend910B1 .. Ascend910B4_1: Atlas A2 training / 800I A2 inference
    (240, 250, "310B"),  # Atlas 200I/500 A2 inference
    (250, 260, "A3"),  # Ascend910_93xx: Atlas A3 training / inference
    (260, 1 << 30, "A5"),  # Ascend950
)


def _torch_npu():
    return importlib.import_module("torch_npu")


@functools.cache
def op_arguments(op: str) -> tuple[str, ...] | None:
    """Argument names of ``torch_npu.<op>``'s default overload, or None if torch_npu has no such op.

    >>> op_arguments("npu_rotary_mul")  # doctest: +SKIP
    ('self', 'r1', 'r2', 'rotary_mode', 'rotate')
    """
    packet = getattr(_torch_npu(), op, None)
    if packet is None:
        return None
    schema = getattr(getattr(packet, "default", None), "_schema", None)
    if schema is None:  # not an OpOverloadPacket: fall back to the registered op
        import torch

        try:
            schema = getattr(torch.ops.npu, op).default._schema
        except (AttributeError, RuntimeError):
            return ()
    return tuple(a.name for a in schema.arguments)


def has_op(op: str) -> bool:
    """Whether the installed torch_npu exposes ``torch_npu.<op>``."""
    return op_arguments(op) is not None


@functools.cache
def soc_version() -> int:
    """``c10_npu::SocVersion`` of the current device (-1 when torch_npu cannot tell)."""
    try:
        return int(_torch_npu().npu.get_soc_version())
    except Exception:  # no device / older torch_npu: "unknown" gates every SoC-dependent path off
        return -1


@functools.cache
def soc_name() -> str:
    """The SoC name (e.g. ``"Ascend910B2"``), or ``"unknown"``."""
    try:
        return str(_torch_npu().npu.get_device_name())
    except Exception:
        return "unknown"


def soc_family(soc: int | None = None) -> str:
    """The product family the torch_npu docs name for a SocVersion: ``"A2"`` (Ascend910B1..),
    ``"A3"`` (Ascend910_93..), ``"A5"``, ``"910"``, ``"310P"``, ``"310B"`` or ``"unknown"``.

    >>> soc_family(221), soc_family(250), soc_family(104)  # Ascend910B2, Ascend910_9391, Ascend910B
    ('A2', 'A3', '910')
    """
    soc = soc_version() if soc is None else soc
    return next((fam for lo, hi, fam in _FAMILIES if lo <= soc < hi), "unknown")


def is_a2_a3(soc: int | None = None) -> bool:
    """Atlas A2 (910B) or A3 (910_93) training/inference parts: the targets of the aclnn docs."""
    return soc_family(soc) in ("A2", "A3")


def is_a2(soc: int | None = None) -> bool:
    """Atlas A2 (Ascend910B1..): the only family some docs list (``npu_swiglu``)."""
    return soc_family(soc) == "A2"


def jit_compile() -> bool:
    """Whether torch_npu runs with ``jit_compile=True`` (``acl_op`` kernels); unknown counts as True."""
    try:
        return not bool(_torch_npu().npu.is_jit_compile_false())
    except Exception:
        return True


# What torch_npu's aclnn lookup (op-plugin GetOpApiFuncAddr) opens after the custom libraries, in
# its order; the names are the strings of libtorch_npu.so (tests/kernels/npu_contracts.json).
_FEATURE_LIBRARIES = (
    "libaclnn_ops_infer.so",
    "libaclnn_ops_train.so",
    "libaclnn_math.so",
    "libaclnn_sparse.so",
    "libaclnn_fft.so",
    "libaclnn_rand.so",
)


def _vendor_dirs() -> list[str]:
    """``op_api/lib`` of each custom op package: ``ASCEND_CUSTOM_OPP_PATH`` entries, then the vendors
    ``$ASCEND_OPP_PATH/vendors/config.ini`` lists under ``load_priority`` (MindIE SD adds its own)."""
    dirs = [os.path.join(p, "op_api", "lib") for p in os.environ.get("ASCEND_CUSTOM_OPP_PATH", "").split(":") if p]
    opp = os.environ.get("ASCEND_OPP_PATH")
    if opp:
        try:
            with open(os.path.join(opp, "vendors", "config.ini")) as f:
                line = next((ln for ln in f if ln.startswith("load_priority=")), "")
        except OSError:
            line = ""
        dirs += [
            os.path.join(opp, "vendors", v.strip(), "op_api", "lib")
            for v in line[len("load_priority=") :].split(",")
            if v.strip()
        ]
    return dirs


def _op_api_libraries() -> list[str]:
    """The libraries torch_npu searches for an aclnn symbol: custom ``libcust_opapi.so`` first,
    then ``libopapi.so`` (and CANN's split ``libopapi_*.so``), then the ``libaclnn_*.so`` feature libraries."""
    names = [os.path.join(d, "libcust_opapi.so") for d in _vendor_dirs()] + ["libcust_opapi.so", "libopapi.so"]
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    if home:
        names += sorted(glob.glob(os.path.join(home, "lib64", "libopapi*.so")))
    return names + list(_FEATURE_LIBRARIES)


@functools.cache
def _open(name: str):
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.cache
def aclnn_available(api: str) -> bool:
    """Whether ``aclnn<Op>`` and ``aclnn<Op>GetWorkspaceSize`` are in the CANN op-api libraries
    (torch_npu's ``DO_COMPATIBILITY`` takes the ``acl_op`` path when either is missing)."""
    for lib in filter(None, map(_open, _op_api_libraries())):
        if hasattr(lib, api) and hasattr(lib, api + "GetWorkspaceSize"):
            return True
    return False


def rms_norm_fp32_gamma(dtype) -> bool:
    """Whether this device's ``npu_rms_norm`` takes an fp32 gamma with ``dtype`` (fp16/bf16) input.

    The torch_npu 2.10/2.14 docs say gamma's dtype must equal the input's; the op-plugin page and
    aclnnRmsNorm list fp32 gamma with bf16/fp16 input on A2/A3. Only the device settles it: one small
    call on the current NPU, compared with the fp32 reference, once per process and dtype. False
    without a real NPU (CPU, stand-ins): never assumed. Never asked during a graph capture (the
    probe synchronizes): False there until an eager call has asked.
    """
    import torch

    npu = getattr(torch, "npu", None)
    if npu is None or dtype not in (torch.float16, torch.bfloat16):
        return False
    if dtype not in _FP32_GAMMA:
        try:
            if npu.is_current_stream_capturing():
                return False
        except Exception:  # no device, or a torch_npu without the query: ask below
            pass
        _FP32_GAMMA[dtype] = _ask_device_fp32_gamma(dtype)
    return _FP32_GAMMA[dtype]


_FP32_GAMMA: dict = {}  # dtype -> the device's answer (cache_clear drops it)


def _ask_device_fp32_gamma(dtype, device: str = "npu") -> bool:
    # `device`: where the probe's tensors live; the wheel-binding test drives this call on the CPU
    # with a stand-in torch_npu (tests/kernels/test_npu_wheel_bindings.py).
    import torch

    try:
        if not torch.npu.is_available():
            return False
        x = torch.linspace(-2, 2, 64, device=device).reshape(2, 32).to(dtype)
        gamma = torch.linspace(0.5, 1.5, 32, device=device, dtype=torch.float32)
        y = _torch_npu().npu_rms_norm(x, gamma, epsilon=1e-6)[0]
        xf = x.float()
        ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma).to(dtype)
        return y.dtype == dtype and bool(torch.allclose(y.float(), ref.float(), rtol=1e-2, atol=1e-2))
    except Exception:  # refused (the documented dtype check) or no device: cast gamma, as the doc says
        return False


_CACHED = (op_arguments, soc_version, soc_name, aclnn_available, _open)


def cache_clear() -> None:
    """Forgets the cached facts (after swapping torch_npu, in tests)."""
    for f in _CACHED:
        f.cache_clear()
    _FP32_GAMMA.clear()
