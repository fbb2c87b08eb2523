"""The one comparison helper: a kernel output against its float64 reference -> CheckResult with NaN/inf
positions, max abs / rel error, relative L2, % of elements outside tolerance and the worst element.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kdbench.config import Tolerance


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    n_nan: int              # elements where got is NaN/inf and the reference is not the same non-finite value
    max_abs: float          # max |got - want| over elements finite in both
    max_rel: float          # max |got - want| / |want| over elements finite in both with want != 0
    rel_l2: float           # ||got - want||_2 / ||want||_2 over elements finite in both
    pct_outside: float      # 100 * (elements outside tolerance, non-finite mismatches included) / size
    worst: str              # "(i, j) (got=..., want=...)": the element furthest beyond its allowed error


def _fmt(value) -> str:
    if isinstance(value, (np.integer, int, np.bool_, bool)):
        return str(int(value))
    return f"{float(value):.9g}"


def _index(flat: int, shape: tuple[int, ...]) -> str:
    if not shape:
        return "()"
    idx = np.unravel_index(flat, shape)
    return "(" + ", ".join(str(int(i)) for i in idx) + ")"


def _failed(worst: str) -> CheckResult:
    return CheckResult(False, 0, math.nan, math.nan, math.nan, 100.0, worst)


def compare(got, want, tol: Tolerance) -> CheckResult:
    """Elementwise |got - want| <= atol + rtol * |want|; pass iff no unmatched NaN/inf, at most
    tol.max_outside_pct % of elements outside, and rel_l2 <= tol.rel_l2 when that is set.
    Integer/bool references are compared exactly whatever the tolerance says, as int64 bit patterns: a uint64
    bitmask equals its int64 view (torch stores uint64 masks in int64 tensors)."""
    got_raw, want_raw = np.asarray(got), np.asarray(want)
    if got_raw.shape != want_raw.shape:
        return _failed(f"shape mismatch: got {got_raw.shape}, want {want_raw.shape}")
    if want_raw.size == 0:
        return CheckResult(True, 0, 0.0, 0.0, 0.0, 0.0, "empty arrays")
    exact = want_raw.dtype.kind in "iub" or (tol.rtol == 0 and tol.atol == 0)
    if exact and _identical(got_raw, want_raw):   # one pass instead of ~25 over large exact outputs
        return CheckResult(True, 0, 0.0, 0.0, 0.0, 0.0, "identical")
    if want_raw.dtype.kind in "iub" and got_raw.dtype.kind in "iub":
        return _compare_ints(got_raw, want_raw)
    g = got_raw.astype(np.float64).ravel()
    w = want_raw.astype(np.float64).ravel()
    rtol, atol = (0.0, 0.0) if exact else (tol.rtol, tol.atol)
    return _compare_floats(g, w, got_raw, want_raw, rtol, atol, tol)


def _identical(got: np.ndarray, want: np.ndarray) -> bool:
    """Same values element for element (NaN equal to NaN): the result the full exact comparison would give
    with every error 0. Floats are compared in the wider of the two dtypes (each numpy float widens exactly to
    it: a float32 reference of bf16-rounded inputs against a float64 result, or the other way)."""
    if got.dtype.kind in "iub" and want.dtype.kind in "iub":
        return bool(np.array_equal(got.astype(np.int64), want.astype(np.int64)))
    if got.dtype.kind == "f" and want.dtype.kind == "f":
        wide = np.promote_types(got.dtype, want.dtype)
        return bool(np.array_equal(got.astype(wide, copy=False), want.astype(wide, copy=False), equal_nan=True))
    return False


def _compare_ints(got: np.ndarray, want: np.ndarray) -> CheckResult:
    # int64 differences, not float64, so large token ids / slot numbers stay exact
    diff = np.abs(got.astype(np.int64).ravel() - want.astype(np.int64).ravel())
    n_out = int(np.count_nonzero(diff))
    nz = want.ravel() != 0
    max_rel = float((diff[nz] / np.abs(want.ravel()[nz].astype(np.float64))).max()) if nz.any() else 0.0
    norm = float(np.linalg.norm(want.ravel().astype(np.float64)))
    err = float(np.linalg.norm(diff.astype(np.float64)))
    rel_l2 = err / norm if norm > 0 else (0.0 if err == 0 else math.inf)
    k = int(np.argmax(diff))
    worst = f"{_index(k, want.shape)} (got={_fmt(got.ravel()[k])}, want={_fmt(want.ravel()[k])})"
    pct = 100.0 * n_out / want.size
    return CheckResult(n_out == 0, 0, float(diff.max()), max_rel, rel_l2, pct, worst)


def _compare_floats(g, w, got_raw, want_raw, rtol: float, atol: float, tol: Tolerance) -> CheckResult:
    fin_g, fin_w = np.isfinite(g), np.isfinite(w)
    both = fin_g & fin_w
    # matching non-finite values are equal: -inf scores of padding rows, NaN-filled unused pages
    same_nonfinite = (np.isnan(g) & np.isnan(w)) | (np.isinf(g) & np.isinf(w) & (g == w))
    got_bad = ~fin_g & ~same_nonfinite            # NaN/inf in got where the reference differs
    want_bad = ~fin_w & fin_g                     # the reference is non-finite, got is a number
    diff = np.zeros_like(g)
    diff[both] = np.abs(g[both] - w[both])
    allowed = atol + rtol * np.abs(np.where(both, w, 0.0))
    outside = (both & (diff > allowed)) | got_bad | want_bad
    n_nan = int(np.count_nonzero(got_bad))
    max_abs = float(diff.max())
    rel_mask = both & (w != 0)
    max_rel = float((diff[rel_mask] / np.abs(w[rel_mask])).max()) if rel_mask.any() else 0.0
    norm = float(np.linalg.norm(w[both]))
    err = float(np.linalg.norm(diff))
    rel_l2 = err / norm if norm > 0 else (0.0 if err == 0 else math.inf)
    pct = 100.0 * float(np.count_nonzero(outside)) / w.size
    passed = (n_nan == 0 and not want_bad.any() and pct <= tol.max_outside_pct
              and (tol.rel_l2 is None or rel_l2 <= tol.rel_l2))
    worst = _worst(g, w, diff, allowed, got_bad | want_bad, want_raw.shape)
    return CheckResult(bool(passed), n_nan, max_abs, max_rel, rel_l2, pct, worst)


def _worst(g, w, diff, allowed, nonfinite_bad, shape) -> str:
    """The first non-finite mismatch if any, else the element with the largest error beyond its allowance,
    else (every element within its allowance) the element with the largest absolute error."""
    bad = np.flatnonzero(nonfinite_bad)
    excess = diff - allowed
    if bad.size:
        k = int(bad[0])
    else:
        k = int(np.argmax(excess)) if (excess > 0).any() else int(np.argmax(diff))
    return f"{_index(k, shape)} (got={_fmt(g[k])}, want={_fmt(w[k])})"


def _nanmax(values) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return max(vals) if vals else math.nan


def merge(results: list[CheckResult]) -> CheckResult:
    """Worst over trials: passed only if every trial passed; maxima of the error figures; the worst string
    of the worst trial (most elements outside, then largest max_abs), prefixed with its trial number."""
    if not results:
        raise ValueError("merge() needs at least one CheckResult")
    order = sorted(range(len(results)), key=lambda i: (results[i].passed, -results[i].pct_outside,
                                                       -_finite_or_inf(results[i].max_abs)))
    k = order[0]
    worst = f"trial {k}: {results[k].worst}" if len(results) > 1 else results[k].worst
    return CheckResult(
        passed=all(r.passed for r in results),
        n_nan=sum(r.n_nan for r in results),
        max_abs=_nanmax(r.max_abs for r in results),
        max_rel=_nanmax(r.max_rel for r in results),
        rel_l2=_nanmax(r.rel_l2 for r in results),
        pct_outside=_nanmax(r.pct_outside for r in results),
        worst=worst,
    )


def _finite_or_inf(x: float) -> float:
    return math.inf if math.isnan(x) else x


def require(got, want, tol: Tolerance, what: str) -> CheckResult:
    """compare(), raising AssertionError with the figures and the worst element when the check fails
    (the form tests use, so every test reports a failure the same way)."""
    res = compare(got, want, tol)
    if not res.passed:
        raise AssertionError(f"{what}: rel L2 {res.rel_l2:.3e}, max abs {res.max_abs:.3e}, "
                             f"{res.pct_outside:.3g}% outside, {res.n_nan} non-finite; worst {res.worst}")
    return res


def require_rel_l2(got, want, rel_l2: float, what: str) -> CheckResult:
    """Relative L2 error <= rel_l2, every element finite where the reference is (no elementwise bound)."""
    return require(got, want, Tolerance(rtol=0.0, atol=1e300, rel_l2=rel_l2, max_outside_pct=100.0), what)
