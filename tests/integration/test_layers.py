"""Fused layer swaps (diffusers_ascend.layers): exact swap counts, numerics vs the stock modules in
fp32 and bf16, identity of objects and state dicts, fusions honoured, exact restore."""

from __future__ import annotations

import pytest
import torch

import ascend_kernels  # noqa: F401
from ascend_kernels.testing import assert_close
from diffusers_ascend.adapters.registry import adapter_swaps
from diffusers_ascend.layers import apply_swaps, restore_swaps
from diffusers_ascend.tiny import (
    flux_block_inputs,
    flux_single_block_inputs,
    tiny_flux_blocks,
    tiny_wan_block,
    wan_block_inputs,
)

ALL = ("rms_norm", "rope", "gelu_tanh")
# Per block: nn.RMSNorm modules, GELU-tanh modules, attention processors with rope.
EXPECTED = {
    "flux_double": {"rms_norm": 4, "gelu_tanh": 2, "rope": 1},
    "flux_single": {"rms_norm": 2, "gelu_tanh": 1, "rope": 1},
    "wan": {"rms_norm": 4, "rope": 2},  # Wan's FFN is GELU-tanh inside FeedForward: see below
}


def _block(kind, dtype):
    if kind == "wan":
        return tiny_wan_block(dtype=dtype), wan_block_inputs(dtype=dtype)
    double, single = tiny_flux_blocks(dtype=dtype)
    if kind == "flux_double":
        return double, flux_block_inputs(dtype=dtype)
    return single, flux_single_block_inputs(dtype=dtype)


def _classes(module):
    objs = list(module.modules()) + [m.processor for m in module.modules() if hasattr(m, "processor")]
    return [(id(o), type(o)) for o in objs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_swaps_count_numerics_and_restore(kind, dtype):
    block, inputs = _block(kind, dtype)
    before_classes = _classes(block)
    sd = {k: v.clone() for k, v in block.state_dict().items()}
    params = {k: id(p) for k, p in block.named_parameters()}
    with torch.no_grad():
        ref = block(**inputs)
    undo, counts = apply_swaps(block, ALL, extra=adapter_swaps())
    expected = dict(EXPECTED[kind])
    if kind == "wan":
        expected["gelu_tanh"] = sum(1 for m in block.modules() if type(m).__name__ == "FusedGELU")
        assert expected["gelu_tanh"] == 1  # Wan's FeedForward("gelu-approximate")
    assert counts == expected
    assert {k: id(p) for k, p in block.named_parameters()} == params  # same objects, same names
    with torch.no_grad():
        out = block(**inputs)
    for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        assert_close(o, r, dtype=dtype)
    restore_swaps(undo)
    assert _classes(block) == before_classes
    assert all(torch.equal(sd[k], v) for k, v in block.state_dict().items())


def test_swapped_forward_calls_the_fused_ops():
    double, _ = tiny_flux_blocks()
    apply_swaps(double, ALL, extra=adapter_swaps())
    inputs = flux_block_inputs()
    from torch.profiler import profile

    with profile() as prof, torch.no_grad():
        double(**inputs)
    names = [e.name for e in prof.events()]
    calls = {op: sum(n == f"ascend_kernels::{op}" for n in names) for op in ("rms_norm", "rope", "gelu_tanh")}
    # 4 norms (q, k, added q, added k); rope on joint q and k; 2 feed-forwards.
    assert calls == {"rms_norm": 4, "rope": 2, "gelu_tanh": 2}


@pytest.mark.parametrize(
    "fusions,expected",
    [
        (["rms_norm"], {"rms_norm": 4}),
        (["rope"], {"rope": 1}),
        (["gelu_tanh"], {"gelu_tanh": 2}),
        (["fast_gelu"], {"fast_gelu": 2}),
        (["adaln", "mul_add"], {}),
    ],
)
def test_swaps_honour_fusions(fusions, expected):
    double, _ = tiny_flux_blocks()
    _, counts = apply_swaps(double, fusions, extra=adapter_swaps())
    assert counts == expected


def test_fast_gelu_changes_numerics_as_documented():
    _, single = tiny_flux_blocks()
    inputs = flux_single_block_inputs()
    with torch.no_grad():
        ref = single(**inputs)
        undo, _ = apply_swaps(single, ["fast_gelu"], extra=adapter_swaps())
        out = single(**inputs)
    restore_swaps(undo)
    diff = max((o - r).abs().max().item() for o, r in zip(out, ref))
    assert 1e-4 < diff < 0.5  # x*sigmoid(1.702x) is close to, not equal to, tanh-GELU


def test_user_subclasses_are_left_alone():
    class MyNorm(torch.nn.RMSNorm):
        pass

    model = torch.nn.Sequential(MyNorm(8), torch.nn.RMSNorm(8), torch.nn.GELU(), torch.nn.GELU(approximate="tanh"))
    undo, counts = apply_swaps(model, ALL, extra=adapter_swaps())
    assert counts == {"rms_norm": 1, "gelu_tanh": 1}
    assert [type(m).__name__ for m in model] == ["MyNorm", "FusedRMSNorm", "GELU", "FusedTorchGELU"]
    restore_swaps(undo)
    assert [type(m).__name__ for m in model] == ["MyNorm", "RMSNorm", "GELU", "GELU"]


def test_rms_norm_eps_none_means_finfo_eps():
    norm = torch.nn.RMSNorm(8)
    x = torch.randn(3, 8) * 1e-4
    ref = norm(x)
    apply_swaps(norm, ["rms_norm"])
    assert_close(norm(x), ref, dtype=torch.float32)


def test_swapped_block_compiles_fullgraph():
    from diffusers_ascend import AscendBackend

    _, single = tiny_flux_blocks()
    inputs = flux_single_block_inputs()
    with torch.no_grad():
        ref = single(**inputs)
    apply_swaps(single, ALL, extra=adapter_swaps())
    backend = AscendBackend(fusions="all", executor="eager")
    with torch.no_grad():
        out = torch.compile(single, backend=backend, fullgraph=True)(**inputs)
    for o, r in zip(out, ref):
        assert_close(o, r, dtype=torch.float32)
    # The swapped layers are already fused: only adaLN and mul_add are left to the passes.
    assert {f: n for f, n in backend.report.matches.items() if n} == {"adaln": 1, "mul_add": 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_wan_i2v_processor_branch(dtype):
    # Wan I2V: cross-attention with added image K/V (the first len - 512 context tokens are image tokens).
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    torch.manual_seed(0)
    block = WanTransformerBlock(dim=24, ffn_dim=32, num_heads=2, cross_attn_norm=True, added_kv_proj_dim=24)
    block = block.eval().to(dtype)
    inputs = wan_block_inputs(dtype=dtype, txt_len=512 + 4)
    with torch.no_grad():
        ref = block(**inputs)
    undo, counts = apply_swaps(block, ALL, extra=adapter_swaps())
    assert counts == {"rms_norm": 5, "gelu_tanh": 1, "rope": 2}  # + norm_added_k
    with torch.no_grad():
        out = block(**inputs)
    assert_close(out, ref, dtype=dtype)
    restore_swaps(undo)


def test_flux_processor_with_fused_qkv_projections():
    double, _ = tiny_flux_blocks()
    double.attn.fuse_projections()
    inputs = flux_block_inputs()
    with torch.no_grad():
        ref = double(**inputs)
    apply_swaps(double, ALL, extra=adapter_swaps())
    with torch.no_grad():
        out = double(**inputs)
    for o, r in zip(out, ref):
        assert_close(o, r, dtype=torch.float32)
