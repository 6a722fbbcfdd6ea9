"""Statistics for benchmark scores and baseline gates, in pure Python (no numpy/scipy).

*Estimates* describe one score: Wilson and Clopper–Pearson intervals for
proportions, t intervals for means, cluster-robust standard errors and
Rao–Scott design effects when an example has several rollouts, and the spread
across seeds. *Tests against a baseline number* (exact binomial,
Farrington–Manning score, t) and *paired tests* against a reference run (exact
McNemar, Tango's score test, paired t, seeded paired bootstrap) each come with
the interval that inverts them. :func:`holm_adjust` corrects many p-values at once.

Conventions: paired functions take ``(x, y)`` and describe the difference
``x - y`` (as R's ``t.test(x, y, paired=TRUE)`` does); ``alternative`` names
the alternative hypothesis about that difference relative to
``null_difference`` (``"less"``: x is worse than y by more than the null).
The distribution functions are accurate to about 1e-12 (normal) and better
than 1e-8 (Student t, any df; 1e-10 for df < 1e5) in absolute terms; the
tests are cross-checked against scipy in ``tests/unit/test_gate_exact.py``.
"""

from __future__ import annotations

from pytest_modelbench.gating.stats.distributions import (
    binomial_cdf,
    binomial_half_cdf,
    binomial_sf,
    find_root,
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
    clopper_pearson_interval,
    clustered_mean,
    clustered_mean_estimate,
    design_effect,
    mean_ci,
    mean_estimate,
    proportion_estimate,
    proportion_stderr,
    seed_estimate,
    summarize_scores,
    wilson_interval,
)
from pytest_modelbench.gating.stats.noninferiority import (
    NonInferiorityResult,
    constant_bounded_test,
    exact_binomial_test,
    farrington_manning_test,
    fm_restricted_mle,
    mean_noninferiority_test,
)
from pytest_modelbench.gating.stats.significance import (
    Alternative,
    McNemarResult,
    PairedResult,
    holm_adjust,
    mcnemar_exact,
    mcnemar_exact_ci,
    paired_bootstrap_test,
    paired_proportions_score_ci,
    paired_proportions_score_test,
    paired_t_test,
)

__all__ = [
    "Alternative",
    "Estimate",
    "McNemarResult",
    "NonInferiorityResult",
    "PairedResult",
    "binomial_cdf",
    "binomial_half_cdf",
    "binomial_sf",
    "clopper_pearson_interval",
    "clustered_mean",
    "clustered_mean_estimate",
    "constant_bounded_test",
    "design_effect",
    "exact_binomial_test",
    "farrington_manning_test",
    "find_root",
    "fm_restricted_mle",
    "holm_adjust",
    "mcnemar_exact",
    "mcnemar_exact_ci",
    "mean_ci",
    "mean_estimate",
    "mean_noninferiority_test",
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
