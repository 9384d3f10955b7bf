"""``ascend_kernels.testing``: the tolerance table and assert_close's mismatch report."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels.testing import TOLERANCES, assert_close, tolerance


def test_table_covers_dtypes_and_is_ordered_by_precision():
    assert set(TOLERANCES) == {torch.float64, torch.float32, torch.float16, torch.bfloat16}
    order = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
    for lo, hi in zip(order, order[1:]):
        assert TOLERANCES[lo]["atol"] <= TOLERANCES[hi]["atol"] and TOLERANCES[lo]["rtol"] <= TOLERANCES[hi]["rtol"]
    with pytest.raises(KeyError, match="known dtypes: float64, float32, float16, bfloat16"):
        tolerance(torch.int8)


def test_passes_within_tolerance_and_uses_dtype_row():
    x = torch.linspace(-4, 4, 101)
    assert_close(x + 5e-6, x)
    assert_close((x + 5e-3).bfloat16(), x.bfloat16())
    with pytest.raises(AssertionError):
        assert_close(x + 5e-3, x)  # the same difference is too large for fp32


def test_mismatch_report_names_worst_element_and_counts():
    expected = torch.zeros(4, 5)
    actual = expected.clone()
    actual[1, 2], actual[3, 4] = 0.5, 2.0
    with pytest.raises(AssertionError) as e:
        assert_close(actual, expected, msg="demo")
    text = str(e.value)
    assert text.startswith("demo: tensors not close (atol=1e-05, rtol=1e-05")
    assert "mismatched elements: 2 / 20" in text
    assert "max abs diff: 2 at index (3, 4) (actual 2, expected 0)" in text
    assert "at (1, 2): actual 0.5, expected 0" in text


def test_shape_dtype_and_nan_checks():
    with pytest.raises(AssertionError, match="shape mismatch"):
        assert_close(torch.zeros(3), torch.zeros(4))
    with pytest.raises(AssertionError, match="dtype mismatch"):
        assert_close(torch.zeros(3), torch.zeros(3, dtype=torch.float64))
    assert_close(torch.zeros(3), torch.zeros(3, dtype=torch.float64), check_dtype=False)
    nan = torch.tensor([1.0, float("nan")])
    assert_close(nan, nan.clone())
    with pytest.raises(AssertionError, match="mismatched elements: 1 / 2"):
        assert_close(torch.tensor([1.0, 2.0]), nan)
    inf = torch.tensor([float("inf"), 1.0])
    assert_close(inf, inf.clone())
