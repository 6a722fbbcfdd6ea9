"""The anytime-valid tests behind ``--mb-stop-early``: the wealth is the betting product it
claims (known answer), the rule is certain at the wrong side no more than alpha of the time
(simulation with known truth, checked after every observation), and the printed confidence
sequence and the decision never disagree."""

from __future__ import annotations

import math
import random

import pytest

from pytest_modelbench.gating.early import EarlyStopper, fixed_alpha, paired_rule, value_rule
from pytest_modelbench.gating.stats.sequential import (
    TRUNCATION,
    SequentialTest,
    bet_size,
    confidence_sequence,
    plug_in_bets,
)


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
