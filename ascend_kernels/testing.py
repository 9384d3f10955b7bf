"""Numerical tolerances of the ``ascend_kernels`` ops and a verbose ``assert_close``.

`TOLERANCES` is the one per-dtype table every op and fusion test compares with: fused kernels
and fp32 intermediates round differently from the composite, equally validly."""

from __future__ import annotations

import torch

__all__ = ["TOLERANCES", "assert_close", "tolerance"]

TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float64: dict(atol=1e-10, rtol=1e-7),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    # fp16: 10 mantissa bits (eps 9.8e-4); bf16: 7 (eps 7.8e-3): about two ulps relative.
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2),
}


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """A copy of ``TOLERANCES[dtype]``.

    Raises:
        KeyError: a dtype without tolerances (the message lists the known ones).
    """
    try:
        return dict(TOLERANCES[dtype])
    except KeyError:
        known = ", ".join(str(d).replace("torch.", "") for d in TOLERANCES)
        raise KeyError(f"no tolerances for {dtype}; known dtypes: {known}") from None


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    dtype: torch.dtype | None = None,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    check_dtype: bool = True,
    msg: str = "",
    max_report: int = 5,
) -> None:
    """Asserts ``|actual - expected| <= atol + rtol * |expected|`` elementwise, explaining failures.

    On mismatch the error names the tolerance, the mismatch count, the max differences, the worst
    element and the first few mismatches. NaNs must appear at the same positions.

    Args:
        actual: tensor under test.
        expected: reference tensor (same shape).
        dtype: dtype whose `TOLERANCES` apply; default ``expected.dtype``.
        atol: override of the absolute tolerance.
        rtol: override of the relative tolerance.
        check_dtype: also require ``actual.dtype == expected.dtype``.
        msg: prefix of the error message (what was compared).
        max_report: how many mismatching elements to list.

    Raises:
        AssertionError: shape or dtype differ, or values are not close.

    Example:
        >>> import torch
        >>> from ascend_kernels.testing import assert_close
        >>> assert_close(torch.ones(3), torch.ones(3) + 1e-7)
    """
    prefix = f"{msg}: " if msg else ""
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{prefix}shape mismatch: actual {tuple(actual.shape)} vs expected {tuple(expected.shape)}"
        )
    if check_dtype and actual.dtype != expected.dtype:
        raise AssertionError(f"{prefix}dtype mismatch: actual {actual.dtype} vs expected {expected.dtype}")
    tol = tolerance(dtype or expected.dtype)
    atol = tol["atol"] if atol is None else atol
    rtol = tol["rtol"] if rtol is None else rtol

    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    nan_a, nan_e = a.isnan(), e.isnan()
    diff = (a - e).abs()
    both_inf_equal = a == e  # equal infinities have nan differences
    diff = torch.where(both_inf_equal, torch.zeros_like(diff), diff)
    bad = (diff > atol + rtol * e.abs()) | (nan_a != nan_e) | (diff.isnan() & ~(nan_a & nan_e))
    n_bad = int(bad.sum())
    if n_bad == 0:
        return

    finite = torch.where(diff.isnan(), torch.full_like(diff, float("inf")), diff)
    rel = torch.nan_to_num(finite / e.abs().clamp_min(torch.finfo(torch.float64).tiny), nan=float("inf"))
    worst = int(finite.flatten().argmax())
    worst_idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), a.shape)) if a.dim() else ()
    lines = [
        f"{prefix}tensors not close (atol={atol:g}, rtol={rtol:g}, dtype={dtype or expected.dtype}):",
        f"  mismatched elements: {n_bad} / {a.numel()} ({100.0 * n_bad / max(a.numel(), 1):.3f}%)",
        f"  max abs diff: {float(finite.max()):.6g} at index {worst_idx} "
        f"(actual {float(a.flatten()[worst]):.8g}, expected {float(e.flatten()[worst]):.8g})",
        f"  max rel diff: {float(rel[bad].max()):.6g}",
    ]
    for flat in bad.flatten().nonzero().flatten()[:max_report].tolist():
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)) if a.dim() else ()
        lines.append(f"    at {idx}: actual {float(a.flatten()[flat]):.8g}, expected {float(e.flatten()[flat]):.8g}")
    raise AssertionError("\n".join(lines))
