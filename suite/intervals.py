"""How sure a tau (and the speedup it drives) is: a 95 % Student-t interval of the mean over prompts.

A run's tau is one number per prompt set; prompts differ (a code prompt accepts more than a chat one), and a small
change in numerics moves one draft and with it the alignment of every later block of that prompt, so the
per-prompt mean tau is the unit that varies. The interval is mean +- t(0.975, n - 1) s / sqrt(n) over the n
per-prompt means (s: their sample standard deviation). It is wide for few prompts by design (t = 4.30 at n = 3):
a batch-1 row over three prompts cannot tell 1.2x from 1.4x, and the report says so (plans/0003 "Uncertainty").
"""
from __future__ import annotations

import math
from typing import NamedTuple

# t(0.975, df), two-sided 95 %; a df between entries takes the entry below it (a larger t: conservative)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
Z975 = 1.960  # df beyond the table's last entry's reach: the normal quantile


def t975(df: int) -> float:
    """t(0.975, df) for df >= 1 (the table entry at or below df; 1.96 above 1000)."""
    if df < 1:
        raise ValueError(f"t975: df must be >= 1, got {df}")
    if df > 1000:
        return Z975
    return T975[max(k for k in T975 if k <= df)]


class MeanInterval(NamedTuple):
    mean: float
    lo: float | None   # None: fewer than 2 values, no interval
    hi: float | None
    n: int


def mean_interval(values) -> MeanInterval:
    """The 95 % t interval of the mean of the finite values (NaN: a prompt with no speculative step)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return MeanInterval(float("nan"), None, None, 0)
    mean = sum(xs) / n
    if n < 2:
        return MeanInterval(mean, None, None, n)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return MeanInterval(mean, mean - half, mean + half, n)


def scaled(value: float, iv: MeanInterval) -> list[float] | None:
    """[lo, hi] of a figure proportional to the interval's mean (a speedup at fixed step times), or None."""
    if iv.lo is None or not iv.mean > 0:
        return None
    return [value * iv.lo / iv.mean, value * iv.hi / iv.mean]
