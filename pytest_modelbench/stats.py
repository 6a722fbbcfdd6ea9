"""Statistics for benchmark scores and baseline gates, in pure Python (no numpy/scipy).

*Estimates* describe one score: Wilson intervals for proportions, t intervals
for means, cluster-robust standard errors when an example has several
rollouts, and the spread across seeds. *Tests* compare two scores: exact
McNemar and Tango's score test for paired 0/1 scores, the paired t-test and a
seeded paired bootstrap for continuous ones, and a one-sided z-test against a
baseline number. :func:`holm_adjust` corrects many p-values at once.

Conventions: paired functions take ``(x, y)`` and describe the difference
``x - y`` (as R's ``t.test(x, y, paired=TRUE)`` does); ``alternative`` names
the alternative hypothesis about that difference relative to
``null_difference`` (``"less"``: x is worse than y by more than the null).
The distribution functions are accurate to about 1e-12 (normal) and better
than 1e-8 (Student t, any df; 1e-10 for df < 1e5) in absolute terms.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Alternative",
    "Estimate",
    "McNemarResult",
    "PairedResult",
    "ZTestResult",
    "binomial_half_cdf",
    "clustered_mean",
    "clustered_mean_estimate",
    "holm_adjust",
    "mcnemar_exact",
    "mean_ci",
    "mean_estimate",
    "noninferiority_z_test",
    "normal_cdf",
    "normal_ppf",
    "normal_sf",
    "paired_bootstrap_test",
    "paired_proportions_score_ci",
    "paired_proportions_score_test",
    "paired_t_test",
    "proportion_estimate",
    "proportion_stderr",
    "regularized_beta",
    "seed_estimate",
    "summarize_scores",
    "t_cdf",
    "t_ppf",
    "t_sf",
    "wilson_interval",
]

Alternative = Literal["two-sided", "less", "greater"]

_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)
# Above this many degrees of freedom the t distribution is the normal to < 1e-8.
_T_AS_NORMAL_DF = 1e7


# --------------------------------------------------------------------------- distributions


def normal_cdf(x: float) -> float:
    """P(Z <= x) for a standard normal Z."""
    return 0.5 * math.erfc(-x / _SQRT2)


def normal_sf(x: float) -> float:
    """P(Z > x) for a standard normal Z (accurate far in the upper tail)."""
    return 0.5 * math.erfc(x / _SQRT2)


def normal_ppf(p: float) -> float:
    """The standard normal quantile: x with P(Z <= x) = p.

    Acklam's rational approximation as a start, polished by Halley steps on
    ``math.erfc`` so the result is accurate to machine precision.
    """
    if math.isnan(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"normal_ppf: p must be in [0, 1], got {p!r}")
    if p == 0.0:
        return -math.inf
    if p == 1.0:
        return math.inf
    if p > 0.5:
        return -normal_ppf(1.0 - p)
    x = _acklam(p)
    for _ in range(8):
        error = normal_cdf(x) - p
        u = error * _SQRT2PI * math.exp(0.5 * x * x)
        step = u / (1.0 + 0.5 * x * u)
        x -= step
        if abs(step) <= 1e-15 * max(1.0, abs(x)):
            break
    return x


def _acklam(p: float) -> float:
    """Acklam's approximation of the normal quantile for 0 < p <= 0.5 (rel. error 1e-9)."""
    a = (-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.3577518672690,
         -30.66479806614716, 2.506628277459239)  # fmt: skip
    b = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972,
         -13.28068155288572)  # fmt: skip
    c = (-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734,
         4.374664141464968, 2.938163982698783)  # fmt: skip
    d = (0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416)
    if p < 0.02425:
        q = math.sqrt(-2.0 * math.log(p))
        num = ((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]
        return num / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0)
    q = p - 0.5
    r = q * q
    num = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q
    return num / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0)


def regularized_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if not (a > 0.0 and b > 0.0):
        raise ValueError(f"regularized_beta: a and b must be positive, got a={a!r}, b={b!r}")
    return _regularized_beta(x, 1.0 - x, a, b)


