"""Benchmark `host_path`: host time per call of a fused op's Python path, layer by layer (CPU, no kernel).

    diffusers-ascend bench host_path --out benchmarks/results/     # needs triton (pip install triton)

An uncaptured fused op pays its host path on every call, and at Flux sizes on a GPU that path, not
the kernel, sets the time (docs/triton.md). This benchmark times the layers of that path that are
Python, on small CPU tensors (nothing here depends on the tensor size but the native composite's
own compute):

- ``native_us``: the native composite called directly (the reference; includes its CPU compute).
- ``op_us``: ``torch.ops.ascend_kernels.<op>`` on CPU: the dispatcher, the registry's choice and
  the native composite; ``dispatch_us`` is the difference.
- ``supports_us`` and ``plan_us``: what the ``triton`` provider adds before Triton's own launcher
  on every call: its ``supports_args`` limits check and its launch planning (``plan_<op>``:
  output allocation, strides, grid), both run here on CPU tensors.
- ``ascend_plan_us``: the same planning as an Ascend NPU does it (`_common.AFFINE_TILE_DEVICES`:
  rope's and rms_norm's token tiles, adaLN's and mul_add's batch tiles where the operands take
  them), which its default eager executor pays on every call. The batch-2 rows are the forms that
  take batch tiles, and q of a fused QKV projection the form that takes rms_norm's token tiles.

The inductor executor pays none of these (`bind_compiler_ops`). Medians of ``--repeat`` runs.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

from ._common import machine_info, text_table, time_ms, write_json


def _cases() -> list[tuple[str, str, tuple]]:
    import torch

    bf, f32 = torch.bfloat16, torch.float32

    def rand(*shape, dtype=bf):
        return torch.randn(*shape, dtype=dtype)

    # Flux's forms at 4 tokens: the host path does not depend on the token count.
    x, h, table = rand(1, 4, 24, 128), rand(1, 4, 3072), rand(1, 4, 1, 128, dtype=f32)
    x2, h2 = rand(2, 4, 24, 128), rand(2, 4, 3072)  # two images a prompt, or a batched CFG
    q2 = rand(2, 4, 3 * 3072)[..., :3072].unflatten(-1, (24, 128))  # q of fused QKV projections
    return [
        ("rms_norm", "1x4x24x128", (x, rand(128, dtype=f32), 1e-6, None)),
        ("rope", "1x4x24x128", (x, table, table, "interleaved")),
        ("adaln_modulate", "1x4x3072", (h, rand(1, 3072), rand(1, 3072), 1e-6, None, None, None)),
        ("mul_add", "1x4x3072", (rand(1, 1, 3072), h, h)),
        ("rope", "2x4x24x128", (x2, table, table, "interleaved")),
        ("adaln_modulate", "2x4x3072", (h2, rand(2, 3072), rand(2, 3072), 1e-6, None, None, None)),
        ("mul_add", "2x4x3072", (rand(2, 1, 3072), h2, h2)),
        ("rms_norm", "2x4x24x128 of QKV", (q2, rand(128, dtype=f32), 1e-6, None)),
    ]


def per_call_us(fn: Callable[[], Any], calls: int, repeat: int) -> float:
    """Median over ``repeat`` runs of the mean time of one of ``calls`` back-to-back calls, in us."""
    for _ in range(max(calls // 10, 1)):
        fn()

    def batch():
        for _ in range(calls):
            fn()

    return statistics.median(time_ms(batch, runs=repeat, warmup=0)) / calls * 1e3


def run(calls: int = 2000, repeat: int = 5) -> dict[str, Any]:
    import torch

    import ascend_kernels  # noqa: F401  (registers torch.ops.ascend_kernels)
    from ascend_kernels.registry import providers
    from ascend_kernels.triton import _common, planner

    rows = []
    with torch.no_grad():
        for op, shape, args in _cases():
            native = next(p.impl for p in providers(op) if p.name == "native")
            triton = next(p for p in providers(op) if p.name == "triton")
            plan = planner(op)
            overload = getattr(torch.ops.ascend_kernels, op).default
            assert triton.supports_args(*args), f"{op}: the case is outside the triton provider's limits"
            row = dict(op=op, shape=shape)
            for key, fn in (
                ("native_us", lambda: native(*args)),
                ("op_us", lambda: overload(*args)),
                ("supports_us", lambda: triton.supports_args(*args)),
                ("plan_us", lambda: plan(*args)),
            ):
                row[key] = per_call_us(fn, calls, repeat)
            with _common.ascend_tiling("cpu"):
                row["ascend_kernel"] = plan(*args)[1].kernel.__name__
                row["ascend_plan_us"] = per_call_us(lambda: plan(*args), calls, repeat)
            row["dispatch_us"] = row["op_us"] - row["native_us"]
            row["triton_python_us"] = row["supports_us"] + row["plan_us"]
            rows.append(row)
    return dict(benchmark="host_path", calls=calls, repeat=repeat, machine=machine_info("cpu"), rows=rows)


COLUMNS = [
    ("op", "op"),
    ("shape", "shape"),
    ("native_us", "native us"),
    ("op_us", "op us"),
    ("dispatch_us", "dispatch us"),
    ("supports_us", "triton supports_args us"),
    ("plan_us", "triton plan us"),
    ("triton_python_us", "triton Python us"),
    ("ascend_plan_us", "Ascend plan us"),
    ("ascend_kernel", "Ascend kernel"),
]


def cli(args) -> int:
    """``diffusers-ascend bench host_path``: 0, or 2 without triton."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        print(
            "bench host_path times the triton provider's Python path and needs triton "
            "(pip install triton numpy); it launches no kernel and needs no GPU.",
            file=sys.stderr,
        )
        return 2
    result = run(args.calls, args.repeat)
    print(
        f"{result['machine']['cpu']}, torch {result['machine']['torch']}: us per call, "
        f"median of {args.repeat} x {args.calls} calls"
    )
    print(text_table(result["rows"], COLUMNS))
    write_json(result, args.out, "host_path.json")
    return 0
