"""Argument sets of the kernel tests: the model forms (Flux, Wan) and odd shapes (non-power-of-two D,
one token, batch 3, slices), built for a dtype and a device. Shared by the interpreter tests and the
``cuda`` tests. Shapes stay small: the interpreter runs every program in Python."""

from __future__ import annotations

import contextlib

import torch

from .conftest import randn

# name -> builder(dtype, device) -> op arguments


def gapped(t):
    """``t``'s values in a row-major view whose rows are not evenly spaced (two spare rows per
    block of dim -2), so the kernels take their general row addressing for it (`row_strides`)."""
    buf = torch.zeros(*t.shape[:-2], t.shape[-2] + 2, t.shape[-1], dtype=t.dtype, device=t.device)
    buf[..., 1:-1, :] = t
    return buf[..., 1:-1, :]


def rms_norm_cases():
    def make(shape, weight=None, out_dtype=None, sliced=False):
        def build(dtype, device):
            d = shape[-1]
            x = randn(*shape[:-1], d + 8 if sliced is True else d, dtype=dtype, scale=3.0, device=device)
            if sliced == "gapped":
                x = gapped(x)
            elif sliced == "fused_qkv":  # q of a fused QKV projection, (B, S, H, D): token stride 3HD
                qkv = randn(*shape[:-2], 3 * shape[-2] * d, dtype=dtype, scale=3.0, device=device)
                x = qkv.chunk(3, dim=-1)[0].unflatten(-1, shape[-2:])
            elif sliced == "tokens":  # heads-major (B, H, S, D), the image tokens after 2 text tokens
                x = randn(*shape[:-2], shape[-2] + 2, d, dtype=dtype, scale=3.0, device=device)[..., 2:, :]
            elif sliced:  # a row-major, non-contiguous view (a slice of a fused projection)
                x = x[..., :d]
            w = None if weight is None else randn(d, dtype=weight if weight != "x" else dtype, seed=1, device=device)
            return (x, w, 1e-6, out_dtype)

        return build

    return {
        "flux_qk_fp32_weight": make((1, 13, 3, 16), weight=torch.float32),
        "low_precision_weight": make((3, 5, 40), weight="x"),
        "no_weight_one_token": make((3, 1, 40)),
        "d77_out_fp32": make((2, 7, 77), weight=torch.float32, out_dtype=torch.float32),
        "sliced_1d_rows": make((5, 24), weight=torch.float32, sliced=True),
        "gapped_rows": make((2, 3, 40), weight=torch.float32, sliced="gapped"),
        "fused_qkv_batch2": make((2, 5, 3, 16), weight="x", sliced="fused_qkv"),
        "fused_qkv_many_heads": make((1, 3, 11, 24), weight=torch.float32, sliced="fused_qkv"),
        "heads_major_token_slice": make((2, 3, 5, 40), sliced="tokens"),
        "one_dim": make((100,), weight="x"),
    }


def rope_cases():
    def make(x_shape, table_shape, table_dtype=torch.float32, sliced=False):
        def build(dtype, device):
            d = x_shape[-1]
            x = randn(*x_shape[:-1], d + 6 if sliced is True else d, dtype=dtype, device=device)
            if sliced == "gapped":
                x = gapped(x)
            elif sliced:
                x = x[..., :d]
            cos = randn(*table_shape, dtype=table_dtype, seed=1, device=device)
            sin = randn(*table_shape, dtype=table_dtype, seed=2, device=device)
            return (x, cos, sin)

        return build

    return {
        "flux_bshd_1s1d": make((1, 13, 3, 16), (1, 13, 1, 16)),
        "bnsd_11sd_batch3": make((3, 2, 5, 24), (1, 1, 5, 24)),  # D=24: 12 pairs, halves of 12
        "per_batch_tables": make((3, 5, 2, 24), (3, 5, 1, 24)),
        "one_token": make((3, 1, 2, 40), (1, 1, 40)),
        "three_dims_sd_tables": make((7, 2, 20), (7, 1, 20), table_dtype=torch.bfloat16),
        "sliced_x": make((2, 5, 2, 16), (5, 1, 16), sliced=True),
        "gapped_x": make((2, 5, 2, 16), (5, 1, 16), sliced="gapped"),
    }


