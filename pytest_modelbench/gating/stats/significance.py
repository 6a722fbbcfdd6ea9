"""Paired tests that compare two runs example by example: exact McNemar and Tango's score test
for 0/1 scores, the paired t-test and a seeded paired bootstrap for continuous ones, each with
the interval that inverts it; and Holm's correction for many p-values at once.

Paired functions take ``(x, y)`` and describe the difference ``x - y`` (as R's
``t.test(x, y, paired=TRUE)`` does); ``alternative`` names the alternative
hypothesis about that difference relative to ``null_difference`` (``"less"``:
x is worse than y by more than the null).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pytest_modelbench.gating.stats.distributions import (
    binomial_half_cdf,
    normal_cdf,
    normal_quantile_two_sided,
    normal_sf,
    t_cdf,
    t_sf,
)
from pytest_modelbench.gating.stats.estimates import (
    clopper_pearson_interval,
    mean_and_var,
    symmetric_interval,
)

Alternative = Literal["two-sided", "less", "greater"]


@dataclass(frozen=True)
class McNemarResult:
    """Exact (conditional) McNemar test on the discordant pairs of a paired 0/1 table.

    ``b`` counts pairs with x=1, y=0 and ``c`` pairs with x=0, y=1; under H0
    ``b ~ Binomial(b + c, 1/2)``.
    """

    b: int
    c: int
    p_value: float
    alternative: Alternative
    mid_p: bool = False

    @property
    def method(self) -> str:
        return "mid-p McNemar" if self.mid_p else "exact McNemar"


def mcnemar_exact(
    b: int, c: int, alternative: Alternative = "two-sided", *, mid_p: bool = False
) -> McNemarResult:
    """Exact McNemar test via the binomial distribution of ``b`` given ``b + c``.

    ``"less"`` tests H1: P(x=1) < P(y=1) (x worse, i.e. b small), ``"greater"``
    the reverse; the two-sided p-value doubles the smaller tail (capped at 1).
    ``mid_p`` subtracts half the probability of the observed table.
    """
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar_exact: counts must be non-negative, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return McNemarResult(b, c, 1.0, alternative, mid_p)
    lower = binomial_half_cdf(b, n)  # P(B <= b)
    upper = binomial_half_cdf(n - b, n)  # P(B >= b), by symmetry
    half_point = 0.5 * (binomial_half_cdf(b, n) - binomial_half_cdf(b - 1, n)) if mid_p else 0.0
    if alternative == "less":
        p = lower - half_point
    elif alternative == "greater":
        p = upper - half_point
    else:
        p = 2.0 * (min(lower, upper) - half_point)
    return McNemarResult(b, c, min(1.0, p), alternative, mid_p)


def mcnemar_exact_ci(b: int, c: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The interval for P(x=1) - P(y=1) that inverts the exact McNemar test.

    Clopper–Pearson bounds for theta = b / (b + c), the share of discordant
    pairs that favour x, mapped to ((b + c) / n) (2 theta - 1): conditional on
    the discordant count, as the test is. So the one-sided test at
    (1 - confidence) / 2 rejects exactly when the interval excludes 0.
    """
    if min(b, c) < 0 or b + c > n or n <= 0:
        raise ValueError(f"bad paired counts b={b}, c={c}, n={n}")
    discordant = b + c
    if discordant == 0:
        return 0.0, 0.0
    low, high = clopper_pearson_interval(b, discordant, confidence)
    scale = discordant / n
    return scale * (2.0 * low - 1.0), scale * (2.0 * high - 1.0)


@dataclass(frozen=True)
class PairedResult:
    """A paired comparison: the mean difference x - y, its test against ``null_difference``.

    ``statistic`` is t (paired t), Z (score test) or the observed difference
    (bootstrap); ``df`` is set for the t-test only.
    """

    method: str
    alternative: Alternative
    n: int
    estimate: float
    stderr: float
    null_difference: float
    statistic: float
    p_value: float
    ci_low: float
    ci_high: float
    confidence: float = 0.95
    df: float | None = None


