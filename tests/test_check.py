"""Tests of kdbench.check: exact and tolerance comparisons, NaN/inf handling, the all-zero trap, the worst
element report, shape mismatch, integer outputs and merging trials."""
import math

import numpy as np
import pytest

from kdbench.check import CheckResult, compare, merge
from kdbench.config import Tolerance

EXACT = Tolerance()
F32 = Tolerance(rtol=1e-5, atol=1e-6)      # float32 output against a float64 reference


def test_exact_equal_and_one_ulp_off():
    want = np.linspace(-3, 3, 12).reshape(3, 4)
    assert compare(want.copy(), want, EXACT).passed
    got = want.copy()
    got[1, 2] = np.nextafter(got[1, 2], np.inf)
    res = compare(got, want, EXACT)
    assert not res.passed
    assert res.pct_outside == pytest.approx(100 / 12)
    assert res.worst.startswith("(1, 2) ")


def test_tolerance_boundary_is_inclusive():
    want = np.array([1.0, -2.0, 0.0, 100.0])
    tol = Tolerance(rtol=1e-3, atol=1e-4)
    allowed = 1e-4 + 1e-3 * np.abs(want)
    assert compare(want + 0.999 * allowed, want, tol).passed
    res = compare(want + 1.01 * allowed, want, tol)
    assert not res.passed and res.pct_outside == 100.0


def test_float32_roundoff_passes_and_reports_figures():
    rng = np.random.default_rng(1)
    want = rng.normal(size=(64, 33))
    got = want.astype(np.float32)
    res = compare(got, want, F32)
    assert res.passed and res.n_nan == 0 and res.pct_outside == 0.0
    assert 0 < res.max_abs < 1e-6 and 0 < res.max_rel < 1e-7 and 0 < res.rel_l2 < 1e-7


def test_nan_in_output_fails_and_is_counted():
    want = np.ones((4, 5))
    got = want.copy()
    got[2, 3] = np.nan
    got[0, 1] = np.inf
    res = compare(got, want, Tolerance(rtol=0.5, atol=0.5, max_outside_pct=50.0))
    assert not res.passed             # a NaN fails even when the outside budget would allow it
    assert res.n_nan == 2
    assert res.worst == "(0, 1) (got=inf, want=1)"   # first non-finite mismatch in C order


def test_matching_infinities_and_nans_are_equal():
    want = np.array([0.0, -np.inf, 2.0, np.nan])     # e.g. lse of padding rows is -inf
    got = np.array([0.0, -np.inf, 2.0, np.nan], dtype=np.float32)
    res = compare(got, want, EXACT)
    assert res.passed and res.n_nan == 0
    bad = compare(np.array([0.0, np.inf, 2.0, np.nan]), want, EXACT)   # wrong-signed infinity
    assert not bad.passed and bad.n_nan == 1


def test_finite_output_where_reference_is_infinite_fails():
    want = np.array([0.0, -np.inf])
    res = compare(np.array([0.0, -1e30]), want, Tolerance(rtol=1.0, atol=1.0))
    assert not res.passed and res.n_nan == 0 and res.pct_outside == 50.0


def test_all_zero_output_against_nonzero_reference_fails():
    rng = np.random.default_rng(7)
    want = rng.normal(0, 1e-3, size=1000)            # small values: an absolute-only tol would pass zeros
    zeros = np.zeros_like(want)
    assert compare(zeros, want, Tolerance(rtol=0, atol=1e-2)).passed    # the trap the style guide names
    res = compare(zeros, want, Tolerance(rtol=1e-2, atol=1e-5))
    assert not res.passed and res.pct_outside > 90
    res = compare(zeros, want, Tolerance(rtol=0, atol=1e-2, rel_l2=1e-3))
    assert not res.passed and res.rel_l2 == pytest.approx(1.0)


def test_worst_element_is_the_largest_excess_with_both_values():
    want = np.zeros((3, 4))
    got = want.copy()
    got[0, 0] = 0.1
    got[2, 1] = -0.5
    res = compare(got, want, Tolerance(rtol=0, atol=1e-3))
    assert res.worst == "(2, 1) (got=-0.5, want=0)"
    assert res.max_abs == 0.5
    assert res.max_rel == 0.0          # every reference element is 0: no relative figure exists


def test_integer_arrays_are_exact_whatever_the_tolerance():
    want = np.array([[5, 7], [9, 163839]], dtype=np.int64)
    got = want.astype(np.int32)
    assert compare(got, want, Tolerance(rtol=0.5, atol=3)).passed
    got[1, 1] = 163838
    res = compare(got, want, Tolerance(rtol=0.5, atol=3))
    assert not res.passed and res.max_abs == 1.0
    assert res.worst == "(1, 1) (got=163838, want=163839)"


def test_uint64_bitmasks_compare_exactly():
    want = np.array([2**63 + 1, 3], dtype=np.uint64)
    got = want.copy()
    assert compare(got, want, EXACT).passed
    got[0] = 2**63                   # differs in the lowest bit of a value past float64's 53 bits
    assert not compare(got, want, EXACT).passed


def test_shape_mismatch_fails_clearly():
    res = compare(np.zeros((2, 3)), np.zeros((3, 2)), F32)
    assert not res.passed
    assert res.worst == "shape mismatch: got (2, 3), want (3, 2)"


def test_max_outside_pct_allows_a_few_elements():
    want = np.ones(200)
    got = want.copy()
    got[:2] = 1.5
    assert compare(got, want, Tolerance(rtol=1e-6, max_outside_pct=1.0)).passed
    assert not compare(got, want, Tolerance(rtol=1e-6, max_outside_pct=0.5)).passed


def test_merge_takes_the_worst_trial():
    ok = compare(np.ones(4), np.ones(4), EXACT)
    bad = compare(np.array([1.0, 2.0, 1.0, 1.0]), np.ones(4), EXACT)
    merged = merge([ok, bad, ok])
    assert isinstance(merged, CheckResult)
    assert not merged.passed and merged.max_abs == 1.0 and merged.pct_outside == 25.0
    assert merged.worst.startswith("trial 1: (1) (got=2, want=1)")
    assert merge([ok]) == ok
    with pytest.raises(ValueError):
        merge([])


def test_merge_ignores_nan_figures_of_failed_shape_checks():
    shape_fail = compare(np.zeros(2), np.zeros(3), EXACT)
    ok = compare(np.ones(3), np.ones(3), EXACT)
    merged = merge([ok, shape_fail])
    assert not merged.passed and merged.max_abs == 0.0 and not math.isnan(merged.max_abs)
    assert "shape mismatch" in merged.worst


def test_identical_exact_outputs_take_the_one_pass_path():
    """Exact tolerances on equal arrays (NaN where the reference has NaN) pass with every figure 0; one
    differing element still goes through the full comparison and names the element."""
    want = np.array([[1.5, np.nan], [-0.0, 3.0]])
    same = compare(want.astype(np.float32), want, Tolerance(rtol=0, atol=0))
    assert same.passed and same.worst == "identical" and same.max_abs == 0 and same.pct_outside == 0
    wider = compare(want, want.astype(np.float32), Tolerance(rtol=0, atol=0))  # float64 got, float32 reference
    assert wider.passed and wider.worst == "identical"
    off32 = want.astype(np.float32)
    off32[0, 0] = 1.25
    assert not compare(want, off32, Tolerance(rtol=0, atol=0)).passed
    off = want.copy()
    off[1, 1] = 3.5
    res = compare(off, want, Tolerance(rtol=0, atol=0))
    assert not res.passed and "(1, 1)" in res.worst
