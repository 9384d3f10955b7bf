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
    "add_rms_norm": lambda: (ops.add_rms_norm, (_r(2, 5, 7), _r(2, 5, 7), _r(7), 1e-6, None)),
    "add_rms_norm_broadcast": lambda: (ops.add_rms_norm, (_r(2, 5, 8), _r(1, 5, 8), None, 1e-5, torch.float16)),
    "add_rms_norm_backward": lambda: (
        ops.add_rms_norm_backward,
        (
            _r(2, 5, 7, grad=False),
            _r(2, 5, 7, grad=False),
            _r(2, 5, 7, grad=False),
            _r(1, 5, 7, grad=False),
            _r(7, grad=False),
            1e-6,
            None,
        ),
    ),
    "rope_interleaved": lambda: (ops.rope, (_r(1, 5, 2, 8), _r(1, 5, 1, 8), _r(1, 5, 1, 8), "interleaved")),
    "rope_half": lambda: (ops.rope, (_r(1, 2, 5, 8), _r(1, 1, 5, 8), _r(1, 1, 5, 8), "half")),
    "gelu_tanh": lambda: (ops.gelu_tanh, (_r(3, 7),)),
    "fast_gelu": lambda: (ops.fast_gelu, (_r(3, 7),)),
    "adaln_modulate": lambda: (ops.adaln_modulate, (_r(2, 5, 8), _r(2, 8), _r(2, 8), 1e-6, None, None, None)),
    "adaln_modulate_affine": lambda: (
        ops.adaln_modulate,
        (_r(2, 5, 8), _r(2, 1, 8), _r(2, 1, 8), 1e-6, _r(8), _r(8), torch.float64),
    ),
    "mul_add": lambda: (ops.mul_add, (_r(2, 1, 8), _r(2, 5, 8), _r(2, 5, 8))),
    "swiglu_packed": lambda: (ops.swiglu, (_r(2, 5, 8), None, -1)),
    "swiglu_two_tensors": lambda: (ops.swiglu, (_r(2, 5, 4), _r(2, 5, 4), -1)),
    "swiglu_backward": lambda: (
        ops.swiglu_backward,
        (_r(2, 5, 4, grad=False), _r(2, 5, 4, grad=False), _r(2, 5, 4, grad=False), -1),
    ),
    "int8_dynamic_linear": lambda: (
        ops.int8_dynamic_linear,
        (
            _r(2, 5, 8, grad=False),
            torch.randint(-128, 128, (6, 8), dtype=torch.int8),
            torch.rand(6, 1),
            _r(6, grad=False),
        ),
    ),
    "int8_weight_only_linear": lambda: (
        ops.int8_weight_only_linear,
        (_r(2, 5, 8, grad=False), torch.randint(-128, 128, (6, 8), dtype=torch.int8), torch.rand(6, 1), None),
    ),
    "int8_dynamic_linear_backward": lambda: (
        ops.int8_dynamic_linear_backward,
        (_r(2, 5, 6, grad=False), _r(2, 5, 8, grad=False), torch.ones(6, 8, dtype=torch.int8), torch.rand(6, 1), None),
    ),
    "int8_weight_only_linear_backward": lambda: (
        ops.int8_weight_only_linear_backward,
        (_r(2, 5, 6, grad=False), _r(2, 5, 8, grad=False), torch.ones(6, 8, dtype=torch.int8), torch.rand(6, 1), _r(6)),
    ),
    "mul_add_backward": lambda: (
        ops.mul_add_backward,
        (_r(2, 5, 8, grad=False), _r(2, 1, 8, grad=False), _r(2, 5, 8, grad=False), _r(5, 8, grad=False)),
    ),
    "rms_norm_backward": lambda: (
        ops.rms_norm_backward,
        (_r(2, 5, 7, grad=False), _r(2, 5, 7, grad=False), _r(7, grad=False), 1e-6, None),
    ),
}


# The backward ops run torch.func.vjp of the native impl. opcheck's own harnesses (SchemaCheckMode,
# CrossRefFakeMode, the eager reference inside the aot_dispatch tests) wrap the inputs in modes that
# functorch's wrapper tensors cannot pass through ("Cannot access data pointer of Tensor that doesn't
# have storage"), so for them this test checks directly what opcheck would: no input mutated, no
# output aliasing an input, and the fake impl's metadata equal to the real outputs'. Their tracing
# is exercised by the forward ops' aot_dispatch checks, which trace the backward through them.


def _check_backward_op(op, args):
    from torch._subclasses.fake_tensor import FakeTensorMode

    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    real = op(*args)
    assert all(torch.equal(a, b) for a, b in zip(args, before) if isinstance(a, torch.Tensor)), "input mutated"
    ptrs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    assert not any(r.untyped_storage().data_ptr() in ptrs for r in real), "output aliases an input"
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = op(*fake_args)
    assert [(f.shape, f.dtype, f.stride()) for f in fake] == [(r.shape, r.dtype, r.stride()) for r in real]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_opcheck(name):
    op, args = SAMPLES[name]()
    if name.endswith("_backward"):
        _check_backward_op(op, args)
    else:
        torch.library.opcheck(op, args)


def test_every_op_has_a_sample():
    covered = {SAMPLES[n]()[0]._qualified_op_name.split("::")[1] for n in SAMPLES}
    assert set(ascend_kernels.OPS) <= covered
