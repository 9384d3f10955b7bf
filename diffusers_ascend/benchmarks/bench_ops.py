"""Benchmark `ops_per_block`: dispatched aten operators per transformer block, eager vs fused."""

from __future__ import annotations

from typing import Any

import torch

from ..fusions import default_fusions
from ._common import bars, check_size, machine_info, register_ops

FUSIONS = tuple(f for f in default_fusions() if f != "swiglu")  # the blocks here have no SwiGLU
BLOCKS = ("flux_double", "flux_single", "wan")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# "tiny": the widths of `diffusers_ascend.tiny`; "small": dim 256 and 1024 image tokens. The counts
# must not depend on the size (a pattern that matched only at one size would be a bug).
_SHAPES = {
    "tiny": dict(
        flux=dict(dim_head=16, heads=2, txt_len=8, height=4, width=4),
        wan=dict(dim_head=12, heads=2, ffn_dim=32, frames=2, height=4, width=4),
    ),
    "small": dict(
        flux=dict(dim_head=16, heads=16, txt_len=64, height=32, width=32),
        wan=dict(dim_head=32, heads=8, ffn_dim=1024, frames=4, height=16, width=16),
    ),
}

COLUMNS = [
    ("block", "block"),
    ("dtype", "dtype"),
    ("dim", "dim"),
    ("tokens", "tokens"),
    ("ops_before", "ops eager"),
    ("ops_after", "ops fused"),
    ("ratio", "after/before"),
    *[(f"matches.{f}", f) for f in FUSIONS],
]


def _block_and_inputs(block: str, dtype: torch.dtype, size: str):
    from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks, tiny_wan_block, wan_block_inputs

    if block == "wan":
        s = _SHAPES[size]["wan"]
        module = tiny_wan_block(dtype=dtype, dim_head=s["dim_head"], heads=s["heads"], ffn_dim=s["ffn_dim"])
        inputs = wan_block_inputs(
            frames=s["frames"],
            height=s["height"],
            width=s["width"],
            dim_head=s["dim_head"],
            heads=s["heads"],
            dtype=dtype,
        )
        return module, inputs, s["dim_head"] * s["heads"], s["frames"] * s["height"] * s["width"]
    s = _SHAPES[size]["flux"]
    double, single = tiny_flux_blocks(dtype=dtype, dim_head=s["dim_head"], heads=s["heads"])
    dim = s["dim_head"] * s["heads"]
    inputs = flux_block_inputs(txt_len=s["txt_len"], height=s["height"], width=s["width"], dim=dim, dtype=dtype)
    if block == "flux_single":
        # The single block sees text and image tokens as one sequence, as inside the model.
        hidden = torch.cat([inputs["encoder_hidden_states"], inputs["hidden_states"]], dim=1)
        return (
            single,
            {**inputs, "hidden_states": hidden[:, s["txt_len"] :], "encoder_hidden_states": hidden[:, : s["txt_len"]]},
            dim,
            hidden.shape[1],
        )
    return double, inputs, dim, s["txt_len"] + s["height"] * s["width"]


def ops_per_block(size: str = "small") -> dict[str, Any]:
    """Counts the operators each block dispatches before and after ``fusions="all"``.

    Each block (Flux double-stream, Flux single-stream, Wan) is compiled alone, in fp32 and bf16,
    with the eager executor; its `FusionReport` gives the counts. Nothing is timed.

    Args:
        size: ``"tiny"`` (the widths of `diffusers_ascend.tiny`, seconds) or ``"small"`` (dim 256,
            about 1024 tokens).

    Returns:
        ``{"benchmark", "size", "rows", "columns", "machine"}``; one row per (block, dtype) with
        ``ops_before``, ``ops_after``, ``ratio`` (after / before), ``matches`` (fusion -> count),
        ``graphs_compiled`` and ``fallbacks``.

    >>> result = ops_per_block(size="tiny")
    >>> [r["matches"]["rope"] for r in result["rows"] if r["dtype"] == "fp32"]
    [2, 2, 2]
    """
    from diffusers_ascend.compilation import AscendBackend

    check_size(size)
    register_ops()
    rows = []
    for block in BLOCKS:
        for dtype_name, dtype in DTYPES.items():
            module, inputs, dim, tokens = _block_and_inputs(block, dtype, size)
            backend = AscendBackend(fusions=list(FUSIONS), executor="eager")
            torch.compiler.reset()
            with torch.no_grad():
                torch.compile(module, backend=backend, fullgraph=True)(**inputs)
            report = backend.report
            rows.append(
                dict(
                    block=block,
                    dtype=dtype_name,
                    dim=dim,
                    tokens=tokens,
                    ops_before=report.ops_before,
                    ops_after=report.ops_after,
                    ratio=report.ops_after / report.ops_before if report.ops_before else None,
                    matches=dict(report.matches),
                    graphs_compiled=report.graphs_compiled,
                    fallbacks=len(report.fallbacks),
                )
            )
    torch.compiler.reset()
    return dict(benchmark="ops_per_block", size=size, rows=rows, columns=COLUMNS, machine=machine_info())


def plot(ax, rows) -> None:
    """This benchmark's panel of ``results.png`` (`runner.plot_results`)."""
    labels = [f"{r['block']}\n{r['dtype']}" for r in rows]
    bars(
        ax,
        labels,
        {"eager": [r["ops_before"] for r in rows], "fused": [r["ops_after"] for r in rows]},
        "aten ops per block",
    )
