"""tau's 95 % interval over prompts (kdbench.intervals): the Student-t quantiles, the interval of a mean on values
worked by hand, the edge cases (one value, NaN prompts, equal values) and the speedup's interval it scales to."""
import math

import numpy as np
import pytest

from kdbench.intervals import mean_interval, scaled, t975


def test_t_quantiles_come_from_the_table_rounding_df_down():
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(10) == 2.228
    assert t975(11) == 2.228 and t975(13) == 2.179      # between entries: the entry below (a larger t)
    assert t975(500) == 1.980 and t975(5000) == 1.960
    with pytest.raises(ValueError, match="df must be >= 1"):
        t975(0)


def test_mean_interval_by_hand():
    iv = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])   # mean 3, s = sqrt(2.5), t(4) = 2.776
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)
    assert iv.n == 5 and iv.mean == 3.0
    assert iv.lo == pytest.approx(3.0 - half, rel=1e-12) and iv.hi == pytest.approx(3.0 + half, rel=1e-12)
    two = mean_interval([2.0, 4.0])                  # s = sqrt(2): half = t(1) exactly
    assert (two.lo, two.hi) == pytest.approx((3.0 - 12.706, 3.0 + 12.706))


def test_mean_interval_edges():
    assert mean_interval([2.5]) == (2.5, None, None, 1)
    empty = mean_interval([])
    assert empty.n == 0 and math.isnan(empty.mean) and empty.lo is None
    same = mean_interval([2.0, 2.0, 2.0])
    assert same.lo == same.hi == 2.0
    nan = mean_interval([2.0, float("nan"), 4.0, None])   # a prompt without a speculative step is left out
    assert nan.n == 2 and nan.mean == 3.0


def test_interval_covers_the_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(20261202)
    hits = 0
    for _ in range(4000):
        iv = mean_interval(rng.normal(2.5, 0.6, size=4))
        hits += iv.lo <= 2.5 <= iv.hi
    assert 0.935 < hits / 4000 < 0.965


def test_speedup_interval_scales_with_tau():
    iv = mean_interval([2.0, 2.4, 2.2, 2.6])
    lo, hi = scaled(1.3, iv)
    assert lo == pytest.approx(1.3 * iv.lo / iv.mean) and hi == pytest.approx(1.3 * iv.hi / iv.mean)
    assert scaled(1.3, mean_interval([2.0])) is None