def _regularized_beta(x: float, y: float, a: float, b: float) -> float:
    """I_x(a, b) given both x and y = 1 - x (callers pass y computed without cancellation)."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(x, a, b) / a
    return 1.0 - front * _beta_continued_fraction(y, b, a) / b


def _beta_continued_fraction(x: float, a: float, b: float) -> float:
    """Continued fraction for I_x(a, b), modified Lentz method (Numerical Recipes 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for x={x}, a={a}, b={b}")


def _t_tail(t: float, df: float) -> float:
    """P(T > |t|) for Student's t with ``df`` degrees of freedom (one tail)."""
    t = abs(t)
    if math.isinf(t):
        return 0.0
    if df >= _T_AS_NORMAL_DF:
        return normal_sf(t)
    t2 = t * t
    return 0.5 * _regularized_beta(df / (df + t2), t2 / (df + t2), 0.5 * df, 0.5)


def _check_df(df: float) -> None:
    if not df > 0.0:
        raise ValueError(f"degrees of freedom must be positive, got {df!r}")


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, may be fractional or inf) degrees of freedom."""
    _check_df(df)
    tail = _t_tail(t, df)
    return tail if t < 0 else 1.0 - tail


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    _check_df(df)
    tail = _t_tail(t, df)
    return tail if t >= 0 else 1.0 - tail


def t_ppf(p: float, df: float) -> float:
    """The Student t quantile: t with P(T <= t) = p (bisection on the exact tail)."""
    _check_df(df)
    if math.isnan(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"t_ppf: p must be in [0, 1], got {p!r}")
    if p == 0.5:
        return 0.0
    if p in (0.0, 1.0):
        return math.inf if p == 1.0 else -math.inf
    q = min(p, 1.0 - p)  # the tail probability to match
    lo, hi = 0.0, max(1.0, -normal_ppf(q))
    while _t_tail(hi, df) > q:
        lo, hi = hi, 2.0 * hi
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        if _t_tail(mid, df) > q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * hi:
            break
    x = 0.5 * (lo + hi)
    return x if p > 0.5 else -x


def binomial_half_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly (integer arithmetic) up to n = 20000."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if n > 20_000:
        return _regularized_beta(0.5, 0.5, n - k, k + 1)
    total, term = 0, 1
    for i in range(k + 1):
        total += term
        term = term * (n - i) // (i + 1)
    return total / (1 << n)


def _quantile_two_sided(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return normal_ppf(0.5 + 0.5 * confidence)


# --------------------------------------------------------------------------- estimates


@dataclass(frozen=True)
class Estimate:
    """A score with its uncertainty: value, standard error and a two-sided CI.

    ``n`` counts the independent units behind the estimate (examples, or
    clusters for clustered estimates, or seeds); ``method`` names how the CI
    was made (``wilson``, ``t``, ``normal``, ``cluster-t``, ``seeds-t``...).
    """

    value: float
    stderr: float
    ci_low: float
    ci_high: float
    n: int
    confidence: float = 0.95
    method: str = ""

    @property
    def mean(self) -> float:
        """Alias of ``value`` (the estimate of a mean)."""
        return self.value


def _undefined(value: float, n: int, confidence: float, method: str) -> Estimate:
    """An estimate whose spread cannot be measured (a single unit): NaN stderr and CI."""
    return Estimate(value, math.nan, math.nan, math.nan, n, confidence, method)


def wilson_interval(
    successes: float, n: float, confidence: float = 0.95, *, continuity: bool = False
) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Newcombe 1998, methods 3 and 4).

    ``successes`` and ``n`` may be fractional (effective counts of clustered data).
    ``continuity=True`` gives the continuity-corrected version.
    """
    if n <= 0 or not 0.0 <= successes <= n:
        raise ValueError(
            f"wilson_interval: need 0 <= successes <= n and n > 0, got {successes}/{n}"
        )
    z = _quantile_two_sided(confidence)
    z2 = z * z
    p = successes / n
    if not continuity:
        centre = p + z2 / (2.0 * n)
        half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n))
        denom = 1.0 + z2 / n
        return max(0.0, (centre - half) / denom), min(1.0, (centre + half) / denom)
    q = 1.0 - p
    denom = 2.0 * (n + z2)
    if p == 0.0:
        low = 0.0
    else:
        root = math.sqrt(z2 - 2.0 - 1.0 / n + 4.0 * p * (n * q + 1.0))
        low = max(0.0, (2.0 * n * p + z2 - 1.0 - z * root) / denom)
    if p == 1.0:
        high = 1.0
    else:
        root = math.sqrt(z2 + 2.0 - 1.0 / n + 4.0 * p * (n * q - 1.0))
        high = min(1.0, (2.0 * n * p + z2 + 1.0 + z * root) / denom)
    return low, high


