"""``torch.library.opcheck`` of every op and of its backward op (schema, fake impl vs real,
autograd registration, aot dispatch static and dynamic). fp32 CPU, small shapes."""

from __future__ import annotations

import pytest
import torch

import ascend_kernels  # noqa: F401

ops = torch.ops.ascend_kernels


def _r(*shape, grad=True):
    return torch.randn(*shape, requires_grad=grad)


SAMPLES = {
    "rms_norm": lambda: (ops.rms_norm, (_r(2, 5, 7), _r(7), 1e-6, None)),
    "rms_norm_out_dtype": lambda: (ops.rms_norm, (_r(3, 8), None, 1e-5, torch.float16)),
    "rope_interleaved": lambda: (ops.rope, (_r(1, 5, 2, 8), _r(1, 5, 1, 8), _r(1, 5, 1, 8), "interleaved")),
    "rope_half": lambda: (ops.rope, (_r(1, 2, 5, 8), _r(1, 1, 5, 8), _r(1, 1, 5, 8), "half")),
    "gelu_tanh": lambda: (ops.gelu_tanh, (_r(3, 7),)),
    "fast_gelu": lambda: (ops.fast_gelu, (_r(3, 7),)),
    "adaln_modulate": lambda: (ops.adaln_modulate, (_r(2, 5, 8), _r(2, 8), _r(2, 8), 1e-6, None, None, None)),
    "adaln_modulate_affine": lambda: (
        ops.adaln_modulate, (_r(2, 5, 8), _r(2, 1, 8), _r(2, 1, 8), 1e-6, _r(8), _r(8), torch.float64)),
    "mul_add": lambda: (ops.mul_add, (_r(2, 1, 8), _r(2, 5, 8), _r(2, 5, 8))),
    "mul_add_backward": lambda: (ops.mul_add_backward, (_r(2, 5, 8, grad=False), _r(2, 1, 8, grad=False),
                                                        _r(2, 5, 8, grad=False), _r(5, 8, grad=False))),
    "rms_norm_backward": lambda: (ops.rms_norm_backward, (_r(2, 5, 7, grad=False), _r(2, 5, 7, grad=False),
                                                          _r(7, grad=False), 1e-6, None)),
}


# The backward ops run torch.func.vjp inside; SchemaCheckMode cannot look through functorch's
# wrapper tensors (no storage), so their no-mutation check is done directly below instead.
_BACKWARD_UTILS = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_opcheck(name):
    op, args = SAMPLES[name]()
    if name.endswith("_backward"):
        torch.library.opcheck(op, args, test_utils=_BACKWARD_UTILS)
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        op(*args)
        assert all(torch.equal(a, b) for a, b in zip(args, before) if isinstance(a, torch.Tensor))
    else:
        torch.library.opcheck(op, args)


def test_every_op_has_a_sample():
    covered = {SAMPLES[n]()[0]._qualified_op_name.split("::")[1] for n in SAMPLES}
    assert set(ascend_kernels.OPS) <= covered
