"""The anytime-valid tests behind ``--mb-stop-early``: the wealth is the betting product it
claims (known answer), the rule is certain at the wrong side no more than alpha of the time
(simulation with known truth, checked after every observation), and the printed confidence
sequence and the decision never disagree."""

from __future__ import annotations

import math
import random

import pytest

from pytest_modelbench.gating import early
from pytest_modelbench.gating.early import EarlyStopper, fixed_alpha, paired_rule, value_rule
from pytest_modelbench.gating.stats.sequential import (
    TRUNCATION,
    SequentialTest,
    bet_size,
    confidence_sequence,
    plug_in_bets,
    wealth_below,
)

try:  # at import: a lazy import after an in-process pytester run would load numpy twice
    import scipy.stats as scipy_stats
except ImportError:  # pragma: no cover - scipy is in the test extra
    scipy_stats = None


def test_the_wealth_is_the_product_of_the_bets() -> None:
    values = [0.0, 1.0, 0.0, 0.0, 0.5, 0.0, 1.0, 0.0]
    t, alpha, horizon = 0.65, 0.05, 100
    test = SequentialTest(t, "below", alpha, horizon)
    for x in values:
        test.add(x)
    bets = plug_in_bets(values, alpha, horizon)
    expected = math.prod(
        1.0 + min(b, TRUNCATION / (1.0 - t)) * (t - x) for b, x in zip(bets, values, strict=True)
    )
    assert test.e_value == pytest.approx(expected, rel=1e-12)
    # the first bet uses the prior variance 1/4: sqrt(2 log 20 / (0.25 * 100))
    assert bets[0] == pytest.approx(math.sqrt(2 * math.log(20) / 25), rel=1e-12)
    assert bet_size(alpha, 0.25, 0, 5) == bet_size(alpha, 0.25, 0, 20)  # horizon at least 20


@pytest.mark.parametrize("side", ["below", "above"])
def test_false_certainty_stays_below_alpha_when_checked_after_every_example(side: str) -> None:
    """True mean exactly at the threshold (the null's edge): over 400 runs of 300 examples,
    checked after each, a test is certain in at most alpha of them (+ Monte Carlo error)."""
    rng = random.Random(5)
    alpha, runs, hits = 0.05, 400, 0
    for _ in range(runs):
        test = SequentialTest(0.65, side, alpha, 300)  # type: ignore[arg-type]
        hits += any(test.add(1.0 if rng.random() < 0.65 else 0.0) for _ in range(300))
    assert hits / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs)


def test_the_interval_and_the_decision_never_disagree() -> None:
    rng = random.Random(9)
    for trial in range(25):
        truth = rng.choice([0.2, 0.5, 0.6, 0.7, 0.9])
        threshold = rng.choice([0.3, 0.6, 0.65, 0.8])
        test = SequentialTest(threshold, "below", 0.01, 200)
        for _ in range(200):
            certain = test.add(1.0 if rng.random() < truth else 0.0)
            low, high = confidence_sequence(test.values, 0.01, 200)
            assert low <= math.fsum(test.values) / len(test.values) <= high
            if abs(high - threshold) > 1e-9:
                assert certain == (high < threshold), (trial, len(test.values), high)
            if certain:
                break


def test_errors_count_right_for_a_regression_and_wrong_for_a_pass() -> None:
    rule = value_rule(0.5, 0.0, 0.05)
    assert rule is not None
    order = [f"q{i}" for i in range(400)]
    errors = EarlyStopper(rule, order, 1, "m")
    for example in order:  # every row an error: neither side can ever be certain
        assert errors.add({"example_id": example, "error": "HTTP 503", "metrics": {}}) is None
    assert errors.used == 400


def test_paired_observations_and_alpha_split() -> None:
    rule = paired_rule({"a": 1.0, "b": 0.0}, 0.0, 0.05, "ref")
    assert rule is not None
    assert rule.observation("a", 0.0) == 0.0 and rule.observation("b", 1.0) == 1.0
    assert rule.observation("c", 1.0) is None  # not shared with the reference
    assert rule.to_score(0.25) == -0.5
    assert fixed_alpha(0.05) == pytest.approx(0.04) and rule.alpha_regression == pytest.approx(0.01)
    noisy = value_rule(0.6, 0.0, 0.05, baseline_n=400)
    assert noisy is not None and noisy.regression_below < 0.6 < noisy.fine_above
    assert value_rule(6.0, 0.0, 0.05) is None  # off the 0..1 scale: no rule


# scipy is the reference: the e-process with a fixed bet against the binomial distribution.
# No sequential-testing library fits as a test dependency: confseq (Howard & Waudby-Smith)
# has no wheel, its build pins pybind11 2.6, which does not compile on Python 3.11 (even with
# Boost installed), and its Python code predates NumPy 2; expectation needs Python 3.12.


