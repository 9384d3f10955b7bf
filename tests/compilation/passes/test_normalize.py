"""Graph normalisation before the passes (`passes/normalize.py`): common-subexpression
elimination merges repeated pure calls only, so a form written with a repeated cast matches."""

from __future__ import annotations

import collections

import pytest
import torch

from .harness import DTYPES, aten, run


class TwiceCastRMSNorm(torch.nn.Module):
    """A hand-written RMSNorm that casts x to fp32 twice: once for the variance, once for the product."""

    def __init__(self, dim, weight_first):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim))
        self.weight_first = weight_first

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        y = (x.to(torch.float32) * torch.rsqrt(variance + 1e-6)).to(x.dtype)
        return self.weight * y if self.weight_first else y * self.weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_first", [True, False], ids=["weight_first", "weight_last"])
def test_rms_norm_with_the_cast_written_twice(weight_first, dtype):
    # The two casts are one after common-subexpression elimination, as the patterns are traced.
    torch.manual_seed(0)
    run(
        TwiceCastRMSNorm(16, weight_first),
        torch.randn(2, 5, 16, dtype=dtype),
        fusions=["rms_norm"],
        dtype=dtype,
        expected=1,
        gone=[aten.rsqrt.default, aten.mean.dim],
    )


def test_cse_merges_repeated_pure_calls_only():
    from diffusers_ascend.compilation.passes.normalize import eliminate_common_subexpressions

    def f(x, y):
        a, b = x.to(torch.float32), x.to(torch.float32)  # merged
        c, d = x.to(torch.float64), y.to(torch.float32)  # another dtype, another input: kept
        e, g = x.add(1), x.add(1.0)  # 1 and 1.0 are different arguments
        r1, r2 = torch.rand_like(x), torch.rand_like(x)  # random: never merged
        return a + b + c.float() + d + e + g + r1 + r2, x.to(torch.float32)  # returned: kept

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f)(torch.randn(3, dtype=torch.bfloat16), torch.randn(3, dtype=torch.bfloat16))
    before = collections.Counter(n.target for n in gm.graph.nodes)
    assert eliminate_common_subexpressions(gm.graph) == 1
    gm.graph.eliminate_dead_code()
    after = collections.Counter(n.target for n in gm.graph.nodes)
    assert before - after == collections.Counter({aten._to_copy.default: 1})
    assert after[aten.rand_like.default] == 2 and after[aten.add.Tensor] >= 2