def _standardize(gap: float, se: float) -> float:
    """gap / se, with a zero standard error giving 0 (no gap) or an infinite statistic."""
    if se > 0.0:
        return gap / se
    return 0.0 if gap == 0 else math.copysign(math.inf, gap)


def _p_from_z(z: float, alternative: Alternative) -> float:
    if alternative == "less":
        return normal_cdf(z)
    if alternative == "greater":
        return normal_sf(z)
    return min(1.0, 2.0 * normal_sf(abs(z)))


def _tango_restricted_pc(b: int, c: int, n: int, delta: float) -> float:
    """Restricted MLE of P(x=0, y=1) under H0: P(x=1) - P(y=1) = delta (Tango 1998)."""
    m = n - b - c
    lin = c * (1.0 - 3.0 * delta) + b * (1.0 - delta) - 2.0 * m * delta
    disc = lin * lin + 8.0 * n * c * delta * (1.0 - delta)
    return (lin + math.sqrt(max(0.0, disc))) / (4.0 * n)


def _tango_z(b: int, c: int, n: int, delta: float) -> float:
    q = _tango_restricted_pc(b, c, n, delta)
    var = n * (2.0 * q + delta * (1.0 - delta))
    diff = b - c - n * delta
    if var <= 0.0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / math.sqrt(var)


def paired_proportions_score_test(
    b: int,
    c: int,
    n: int,
    null_difference: float = 0.0,
    alternative: Alternative = "two-sided",
    confidence: float = 0.95,
) -> PairedResult:
    """Tango's (1998) score test of P(x=1) - P(y=1) = ``null_difference`` for paired 0/1 data.

    ``b`` = #(x=1, y=0), ``c`` = #(x=0, y=1), ``n`` = all pairs. The variance
    uses the restricted MLE under H0, so a non-zero null (a non-inferiority
    margin) is tested properly; with a null of 0 it is McNemar's z.
    """
    if min(b, c) < 0 or b + c > n or n <= 0:
        raise ValueError(f"bad paired counts b={b}, c={c}, n={n}")
    if not -1.0 < null_difference < 1.0:
        raise ValueError(f"null_difference must be in (-1, 1), got {null_difference}")
    z = _tango_z(b, c, n, null_difference)
    q = _tango_restricted_pc(b, c, n, null_difference)
    se0 = math.sqrt(max(0.0, 2.0 * q + null_difference * (1.0 - null_difference)) / n)
    low, high = paired_proportions_score_ci(b, c, n, confidence)
    return PairedResult(
        "Tango score test",
        alternative,
        n,
        (b - c) / n,
        se0,
        null_difference,
        z,
        _p_from_z(z, alternative),
        low,
        high,
        confidence,
    )