def adaln_cases():
    def make(x_shape, mod_shapes, mod_dtype=None, affine=None, out_dtype=None, gap=False):
        def build(dtype, device):
            x = randn(*x_shape, dtype=dtype, scale=2.0, device=device)
            x = gapped(x) if gap else x
            mdt = mod_dtype or dtype
            scale = randn(*mod_shapes[0], dtype=mdt, seed=1, device=device)
            shift = randn(*mod_shapes[1], dtype=mdt, seed=2, device=device)
            d = x_shape[-1]
            w = randn(d, dtype=affine, seed=3, device=device) if affine else None
            b = randn(d, dtype=affine, seed=4, device=device) if affine else None
            return (x, scale, shift, 1e-6, w, b, out_dtype)

        return build

    return {
        "flux_bd_chunks_batch3": make((3, 5, 40), [(3, 40), (3, 40)]),
        "wan_b1d_fp32_out": make(
            (3, 5, 40), [(3, 1, 40), (3, 1, 40)], mod_dtype=torch.float32, out_dtype=torch.float32
        ),
        "one_token_d77_affine": make((2, 1, 77), [(2, 77), (2, 1, 77)], affine=torch.float32),
        "per_token_mod": make((2, 3, 24), [(2, 3, 24), (24,)]),
        "two_dims": make((7, 100), [(100,), (1, 100)]),
        "gapped_x": make((2, 5, 40), [(2, 40), (2, 1, 40)], gap=True),
        "gapped_x_shared_mod": make((2, 5, 40), [(40,), (1, 1, 40)], gap=True),
        "batches_span_tiles": make((2, 70, 200), [(2, 200), (2, 1, 200)]),  # 16-row tiles, 70 rows a batch
        "four_dims_b11d": make((2, 3, 4, 24), [(2, 1, 1, 24), (2, 1, 1, 24)], affine=torch.float32),
        "mod_shared_by_batch": make((2, 3, 4, 24), [(1, 3, 1, 24), (1, 3, 1, 24)]),  # rows wrap every 12
    }


def mul_add_cases():
    def make(shapes, dtypes=(None, None, None), gap=()):
        def build(dtype, device):
            ts = [randn(*s, dtype=dt or dtype, seed=i, device=device) for i, (s, dt) in enumerate(zip(shapes, dtypes))]
            return tuple(gapped(t) if i in gap else t for i, t in enumerate(ts))

        return build

    f32 = torch.float32
    return {
        "gate_b1d_batch3": make([(3, 1, 40), (3, 5, 40), (3, 5, 40)]),
        "residual_first_gate_bd": make([(2, 5, 24), (2, 1, 24), (2, 5, 24)]),
        "wan_mixed_promotes_to_fp32": make([(2, 1, 40), (2, 5, 40), (2, 5, 40)], dtypes=(f32, None, f32)),
        "zero_dim_scalar": make([(), (3, 5, 7), (3, 5, 7)], dtypes=(f32, None, None)),
        "last_dim_broadcast": make([(3, 5, 1), (3, 5, 24), (24,)]),
        "long_rows_column_tiles": make([(1, 1, 1500), (1, 2, 1500), (1, 2, 1500)]),
        "one_dim": make([(77,), (77,), (1,)]),
        "gapped_x_and_residual": make([(2, 5, 24), (2, 1, 24), (2, 5, 24)], gap=(0, 2)),
        "batches_span_tiles": make([(2, 1, 200), (2, 70, 200), (2, 70, 200)]),  # 16-row tiles, 70 a batch
        "shared_by_batch_per_token": make([(2, 5, 3, 24), (1, 5, 1, 24), (2, 5, 3, 24)]),  # y's rows wrap
    }


# -- the model sizes, planned from meta tensors (no memory, no device): compile and lowering checks --

TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def arg_type(value) -> str:
    """Triton's signature type of a (non-constexpr) launch argument, as its JIT types it."""
    if isinstance(value, torch.Tensor):
        return "*" + TRITON_TYPES[value.dtype]
    if isinstance(value, float):
        return "fp32"
    return "i32" if -(2**31) <= value < 2**31 else "i64"


def check_forced(op: str, args: tuple, msg: str) -> torch.Tensor:
    """``op`` with the ``triton`` provider chosen explicitly (where the device's own kernels or
    Inductor's code would otherwise take it) against the native provider on the same device:
    values within `ascend_kernels.testing` tolerances, and the same strides."""
    from ascend_kernels.registry import select_provider, use_providers
    from ascend_kernels.testing import assert_close

    ops = torch.ops.ascend_kernels
    with use_providers(**{op: "triton"}):
        assert select_provider(op, *args).name == "triton", f"{msg}: the triton provider refused the call"
        out = getattr(ops, op)(*args)
    with use_providers(**{op: "native"}):
        expected = getattr(ops, op)(*args)
    assert out.stride() == expected.stride(), msg
    assert_close(out, expected, msg=msg)
    return out


