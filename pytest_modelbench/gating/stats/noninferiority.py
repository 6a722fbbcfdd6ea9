"""Tests of one score against a baseline, each with the interval made by inverting it.

Every test answers H0: current - baseline >= -margin against H1: worse by
more than the margin, one-sided at ``alpha``, and returns the two-sided
(1 - 2 alpha) interval for the difference that inverts the *same* test, so
``p_value < alpha`` exactly when ``ci_high < -margin`` (to 1e-13):

* :func:`exact_binomial_test`: 0/1 scores against an exact baseline number,
  P(X <= k | n, baseline - margin) with the Clopper–Pearson interval.
* :func:`farrington_manning_test`: 0/1 scores against a baseline measured on
  its own n; a score test whose variance uses the restricted MLE under H0
  (Farrington & Manning 1990), continuity-corrected so that its size stays
  at or below alpha at small n.
* :func:`constant_bounded_test`: scores that are all equal, each in [0, 1],
  against an exact baseline: the exact test on the sample maximum (no spread
  is not "no evidence": n equal scores of 0.2 cannot come from a mean of 0.95).
* :func:`mean_noninferiority_test`: means, by the (Welch) t-test. A zero or
  undefined standard error cannot decide anything: ``p_value`` is None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytest_modelbench.gating.stats.distributions import (
    binomial_cdf,
    find_root,
    normal_cdf,
    normal_ppf,
    t_cdf,
    t_ppf,
)
from pytest_modelbench.gating.stats.estimates import clopper_pearson_interval

# Differences are searched on [-1 + _EDGE, 1 - _EDGE]: the restricted MLE needs |delta| < 1.
_EDGE = 1e-12


@dataclass(frozen=True)
class NonInferiorityResult:
    """One comparison of a score with its baseline, and the interval that inverts the test.

    ``delta`` = estimate - baseline; [``ci_low``, ``ci_high``] is its two-sided
    ``confidence`` interval. ``p_value`` (one-sided, small = regression beyond
    the margin) is None when the data cannot decide; ``reason`` says why.
    """

    method: str
    estimate: float
    delta: float
    margin: float
    p_value: float | None
    ci_low: float
    ci_high: float
    confidence: float
    reason: str = ""

    @property
    def undecidable(self) -> bool:
        """Whether the test could not decide (zero or undefined standard error)."""
        return self.p_value is None


def _check(alpha: float, margin: float) -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if not margin >= 0.0:
        raise ValueError(f"margin must be non-negative, got {margin!r}")


def exact_binomial_test(
    successes: float, n: float, baseline: float, margin: float = 0.0, alpha: float = 0.05
) -> NonInferiorityResult:
    """One-sided exact binomial test of H0: p >= baseline - margin, Clopper–Pearson interval.

    The p-value is P(X <= successes | n, baseline - margin), as scipy's
    ``binomtest(k, n, p0, alternative="less")``; fractional counts (Rao–Scott
    effective counts of rollouts) use the binomial's continuous extension.
    """
    _check(alpha, margin)
    if n <= 0 or not 0.0 <= successes <= n:
        raise ValueError(f"exact_binomial_test: need 0 <= successes <= n, got {successes}/{n}")
    null = baseline - margin
    # above 1 the null is impossible, whatever the data: reject (the interval agrees)
    p_value = binomial_cdf(successes, n, null) if null <= 1.0 else 0.0
    low, high = clopper_pearson_interval(successes, n, 1.0 - 2.0 * alpha)
    estimate = successes / n
    return NonInferiorityResult(
        "exact binomial",
        estimate,
        estimate - baseline,
        margin,
        p_value,
        low - baseline,
        high - baseline,
        1.0 - 2.0 * alpha,
    )


def constant_bounded_test(
    value: float, n: int, baseline: float, margin: float = 0.0, alpha: float = 0.05
) -> NonInferiorityResult:
    """Exact one-sided test of H0: mean >= baseline - margin when all ``n`` scores equal
    ``value`` and every score lies in [0, 1] (partial credit).

    The statistic is the sample maximum. For a score X in [0, 1] with mean mu,
    P(X <= value) <= (1 - mu) / (1 - value) (Markov's inequality on 1 - X, attained by
    the two-point law on {value, 1}), so the p-value is ((1 - null) / (1 - value))^n,
    exactly its supremum over H0. Inverting the same bound on both sides gives the
    interval [value alpha^(1/n), 1 - (1 - value) alpha^(1/n)] for the mean, so the test
    fails exactly when the interval lies below baseline - margin.
    """
    _check(alpha, margin)
    if n < 1 or not 0.0 <= value <= 1.0:
        raise ValueError(f"constant_bounded_test: need n >= 1 and value in [0, 1], got {value}/{n}")
    null = baseline - margin
    if value >= null:
        p_value = 1.0
    elif null > 1.0:
        p_value = 0.0  # no score in [0, 1] has a mean above 1
    else:
        p_value = ((1.0 - null) / (1.0 - value)) ** n
    root = alpha ** (1.0 / n)
    low, high = value * root, 1.0 - (1.0 - value) * root
    return NonInferiorityResult(
        f"exact test for {n} equal scores in [0, 1]",
        value,
        value - baseline,
        margin,
        p_value,
        low - baseline,
        high - baseline,
        1.0 - 2.0 * alpha,
    )


def fm_restricted_mle(
    p1: float, n1: float, p2: float, n2: float, delta: float
) -> tuple[float, float]:
    """Maximum-likelihood (p1, p2) of two binomials restricted to p1 - p2 = ``delta``.

    The closed-form root of the likelihood's cubic (Farrington & Manning 1990;
    Miettinen & Nurminen 1985), clipped to [0, 1] against rounding.
    """
    theta = n2 / n1
    a = 1.0 + theta
    b = -(1.0 + theta + p1 + theta * p2 + delta * (theta + 2.0))
    c = delta * delta + delta * (2.0 * p1 + theta + 1.0) + p1 + theta * p2
    d = -p1 * delta * (1.0 + delta)
    v = b**3 / (27.0 * a**3) - b * c / (6.0 * a * a) + d / (2.0 * a)
    u = math.copysign(math.sqrt(max(0.0, b * b / (9.0 * a * a) - c / (3.0 * a))), v)
    if u == 0.0:
        r1 = -b / (3.0 * a)
    else:
        w = (math.pi + math.acos(max(-1.0, min(1.0, v / u**3)))) / 3.0
        r1 = 2.0 * u * math.cos(w) - b / (3.0 * a)
    r1 = min(1.0, max(0.0, r1, delta))
    r2 = min(1.0, max(0.0, r1 - delta))
    return r1, r2


def _fm_z(p1: float, n1: float, p2: float, n2: float, delta: float, correction: float) -> float:
    """The score statistic (p1 - p2 - delta + correction) / SE under H0: p1 - p2 = delta."""
    r1, r2 = fm_restricted_mle(p1, n1, p2, n2, delta)
    variance = r1 * (1.0 - r1) / n1 + r2 * (1.0 - r2) / n2
    gap = p1 - p2 - delta + correction
    if variance <= 0.0:  # only at delta = 0 with every row 0 (or 1): the limit is 0
        return 0.0 if gap == 0.0 else math.copysign(math.inf, gap)
    return gap / math.sqrt(variance)


def farrington_manning_test(
    successes: float,
    n: float,
    baseline: float,
    baseline_n: float,
    margin: float = 0.0,
    alpha: float = 0.05,
) -> NonInferiorityResult:
    """Farrington–Manning score test of H0: p - p_baseline >= -margin, interval by inversion.

    The variance uses the MLE of both proportions restricted to the null, so it
    does not vanish at a score of 0 or 1. The statistic is moved toward the
    null by (1/n + 1/baseline_n)/2 (continuity correction), which keeps the
    size at or below alpha down to n = 5; with margin 0 and no correction it
    is the pooled two-proportion z-test (Pearson's chi-square).
    """
    _check(alpha, margin)
    if n <= 0 or baseline_n <= 0 or not 0.0 <= successes <= n:
        raise ValueError(
            f"farrington_manning_test: need 0 <= successes <= n and n, baseline_n > 0, "
            f"got {successes}/{n} vs n={baseline_n}"
        )
    if not 0.0 <= baseline <= 1.0:
        raise ValueError(f"farrington_manning_test: baseline must be in [0, 1], got {baseline!r}")
    p1 = successes / n
    correction = 0.5 * (1.0 / n + 1.0 / baseline_n)
    z_alpha = normal_ppf(1.0 - alpha)

    def upper(delta: float) -> float:  # "less" side: decreasing in delta, 0 at the bound
        return _fm_z(p1, n, baseline, baseline_n, delta, correction) + z_alpha

    def lower(delta: float) -> float:  # "greater" side
        return _fm_z(p1, n, baseline, baseline_n, delta, -correction) - z_alpha

    null = -margin
    p_value = (
        1.0
        if null <= -1.0 + _EDGE
        else normal_cdf(_fm_z(p1, n, baseline, baseline_n, null, correction))
    )
    lo, hi = -1.0 + _EDGE, 1.0 - _EDGE
    high = 1.0 if upper(hi) >= 0.0 else find_root(upper, lo, hi)
    low = -1.0 if lower(lo) <= 0.0 else find_root(lower, lo, hi)
    return NonInferiorityResult(
        "Farrington–Manning score",
        p1,
        p1 - baseline,
        margin,
        p_value,
        low,
        high,
        1.0 - 2.0 * alpha,
    )


def _welch_df(stderr: float, df: float, baseline_stderr: float, baseline_df: float) -> float:
    """Welch–Satterthwaite degrees of freedom of stderr^2 + baseline_stderr^2."""
    parts = [
        se**4 / d
        for se, d in ((stderr, df), (baseline_stderr, baseline_df))
        if se > 0 and d < math.inf
    ]
    total = stderr**2 + baseline_stderr**2
    return total**2 / math.fsum(parts) if parts else math.inf


def mean_noninferiority_test(
    estimate: float,
    stderr: float,
    df: float,
    baseline: float,
    margin: float = 0.0,
    alpha: float = 0.05,
    *,
    baseline_stderr: float = 0.0,
    baseline_df: float = math.inf,
    method: str = "one-sample t",
) -> NonInferiorityResult:
    """t-test of H0: mean - baseline >= -margin, with the t interval for the difference.

    A baseline with its own ``baseline_stderr`` makes it Welch's test
    (Welch–Satterthwaite df; ``df = inf`` is the normal). A total standard
    error that is zero or not finite is undecidable: ``p_value`` is None.
    """
    _check(alpha, margin)
    delta = estimate - baseline
    confidence = 1.0 - 2.0 * alpha
    variance = stderr * stderr + baseline_stderr * baseline_stderr
    if not (variance > 0.0 and math.isfinite(variance) and df > 0):
        reason = "zero standard error" if variance == 0.0 else "undefined standard error"
        return NonInferiorityResult(
            method, estimate, delta, margin, None, math.nan, math.nan, confidence, reason
        )
    se = math.sqrt(variance)
    total_df = _welch_df(stderr, df, baseline_stderr, baseline_df)
    p_value = t_cdf((delta + margin) / se, total_df)
    half = t_ppf(1.0 - alpha, total_df) * se
    return NonInferiorityResult(
        method, estimate, delta, margin, p_value, delta - half, delta + half, confidence
    )
