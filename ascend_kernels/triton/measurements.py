"""Measured speed of the Triton kernels against the compiler's code for the same composite.

On CUDA a fused op replaces code that Inductor would otherwise generate and fuse itself, so the
``triton`` provider runs there (and ``fusions="auto"`` picks the fusion) only for an op recorded
here as faster than ``torch.compile`` of its composite at EVERY recorded model size. The rows come
from ``diffusers-ascend bench kernels`` on the device named in them (it prints them ready to paste);
a block-level check (``diffusers-ascend bench blocks``: a full-width Flux block with the fusion under the
inductor executor no slower than Inductor alone) must hold too before a row lands, because an
opaque op also stops Inductor from fusing the neighbouring pointwise ops into its code.

Recorded on an NVIDIA H100 (torch 2.11.0+cu130, triton 3.6.0, 2026-11-23; device time, no host
launch cost): no op is faster than Inductor's code at every size. The adaLN kernel is 1.56x faster
at Flux's 1x4096x3072 but 0.97x at Wan 14B's; rope is 1.05x / 0.96x; rms_norm and mul_add are
0.81-0.96x: Inductor's own code for these composites already runs at 73-100% of the copy
bandwidth, which leaves a hand-written kernel little room. The block check agrees
(``benchmarks/results/blocks-h100*.json``: each fusion alone with the Triton kernel is 0.98-2.2x
Inductor's block time uncaptured, 0.95-1.07x captured). So on CUDA no op qualifies and
``fusions="auto"`` picks no fusion.

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
        size: the benchmark case, e.g. ``"flux_qk"`` (see ``diffusers-ascend bench kernels``).
        dtype: ``"bf16"``.
        kernel_ms: median device time of the Triton kernel (CUDA-graph replay, no host launch cost).
        compiled_ms: the same for ``torch.compile`` (Inductor, default mode) of the composite.
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


# Append rows printed by `diffusers-ascend bench kernels` (never edit numbers by hand).
MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement('rms_norm', 'cuda', 'NVIDIA H100 80GB HBM3', 'flux_qk_norm', 'bf16', kernel_ms=0.0254, compiled_ms=0.0234, versions='torch 2.11.0+cu130, triton 3.6.0', date='2026-11-23'),
    Measurement('rms_norm', 'cuda', 'NVIDIA H100 80GB HBM3', 'wan_qk_norm', 'bf16', kernel_ms=0.6318, compiled_ms=0.5091, versions='torch 2.11.0+cu130, triton 3.6.0', date='2026-11-23'),
    Measurement('rope', 'cuda', 'NVIDIA H100 80GB HBM3', 'flux_rope', 'bf16', kernel_ms=0.0265, compiled_ms=0.0279, versions='torch 2.11.0+cu130, triton 3.6.0', date='2026-11-23'),
    Measurement('rope', 'cuda', 'NVIDIA H100 80GB HBM3', 'wan_rope', 'bf16', kernel_ms=0.6136, compiled_ms=0.5863, versions='torch 2.11.0+cu130, triton 3.6.0', date='2026-11-23'),
    Measurement('adaln_modulate', 'cuda', 'NVIDIA H100 80GB HBM3', 'flux_adaln', 'bf16', kernel_ms=0.0232, compiled_ms=0.0364, versions='torch 2.11.0+cu130, triton 3.6.0', date='2026-11-23'),
    Measurement('adaln_modulate', 'cuda', 'NVIDIA H100 80GB HBM3', 'wan_adaln', 'bf16', kernel_ms=0.6917, compiled_ms=0.6744, versions='torch 2.11.0+cu130, triton 3.6.0', date='2026-11-23'),
    Measurement('mul_add', 'cuda', 'NVIDIA H100 80GB HBM3', 'flux_gate', 'bf16', kernel_ms=0.0319, compiled_ms=0.0308, versions='torch 2.11.0+cu130, triton 3.6.0', date='2026-11-23'),
    Measurement('mul_add', 'cuda', 'NVIDIA H100 80GB HBM3', 'wan_gate', 'bf16', kernel_ms=1.3793, compiled_ms=1.2690, versions='torch 2.11.0+cu130, triton 3.6.0', date='2026-11-23'),
)


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