def tiny_block(name: str, dtype: torch.dtype, batch: int, device: str = "cpu"):
    """``(block, inputs)``: the tiny ``"flux_double"``, ``"flux_single"`` or ``"wan"`` block of
    `diffusers_ascend.tiny` and its keyword inputs at ``batch``, on ``device``."""
    from torch.utils._pytree import tree_map

    from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks, tiny_wan_block, wan_block_inputs

    if name == "wan":
        block, inputs = tiny_wan_block(dtype=dtype), wan_block_inputs(batch=batch, dtype=dtype)
    else:
        double, single = tiny_flux_blocks(dtype=dtype)
        block, inputs = (double if name == "flux_double" else single), flux_block_inputs(batch=batch, dtype=dtype)
    return block.to(device), tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, inputs)


def compile_block(block, inputs: dict):
    """One forward of ``block`` compiled with every fusion on the eager executor, and eager's:
    ``(backend, outputs, eager outputs)``, outputs as tuples."""
    from diffusers_ascend.compilation import AscendBackend

    torch._dynamo.reset()
    backend = AscendBackend(fusions="all", executor="eager", on_error="raise")
    try:
        with torch.no_grad():
            out = torch.compile(block, backend=backend, fullgraph=True)(**inputs)
            ref = block(**inputs)
    finally:
        torch._dynamo.reset()
    return backend, (out if isinstance(out, tuple) else (out,)), (ref if isinstance(ref, tuple) else (ref,))


def assert_block_matches(out: tuple, ref: tuple, dtype: torch.dtype, name: str) -> None:
    """A compiled block's outputs against eager's, at tests/compilation/test_blocks.py's tolerance
    (fused fp32 math against eager's bf16 steps)."""
    from ascend_kernels.testing import assert_close

    for o, r in zip(out, ref):
        kw = {} if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
        assert_close(o, r, dtype, **kw, msg=name)