def paired_proportions_score_ci(
    b: int, c: int, n: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Tango's score CI for P(x=1) - P(y=1): the nulls the two-sided score test keeps."""
    z = normal_quantile_two_sided(confidence)
    estimate = (b - c) / n

    def solve(target: float, lo: float, hi: float) -> float:
        # _tango_z decreases in delta; find delta with z(delta) = target on [lo, hi].
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if _tango_z(b, c, n, mid) > target:
                lo = mid
            else:
                hi = mid
            if hi - lo < 1e-13:
                break
        return 0.5 * (lo + hi)

    low = -1.0 if _tango_z(b, c, n, -1.0 + 1e-12) <= z else solve(z, -1.0 + 1e-12, estimate)
    high = 1.0 if _tango_z(b, c, n, 1.0 - 1e-12) >= -z else solve(-z, estimate, 1.0 - 1e-12)
    return low, high


def _differences(x: Sequence[float], y: Sequence[float]) -> list[float]:
    if len(x) != len(y):
        raise ValueError(f"paired samples differ in length: {len(x)} vs {len(y)}")
    return [a - b for a, b in zip(x, y, strict=True)]


def paired_t_test(
    x: Sequence[float],
    y: Sequence[float],
    null_difference: float = 0.0,
    alternative: Alternative = "two-sided",
    confidence: float = 0.95,
) -> PairedResult:
    """Student's paired t-test of mean(x - y) = ``null_difference`` (df = n - 1).

    When every difference is identical the standard error is 0; the p-value is
    then 0 or 1 depending on which side of the null the difference lies.
    """
    d = _differences(x, y)
    n = len(d)
    if n < 2:
        raise ValueError(f"paired_t_test needs at least 2 pairs, got {n}")
    mean, var = mean_and_var(d)
    se = math.sqrt(var / n)
    df = float(n - 1)
    gap = mean - null_difference
    t = _standardize(gap, se)
    if alternative == "less":
        p = t_cdf(t, df)
    elif alternative == "greater":
        p = t_sf(t, df)
    else:
        p = min(1.0, 2.0 * t_sf(abs(t), df))
    low, high = symmetric_interval(mean, se, df, confidence)
    return PairedResult(
        "paired t-test", alternative, n, mean, se, null_difference, t, p, low, high, confidence, df
    )


def paired_bootstrap_test(
    x: Sequence[float],
    y: Sequence[float],
    null_difference: float = 0.0,
    alternative: Alternative = "two-sided",
    confidence: float = 0.95,
    *,
    n_resamples: int = 2000,
    seed: int = 0,
) -> PairedResult:
    """Paired bootstrap of mean(x - y): resample pairs with replacement ``n_resamples`` times.

    The p-value compares the centred bootstrap distribution ``d* - d`` with
    the observed ``d - null`` (Hall & Wilson's shift method), with the usual
    +1 correction so it is never 0. The CI inverts that same test (the
    "basic" bootstrap interval 2d - d*), so the one-sided test at
    (1 - confidence) / 2 rejects a null exactly when the CI excludes it;
    it is infinite when ``n_resamples`` is too small to ever reject.
    Deterministic for a given ``seed`` (``random.Random``).
    """
    d = _differences(x, y)
    n = len(d)
    if n < 2:
        raise ValueError(f"paired_bootstrap_test needs at least 2 pairs, got {n}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, got {n_resamples}")
    mean = math.fsum(d) / n
    rng = random.Random(seed)
    means = sorted(math.fsum(rng.choices(d, k=n)) / n for _ in range(n_resamples))
    gap = mean - null_difference
    tol = 1e-12 * max(1.0, abs(gap))
    if alternative == "less":
        hits = sum(1 for m in means if m - mean <= gap + tol)
    elif alternative == "greater":
        hits = sum(1 for m in means if m - mean >= gap - tol)
    else:
        hits = sum(1 for m in means if abs(m - mean) >= abs(gap) - tol)
    p = min(1.0, (hits + 1) / (n_resamples + 1))
    _, boot_var = mean_and_var(means)
    # rounded so that confidence = 1 - 2 alpha gives back alpha exactly (not alpha + 1 ulp)
    low, high = _inverted_bootstrap_interval(means, mean, round(0.5 * (1.0 - confidence), 12))
    return PairedResult(
        "paired bootstrap",
        alternative,
        n,
        mean,
        math.sqrt(boot_var),
        null_difference,
        mean,
        p,
        low,
        high,
        confidence,
    )


def _inverted_bootstrap_interval(
    sorted_means: Sequence[float], mean: float, tail: float
) -> tuple[float, float]:
    """The nulls that the one-sided shift tests at level ``tail`` keep (each side).

    "less" keeps null d0 iff (#{m* - d <= d - d0} + 1) / (R + 1) >= tail, i.e.
    iff at least ``hits`` resampled means lie at or below 2d - d0.
    """
    r = len(sorted_means)
    hits = max(0, int(tail * (r + 1)) - 2)
    while (hits + 1) / (r + 1) < tail:  # the same float comparison the gate makes
        hits += 1
    if hits == 0:
        return -math.inf, math.inf
    return 2.0 * mean - sorted_means[r - hits], 2.0 * mean - sorted_means[hits - 1]


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the input order (as R's ``p.adjust(, "holm")``).

    Rejecting where the adjusted p-value is below alpha controls the
    family-wise error rate at alpha.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
