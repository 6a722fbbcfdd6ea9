"""Degenerate data is decided by an exact test, never waved through: equal paired differences
by the sign-flip test, equal partial-credit scores by the exact bounded test (or Farrington–Manning
against a baseline with its own n); each verdict agrees with its printed interval. scipy is the
reference (``binomtest``, ``permutation_test``)."""

from __future__ import annotations

import math
import random

import pytest

from pytest_modelbench.gating import stats
from pytest_modelbench.gating.gates import (
    BaselineEntry,
    NonInferiorityRule,
    PairedRule,
    ScoreSummary,
    gate_with_errors,
    require_decided,
    rule_for,
)
from tests.unit.test_gate_exact import agrees_with_its_interval, summary_of

np = pytest.importorskip("numpy")
scipy_stats = pytest.importorskip("scipy.stats")


def value_gate(value: float, margin: float = 0.0, **kw: float) -> NonInferiorityRule:
    rule = rule_for(BaselineEntry("reward", value=value, margin=margin, **kw))  # type: ignore[arg-type]
    assert isinstance(rule, NonInferiorityRule)
    return rule


def flat(score: float, n: int, rollouts: int = 1) -> dict[str, list[float]]:
    return {f"q{i}": [score] * rollouts for i in range(n)}


# --------------------------------------------------------------------------- paired


def test_twenty_equal_drops_fail_by_the_exact_bounded_test() -> None:
    """Yesterday 1.0 on every example; today's checkpoint keeps the format and scores 0.2. A
    difference of two 0..1 scores lies in [-1, 1]: (d + 1) / 2 is a [0, 1] score, all equal
    to 0.1, against a null mean of 0.5: p = (0.5 / 0.9)^20 (a sign test's 2^-20 would assume
    the differences symmetric, which the null of a mean does not give)."""
    reference = {f"q{i}": 1.0 for i in range(20)}
    verdict = PairedRule(reference).evaluate(ScoreSummary("reward", 0.2, 20, 0.0), flat(0.2, 20))
    assert not verdict.passed and verdict.status == "fail"
    assert verdict.p_value == pytest.approx((0.5 / 0.9) ** 20, rel=1e-12)
    assert verdict.test == "exact test for 20 equal paired differences in [-1, 1]"
    root = 0.05 ** (1 / 20)
    assert verdict.delta_ci_high == pytest.approx(2 * (1 - 0.9 * root) - 1 - 0.0)
    assert "regression of 0.800, Δ -0.800" in verdict.message and "p<0.001" in verdict.message
    assert agrees_with_its_interval(verdict)


@pytest.mark.parametrize("n", [5, 8, 12, 40])
@pytest.mark.parametrize(("shift", "margin"), [(-0.3, 0.0), (-0.3, 0.25), (-0.3, 0.4), (0.1, 0.0)])
def test_equal_differences_hold_their_size_at_the_least_favourable_null(
    n: int, shift: float, margin: float
) -> None:
    """The bound is attained: differences on {d, 1} with mean exactly -margin are all d with
    probability p itself, so the test rejects at most alpha of the time (known truth)."""
    reference = {f"q{i}": 0.5 + 0.01 * i for i in range(n)}
    current = {key: [value + shift] for key, value in reference.items()}
    for method in ("auto", "t", "bootstrap"):
        rule = PairedRule(reference, margin=margin, method=method)  # type: ignore[arg-type]
        verdict = rule.evaluate(ScoreSummary("reward", 0.5, n, 0.0), current)
        y, null = (shift + 1) / 2, (1 - margin) / 2
        expected = 1.0 if y >= null else ((1 - null) / (1 - y)) ** n
        assert verdict.p_value == pytest.approx(expected, rel=1e-9), (method, verdict)
        assert verdict.passed == (expected >= 0.05)
        assert agrees_with_its_interval(verdict)
    y, null = (shift + 1) / 2, (1 - margin) / 2
    if y < null:  # P(all n at y) under the two-point law on {y, 1} with mean null
        p_low = (1 - null) / (1 - y)
        assert scipy_stats.binom.pmf(n, n, p_low) == pytest.approx(((1 - null) / (1 - y)) ** n)


def test_equal_differences_off_the_0_1_scale_are_undecidable() -> None:
    reference = {f"q{i}": 5.0 for i in range(10)}
    verdict = PairedRule(reference).evaluate(ScoreSummary("r", 4.0, 10, 0.0), flat(4.0, 10))
    assert verdict.passed and verdict.status == "undecidable"
    assert "not on a 0..1 scale" in verdict.undecidable and "would decide it" in verdict.undecidable


# --------------------------------------------------------------------------- value gates


def test_constant_partial_credit_against_an_exact_baseline_fails() -> None:
    """0.2 on every one of 20 examples against 0.95: (0.05 / 0.8)^20, not "undecidable"."""
    rows = flat(0.2, 20)
    verdict = value_gate(0.95).evaluate(summary_of(rows, "reward"), rows)
    assert not verdict.passed and verdict.status == "fail" and not verdict.undecidable
    assert verdict.p_value == pytest.approx((0.05 / 0.8) ** 20, rel=1e-12)
    assert verdict.test == "exact test for 20 equal scores in [0, 1]"
    assert verdict.delta_ci_high == pytest.approx(1 - 0.8 * 0.05 ** (1 / 20) - 0.95)
    assert agrees_with_its_interval(verdict)


