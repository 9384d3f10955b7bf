"""Measured speed of the Triton kernels against ``torch.compile`` of the same composite.

On CUDA the ``triton`` provider runs (and ``fusions="auto"`` picks the fusion) only for an op
recorded here as faster than Inductor at every recorded size, since an opaque op also stops
Inductor fusing its neighbours. Rows come from ``diffusers-ascend bench kernels``; none qualifies yet
(numbers and discussion in docs/triton.md).

>>> from ascend_kernels.triton.measurements import beats_compiler
>>> beats_compiler("adaln_modulate", "cuda")
False
"""

from __future__ import annotations

import dataclasses

__all__ = ["MEASUREMENTS", "Measurement", "beats_compiler"]


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One row of ``diffusers-ascend bench kernels``: a Triton kernel's and ``torch.compile``'s median device
    time (ms) for the op's composite on the same inputs."""

    op: str
    device_type: str
    device: str
    size: str
    dtype: str
    kernel_ms: float
    compiled_ms: float
    versions: str
    date: str

    @property
    def speedup(self) -> float:
        """``compiled_ms / kernel_ms``: above 1 when the kernel is faster."""
        return self.compiled_ms / self.kernel_ms


# Append rows printed by `diffusers-ascend bench kernels` (never edit numbers by hand).
MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement(
        "rms_norm",
        "cuda",
        "NVIDIA H100 80GB HBM3",
        "flux_qk_norm",
        "bf16",
        kernel_ms=0.0254,
        compiled_ms=0.0234,
        versions="torch 2.11.0+cu130, triton 3.6.0",
        date="2026-11-23",
    ),
    Measurement(
        "rms_norm",
        "cuda",
        "NVIDIA H100 80GB HBM3",
        "wan_qk_norm",
        "bf16",
        kernel_ms=0.6318,
        compiled_ms=0.5091,
        versions="torch 2.11.0+cu130, triton 3.6.0",
        date="2026-11-23",
    ),
    Measurement(
        "rope",
        "cuda",
        "NVIDIA H100 80GB HBM3",
        "flux_rope",
        "bf16",
        kernel_ms=0.0265,
        compiled_ms=0.0279,
        versions="torch 2.11.0+cu130, triton 3.6.0",
        date="2026-11-23",
    ),
    Measurement(
        "rope",
        "cuda",
        "NVIDIA H100 80GB HBM3",
        "wan_rope",
        "bf16",
        kernel_ms=0.6136,
        compiled_ms=0.5863,
        versions="torch 2.11.0+cu130, triton 3.6.0",
        date="2026-11-23",
    ),
    Measurement(
        "adaln_modulate",
        "cuda",
        "NVIDIA H100 80GB HBM3",
        "flux_adaln",
        "bf16",
        kernel_ms=0.0232,
        compiled_ms=0.0364,
        versions="torch 2.11.0+cu130, triton 3.6.0",
        date="2026-11-23",
    ),
    Measurement(
        "adaln_modulate",
        "cuda",
        "NVIDIA H100 80GB HBM3",
        "wan_adaln",
        "bf16",
        kernel_ms=0.6917,
        compiled_ms=0.6744,
        versions="torch 2.11.0+cu130, triton 3.6.0",
        date="2026-11-23",
    ),
    Measurement(
        "mul_add",
        "cuda",
        "NVIDIA H100 80GB HBM3",
        "flux_gate",
        "bf16",
        kernel_ms=0.0319,
        compiled_ms=0.0308,
        versions="torch 2.11.0+cu130, triton 3.6.0",
        date="2026-11-23",
    ),
    Measurement(
        "mul_add",
        "cuda",
        "NVIDIA H100 80GB HBM3",
        "wan_gate",
        "bf16",
        kernel_ms=1.3793,
        compiled_ms=1.2690,
        versions="torch 2.11.0+cu130, triton 3.6.0",
        date="2026-11-23",
    ),
)


def beats_compiler(op: str, device_type: str) -> bool:
    """Whether ``op``'s kernel beat the compiler's code at every recorded size on ``device_type``
    (False when nothing is recorded)."""
    rows = [m for m in MEASUREMENTS if m.op == op and m.device_type == device_type]
    return bool(rows) and all(m.speedup > 1.0 for m in rows)
