"""pytest_modelbench.gating.stats against published answers (textbooks, tables, closed forms)."""

from __future__ import annotations

import math
import random

import pytest

from pytest_modelbench.gating import stats
from pytest_modelbench.gating.stats import significance

# --------------------------------------------------------------------------- distributions


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (0.975, 1.959963984540054),
        (0.95, 1.6448536269514722),
        (0.995, 2.5758293035489004),
        (0.5, 0.0),
        (0.025, -1.959963984540054),
        (1e-10, -6.361340902404056),
    ],
)
def test_normal_quantiles(p: float, expected: float) -> None:
    assert stats.normal_ppf(p) == pytest.approx(expected, abs=1e-12)


def test_normal_cdf_known_values_and_round_trip() -> None:
    assert stats.normal_cdf(0.0) == 0.5
    assert stats.normal_cdf(1.96) == pytest.approx(0.9750021048517795, abs=1e-15)
    assert stats.normal_cdf(-4.0) == pytest.approx(3.1671241833119863e-05, rel=1e-12)
    assert stats.normal_sf(6.0) == pytest.approx(9.865876450376946e-10, rel=1e-12)
    for x in (-7.5, -3.1, -0.4, 0.0, 0.8, 2.2, 5.0):
        assert stats.normal_ppf(stats.normal_cdf(x)) == pytest.approx(x, abs=1e-9)


# Student's t critical values, NIST/SEMATECH e-Handbook table 1.3.6.7.2 (3 decimals).
T_TABLE = {
    1: (3.078, 6.314, 12.706, 31.821, 63.657),
    2: (1.886, 2.920, 4.303, 6.965, 9.925),
    5: (1.476, 2.015, 2.571, 3.365, 4.032),
    10: (1.372, 1.812, 2.228, 2.764, 3.169),
    30: (1.310, 1.697, 2.042, 2.457, 2.750),
    100: (1.290, 1.660, 1.984, 2.364, 2.626),
}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantiles_match_table(df: int) -> None:
    for p, expected in zip((0.90, 0.95, 0.975, 0.99, 0.995), T_TABLE[df], strict=True):
        assert stats.t_ppf(p, df) == pytest.approx(expected, abs=5e-4)
        assert stats.t_ppf(1 - p, df) == pytest.approx(-expected, abs=5e-4)


