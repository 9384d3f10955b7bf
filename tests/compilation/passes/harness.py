"""What the per-fusion pattern tests share: the dtypes every form runs in and `run`, which compiles
an isolated module with the snapshot backend and asserts the exact match count, the unfused ops
gone, the fused op present and the numerics vs eager."""

from __future__ import annotations

import copy

import torch

from ..conftest import SnapshotBackend, assert_close, compile_module, tolerances

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16]


def run(module, *inputs, fusions, dtype, expected, gone=(), fusion=None, reference="eager"):
    """Compiles `module`, asserts the exact match count and the numerics: against eager, or with
    ``reference="fp64"`` as close to an fp64 run as eager is (for code that rounds every step in
    low precision, where the fused op's single rounding differs from eager by more than the
    tolerance although it is the more accurate of the two)."""
    fusion = fusion or fusions[0]
    module = module.to(dtype)
    backend = SnapshotBackend(fusions=list(fusions), executor="eager")
    with torch.no_grad():
        out = compile_module(module, backend)(*inputs)
        ref = module(*inputs)
        exact = copy.deepcopy(module).double()(*(i.double() for i in inputs)) if reference == "fp64" else None
    assert backend.report.matches[fusion] == expected
    backend.assert_fused(fusion, expected, gone=gone)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if exact is None:
        assert_close(out, ref, dtype)
    else:
        err, eager_err = (out.double() - exact).abs().max(), (ref.double() - exact).abs().max()
        assert err <= eager_err + tolerances(dtype)["atol"], (float(err), float(eager_err))
    return backend