@pytest.mark.parametrize("score", [0.0, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("n", [2, 5, 20, 200])
def test_the_bounded_test_holds_its_size_at_the_least_favourable_null(score: float, n: int) -> None:
    """Scores on {score, 1} with mean exactly at the baseline: P(all n equal score) is the
    p-value itself, so rejections happen at most alpha of the time (simulation, known truth)."""
    baseline = 0.95
    p_value = stats.constant_bounded_test(score, n, baseline).p_value
    assert p_value is not None
    p_low = (1 - baseline) / (1 - score)  # P(X = score) for mean = baseline on {score, 1}
    assert p_value == pytest.approx(scipy_stats.binom.pmf(n, n, p_low), rel=1e-9)
    rng = random.Random(n)
    draws = 4000
    all_low = sum(all(rng.random() < p_low for _ in range(n)) for _ in range(draws))
    rejected = all_low if p_value < 0.05 else 0
    assert rejected / draws <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / draws)


def test_constant_scores_at_or_above_the_baseline_pass() -> None:
    for score in (0.95, 1.0):
        rows = flat(score, 30)
        verdict = value_gate(0.95).evaluate(summary_of(rows, "reward"), rows)
        assert verdict.passed and verdict.p_value == 1.0 and agrees_with_its_interval(verdict)
    within = flat(0.9, 30)
    assert value_gate(0.95, margin=0.05).evaluate(summary_of(within, "reward"), within).passed


def test_constant_scores_against_a_baseline_with_its_own_n() -> None:
    """Yesterday's --update-baselines entry: value 1.0, n 20, stderr 0 (every example 1.0)."""
    rows = flat(0.2, 20)
    verdict = value_gate(1.0, n=20, stderr=0.0).evaluate(summary_of(rows, "reward"), rows)
    expected = stats.farrington_manning_test(4.0, 20, 1.0, 20)
    assert not verdict.passed and verdict.p_value == pytest.approx(expected.p_value)
    assert verdict.test == "Farrington–Manning score on 20 equal scores in [0, 1]"
    assert agrees_with_its_interval(verdict)
    rollouts = flat(0.2, 20, rollouts=4)  # a baseline n counts rows, as summary.json's does
    again = value_gate(1.0, n=80, stderr=0.0).evaluate(summary_of(rollouts, "reward"), rollouts)
    assert again.p_value == pytest.approx(expected.p_value)
    # a baseline with a stderr of its own: Farrington–Manning against the n it stands for,
    # never a t-test on the baseline's spread alone (this run has none to show)
    noisy = value_gate(0.5, stderr=0.01).evaluate(summary_of(flat(0.47, 10), "r"), flat(0.47, 10))
    fm = stats.farrington_manning_test(4.7, 10, 0.5, 0.25 / 0.01**2)
    assert noisy.passed and noisy.p_value == pytest.approx(fm.p_value)
    assert noisy.test == "Farrington–Manning score on 10 equal scores in [0, 1]"


def test_require_baseline_fails_what_the_data_cannot_decide() -> None:
    one = {"q0": [0.25]}
    verdict = value_gate(0.6).evaluate(summary_of(one, "reward"), one)
    assert verdict.passed and verdict.status == "undecidable"
    required = require_decided(verdict)
    assert not required.passed and required.status == "fail"
    assert "undecidable, fails under --require-baseline (one example" in required.message
    assert "more examples would decide it" in required.message


# --------------------------------------------------------------------------- excluded errors


def test_errors_never_turn_a_fail_into_a_pass() -> None:
    """100 right and 10 errored (timeouts) against an exact 0.95: leaving the errors out gives
    1.000 and a pass; the gate counts them wrong (100/110), and since counting them right would
    pass, the errors decide it: inconclusive, a failure."""
    rows = {f"q{i}": [1.0] for i in range(100)}
    errored = [f"q{i}" for i in range(100, 110)]
    gate = value_gate(0.95)
    excluded = gate.evaluate(summary_of(rows, "reward"), rows)
    assert excluded.passed  # what the score alone would say
    verdict = gate_with_errors(gate, summary_of(rows, "reward"), rows, errored)
    expected = scipy_stats.binomtest(100, 110, 0.95, alternative="less").pvalue
    assert verdict.p_value == pytest.approx(expected, rel=1e-9) and expected < 0.05
    assert not verdict.passed and verdict.errors_decide and verdict.errors_excluded == 10
    assert verdict.value == pytest.approx(100 / 110) and verdict.value_errors_right == 1.0
    assert verdict.message.startswith("env reward 0.909")
    assert "inconclusive, fails with the 10 errored rows counted wrong" in verdict.message
    assert "0.909 counted wrong (gated), 1.000 counted right" in verdict.message
    assert "the 10 error(s) decide it" in verdict.message


def test_errors_that_cannot_change_the_verdict_leave_it_decided() -> None:
    rows = {f"q{i}": [1.0 if i < 95 else 0.0] for i in range(100)}
    calm = gate_with_errors(value_gate(0.8), summary_of(rows, "r"), rows, ["q100", "q101"])
    assert calm.passed and not calm.errors_decide  # 95/102 counted wrong still passes
    bad = {f"q{i}": [1.0 if i < 50 else 0.0] for i in range(100)}
    worse = gate_with_errors(value_gate(0.8), summary_of(bad, "r"), bad, ["q100", "q101"])
    assert not worse.passed and not worse.errors_decide  # 52/102 counted right still fails
    assert "regression of" in worse.message
    # a paired gate fills errored examples of this run the same way
    reference = {f"q{i}": 1.0 for i in range(40)}
    current = {f"q{i}": [1.0] for i in range(38)}
    paired = gate_with_errors(
        PairedRule(reference), summary_of(current, "r"), current, ["q38", "q39"]
    )
    assert paired.passed and paired.n_shared == 40 and paired.errors_excluded == 2
