"""Estimates of one score: Wilson and Clopper–Pearson intervals for proportions, t intervals for
means, cluster-robust standard errors and design effects when an example has several rollouts,
and the spread across seeds."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pytest_modelbench.gating.stats.distributions import (
    binomial_cdf,
    binomial_sf,
    find_root,
    normal_quantile_two_sided,
    t_ppf,
)


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
    z = normal_quantile_two_sided(confidence)
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


def clopper_pearson_interval(
    successes: float, n: float, confidence: float = 0.95
) -> tuple[float, float]:
    """Clopper–Pearson ("exact") interval: the p whose binomial tails at ``successes`` are
    (1 - confidence) / 2 each (scipy's ``binomtest(...).proportion_ci(method="exact")``).

    Fractional counts (effective counts of clustered data) use the binomial's
    continuous extension (:func:`binomial_cdf`).
    """
    if n <= 0 or not 0.0 <= successes <= n:
        raise ValueError(
            f"clopper_pearson_interval: need 0 <= successes <= n and n > 0, got {successes}/{n}"
        )
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    tail = 0.5 * (1.0 - confidence)
    low = (
        0.0
        if successes <= 0
        else find_root(lambda p: binomial_sf(successes, n, p) - tail, 0.0, 1.0)
    )
    high = (
        1.0
        if successes >= n
        else find_root(lambda p: binomial_cdf(successes, n, p) - tail, 0.0, 1.0)
    )
    return low, high


def design_effect(values_by_cluster: Mapping[Hashable, Sequence[float]]) -> float:
    """Rao–Scott design effect of the mean of clustered 0/1 rows (rollouts grouped by example).

    The cluster-robust (CR1) variance of the mean over the binomial p(1-p)/N,
    kept within [1, sum(m_g^2)/N] (independent rows .. identical rollouts).
    With one row per cluster it is 1; at a mean of 0 or 1, where the data
    cannot tell, it is the upper end (every rollout of an example alike).
    """
    sizes = [len(rows) for rows in values_by_cluster.values() if rows]
    total = sum(sizes)
    if total == 0:
        raise ValueError("design_effect: no values")
    upper = sum(m * m for m in sizes) / total
    if upper <= 1.0:
        return 1.0
    p = math.fsum(v for rows in values_by_cluster.values() for v in rows) / total
    if len(sizes) < 2 or p <= 0.0 or p >= 1.0:
        return upper
    g = len(sizes)
    spread = math.fsum(
        math.fsum(v - p for v in rows) ** 2 for rows in values_by_cluster.values() if rows
    )
    robust = g / (g - 1) * spread / (total * total)
    return min(upper, max(1.0, robust / (p * (1.0 - p) / total)))


def proportion_estimate(successes: float, n: int, confidence: float = 0.95) -> Estimate:
    """A proportion with its binomial standard error and Wilson CI."""
    low, high = wilson_interval(successes, n, confidence)
    p = successes / n
    return Estimate(p, proportion_stderr(successes, n), low, high, n, confidence, "wilson")


def proportion_stderr(successes: float, n: int) -> float:
    """Binomial standard error sqrt(p(1-p)/n) of the proportion successes / n."""
    p = successes / n
    return math.sqrt(p * (1.0 - p) / n)


def mean_and_var(values: Sequence[float]) -> tuple[float, float]:
    """Mean and unbiased sample variance (two-pass, for accuracy)."""
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, var


def symmetric_interval(
    value: float, stderr: float, df: float | None, confidence: float
) -> tuple[float, float]:
    crit = (
        normal_quantile_two_sided(confidence) if df is None else t_ppf(0.5 + 0.5 * confidence, df)
    )
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
    mean, var = mean_and_var(values)
    se = math.sqrt(var / n)
    low, high = symmetric_interval(mean, se, n - 1 if distribution == "t" else None, confidence)
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
    low, high = symmetric_interval(mean, se, g - 1 if distribution == "t" else None, confidence)
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
