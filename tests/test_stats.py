"""accord.stats: the intervals of accord compare against textbook values, and the verdict rule."""

from __future__ import annotations

import pytest

from accord.stats import average, mean_ci, paired, proportion, rate, t_quantile, verdict, wilson


def test_t_quantile_matches_tables():
    # two-sided 95 % critical values of Student's t (any statistics table)
    for df, t in ((1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (30, 2.0423), (47, 2.0117), (1000, 1.9623)):
        assert t_quantile(0.975, df) == pytest.approx(t, abs=2e-4)
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)


def test_wilson_and_mean_intervals():
    # Wilson 95 % for 0/10, 10/10 and 3/10 (Newcombe 1998, method 3)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    for n in range(1, 200):   # the ends hold the proportion exactly, also where rounding would cross it
        assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0
        assert all(wilson(k, n)[0] <= k / n <= wilson(k, n)[1] for k in range(n + 1))
    m, lo, hi = mean_ci([1.0, 2.0, 3.0, 4.0])   # mean 2.5, sd 1.291, t(3) = 3.1824
    assert (m, lo, hi) == pytest.approx((2.5, 2.5 - 3.1824 * 1.291 / 2, 2.5 + 3.1824 * 1.291 / 2), abs=1e-3)
    assert mean_ci([-1.0, -1.0]) == (-1.0, -1.0, -1.0)


def test_rates_pick_their_interval():
    """Greedy (0/1 per unit): Wilson. Sampled (a share per unit): t, cut to [0, 1]."""
    assert rate([0.0, 1.0, 1.0], binary=True) == proportion([0.0, 1.0, 1.0])
    assert rate([0.0, 1.0, 1.0], binary=True)["interval"] == "wilson"
    shares = [0.0, 0.0, 0.25, 0.0]
    s = rate(shares, binary=False)
    t = average(shares)
    assert s["interval"] == "t" and s["mean"] == t["mean"] == pytest.approx(0.0625)
    assert t["low"] < 0 and s["low"] == 0.0 and s["high"] == pytest.approx(t["high"])
    with pytest.raises(ValueError):
        rate([0.5], binary=True)


def test_paired_difference_and_verdict():
    a, b = [1.0, 2.0, 3.0, 4.0], [0.0, 1.5, 2.0, 3.5]   # differences 1, 0.5, 1, 0.5
    d = paired(a, b)
    assert d["mean"] == pytest.approx(0.75) and d["n"] == 4
    assert d == average([1.0, 0.5, 1.0, 0.5])
    assert verdict(d) == 1 and verdict(paired(b, a)) == -1
    assert verdict(paired([1.0, 0.0], [0.0, 1.0])) == 0          # holds 0: a tie
    assert verdict(paired([1.0, 1.0], [1.0, 1.0])) == 0          # identical: the interval is the point 0
    with pytest.raises(ValueError):
        paired([1.0], [1.0, 2.0])