def _fixed_bet_wealth(ones: int, n: int, t: float, bet: float) -> float:
    """Our wealth for ``ones`` right answers of ``n`` (in a scattered order) at one fixed bet."""
    values = [1.0 if (i * ones) // n != ((i + 1) * ones) // n else 0.0 for i in range(n)]
    assert sum(values) == ones
    return wealth_below(values, [bet] * n, t)


@pytest.mark.parametrize(("n", "t", "bet"), [(30, 0.65, 0.9), (200, 0.2125, 0.5), (80, 0.5, 1.4)])
def test_a_fixed_bet_is_a_fair_game_at_the_null_by_scipys_binomial(
    n: int, t: float, bet: float
) -> None:
    """With a fixed bet the wealth depends on the count of right answers only, is the closed
    form (1 + bet t)^(n-k) (1 - bet (1-t))^k, and its expectation over scipy's binomial is
    exactly 1 at the null's edge (a martingale) and below 1 inside the null (mean > t)."""
    if scipy_stats is None:
        pytest.skip("scipy is not installed (the test extra)")
    closed = [(1 + bet * t) ** (n - k) * (1 - bet * (1 - t)) ** k for k in range(n + 1)]
    ours = [_fixed_bet_wealth(k, n, t, bet) for k in range(n + 1)]
    assert ours == pytest.approx(closed, rel=1e-9)
    ks = range(n + 1)
    at_edge = math.fsum(scipy_stats.binom.pmf(k, n, t) * ours[k] for k in ks)
    inside = math.fsum(scipy_stats.binom.pmf(k, n, min(1.0, t + 0.1)) * ours[k] for k in ks)
    assert at_edge == pytest.approx(1.0, rel=1e-9) and inside < 1.0


@pytest.mark.parametrize(("n", "alpha", "bet"), [(50, 0.05, 1.0), (300, 0.01, 0.6)])
def test_a_fixed_bet_never_rejects_inside_scipys_exact_interval(
    n: int, alpha: float, bet: float
) -> None:
    """Read at a fixed n, the test rejects "mean >= t" only where scipy's exact binomial test
    at the same level does (its Clopper-Pearson bound), and the rejection set's probability
    at the null's edge, a binomial tail from scipy, is at most alpha (Markov, then Ville)."""
    if scipy_stats is None:
        pytest.skip("scipy is not installed (the test extra)")
    for ones in range(0, n + 1, max(1, n // 25)):
        exact = scipy_stats.binomtest(ones, n, alternative="less")
        upper = exact.proportion_ci(confidence_level=1 - alpha, method="exact").high
        if upper >= 1.0:
            continue
        below = upper - 1e-9
        if bet < TRUNCATION / (1.0 - below):  # the bet as given, not cut to the bound's share
            assert _fixed_bet_wealth(ones, n, below, bet) < 1.0 / alpha, (ones, upper)
    for t in (0.1, 0.35, 0.65, 0.9):
        rejected = [k for k in range(n + 1) if _fixed_bet_wealth(k, n, t, bet) >= 1.0 / alpha]
        tail = scipy_stats.binom.cdf(max(rejected), n, t) if rejected else 0.0
        assert rejected == list(range(len(rejected)))  # fewer right answers: more evidence
        assert tail <= alpha, (t, rejected)


# --collect-only's expected examples (gating.early.expected_examples)


def test_the_paired_figure_is_not_the_best_case_of_identical_replies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model scoring the reference's mean still answers some examples differently: the
    figure simulates replies independent of the reference's, not a zero-variance sequence of
    identical replies (which made "no regression" certain at once: 112 of 1000 at margin 0.05,
    where a same-mean model needs about 500)."""
    monkeypatch.setattr(early, "_expected", {})
    monkeypatch.setattr(early, "_spent", [0])
    reference = {f"e{i}": float(i % 2) for i in range(1000)}
    rule = early.paired_rule(reference, 0.05, 0.05, "ref")
    assert rule is not None
    identical = early._used(rule, [0.5] * 1000, 1000)
    expected = early.expected_examples(rule, 1000)
    assert expected.at_baseline is not None and expected.at_baseline > 3 * identical


def test_rollouts_of_one_example_agree_in_the_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rollouts of an example mostly agree, so the figure does not shrink with rollouts."""
    monkeypatch.setattr(early, "_expected", {})
    monkeypatch.setattr(early, "_spent", [0])
    rule = early.value_rule(0.5, 0.05, 0.05)
    assert rule is not None
    one, eight = (early.expected_examples(rule, 400, r).at_baseline for r in (1, 8))
    assert one == eight


def test_a_plan_of_many_rules_spends_a_bounded_simulation_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(early, "_expected", {})
    monkeypatch.setattr(early, "_spent", [0])
    monkeypatch.setattr(early, "SIMULATION_BUDGET", 30_000)
    figures = []
    for i in range(5):
        rule = early.value_rule(0.3 + i / 100, 0.0, 0.05)
        assert rule is not None
        figures.append(early.expected_examples(rule, 1000))
    assert early._spent[0] <= 30_000 + 1000 * 200
    assert figures[0].at_baseline is not None and figures[-1].at_baseline is None
    assert all(f.collapsed < 1000 for f in figures)  # the collapse is always computed