def proportion_estimate(successes: float, n: int, confidence: float = 0.95) -> Estimate:
    """A proportion with its binomial standard error and Wilson CI."""
    low, high = wilson_interval(successes, n, confidence)
    p = successes / n
    return Estimate(p, proportion_stderr(successes, n), low, high, n, confidence, "wilson")


def proportion_stderr(successes: float, n: int) -> float:
    """Binomial standard error sqrt(p(1-p)/n) of the proportion successes / n."""
    p = successes / n
    return math.sqrt(p * (1.0 - p) / n)


def _mean_and_var(values: Sequence[float]) -> tuple[float, float]:
    """Mean and unbiased sample variance (two-pass, for accuracy)."""
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, var


def _interval(
    value: float, stderr: float, df: float | None, confidence: float
) -> tuple[float, float]:
    crit = _quantile_two_sided(confidence) if df is None else t_ppf(0.5 + 0.5 * confidence, df)
    return value - crit * stderr, value + crit * stderr


def mean_estimate(
    values: Sequence[float],
    confidence: float = 0.95,
    *,
    distribution: Literal["t", "normal"] = "t",
) -> Estimate:
    """Mean, standard error s/sqrt(n) and a t (df = n - 1) or normal CI."""
    n = len(values)
    if n < 2:
        raise ValueError(f"mean_estimate needs at least 2 values, got {n}")
    mean, var = _mean_and_var(values)
    se = math.sqrt(var / n)
    low, high = _interval(mean, se, n - 1 if distribution == "t" else None, confidence)
    return Estimate(mean, se, low, high, n, confidence, distribution)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """:func:`mean_estimate` that accepts a single value (NaN stderr and CI)."""
    if len(values) == 1:
        return _undefined(float(values[0]), 1, confidence, "t")
    return mean_estimate(values, confidence)


def clustered_mean(
    values_by_cluster: Mapping[Hashable, Sequence[float]], confidence: float = 0.95
) -> Estimate:
    """:func:`clustered_mean_estimate` for rows grouped by cluster (example id -> rollout scores).

    A single cluster gives NaN stderr and CI (its spread says nothing about other examples).
    """
    values = [v for rows in values_by_cluster.values() for v in rows]
    labels = [key for key, rows in values_by_cluster.items() for _ in rows]
    if not values:
        raise ValueError("clustered_mean: no values")
    if len(values_by_cluster) < 2:
        return _undefined(math.fsum(values) / len(values), 1, confidence, "cluster-t")
    return clustered_mean_estimate(values, labels, confidence)


def clustered_mean_estimate(
    values: Sequence[float],
    clusters: Sequence[Hashable],
    confidence: float = 0.95,
    *,
    distribution: Literal["t", "normal"] = "t",
) -> Estimate:
    """Mean of all rows with a cluster-robust (CR1) standard error.

    Rows sharing a cluster (rollouts of one example) are not independent; the
    variance is ``G/(G-1) * sum_g (sum_{i in g} (y_i - mean))^2 / N^2`` with G
    clusters, and the t CI uses G - 1 degrees of freedom. With one row per
    cluster this is exactly the ordinary s/sqrt(n).
    """
    if len(values) != len(clusters):
        raise ValueError(f"{len(values)} values but {len(clusters)} cluster labels")
    total = len(values)
    mean = math.fsum(values) / total if total else math.nan
    sums: dict[Hashable, float] = {}
    for value, cluster in zip(values, clusters, strict=True):
        sums[cluster] = sums.get(cluster, 0.0) + (value - mean)
    g = len(sums)
    if g < 2:
        raise ValueError(f"clustered_mean_estimate needs at least 2 clusters, got {g}")
    var = g / (g - 1) * math.fsum(s * s for s in sums.values()) / (total * total)
    se = math.sqrt(var)
    low, high = _interval(mean, se, g - 1 if distribution == "t" else None, confidence)
    return Estimate(mean, se, low, high, g, confidence, f"cluster-{distribution}")


