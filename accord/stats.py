"""95 % intervals for held-out results: Wilson for success rates, Student-t for means and paired differences.

Used by ``accord compare`` (:mod:`accord.compare`) and the Plan-Path benchmark. Pure Python, no SciPy:
Student's t quantile comes from the regularised incomplete beta function (a continued fraction),
which matches statistics tables to 4 decimals (see ``tests/test_stats.py``).

Why these intervals:

- a **success rate** gets the Wilson score interval: right coverage near 0 and 1, where the normal
  (Wald) interval collapses to a point;
- a **mean** (team return, or a success rate averaged over sampled episodes) gets the Student-t
  interval: deterministic, and at the sizes of a comparison (dozens of episodes) about as wide as a
  bootstrap, which would change with its own seed;
- a **difference** over the same units (before -> after on the same instances; method A against
  method B on the same instances and seeds) gets the paired t interval over the per-unit differences,
  which removes the spread between instances from the comparison.

Every interval treats its units as independent draws; see ``docs/compare.md`` for what that leaves out.
"""

from __future__ import annotations

import math
from typing import Sequence

Z95 = 1.959963984540054

__all__ = ["Z95", "wilson", "betainc", "t_quantile", "mean_ci", "proportion", "average", "rate", "paired",
           "verdict"]


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % by default)."""
    if n <= 0:
        raise ValueError("wilson: n must be > 0")
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the interval holds p; rounding can put an end a hair past it (0 successes in 48: low 7e-18)
    return max(0.0, min(p, center - half)), min(1.0, max(p, center + half))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (p in (0.5, 1)), by bisection on the CDF."""
    if df < 1 or not 0.5 < p < 1.0:
        raise ValueError(f"t_quantile: need df >= 1 and 0.5 < p < 1, got df={df}, p={p}")
    target = 2.0 * (1.0 - p)   # two-sided tail mass: P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2)
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if betainc(df / 2.0, 0.5, df / (df + mid * mid)) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % Student-t interval of the mean (a point when n < 2 or all values equal)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci: no values")
    m = sum(values) / n
    if n < 2:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    return m, m - half, m + half


def proportion(values: Sequence[float]) -> dict:
    """Success rate of 0/1 ``values`` with its Wilson interval: {mean, low, high, n, interval}."""
    if not values:
        raise ValueError("proportion: no values")
    lo, hi = wilson(sum(values), len(values))
    return {"mean": sum(values) / len(values), "low": lo, "high": hi, "n": len(values), "interval": "wilson"}


def average(values: Sequence[float]) -> dict:
    """Mean of ``values`` with its Student-t interval: {mean, low, high, n, interval}."""
    m, lo, hi = mean_ci(values)
    return {"mean": m, "low": lo, "high": hi, "n": len(values), "interval": "t"}


def rate(values: Sequence[float], *, binary: bool) -> dict:
    """A success rate over units: ``binary`` (one 0/1 episode per unit) the Wilson interval; else each unit's
    value is the share of its sampled episodes that succeeded, and the rate gets the t interval of their
    mean, cut to [0, 1] (a rate lies there; the t interval of a few units near 0 or 1 reaches past it)."""
    if binary:
        if any(v not in (0.0, 1.0) for v in values):
            raise ValueError("rate: binary=True needs 0/1 values (one episode per unit)")
        return proportion(values)
    out = average(values)
    out.update(low=max(0.0, out["low"]), high=min(1.0, out["high"]))
    return out


def paired(a: Sequence[float], b: Sequence[float]) -> dict:
    """Mean of ``a - b`` over paired units with the paired Student-t interval."""
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} values against {len(b)}; pair the same units")
    return average([x - y for x, y in zip(a, b)])


def verdict(diff: dict) -> int:
    """+1 when the interval of a difference (A - B) lies above 0, -1 when below, 0 (a tie) when it holds 0."""
    if diff["low"] > 0:
        return 1
    if diff["high"] < 0:
        return -1
    return 0
