"""The ``ascend_kernels`` custom ops: one module per op (schema, native impl, fake, autograd)."""

from . import adaln, gelu, mul_add, rms_norm, rope, swiglu  # noqa: F401  (importing registers the ops)
