"""The pooled tau's 95 % interval over prompts (kdbench.intervals): the Student-t quantiles, the ratio estimator's
interval worked by hand, its reduction to the t interval of the means when every prompt takes the same steps, the
edge cases (one prompt, prompts without a step), its coverage, the speedup's interval it scales to, and the
speedup's interval over batches (kinds/e2e.speedup_uncertainty)."""
import math

import numpy as np
import pytest

from kdbench.intervals import ratio_interval, scaled, t975


def test_t_quantiles_come_from_the_table_rounding_df_down():
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(10) == 2.228
    assert t975(11) == 2.228 and t975(13) == 2.179      # between entries: the entry below (a larger t)
    assert t975(500) == 1.980 and t975(5000) == 1.980    # above the table: its last entry (conservative)
    with pytest.raises(ValueError, match="df must be >= 1"):
        t975(0)


def test_ratio_interval_by_hand():
    ys, xs = [10.0, 30.0, 20.0], [5, 10, 5]              # pooled 60 / 20 = 3
    iv = ratio_interval(ys, xs)
    resid = [10 - 15, 30 - 30, 20 - 15]                  # y - 3 x
    se = math.sqrt(sum(e * e for e in resid) / (3 * 2)) / (20 / 3)
    assert iv.n == 3 and iv.value == 3.0
    assert (iv.lo, iv.hi) == pytest.approx((3 - 4.303 * se, 3 + 4.303 * se), rel=1e-12)


def test_equal_steps_give_the_t_interval_of_the_per_prompt_means():
    taus = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    iv = ratio_interval(list(taus * 7), [7] * 5)
    half = 2.776 * taus.std(ddof=1) / math.sqrt(5)
    assert iv.value == pytest.approx(3.0) and (iv.lo, iv.hi) == pytest.approx((3 - half, 3 + half), rel=1e-12)


def test_ratio_interval_edges():
    assert ratio_interval([5.0], [2]) == (2.5, None, None, 1)
    empty = ratio_interval([], [])
    assert empty.n == 0 and math.isnan(empty.value) and empty.lo is None
    assert ratio_interval([0.0, 6.0, 4.0], [0, 3, 2]).n == 2            # a prompt without a step is left out
    same = ratio_interval([4.0, 8.0, 2.0], [2, 4, 1])
    assert same.lo == same.hi == 2.0


def test_interval_covers_the_pooled_tau_about_95_percent_of_the_time():
    rng = np.random.default_rng(20261202)
    hits, trials = 0, 3000
    for _ in range(trials):
        xs = rng.integers(5, 40, size=24)                  # steps per prompt
        ys = xs * rng.normal(2.5, 0.6, size=24)            # each prompt's own tau around 2.5
        iv = ratio_interval(ys, xs)
        hits += iv.lo <= 2.5 <= iv.hi
    assert 0.93 < hits / trials < 0.97


def test_speedup_interval_scales_with_tau():
    iv = ratio_interval([20.0, 24.0, 22.0, 26.0], [10, 10, 10, 10])
    lo, hi = scaled(1.3, iv)
    assert lo == pytest.approx(1.3 * iv.lo / iv.value) and hi == pytest.approx(1.3 * iv.hi / iv.value)
    assert scaled(1.3, ratio_interval([2.0], [1])) is None
    assert scaled(float("nan"), iv) is None and scaled(float("inf"), iv) is None


def test_speedup_interval_is_over_batches():
    """kinds/e2e.speedup_uncertainty: the batch is the unit (delivered tokens = requests x (max_new - 1), x = its
    steps); one batch gives no interval."""
    from types import SimpleNamespace as NS

    from kdbench.kinds.e2e import speedup_uncertainty
    batches = [NS(tokens=[[0]] * 8, steps=[None] * n) for n in (30, 36, 33)]
    got = speedup_uncertainty(batches, 64, 0.9)
    iv = ratio_interval([8 * 63] * 3, [30, 36, 33])
    assert got["speedup_batches"] == 3 and got["speedup_ci95"] == pytest.approx(scaled(0.9, iv))
    assert speedup_uncertainty(batches[:1], 64, 0.9) == {"speedup_ci95": None, "speedup_batches": 1}
