"""The value and paired gates against scipy, at every n: exact where the data are 0/1, tests
that agree with their own interval, nothing significant from a vanishing standard error.

scipy is the reference (``binomtest``, ``ttest_1samp``, ``optimize``, ``fisher_exact``); the
gates themselves stay pure Python.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.errors import EvaluationError
from pytest_modelbench.gating import stats
from pytest_modelbench.gating.baselines import BaselineBook
from pytest_modelbench.gating.gates import (
    BaselineEntry,
    GateVerdict,
    NonInferiorityRule,
    PairedRule,
    ScoreSummary,
    min_paired_examples,
    rule_for,
)
from pytest_modelbench.gating.stats import noninferiority
from pytest_modelbench.store.result import EvalResult

scipy_stats = pytest.importorskip("scipy.stats")
optimize = pytest.importorskip("scipy.optimize")

ALPHA = 0.05
Z_ALPHA = 1.6448536269514722  # the one-sided 95% normal quantile


def rows_of(k: int, n: int, rollouts: int = 1) -> dict[str, list[float]]:
    """n examples, the first k correct in every rollout (rollouts of an example agree)."""
    return {f"q{i}": [1.0 if i < k else 0.0] * rollouts for i in range(n)}


def summary_of(rows: Mapping[str, Sequence[float]], metric: str = "accuracy") -> ScoreSummary:
    """What summary.json would say about these rows (value = mean of all rows)."""
    values = [v for scores in rows.values() for v in scores]
    clusters = [key for key, scores in rows.items() for _ in scores]
    est = stats.summarize_scores(values, clusters)
    return ScoreSummary(metric, est.value, len(rows), est.stderr, est.ci_low, est.ci_high, "env")


def value_gate(value: float, margin: float = 0.0, **kw: Any) -> NonInferiorityRule:
    rule = rule_for(BaselineEntry("accuracy", value=value, margin=margin, **kw), alpha=ALPHA)
    assert isinstance(rule, NonInferiorityRule)
    return rule


def agrees_with_its_interval(verdict: GateVerdict) -> bool:
    """passed == (Δ upper bound >= -margin), except within root-finding precision of the edge."""
    if verdict.undecidable:
        return verdict.passed and verdict.p_value is None
    assert verdict.delta_ci_high is not None and verdict.delta_ci_low is not None
    assert verdict.delta_confidence == pytest.approx(1 - 2 * ALPHA)
    assert verdict.delta_ci_low <= verdict.delta + 1e-12 <= verdict.delta_ci_high + 2e-12
    if abs(verdict.delta_ci_high + verdict.margin) < 1e-9:
        return True
    return verdict.passed == (verdict.delta_ci_high >= -verdict.margin)


# --------------------------------------------------------------------------- the cases


def test_zero_of_five_against_an_exact_ten_percent_passes() -> None:
    rows = rows_of(0, 5)
    verdict = value_gate(0.10).evaluate(summary_of(rows), rows)
    # P(X = 0 | 5, 0.1) = 0.9^5: nothing like p < 0.001
    assert verdict.p_value == pytest.approx(0.59049, abs=1e-12)
    assert verdict.p_value == pytest.approx(
        scipy_stats.binomtest(0, 5, 0.10, alternative="less").pvalue, abs=1e-12
    )
    assert verdict.passed and verdict.test == "exact binomial"
    assert verdict.delta_ci_high == pytest.approx(1 - 0.05 ** (1 / 5) - 0.10, abs=1e-12)
    assert "Δ -0.100, 90% CI [-0.100, +0.351], p=0.590, exact binomial" in verdict.message


def test_perfect_score_on_three_examples_is_no_evidence() -> None:
    rows = rows_of(3, 3)
    for gate in (value_gate(0.9), value_gate(0.9, n=1000), value_gate(0.9, stderr=0.01)):
        verdict = gate.evaluate(summary_of(rows), rows)
        assert verdict.passed and verdict.p_value is not None and verdict.p_value > 0.5
        assert agrees_with_its_interval(verdict)


def test_the_same_rows_as_rollouts_get_the_same_exact_answer() -> None:
    # 4 identical rollouts per example carry the information of one: design effect 4
    single, repeated = rows_of(2, 10), rows_of(2, 10, rollouts=4)
    assert stats.design_effect(repeated) == 4.0
    a = value_gate(0.5).evaluate(summary_of(single), single)
    b = value_gate(0.5).evaluate(summary_of(repeated), repeated)
    assert b.p_value == pytest.approx(a.p_value, rel=1e-12)
    assert (b.delta_ci_low, b.delta_ci_high) == pytest.approx((a.delta_ci_low, a.delta_ci_high))
    assert b.test == "exact binomial, Rao–Scott design effect 4.00"
    zero = rows_of(0, 5, rollouts=4)  # 0/20 rows vs 0.10: still P = 0.9^5
    assert value_gate(0.10).evaluate(summary_of(zero), zero).p_value == pytest.approx(0.59049)


def test_a_vanishing_standard_error_is_undecidable_only_without_bounds() -> None:
    # equal scores in [0, 1] are decided (tests/unit/test_gate_degenerate.py); outside 0..1
    # nothing bounds how they could vary against an exact number
    flat = {f"q{i}": [5.0] for i in range(40)}
    verdict = value_gate(6.0).evaluate(summary_of(flat, "reward"), flat)
    assert verdict.passed and verdict.p_value is None and verdict.status == "undecidable"
    assert verdict.undecidable.startswith("all 40 scores are 5.000 against 6.000, not a 0..1")
    assert "would decide it" in verdict.undecidable
    assert "undecidable, passes untested (all 40 scores are 5.000" in verdict.message
    # without rows, a summary whose stderr vanished (0/5 scored as Wald) decides nothing either
    empty = ScoreSummary("accuracy", 0.0, 5, 0.0, 0.0, 0.0, "env")
    assert value_gate(0.10).evaluate(empty).status == "undecidable"
    one = {"q0": [0.25]}
    assert (
        value_gate(0.6)
        .evaluate(summary_of(one, "reward"), one)
        .undecidable.startswith("one example")
    )


# --------------------------------------------------------------------------- exact binomial


@pytest.mark.parametrize("n", [1, 5, 20, 137, 2000])
def test_exact_binomial_matches_scipy(n: int) -> None:
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
        if k < 0:
            continue
        ci = scipy_stats.binomtest(k, n).proportion_ci(1 - 2 * ALPHA, method="exact")
        for baseline, margin in itertools.product((0.03, 0.5, 0.7, 0.97), (0.0, 0.02)):
            result = stats.exact_binomial_test(k, n, baseline, margin, ALPHA)
            expected = scipy_stats.binomtest(k, n, baseline - margin, alternative="less").pvalue
            assert result.p_value == pytest.approx(expected, rel=1e-9, abs=1e-14)
            assert result.ci_low == pytest.approx(ci.low - baseline, abs=1e-10)
            assert result.ci_high == pytest.approx(ci.high - baseline, abs=1e-10)


def test_clopper_pearson_fractional_counts_match_the_beta_quantiles() -> None:
    # Rao–Scott effective counts are fractional: the interval is the beta quantiles
    for k, n in ((0.0, 3.7), (2.5, 7.25), (100.4, 331.9), (12.0, 12.0)):
        low, high = stats.clopper_pearson_interval(k, n, 0.9)
        expected_low = scipy_stats.beta.ppf(0.05, k, n - k + 1) if k > 0 else 0.0
        expected_high = scipy_stats.beta.ppf(0.95, k + 1, n - k) if k < n else 1.0
        assert (low, high) == pytest.approx((expected_low, expected_high), abs=1e-10)
        assert stats.binomial_cdf(k, n, 0.3) == pytest.approx(
            scipy_stats.beta.sf(0.3, k + 1, n - k) if k < n else 1.0, abs=1e-12
        )


# --------------------------------------------------------------------------- Farrington–Manning


def reference_restricted_mle(x1: int, n1: int, p2: float, n2: int, delta: float) -> float:
    """argmax over p2~ of the two-binomial likelihood with p1~ = p2~ + delta (scipy)."""
    x2 = p2 * n2

    def nll(q: float) -> float:
        p = q + delta
        tiny = 1e-300
        return -(
            x1 * math.log(max(p, tiny))
            + (n1 - x1) * math.log(max(1 - p, tiny))
            + x2 * math.log(max(q, tiny))
            + (n2 - x2) * math.log(max(1 - q, tiny))
        )

    lo, hi = max(0.0, -delta), min(1.0, 1.0 - delta)
    found = optimize.minimize_scalar(
        nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}
    )
    best: float = min((found.x, lo, hi), key=nll)
    return best


def reference_fm_z(x1: int, n1: int, p2: float, n2: int, delta: float, correction: float) -> float:
    q = reference_restricted_mle(x1, n1, p2, n2, delta)
    p = q + delta
    se = math.sqrt(p * (1 - p) / n1 + q * (1 - q) / n2)
    return (x1 / n1 - p2 - delta + correction) / se


FM_GRID = [(0, 5, 0.10, 100), (3, 10, 0.6, 10), (20, 25, 0.9, 400), (801, 1319, 0.65, 1319)]


@pytest.mark.parametrize(("x1", "n1", "p2", "n2"), FM_GRID)
def test_farrington_manning_matches_a_scipy_reference(x1: int, n1: int, p2: float, n2: int) -> None:
    correction = 0.5 * (1 / n1 + 1 / n2)
    for margin in (0.0, 0.01, 0.05, 0.2):
        r1, r2 = stats.fm_restricted_mle(x1 / n1, n1, p2, n2, -margin)
        assert r2 == pytest.approx(reference_restricted_mle(x1, n1, p2, n2, -margin), abs=1e-6)
        assert r1 - r2 == pytest.approx(-margin, abs=1e-12)
        result = stats.farrington_manning_test(x1, n1, p2, n2, margin, ALPHA)
        z = reference_fm_z(x1, n1, p2, n2, -margin, correction)
        assert result.p_value == pytest.approx(scipy_stats.norm.cdf(z), abs=1e-6)
    # the interval: the differences whose one-sided tests give exactly alpha (scipy's brentq)
    result = stats.farrington_manning_test(x1, n1, p2, n2, 0.0, ALPHA)
    for bound, sign in ((result.ci_high, 1.0), (result.ci_low, -1.0)):
        if abs(bound) < 1 - 1e-9:
            root = optimize.brentq(
                lambda d, s=sign: reference_fm_z(x1, n1, p2, n2, d, s * correction) + s * Z_ALPHA,
                -1 + 1e-9,
                1 - 1e-9,
                xtol=1e-12,
            )
            assert bound == pytest.approx(root, abs=1e-6)


def test_farrington_manning_without_correction_is_pearsons_chi_square() -> None:
    for x1, n1, x2, n2 in ((3, 10, 7, 12), (40, 100, 55, 90), (0, 5, 1, 20)):
        z = noninferiority._fm_z(x1 / n1, n1, x2 / n2, n2, 0.0, 0.0)
        table = [[x1, n1 - x1], [x2, n2 - x2]]
        chi2 = scipy_stats.chi2_contingency(table, correction=False).statistic
        assert z * z == pytest.approx(chi2, rel=1e-9)


def test_corrected_score_test_tracks_fishers_exact_test() -> None:
    # With margin 0 the continuity-corrected score test approximates the one-sided Fisher test.
    for x1, n1, x2, n2 in ((30, 60, 40, 60), (70, 100, 80, 100), (5, 20, 11, 20)):
        fm = stats.farrington_manning_test(x1, n1, x2 / n2, n2, 0.0, ALPHA)
        fisher = scipy_stats.fisher_exact([[x1, n1 - x1], [x2, n2 - x2]], alternative="less")
        assert fm.p_value == pytest.approx(fisher.pvalue, abs=0.015)


@pytest.mark.parametrize(("n1", "n2", "margin"), [(10, 10, 0.0), (20, 20, 0.05), (30, 300, 0.0)])
def test_exact_size_of_the_two_sample_gate_is_at_most_alpha(
    n1: int, n2: int, margin: float
) -> None:
    """Known truth: P(fail) under H0, summed over every outcome, at the worst true p."""
    np = pytest.importorskip("numpy")
    rejected = np.zeros((n1 + 1, n2 + 1))
    for x1, x2 in itertools.product(range(n1 + 1), range(n2 + 1)):
        p = stats.farrington_manning_test(x1, n1, x2 / n2, n2, margin, ALPHA).p_value
        rejected[x1, x2] = p is not None and p < ALPHA
    worst = 0.0
    for p2 in np.linspace(margin, 1.0, 201):
        pmf1 = scipy_stats.binom.pmf(np.arange(n1 + 1), n1, max(0.0, p2 - margin))
        pmf2 = scipy_stats.binom.pmf(np.arange(n2 + 1), n2, p2)
        worst = max(worst, float(pmf1 @ rejected @ pmf2))
    assert 0.0 < worst <= ALPHA


# --------------------------------------------------------------------------- t-tests


def test_one_sample_t_matches_scipy() -> None:
    rng = random.Random(3)
    values = [rng.uniform(0.0, 1.0) for _ in range(30)]
    rows = {f"q{i}": [v] for i, v in enumerate(values)}
    for margin in (0.0, 0.05):
        verdict = value_gate(0.6, margin).evaluate(summary_of(rows, "reward"), rows)
        ref = scipy_stats.ttest_1samp(values, 0.6 - margin, alternative="less")
        ci = scipy_stats.ttest_1samp(values, 0.6).confidence_interval(1 - 2 * ALPHA)
        assert verdict.test == "one-sample t"
        assert verdict.p_value == pytest.approx(ref.pvalue, rel=1e-8)
        assert verdict.delta_ci_low == pytest.approx(ci.low - 0.6, abs=1e-9)
        assert verdict.delta_ci_high == pytest.approx(ci.high - 0.6, abs=1e-9)


def test_welch_t_with_the_baseline_stderr() -> None:
    rng = random.Random(4)
    values = [rng.gauss(0.5, 0.2) for _ in range(25)]
    rows = {f"q{i}": [v] for i, v in enumerate(values)}
    verdict = value_gate(0.6, stderr=0.03, n=50).evaluate(summary_of(rows, "reward"), rows)
    se = scipy_stats.sem(values)
    total = math.hypot(se, 0.03)
    df = total**4 / (se**4 / 24 + 0.03**4 / 49)
    mean = sum(values) / 25
    assert verdict.test == "Welch t"
    assert verdict.p_value == pytest.approx(scipy_stats.t.cdf((mean - 0.6) / total, df), rel=1e-8)
    half = scipy_stats.t.ppf(1 - ALPHA, df) * total
    assert verdict.delta_ci_high == pytest.approx(mean - 0.6 + half, abs=1e-9)


def test_cluster_robust_t_for_continuous_rollouts() -> None:
    np = pytest.importorskip("numpy")
    rng = random.Random(5)
    rows = {f"q{i}": [rng.uniform(0, 1) for _ in range(3)] for i in range(12)}
    verdict = value_gate(0.6).evaluate(summary_of(rows, "reward"), rows)
    y = np.array(list(rows.values()))
    mean = y.mean()
    g = len(y)
    se = math.sqrt(g / (g - 1) * ((y - mean).sum(axis=1) ** 2).sum() / y.size**2)
    assert verdict.test == "cluster-robust t"
    assert verdict.p_value == pytest.approx(scipy_stats.t.cdf((mean - 0.6) / se, g - 1), rel=1e-8)


def test_design_effect_by_hand() -> None:
    np = pytest.importorskip("numpy")
    rows = {"a": [1.0, 1.0, 0.0], "b": [0.0, 0.0, 0.0], "c": [1.0, 1.0, 1.0], "d": [0.0, 1.0, 0.0]}
    y = np.array(list(rows.values()))
    p, g, n = y.mean(), len(y), y.size
    robust = g / (g - 1) * ((y - p).sum(axis=1) ** 2).sum() / n**2
    assert stats.design_effect(rows) == pytest.approx(robust / (p * (1 - p) / n), rel=1e-12)
    assert stats.design_effect({"a": [1.0], "b": [0.0]}) == 1.0
    # anti-correlated rollouts would claim less than independent rows: kept at 1
    assert stats.design_effect({k: [1.0, 0.0] for k in "abcdef"}) == 1.0


# --------------------------------------------------------------------------- paired


def paired_runs(n: int, worse: int, better: int) -> tuple[dict[str, float], dict[str, float]]:
    ref = {f"q{i}": float(i % 3 != 0) for i in range(n)}
    new = dict(ref)
    for key in [k for k, v in ref.items() if v == 1.0][:worse]:
        new[key] = 0.0
    for key in [k for k, v in ref.items() if v == 0.0][:better]:
        new[key] = 1.0
    return ref, new


def test_mcnemar_and_its_interval_match_scipy() -> None:
    for n, worse, better in ((30, 6, 0), (300, 12, 2), (300, 7, 7), (50, 0, 0), (9, 5, 0)):
        ref, new = paired_runs(n, worse, better)
        verdict = PairedRule(ref).evaluate(ScoreSummary("accuracy", 0.5, n, 0.03), new)
        if worse + better:
            expected = scipy_stats.binomtest(better, worse + better, 0.5, alternative="less")
            assert verdict.p_value == pytest.approx(expected.pvalue, rel=1e-12)
            ci = scipy_stats.binomtest(better, worse + better).proportion_ci(0.9, "exact")
            scale = (worse + better) / n
            assert verdict.delta_ci_low == pytest.approx(scale * (2 * ci.low - 1), abs=1e-10)
            assert verdict.delta_ci_high == pytest.approx(scale * (2 * ci.high - 1), abs=1e-10)
        assert agrees_with_its_interval(verdict)


def test_min_paired_examples_is_where_mcnemar_can_first_fail() -> None:
    for alpha in (0.1, 0.05, 0.01, 0.001):
        d = min_paired_examples(alpha)
        assert scipy_stats.binomtest(0, d, 0.5, alternative="less").pvalue < alpha
        assert scipy_stats.binomtest(0, d - 1, 0.5, alternative="less").pvalue >= alpha
    assert min_paired_examples(0.05) == 5


def test_a_paired_gate_that_shares_too_few_examples_is_an_error() -> None:
    ref = {f"q{i}": 1.0 for i in range(10)}
    new = {"q0": 0.0, "q1": 1.0, "q2": 0.0, "other": 1.0}
    rule = rule_for(
        BaselineEntry("accuracy", run="run-ref"),
        reference_scores=ref,
        current_run="run-new",
        item="alpha-qa-seed0",
    )
    current = ScoreSummary("accuracy", 0.5, 4, 0.25, subject="qa")
    with pytest.raises(EvaluationError) as info:
        rule.evaluate(current, new)
    text = str(info.value)
    assert text.startswith("alpha-qa-seed0: the paired gate shares only 3 example(s)")
    assert "run run-new and reference run run-ref" in text and "fewer than the 5" in text
    with pytest.raises(EvaluationError, match="shares only 0 example"):
        rule.evaluate(current, {"x": 1.0})
    required = rule_for(
        BaselineEntry("accuracy", run="run-ref"), reference_scores=ref, required=True
    ).evaluate(current, new)
    assert not required.passed and required.status == "fail" and required.n_shared == 3
    assert required.message.endswith(
        "vs run run-ref: 3 shared examples, fewer than the 5 a paired comparison needs, "
        "not compared (--require-baseline)"
    )


def test_paired_t_and_bootstrap_agree_with_their_intervals() -> None:
    rng = random.Random(8)
    ref = {f"q{i}": rng.uniform(0, 1) for i in range(60)}
    for shift in (-0.2, -0.06, -0.03, 0.0, 0.05):
        new = {k: min(1.0, max(0.0, v + shift + rng.gauss(0, 0.1))) for k, v in ref.items()}
        for method, margin in itertools.product(("t", "bootstrap"), (0.0, 0.02)):
            rule = PairedRule(ref, margin=margin, method=method, n_resamples=999)  # type: ignore[arg-type]
            verdict = rule.evaluate(ScoreSummary("reward", 0.5, 60, 0.03), new)
            assert agrees_with_its_interval(verdict), (method, shift, margin, verdict)
            if method == "t":
                diffs = [new[k] - ref[k] for k in ref]
                expected = scipy_stats.ttest_1samp(diffs, -margin, alternative="less").pvalue
                assert verdict.p_value == pytest.approx(expected, rel=1e-8)
    ref = {k: max(v, 0.05) for k, v in ref.items()}  # both runs' scores stay in [0, 1]
    same = {k: v - 0.05 for k, v in ref.items()}  # every difference identical: se 0
    verdict = PairedRule(ref, method="t").evaluate(ScoreSummary("reward", 0.4, 60, 0.03), same)
    assert verdict.p_value == pytest.approx((0.5 / 0.525) ** 60)  # the exact bounded test
    assert verdict.passed == (verdict.p_value >= ALPHA) and agrees_with_its_interval(verdict)


# --------------------------------------------------------------------------- the property grid


def _binary_rows(k: int, n: int, rollouts: int, rng: random.Random) -> dict[str, list[float]]:
    """k of n examples 'mostly right': their rollouts are right with probability 0.8."""
    if rollouts == 1:
        return rows_of(k, n)
    return {
        f"q{i}": [float(rng.random() < (0.8 if i < k else 0.15)) for _ in range(rollouts)]
        for i in range(n)
    }


@pytest.mark.parametrize("rollouts", [1, 4])
def test_every_value_gate_agrees_with_its_interval_over_the_grid(rollouts: int) -> None:
    """For every (k, n, baseline, baseline n, margin): passed <=> Δ upper bound >= -margin, and
    no gate fails while the score's own exact (1 - 2 alpha) interval reaches baseline - margin."""
    rng = random.Random(rollouts)
    checked = 0
    for n in (5, 12, 40, 200):
        for k in sorted({0, 1, n // 4, n // 2, n - 1, n}):
            rows = _binary_rows(k, n, rollouts, rng)
            current = summary_of(rows)
            for baseline, margin in itertools.product((0.02, 0.3, 0.75, 1.0), (0.0, 0.05)):
                for extra in ({}, {"n": 20}, {"n": 2000}, {"stderr": 0.02}):
                    verdict = value_gate(baseline, margin, **extra).evaluate(current, rows)
                    assert agrees_with_its_interval(verdict), (k, n, baseline, margin, extra)
                    checked += 1
                if rollouts == 1:  # scipy's own Clopper–Pearson interval for the score
                    ci = scipy_stats.binomtest(k, n).proportion_ci(1 - 2 * ALPHA, "exact")
                    verdict = value_gate(baseline, margin).evaluate(current, rows)
                    if ci.high >= baseline - margin + 1e-9:
                        assert verdict.passed, (k, n, baseline, margin)
                    elif ci.high < baseline - margin - 1e-9:
                        assert not verdict.passed, (k, n, baseline, margin)
    assert checked == 23 * 8 * 4  # 23 (k, n) pairs: n = 5 has five distinct k


def test_every_paired_gate_agrees_with_its_interval_over_the_grid() -> None:
    for n, worse, better, margin in itertools.product(
        (5, 20, 100), (0, 1, 4, 10), (0, 1, 4), (0.0, 0.02, 0.1)
    ):
        if worse + better > n // 3 * 2:
            continue
        ref, new = paired_runs(n, worse, better)
        verdict = PairedRule(ref, margin=margin).evaluate(ScoreSummary("acc", 0.5, n, 0.1), new)
        assert verdict.test == ("exact McNemar" if margin == 0 else "Tango score test")
        assert agrees_with_its_interval(verdict), (n, worse, better, margin)


# --------------------------------------------------------------------------- records, wiring


def test_verdict_round_trips_through_json() -> None:
    rows = rows_of(30, 40, rollouts=2)
    verdict = value_gate(0.9, 0.02, n=400).evaluate(summary_of(rows), rows)
    data = json.loads(json.dumps(verdict.as_dict(), allow_nan=False))
    assert data["schema_version"] == GateVerdict.SCHEMA_VERSION == 2
    assert data["delta_ci_high"] == verdict.delta_ci_high and data["delta_confidence"] == 0.9
    assert GateVerdict.from_dict(data) == verdict
    undecided = value_gate(0.6).evaluate(ScoreSummary("r", 0.5, 3, 0.0))
    data = json.loads(json.dumps(undecided.as_dict(), allow_nan=False))
    assert data["status"] == "undecidable" and data["delta_ci_low"] is None
    assert GateVerdict.from_dict(data) == undecided
    # a version-1 record (no interval fields) still loads
    old = {k: v for k, v in data.items() if not k.startswith("delta_ci")}
    old.pop("undecidable")
    assert GateVerdict.from_dict(old).undecidable == ""


def test_baseline_book_passes_the_rollouts_to_the_value_gate(tmp_path: Path) -> None:
    item = tmp_path / "runs" / "run-new" / "alpha-qa-seed0"
    item.mkdir(parents=True)
    lines = [
        {"example_id": f"q{i}", "rollout": r, "metrics": {"accuracy": 0.0}}
        for i in range(5)
        for r in range(4)
    ]
    (item / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "alpha.yaml").write_text("qa: {value: 0.10}\n")
    metric = {"value": 0.0, "stderr": None, "ci_low": None, "ci_high": None, "n": 20}
    result = EvalResult(
        item_id="alpha-qa-seed0",
        model="alpha",
        env="qa",
        variant="qa",
        seed=0,
        metric="accuracy",
        summary={"metrics": {"accuracy": {**metric, "examples": 5}}},
        directory=item,
    )
    book = BaselineBook(tmp_path / "baselines", tmp_path / "runs")
    assert book.example_scores(result, "accuracy") == {f"q{i}": [0.0] * 4 for i in range(5)}
    verdict = book.verdict(result)
    assert verdict.passed and verdict.p_value == pytest.approx(0.59049)
    assert verdict.test == "exact binomial, Rao–Scott design effect 4.00"