@pytest.mark.parametrize("t", [-50.0, -6.3, -1.0, -0.2, 0.0, 0.7, 2.5, 12.0, 300.0])
def test_t_cdf_closed_forms(t: float) -> None:
    # df = 1 is Cauchy; df = 2 has F(t) = 1/2 + t / (2 sqrt(2 + t^2)).
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert stats.t_cdf(t, 1) + stats.t_sf(t, 1) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("p", [0.001, 0.025, 0.1, 0.4, 0.6, 0.95, 0.999])
def test_t_ppf_closed_forms(p: float) -> None:
    assert stats.t_ppf(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
    assert stats.t_ppf(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)


def test_t_cdf_matches_mpmath_to_1e9() -> None:
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    rng = random.Random(7)
    for _ in range(300):
        df = rng.choice([1, 2, 3, 7, 29, 120, 5000, rng.uniform(0.5, 60.0)])
        t = rng.uniform(-30.0, 30.0) * rng.random() ** 3
        x = mpmath.mpf(df) / (df + mpmath.mpf(t) ** 2)
        tail = 0.5 * mpmath.betainc(mpmath.mpf(df) / 2, 0.5, 0, x, regularized=True)
        expected = float(tail if t < 0 else 1 - tail)
        assert stats.t_cdf(t, df) == pytest.approx(expected, abs=1e-9)


def test_t_tends_to_normal() -> None:
    assert stats.t_ppf(0.975, 1e9) == pytest.approx(1.959963984540054, abs=1e-7)
    # z + (z^3 + z) / (4 df) + ... ; mpmath: 1.95998770753461
    assert stats.t_ppf(0.975, 1e5) == pytest.approx(1.95998770753461, abs=1e-9)


def test_regularized_beta_identities() -> None:
    for x in (0.01, 0.3, 0.77):
        assert stats.regularized_beta(x, 2.5, 1.0) == pytest.approx(x**2.5, rel=1e-12)
        assert stats.regularized_beta(x, 1.0, 3.0) == pytest.approx(1 - (1 - x) ** 3, rel=1e-12)
    assert stats.regularized_beta(0.5, 7.3, 7.3) == pytest.approx(0.5, abs=1e-14)


def test_binomial_half_cdf_is_exact() -> None:
    # P(X <= 6), X ~ Bin(22, 1/2) = (1 + 22 + 231 + 1540 + 7315 + 26334 + 74613) / 2^22
    assert stats.binomial_half_cdf(6, 22) == 110056 / 2**22
    assert stats.binomial_half_cdf(-1, 5) == 0.0
    assert stats.binomial_half_cdf(5, 5) == 1.0
    # the incomplete-beta path for very large n agrees with the symmetric answer
    assert stats.binomial_half_cdf(15_000, 30_001) == pytest.approx(0.5, abs=1e-9)


# --------------------------------------------------------------------------- estimates

# Newcombe (1998), Statistics in Medicine 17:857-872, Table II: method 3 (Wilson score)
# and method 4 (Wilson score with continuity correction).
NEWCOMBE = [
    (81, 263, (0.2553, 0.3662), (0.2535, 0.3682)),
    (15, 148, (0.0624, 0.1605), (0.0598, 0.1644)),
    (0, 20, (0.0, 0.1611), (0.0, 0.2005)),
    (1, 29, (0.0061, 0.1718), (0.0018, 0.1963)),
]


@pytest.mark.parametrize(("k", "n", "wilson", "wilson_cc"), NEWCOMBE)
def test_wilson_newcombe_examples(
    k: int, n: int, wilson: tuple[float, float], wilson_cc: tuple[float, float]
) -> None:
    assert stats.wilson_interval(k, n) == pytest.approx(wilson, abs=5e-5)
    assert stats.wilson_interval(k, n, continuity=True) == pytest.approx(wilson_cc, abs=5e-5)


def test_wilson_fagerland_example() -> None:
    # Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables (2017), ch. 2:
    # 13 of 16: Wilson 0.5699 to 0.9341, with continuity correction 0.5369 to 0.9503.
    assert stats.wilson_interval(13, 16) == pytest.approx((0.5699, 0.9341), abs=5e-5)
    assert stats.wilson_interval(13, 16, continuity=True) == pytest.approx(
        (0.5369, 0.9503), abs=5e-5
    )


def test_wilson_zero_successes_closed_form() -> None:
    # upper limit for 0/n is z^2 / (n + z^2)
    z = stats.normal_ppf(0.975)
    assert stats.wilson_interval(0, 50)[1] == pytest.approx(z * z / (50 + z * z), rel=1e-12)
    assert stats.wilson_interval(50, 50)[0] == pytest.approx(50 / (50 + z * z), rel=1e-12)


def test_proportion_estimate() -> None:
    est = stats.proportion_estimate(807, 1319)
    assert est.value == pytest.approx(807 / 1319)
    assert est.stderr == pytest.approx(math.sqrt(0.6118271 * 0.3881729 / 1319), rel=1e-6)
    assert (est.ci_low, est.ci_high) == stats.wilson_interval(807, 1319)
    assert est.method == "wilson"


def test_mean_estimate_by_hand() -> None:
    # mean 5, s^2 = 32/7, se = sqrt(32/56), t(0.975, 7) = 2.364624
    est = stats.mean_estimate([2, 4, 4, 4, 5, 5, 7, 9])
    se = math.sqrt(32 / 56)
    assert est.value == 5.0
    assert est.stderr == pytest.approx(se, rel=1e-12)
    assert est.ci_low == pytest.approx(5 - 2.364624252 * se, abs=1e-8)
    assert est.ci_high == pytest.approx(5 + 2.364624252 * se, abs=1e-8)
    normal = stats.mean_estimate([2, 4, 4, 4, 5, 5, 7, 9], distribution="normal")
    assert normal.ci_high == pytest.approx(5 + 1.959963985 * se, abs=1e-8)


def test_clustered_se_by_hand() -> None:
    # clusters A=[1,1], B=[0,0], C=[1,0]: mean 1/2; residual sums +1, -1, 0;
    # var = G/(G-1) * sum / N^2 = 3/2 * 2/36 = 1/12; df = 2.
    est = stats.clustered_mean_estimate([1, 1, 0, 0, 1, 0], ["A", "A", "B", "B", "C", "C"])
    assert est.value == 0.5
    assert est.stderr == pytest.approx(math.sqrt(1 / 12), rel=1e-12)
    assert est.n == 3
    assert est.ci_high == pytest.approx(0.5 + 4.302652730 * math.sqrt(1 / 12), abs=1e-8)


def test_clustered_se_reduces_to_classic_for_singletons() -> None:
    rng = random.Random(3)
    values = [rng.random() for _ in range(50)]
    clustered = stats.clustered_mean_estimate(values, list(range(50)))
    classic = stats.mean_estimate(values)
    assert clustered.stderr == pytest.approx(classic.stderr, rel=1e-12)
    assert clustered.ci_low == pytest.approx(classic.ci_low, rel=1e-12)


def test_clustered_se_ignores_duplicated_rollouts() -> None:
    # Four identical rollouts per example carry no more information than one.
    rng = random.Random(4)
    per_example = [rng.random() for _ in range(40)]
    rows = [v for v in per_example for _ in range(4)]
    labels = [i for i in range(40) for _ in range(4)]
    assert stats.clustered_mean_estimate(rows, labels).stderr == pytest.approx(
        stats.mean_estimate(per_example).stderr, rel=1e-12
    )
    grouped = stats.clustered_mean({i: [v] * 4 for i, v in enumerate(per_example)})
    assert grouped.mean == pytest.approx(stats.mean_estimate(per_example).value)


def test_summarize_scores_picks_the_interval() -> None:
    binary = [1.0] * 30 + [0.0] * 10
    assert stats.summarize_scores(binary).method == "wilson"
    assert stats.summarize_scores([0.5, 0.25, 1.0]).method == "t"
    # duplicated 0/1 rollouts: the effective n is G - 1 (the CR1 variance of G clusters)
    dup = [v for v in binary for _ in range(3)]
    labels = [i for i in range(40) for _ in range(3)]
    est = stats.summarize_scores(dup, labels)
    assert est.method == "cluster-wilson"
    assert (est.ci_low, est.ci_high) == pytest.approx(stats.wilson_interval(0.75 * 39, 39))
    single = stats.summarize_scores([0.3])
    assert single.value == 0.3 and math.isnan(single.stderr)


def test_seed_estimate() -> None:
    est = stats.seed_estimate([0.70, 0.72, 0.74])
    se = 0.02 / math.sqrt(3)
    assert est.value == pytest.approx(0.72)
    assert est.stderr == pytest.approx(se, rel=1e-9)
    assert est.ci_high - est.value == pytest.approx(4.302652730 * se, rel=1e-8)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        stats.seed_estimate([0.7])


# --------------------------------------------------------------------------- tests


def test_mcnemar_exact_published_examples() -> None:
    # Fagerland et al. (2013, 2017): Bentur et al. (2009) b=1, c=7 -> exact P = 0.0703;
    # Cavo et al. (2012) b=6, c=16 -> exact conditional P = 0.052479, mid-P = 0.034690.
    assert stats.mcnemar_exact(1, 7).p_value == pytest.approx(0.0703125, abs=1e-12)
    assert stats.mcnemar_exact(6, 16).p_value == pytest.approx(0.052479, abs=5e-7)
    assert stats.mcnemar_exact(6, 16, mid_p=True).p_value == pytest.approx(0.034690, abs=5e-7)


def test_exact_binomial_published_example() -> None:
    # Fagerland et al. (2017) ch. 2: 13 of 16 vs pi0 = 0.5: exact P = 0.02127, mid-P = 0.01273.
    assert stats.mcnemar_exact(13, 3).p_value == pytest.approx(0.02127, abs=5e-6)
    assert stats.mcnemar_exact(13, 3, mid_p=True).p_value == pytest.approx(0.01273, abs=5e-6)


def test_mcnemar_one_sided() -> None:
    # x worse than y: b small. P(B <= 6 | 22) = 110056 / 2^22
    assert stats.mcnemar_exact(6, 16, "less").p_value == 110056 / 2**22
    assert stats.mcnemar_exact(6, 16, "greater").p_value == pytest.approx(
        1 - stats.binomial_half_cdf(5, 22)
    )
    assert stats.mcnemar_exact(0, 0, "less").p_value == 1.0
    assert stats.mcnemar_exact(5, 5).p_value == 1.0


def test_tango_score_interval_published_example() -> None:
    # Fagerland et al. (2017) ch. 8, Cavo et al. (2012): n12=6, n21=16, N=161:
    # estimate -0.0621, Tango score CI -0.1240 to -0.0054; McNemar asymptotic Z = -2.132,
    # P = 0.033006.
    low, high = stats.paired_proportions_score_ci(6, 16, 161)
    assert (low, high) == pytest.approx((-0.1240, -0.0054), abs=5e-5)
    result = stats.paired_proportions_score_test(6, 16, 161)
    assert result.estimate == pytest.approx(-0.0621, abs=5e-5)
    assert result.statistic == pytest.approx(-2.132, abs=5e-4)
    assert result.p_value == pytest.approx(0.033006, abs=5e-7)


def test_tango_score_test_inverts_to_its_interval() -> None:
    low, high = stats.paired_proportions_score_ci(6, 16, 161)
    for bound in (low, high):
        result = stats.paired_proportions_score_test(6, 16, 161, null_difference=bound)
        assert result.p_value == pytest.approx(0.05, abs=1e-9)


def test_tango_restricted_mle_maximises_the_likelihood() -> None:
    b, c, n, delta = 12, 30, 200, -0.03
    q = significance._tango_restricted_pc(b, c, n, delta)

    def loglik(pc: float) -> float:
        pb = pc + delta
        return b * math.log(pb) + c * math.log(pc) + (n - b - c) * math.log(1 - pb - pc)

    grid = [0.031 + i * 1e-5 for i in range(20000) if 1 - 2 * (0.031 + i * 1e-5) - delta > 0]
    best = max(grid, key=loglik)
    assert q == pytest.approx(best, abs=2e-5)


SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_paired_t_student_sleep_data() -> None:
    # Student (1908) / Cushny & Peebles sleep data, R: t.test(extra ~ group, paired = TRUE):
    # t = -4.0621, df = 9, p-value = 0.002833, 95% CI -2.4598858 -0.7001142, mean diff -1.58.
    result = stats.paired_t_test(SLEEP_1, SLEEP_2)
    assert result.estimate == pytest.approx(-1.58)
    assert result.statistic == pytest.approx(-4.0621, abs=5e-5)
    assert result.df == 9
    assert result.p_value == pytest.approx(0.002833, abs=5e-7)
    assert (result.ci_low, result.ci_high) == pytest.approx((-2.4598858, -0.7001142), abs=5e-8)
    one_sided = stats.paired_t_test(SLEEP_1, SLEEP_2, alternative="less")
    assert one_sided.p_value == pytest.approx(0.002833 / 2, abs=5e-7)


def test_paired_bootstrap_is_seeded_and_agrees_with_t() -> None:
    rng = random.Random(11)
    y = [rng.gauss(0.0, 1.0) for _ in range(400)]
    x = [v - 0.12 + rng.gauss(0.0, 1.0) for v in y]
    boot = stats.paired_bootstrap_test(x, y, alternative="less", n_resamples=4000, seed=5)
    again = stats.paired_bootstrap_test(x, y, alternative="less", n_resamples=4000, seed=5)
    t = stats.paired_t_test(x, y, alternative="less")
    assert boot == again
    assert boot.estimate == pytest.approx(t.estimate)
    assert boot.p_value == pytest.approx(t.p_value, abs=0.01)
    assert boot.stderr == pytest.approx(t.stderr, rel=0.1)
    assert boot.ci_low == pytest.approx(t.ci_low, abs=0.02)
    assert boot.ci_high == pytest.approx(t.ci_high, abs=0.02)


def test_paired_bootstrap_null_difference_shifts_the_test() -> None:
    x = [0.5 + 0.01 * (i % 7) for i in range(100)]
    y = [v + 0.02 for v in x]  # every difference is exactly -0.02
    assert stats.paired_bootstrap_test(x, y, -0.01, "less").p_value == pytest.approx(1 / 2001)
    assert stats.paired_bootstrap_test(x, y, -0.05, "less").p_value == 1.0


def test_mean_noninferiority_test_normal_and_welch() -> None:
    # delta = -0.05, margin 0.01, se 0.01, df = inf: t = -4, p = Phi(-4)
    result = stats.mean_noninferiority_test(0.60, 0.01, math.inf, 0.65, margin=0.01)
    assert result.p_value == pytest.approx(3.1671241833119863e-05, rel=1e-9)
    assert result.ci_high == pytest.approx(-0.05 + 1.6448536269514722 * 0.01, abs=1e-12)
    # a baseline with its own se 0.01: t = -0.04 / sqrt(2e-4) = -2.828427, p = 0.0023389
    shared = stats.mean_noninferiority_test(
        0.60, 0.01, math.inf, 0.65, margin=0.01, baseline_stderr=0.01
    )
    assert shared.p_value == pytest.approx(0.0023388674905236, rel=1e-9)
    # a zero or undefined standard error decides nothing (it used to give p = 0)
    exact = stats.mean_noninferiority_test(0.60, 0.0, 10, 0.65, margin=0.01)
    assert exact.undecidable and exact.p_value is None and exact.reason == "zero standard error"
    assert stats.mean_noninferiority_test(0.6, math.nan, 10, 0.65).undecidable


def test_holm_worked_example() -> None:
    # Holm (1979) as worked on Wikipedia: p = 0.01, 0.04, 0.03, 0.005 at alpha = 0.05
    # -> adjusted 0.03, 0.06, 0.06, 0.02: H1 and H4 rejected.
    adjusted = stats.holm_adjust([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p < 0.05 for p in adjusted] == [True, False, False, True]
    assert stats.holm_adjust([]) == []
    assert stats.holm_adjust([0.9, 0.3]) == [0.9, 0.6]  # monotone: max(0.6, 0.9)


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError):
        stats.normal_ppf(1.5)
    with pytest.raises(ValueError):
        stats.t_cdf(1.0, 0)
    with pytest.raises(ValueError):
        stats.wilson_interval(5, 3)
    with pytest.raises(ValueError):
        stats.paired_t_test([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        stats.mcnemar_exact(-1, 2)
