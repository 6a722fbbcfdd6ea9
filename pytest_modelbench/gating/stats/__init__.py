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

from pytest_modelbench.gating.stats.distributions import (
    binomial_half_cdf,
    normal_cdf,
    normal_ppf,
    normal_sf,
    regularized_beta,
    t_cdf,
    t_ppf,
    t_sf,
)
from pytest_modelbench.gating.stats.estimates import (
    Estimate,
    clustered_mean,
    clustered_mean_estimate,
    mean_ci,
    mean_estimate,
    proportion_estimate,
    proportion_stderr,
    seed_estimate,
    summarize_scores,
    wilson_interval,
)
from pytest_modelbench.gating.stats.significance import (
    Alternative,
    McNemarResult,
    PairedResult,
    ZTestResult,
    holm_adjust,
    mcnemar_exact,
    noninferiority_z_test,
    paired_bootstrap_test,
    paired_proportions_score_ci,
    paired_proportions_score_test,
    paired_t_test,
)

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