def rows_in_chunks(monkeypatch, args: tuple) -> None:
    """`_common.ROW_TILE_LIMIT` for the device of ``args`` set to half the row of ``x`` (``args[0]``),
    so that the call takes the chunk kernels with 2-8 chunks (Ascend's limit is 4096 lanes)."""
    from ascend_kernels.triton import _common

    monkeypatch.setitem(_common.ROW_TILE_LIMIT, args[0].device.type, _common.block(args[0].shape[-1]) // 2)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@contextlib.contextmanager
def ascend_tiling(*device_types: str):
    """`ascend_kernels.triton._common.ascend_tiling` (Ascend's tiling, planned on CPU or meta
    tensors), imported when used: this module is collected where triton is not installed."""
    from ascend_kernels.triton import _common

    with _common.ascend_tiling(*device_types):
        yield


def ascend_plan(plan):
    """``plan`` run as Ascend plans it (`ascend_tiling`: rope's and rms_norm's token tiles, adaLN's
    and mul_add's batch tiles, adaLN's row chunks) on meta tensors. The cases of `model_plans` so
    planned end in ``_tokens``, ``_batches`` or ``_chunks``."""

    def build():
        with ascend_tiling("meta"):
            return plan()

    return build


def model_plans():
    """``{case: () -> (out, Launch)}``: every kernel's launch at Flux and Wan 14B sizes (bf16, fp32
    tables/modulation/weights where the models have them) and a few odd forms."""
    from ascend_kernels.triton.adaln import plan_adaln_modulate
    from ascend_kernels.triton.mul_add import plan_mul_add
    from ascend_kernels.triton.rms_norm import plan_rms_norm
    from ascend_kernels.triton.rope import plan_rope

    meta, bf, f32 = _meta, torch.bfloat16, torch.float32
    flux_q, wan_q = meta(1, 4608, 24, 128), meta(1, 75600, 40, 128)
    flux_h, wan_h = meta(1, 4096, 3072), meta(1, 75600, 5120)
    flux_tables = (meta(1, 4608, 1, 128, dtype=f32), meta(1, 4608, 1, 128, dtype=f32))
    cog_q, cog_tables = (
        meta(2, 48, 226 + 17550, 64)[:, :, 226:],
        (meta(17550, 64, dtype=f32), meta(17550, 64, dtype=f32)),
    )
    sd3_h, sd3_mod = meta(2, 4096, 1536), meta(2, 6 * 1536)  # the chunks of SD3's AdaLayerNormZero
    flux_qkv_q = meta(1, 4096, 3 * 3072)[..., :3072].unflatten(-1, (24, 128))
    return {
        "rms_norm_flux_qk": lambda: plan_rms_norm(flux_q, meta(128), 1e-6),
        "rms_norm_wan_qk_fp32_weight": lambda: plan_rms_norm(wan_h, meta(5120, dtype=f32), 1e-6),
        "rms_norm_wan_qk_fp32_weight_chunks": ascend_plan(lambda: plan_rms_norm(wan_h, meta(5120, dtype=f32), 1e-6)),
        "rms_norm_fp16_no_weight_fp32_out": lambda: plan_rms_norm(meta(8, 77, dtype=torch.float16), None, 1e-6, f32),
        # Flux's q after fuse_qkv_projections (a chunk of to_qkv's output): row tiles, and Ascend's
        "rms_norm_flux_fused_qkv": lambda: plan_rms_norm(flux_qkv_q, meta(128), 1e-6),
        "rms_norm_flux_fused_qkv_tokens": ascend_plan(lambda: plan_rms_norm(flux_qkv_q, meta(128), 1e-6)),
        "rope_flux_interleaved": lambda: plan_rope(
            flux_q, meta(1, 4608, 1, 128, dtype=f32), meta(1, 4608, 1, 128, dtype=f32), "interleaved"
        ),
        "rope_wan_half": lambda: plan_rope(
            wan_q, meta(1, 75600, 1, 128, dtype=f32), meta(1, 75600, 1, 128, dtype=f32), "half"
        ),
        # the same calls as Ascend plans them: token tiles (`_common.AFFINE_TILE_DEVICES`)
        "rope_flux_interleaved_tokens": ascend_plan(
            lambda: plan_rope(flux_q, meta(1, 4608, 1, 128, dtype=f32), meta(1, 4608, 1, 128, dtype=f32), "interleaved")
        ),
        "rope_wan_half_tokens": ascend_plan(
            lambda: plan_rope(wan_q, meta(1, 75600, 1, 128, dtype=f32), meta(1, 75600, 1, 128, dtype=f32), "half")
        ),
        # two Flux images a prompt: one table for the batch (row tiles), and Ascend's token tiles
        "rope_flux_batch2": lambda: plan_rope(meta(2, 4608, 24, 128), *flux_tables, "interleaved"),
        "rope_flux_batch2_tokens": ascend_plan(lambda: plan_rope(meta(2, 4608, 24, 128), *flux_tables, "interleaved")),
        # CogVideoX-5B's image tokens under a batched CFG: heads-major x, sliced after the 226 text
        # tokens, and one (S, D) table for the batch (row tiles, and Ascend's token tiles)
        "rope_cogvideox_heads_major": lambda: plan_rope(cog_q, *cog_tables, "interleaved"),
        "rope_cogvideox_heads_major_tokens": ascend_plan(lambda: plan_rope(cog_q, *cog_tables, "interleaved")),
        "adaln_flux": lambda: plan_adaln_modulate(flux_h, meta(1, 3072), meta(1, 3072), 1e-6),
        "adaln_wan_fp32_mod": lambda: plan_adaln_modulate(
            wan_h, meta(1, 1, 5120, dtype=f32), meta(1, 1, 5120, dtype=f32), 1e-6, None, None, bf
        ),
        # the same call as Ascend plans it: 5120-wide rows in 1024-wide chunks (`_common.ROW_TILE_LIMIT`)
        "adaln_wan_fp32_mod_chunks": ascend_plan(
            lambda: plan_adaln_modulate(
                wan_h, meta(1, 1, 5120, dtype=f32), meta(1, 1, 5120, dtype=f32), 1e-6, None, None, bf
            )
        ),
        # a per-batch modulation (SD3's width, batched CFG): row tiles, and Ascend's batch tiles
        "adaln_sd3_batch2": lambda: plan_adaln_modulate(sd3_h, sd3_mod[:, :1536], sd3_mod[:, 1536:3072], 1e-6),
        "adaln_sd3_batch2_batches": ascend_plan(
            lambda: plan_adaln_modulate(sd3_h, sd3_mod[:, :1536], sd3_mod[:, 1536:3072], 1e-6)
        ),
        "adaln_affine_fp32": lambda: plan_adaln_modulate(
            meta(3, 5, 77, dtype=f32),
            meta(3, 77, dtype=f32),
            meta(3, 77, dtype=f32),
            1e-6,
            meta(77, dtype=f32),
            meta(77, dtype=f32),
        ),
        "mul_add_flux_gate": lambda: plan_mul_add(meta(1, 1, 3072), flux_h, flux_h),
        "mul_add_gate_batch2": lambda: plan_mul_add(sd3_mod[:, None, :1536], sd3_h, sd3_h),
        "mul_add_gate_batch2_batches": ascend_plan(lambda: plan_mul_add(sd3_mod[:, None, :1536], sd3_h, sd3_h)),
        "mul_add_wan_mixed": lambda: plan_mul_add(wan_h, meta(1, 1, 5120, dtype=f32), meta(1, 75600, 5120, dtype=f32)),
    }


CASES = {
    "rms_norm": rms_norm_cases(),
    "rope": rope_cases(),
    "adaln_modulate": adaln_cases(),
    "mul_add": mul_add_cases(),
}
# (op, case) of every row-reduction case, for the tests of Ascend's row chunks (`rows_in_chunks`).
ROW_REDUCTION_CASES = [(op, c) for op in ("rms_norm", "adaln_modulate") for c in CASES[op]]
