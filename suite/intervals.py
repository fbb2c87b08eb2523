"""How sure a tau (and the speedup it drives) is: a 95 % Student-t interval over prompts.

Prompts differ (a repetitive prompt accepts far more than a chat one), and a small change in numerics moves one draft
and with it the alignment of every later block of that prompt, so the prompt is the unit that varies. A run's tau is
pooled over steps: tau = sum_i y_i / sum_i x_i, prompt i taking x_i speculative steps that commit y_i tokens. Its
interval is the ratio estimator's: tau +- t(0.975, n - 1) SE, SE = sqrt(sum_i (y_i - tau x_i)^2 / (n (n - 1))) / x_bar
over the n prompts with a step (the delta method; with equal x_i it is the t interval of the per-prompt means). It is
wide for few prompts by design (t = 4.30 at n = 3): a batch-1 row over three prompts cannot tell 1.2x from 1.4x, and
the report says so (plans/0016-tau-intervals.md). The same interval over batches bounds the speedup (kinds/e2e.py):
a batch runs until its slowest request is done, so there the batch is the unit.
"""
from __future__ import annotations

import math
from typing import NamedTuple

# t(0.975, df), two-sided 95 %; a df between entries, or above 120, takes the entry at or below it (a larger t:
# conservative; 1.980 against the normal 1.960 at very large df)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df: int) -> float:
    """t(0.975, df) for df >= 1: the table entry at or below df."""
    if df < 1:
        raise ValueError(f"t975: df must be >= 1, got {df}")
    return T975[max(k for k in T975 if k <= df)]


class Interval(NamedTuple):
    value: float       # the estimate: the pooled ratio
    lo: float | None   # None: fewer than 2 prompts, no interval
    hi: float | None
    n: int             # prompts that count (x_i > 0)


def ratio_interval(ys, xs) -> Interval:
    """The 95 % interval of sum(y) / sum(x) over units (y_i, x_i) with x_i > 0 (others are left out)."""
    pairs = [(float(y), float(x)) for y, x in zip(ys, xs) if x > 0]
    n = len(pairs)
    if n == 0:
        return Interval(float("nan"), None, None, 0)
    sx = sum(x for _, x in pairs)
    r = sum(y for y, _ in pairs) / sx
    if n < 2:
        return Interval(r, None, None, n)
    se = math.sqrt(sum((y - r * x) ** 2 for y, x in pairs) / (n * (n - 1))) / (sx / n)
    half = t975(n - 1) * se
    return Interval(r, r - half, r + half, n)


def scaled(value: float, iv: Interval) -> list[float] | None:
    """[lo, hi] of a figure proportional to the interval's estimate (a speedup at fixed step times), or None (no
    interval, or a figure or estimate that is not a finite positive number)."""
    if iv.lo is None or not (iv.value > 0 and math.isfinite(iv.value) and math.isfinite(value)):
        return None
    return [value * iv.lo / iv.value, value * iv.hi / iv.value]


def overlaps(a, b) -> bool:
    """Two [lo, hi] intervals share a point; False when either is None (no interval: nothing to tell apart)."""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def speedup_interval(rec) -> tuple[float, float] | None:
    """An e2e record's speedup interval over batches (kinds/e2e.speedup_uncertainty), or None. Records of s12's first
    form (over prompts, no speedup_batches) are read as having none."""
    ci = rec.extra.get("speedup_ci95")
    return (float(ci[0]), float(ci[1])) if ci and "speedup_batches" in rec.extra else None


def speedup_unsure(rec) -> bool:
    """A speculative record faster than AR whose speedup interval reaches below 1."""
    ci, s = speedup_interval(rec), rec.speedup_vs_ar
    return s is not None and math.isfinite(s) and s >= 1 and ci is not None and ci[0] < 1


UNITS = {"prompt": "prompts", "batch": "batches"}


def ci_text(ci, n, unit: str, suffix: str = "") -> str:
    """'lo-hi<suffix> (n prompts | batches)' of an interval over n units, '1 <unit>: no interval', or ''."""
    if not ci:
        return f"1 {unit}: no interval" if n == 1 else ""
    return f"{ci[0]:.2f}-{ci[1]:.2f}{suffix} ({n} {UNITS[unit]})"