def summarize_scores(
    values: Sequence[float],
    clusters: Sequence[Hashable] | None = None,
    confidence: float = 0.95,
) -> Estimate:
    """The estimate ``summary.json`` should carry for one metric of one item.

    0/1 scores get a Wilson interval; when rows are clustered (several rollouts
    per example) the Wilson interval uses the effective sample size
    p(1-p)/SE_cluster^2. Other scores get a t interval (cluster-robust when
    clustered).
    """
    n = len(values)
    if n == 0:
        raise ValueError("summarize_scores: no values")
    if clusters is not None and len(clusters) != n:
        raise ValueError(f"{n} values but {len(clusters)} cluster labels")
    binary = all(v in (0.0, 1.0) for v in values)
    groups = len(set(clusters)) if clusters is not None else n
    if clusters is not None and groups < n:
        if groups < 2:
            return _undefined(math.fsum(values) / n, 1, confidence, "cluster-t")
        robust = clustered_mean_estimate(values, clusters, confidence)
        if not binary:
            return robust
        p = robust.value
        # Effective sample size: the n whose binomial SE equals the cluster-robust SE.
        n_eff = min(float(n), p * (1.0 - p) / robust.stderr**2) if robust.stderr > 0 else groups
        low, high = wilson_interval(p * n_eff, n_eff, confidence)
        return Estimate(p, robust.stderr, low, high, groups, confidence, "cluster-wilson")
    if binary:
        return proportion_estimate(math.fsum(values), n, confidence)
    if n == 1:
        return _undefined(float(values[0]), 1, confidence, "t")
    return mean_estimate(values, confidence)


def seed_estimate(seed_values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Mean of a variant's per-seed scores with a t CI across seeds (df = seeds - 1).

    This measures run-to-run (sampling) noise only: all seeds see the same
    examples. For uncertainty about the benchmark as a sample of questions,
    pool all seeds' rows in :func:`clustered_mean_estimate` by example id.
    """
    if len(seed_values) < 2:
        raise ValueError(f"seed_estimate needs at least 2 seeds, got {len(seed_values)}")
    est = mean_estimate(seed_values, confidence)
    return Estimate(est.value, est.stderr, est.ci_low, est.ci_high, est.n, confidence, "seeds-t")


# --------------------------------------------------------------------------- tests


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
    z = _quantile_two_sided(confidence)
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
    mean, var = _mean_and_var(d)
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
    low, high = _interval(mean, se, df, confidence)
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
    +1 correction so it is never 0. The CI is the percentile interval.
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
    _, boot_var = _mean_and_var(means)
    tail = 0.5 * (1.0 - confidence)
    low = means[max(0, math.floor(tail * n_resamples))]
    high = means[min(n_resamples - 1, math.ceil((1.0 - tail) * n_resamples) - 1)]
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


@dataclass(frozen=True)
class ZTestResult:
    """One-sided z-test that a score fell more than ``margin`` below a baseline.

    ``delta`` = value - baseline; ``z`` = (delta + margin) / stderr; a small
    ``p_value`` is evidence of a regression beyond the margin.
    """

    delta: float
    margin: float
    stderr: float
    z: float
    p_value: float


def noninferiority_z_test(
    value: float,
    stderr: float,
    baseline: float,
    margin: float = 0.0,
    baseline_stderr: float = 0.0,
) -> ZTestResult:
    """Test H0: true value >= baseline - margin against H1: it is below (a regression).

    The standard error combines the score's and the baseline's
    (``baseline_stderr = 0`` treats the baseline as a fixed, exact number).
    With a total standard error of 0 the p-value is 0 or 1.
    """
    if stderr < 0 or baseline_stderr < 0 or margin < 0:
        raise ValueError("stderr, baseline_stderr and margin must be non-negative")
    delta = value - baseline
    se = math.sqrt(stderr * stderr + baseline_stderr * baseline_stderr)
    gap = delta + margin
    z = _standardize(gap, se)
    return ZTestResult(delta, margin, se, z, normal_cdf(z))


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
