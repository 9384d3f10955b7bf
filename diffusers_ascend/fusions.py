"""The fusion table that config, passes, benchmarks and tests read: a new fusion is its op file,
its pass file, one row and its place in `PASS_ORDER`, and, per device, a provider: at most five
product files (docs/how-fusion-works.md, walked through for ``add_rms_norm``).

>>> TABLE["adaln"].op, FUSIONS[-1], PASS_ORDER[-1]
('adaln_modulate', 'int8_weight_only_linear', 'mul_add')
"""

from __future__ import annotations

import types
from dataclasses import dataclass

__all__ = ["FUSIONS", "FUSION_TO_OP", "PASS_ORDER", "Fusion", "TABLE", "default_fusions", "triton_fusions"]


@dataclass(frozen=True)
class Fusion:
    """One fusion.

    Args:
        name: the name configs use.
        op: the ``torch.ops.ascend_kernels`` op its pass substitutes.
        pass_class: ``"module:Class"`` of its `FusionPass` in `diffusers_ascend.compilation.passes`.
        changes_numerics: the op is not exact; it applies only when named, never under "all"/"auto".
        opt_in: it applies only when named, never under "all"/"auto", though exact (a fusion that
            takes sites another one fuses by default, so turning it on changes what the others match).
    """

    name: str
    op: str
    pass_class: str
    changes_numerics: bool = False
    opt_in: bool = False


# Rows in the public `FUSIONS` order (stored configs keep their cache keys). A new fusion is one
# row here and its name in `PASS_ORDER` (tests/test_fusions.py checks each row is there once).
_ROWS = (
    Fusion("rms_norm", "rms_norm", "rms_norm:RMSNormFusionPass"),
    Fusion("rope", "rope", "rope:RopeFusionPass"),
    Fusion("gelu_tanh", "gelu_tanh", "gelu:GeluTanhFusionPass"),
    Fusion("fast_gelu", "fast_gelu", "gelu:FastGeluFusionPass", changes_numerics=True),
    Fusion("adaln", "adaln_modulate", "adaln:AdaLNFusionPass"),
    Fusion("mul_add", "mul_add", "mul_add:MulAddFusionPass"),
    Fusion("swiglu", "swiglu", "swiglu:SwiGLUFusionPass"),
    Fusion("add_rms_norm", "add_rms_norm", "add_rms_norm:AddRMSNormFusionPass", opt_in=True),
    # torchao's int8 linears (#44): they match only quantized models' graphs.
    Fusion("int8_dynamic_linear", "int8_dynamic_linear", "int8_dynamic_linear:Int8DynamicLinearFusionPass"),
    Fusion(
        "int8_weight_only_linear", "int8_weight_only_linear", "int8_weight_only_linear:Int8WeightOnlyLinearFusionPass"
    ),
)

# The order the passes run in (`FusionPassManager`), where patterns overlap: torchao's int8 linears
# first (their scale products and bias adds are mul/add sites the others would take), add_rms_norm (it
# matches the norm decomposed, before rms_norm makes it one op), fast_gelu before
# gelu_tanh (same site, other numerics), swiglu before mul_add (``silu(a) * b + c`` is a SwiGLU
# feeding an add), the greedy mul_add last.
PASS_ORDER: tuple[str, ...] = (
    "int8_dynamic_linear",
    "int8_weight_only_linear",
    "add_rms_norm",
    "rms_norm",
    "rope",
    "fast_gelu",
    "gelu_tanh",
    "adaln",
    "swiglu",
    "mul_add",
)

TABLE: types.MappingProxyType = types.MappingProxyType({f.name: f for f in _ROWS})
FUSIONS: tuple[str, ...] = tuple(TABLE)
FUSION_TO_OP: types.MappingProxyType = types.MappingProxyType({f.name: f.op for f in _ROWS})


def default_fusions() -> tuple[str, ...]:
    """The fusions ``"all"`` means: every row that keeps numerics and is not opt-in, in table order.

    >>> "fast_gelu" in default_fusions(), "add_rms_norm" in default_fusions()
    (False, False)
    """
    return tuple(f.name for f in _ROWS if not (f.changes_numerics or f.opt_in))


def triton_fusions() -> tuple[str, ...]:
    """The fusions whose op has a Triton kernel (`ascend_kernels.triton.KERNELS`), in table order.

    >>> triton_fusions()
    ('rms_norm', 'rope', 'adaln', 'mul_add')
    """
    from ascend_kernels.triton import KERNELS  # lazy: imports torch

    return tuple(f.name for f in _ROWS if f.op in KERNELS)
