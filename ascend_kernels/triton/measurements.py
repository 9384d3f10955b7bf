"""Measured speed of the Triton kernels against the compiler's code for the same composite.

On CUDA a fused op replaces code that Inductor would otherwise generate and fuse itself, so the
``triton`` provider runs there (and ``fusions="auto"`` picks the fusion) only for an op recorded
here as faster than ``torch.compile`` of its composite at EVERY recorded model size. The rows come
from ``python benchmarks/kernels.py`` on the device named in them (it prints them ready to paste);
a block-level check (``benchmarks/blocks.py``: a full-width Flux block with the fusion under the
inductor executor no slower than Inductor alone) must hold too before a row lands, because an
opaque op also stops Inductor from fusing the neighbouring pointwise ops into its code.

Nothing is recorded yet: issue 14 ran without a GPU (the kernels are verified in Triton's
interpreter only), so on CUDA no op qualifies and ``fusions="auto"`` picks no fusion.

>>> from ascend_kernels.triton.measurements import beats_compiler
>>> beats_compiler("adaln_modulate", "cuda")
False
"""

from __future__ import annotations

import dataclasses

__all__ = ["MEASUREMENTS", "Measurement", "beats_compiler"]


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One benchmark row: a Triton kernel and ``torch.compile`` of the op's composite, same inputs.

    Args:
        op: the op name (``"rms_norm"``, ``"rope"``, ``"adaln_modulate"``, ``"mul_add"``).
        device_type: ``"cuda"`` (or ``"npu"``).
        device: the device's name, e.g. ``"NVIDIA H100 80GB HBM3"``.
        size: the benchmark case, e.g. ``"flux_qk"`` (see ``benchmarks/kernels.py``).
        dtype: ``"bf16"``.
        kernel_ms: median time of the Triton kernel.
        compiled_ms: median time of ``torch.compile`` (Inductor, default mode) of the composite.
        versions: ``"torch 2.11.0+cu130, triton 3.5.0"``.
        date: ``"YYYY-MM-DD"``.
    """

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


# Append rows printed by benchmarks/kernels.py (never edit numbers by hand).
MEASUREMENTS: tuple[Measurement, ...] = ()


def beats_compiler(op: str, device_type: str) -> bool:
    """Whether ``op``'s kernel was measured faster than the compiler's code at every recorded size.

    Args:
        op: an op name.
        device_type: ``"cuda"`` or ``"npu"``.

    Returns:
        False when nothing is recorded for ``(op, device_type)``.
    """
    rows = [m for m in MEASUREMENTS if m.op == op and m.device_type == device_type]
    return bool(rows) and all(m.speedup > 1.0 for m in rows)
