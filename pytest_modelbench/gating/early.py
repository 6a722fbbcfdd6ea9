"""``--mb-stop-early``: stop an item once its gate's verdict is certain.

A :class:`StopRule` is made from the item's baseline before it runs (a value gate on a 0..1
score, or a paired gate against a reference run's per-example scores); an
:class:`EarlyStopper` reads the item's results **in the sample's order** (the completed
prefix of a seeded random order, never arrival order: replies to hard questions take longer)
and feeds them to two anytime-valid tests (:class:`stats.sequential.SequentialTest`). Errored
rows count as right for "regression certain" and as wrong for "no regression certain", so no
error can make a verdict certain. When neither side is certain the item runs to its end and
the fixed-n gate decides as before.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_modelbench.gating.stats.distributions import normal_ppf
from pytest_modelbench.gating.stats.sequential import SequentialTest

RULE_NAME = "anytime-valid betting confidence sequence"


@dataclass(frozen=True)
class StopRule:
    """When an item's verdict is certain. Observations are in [0, 1]: an example's mean score
    (value gates), or (new - reference + 1) / 2 (paired gates, on shared examples).

    ``regression_below`` / ``fine_above`` are the thresholds in those units; ``alpha`` and
    ``alpha_regression`` each side's level (under Holm divided by the family's size, halved
    again for a baseline with its own noise). A failure may come early or from the fixed-n gate
    at the end, so the early side spends :data:`EARLY_SHARE` of the gate's alpha and the
    fixed-n gate the rest: together at most alpha.
    """

    regression_below: float
    fine_above: float
    alpha: float  # "no regression certain" (a pass)
    alpha_regression: float  # "regression certain" (a failure: part of the gate's alpha)
    baseline: float  # the baseline's score (value gates) or 0 (paired: a difference)
    margin: float
    reference: Mapping[str, float] | None = None  # paired: example id -> reference score
    reference_run: str | None = None
    metric: str = ""  # the gated metric (rows are read for it)

    @property
    def key(self) -> str:
        """What a stopped item's decision depends on: reused only under the same rule."""
        against = f"value {self.baseline:.12g}"
        if self.reference is not None:  # the reference's scores, not only its name
            scores = ",".join(f"{k}={float(v):.12g}" for k, v in sorted(self.reference.items()))
            digest = hashlib.sha256(scores.encode()).hexdigest()[:16]
            against = f"run {self.reference_run} scores {digest}"
        return (
            f"{self.metric} {against} margin {self.margin:g} below {self.regression_below:.12g} "
            f"above {self.fine_above:.12g} alpha {self.alpha:.6g}/{self.alpha_regression:.6g}"
        )

    @property
    def paired(self) -> bool:
        return self.reference is not None

    def observation(self, example_id: str, mean: float) -> float | None:
        """The example's observation in [0, 1] (None: not shared with the reference)."""
        if self.reference is None:
            return mean
        ref = self.reference.get(example_id)
        return None if ref is None else (mean - float(ref) + 1.0) / 2.0

    def to_score(self, y: float) -> float:
        """An observation-scale bound in score units (paired: a difference)."""
        return 2.0 * y - 1.0 if self.paired else y


EARLY_SHARE = 0.2  # of a gate's alpha, spent on failing early; the fixed-n gate gets the rest


def fixed_alpha(alpha: float) -> float:
    """The fixed-n gate's alpha under ``--mb-stop-early`` (what early failures leave)."""
    return alpha * (1.0 - EARLY_SHARE)


def value_rule(
    value: float,
    margin: float,
    alpha: float,
    *,
    baseline_n: int | None = None,
    baseline_stderr: float | None = None,
    metric: str = "",
) -> StopRule | None:
    """The rule of a value gate on a 0..1 score, or None where it cannot apply (a baseline
    off the 0..1 scale). A baseline with its own noise splits alpha between its bound and the
    sequence (Bonferroni): regression only below its lower bound, fine only above its upper."""
    if not 0.0 <= value <= 1.0:
        return None
    if baseline_stderr is None and baseline_n:
        baseline_stderr = math.sqrt(max(value * (1.0 - value), 0.25 / baseline_n) / baseline_n)
    early = alpha * EARLY_SHARE
    if not baseline_stderr:
        return StopRule(value - margin, value - margin, alpha, early, value, margin, metric=metric)
    below = value - normal_ppf(1.0 - early / 2.0) * baseline_stderr - margin
    above = value + normal_ppf(1.0 - alpha / 2.0) * baseline_stderr - margin
    return StopRule(below, above, alpha / 2.0, early / 2.0, value, margin, metric=metric)


def paired_rule(
    reference: Mapping[str, float], margin: float, alpha: float, run: str | None, metric: str = ""
) -> StopRule | None:
    """The rule of a paired gate (scores in [0, 1] on both sides), or None."""
    if not all(0.0 <= float(v) <= 1.0 for v in reference.values()):
        return None
    threshold = (1.0 - margin) / 2.0
    early = alpha * EARLY_SHARE
    return StopRule(threshold, threshold, alpha, early, 0.0, margin, reference, run, metric)


@dataclass
class EarlyStopper:
    """Feeds an item's results, in ``order``, to the rule; :attr:`decision` once certain.

    ``order`` lists the example ids in the sample's order; ``rollouts`` rows make an
    example's observation (their mean). :meth:`add` takes a journal row as it arrives."""

    rule: StopRule
    order: Sequence[str]
    rollouts: int
    metric: str
    horizon: int = 0  # the planned examples the bets are tuned to (0: len(order))
    decision: str | None = None
    used: int = 0  # examples of the prefix read (shared or not)
    disabled: str = ""  # why the rule stopped reading (a score off the 0..1 scale)
    _rows: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)
    _regression: SequentialTest = field(init=False)
    _fine: SequentialTest = field(init=False)
    _index: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        r, n = self.rule, self.horizon or len(self.order)
        self._index = {example: i for i, example in enumerate(self.order)}
        self._regression = SequentialTest(r.regression_below, "below", r.alpha_regression, n)
        self._fine = SequentialTest(r.fine_above, "above", r.alpha, n)

    def add(self, row: Mapping[str, Any]) -> str | None:
        """Take one journal row; the decision once certain (then the item stops)."""
        if self.decision is not None or self.disabled:
            return self.decision
        example = str(row.get("example_id"))
        score = (row.get("metrics") or {}).get(self.metric)
        errored = bool(row.get("error")) or not isinstance(score, (int, float))
        value = float(score) if isinstance(score, (int, float)) and not errored else 0.0
        if not errored and not 0.0 <= value <= 1.0:
            self.disabled = f"{self.metric} {value:g} is off the 0..1 scale"
            return None
        self._rows.setdefault(example, []).append((value, errored))
        while self.used < len(self.order) and len(self._rows.get(self.order[self.used], ())) >= (
            self.rollouts
        ):
            self._advance(self._rows[self.order[self.used]])
            self.used += 1
            if self.decision is not None:
                break
        return self.decision

    def _advance(self, rows: list[tuple[float, bool]]) -> None:
        example = self.order[self.used]
        k = len(rows)
        best = math.fsum(1.0 if bad else v for v, bad in rows) / k
        worst = math.fsum(0.0 if bad else v for v, bad in rows) / k
        high, low = self.rule.observation(example, best), self.rule.observation(example, worst)
        if high is None or low is None:
            return
        if self._regression.add(high):  # errors counted right: certain whatever they were
            self.decision = "regression"
        elif self._fine.add(low):  # errors counted wrong
            self.decision = "no regression"

    def position(self, example_id: str, rollout: int) -> int:
        """A work unit's index in the order's list of units (rollouts of an example adjacent)."""
        return self._index[example_id] * self.rollouts + rollout

    def frontier(self) -> int:
        """Units up to the end of the first example the rule still waits for (a run loop sends
        only a window past it, see ``running.runner``); all of them once it reads no more."""
        if self.decision is not None or self.disabled:
            return len(self.order) * self.rollouts
        return (self.used + 1) * self.rollouts

    def add_and_check(self, row: Mapping[str, Any]) -> bool:
        """:meth:`add`, as a run loop's ``on_row``: True once certain (stop the item)."""
        return self.add(row) is not None

    def record(self, planned: int) -> dict[str, Any]:
        """What the summary keeps of a stopped item (see :data:`STOPPED`)."""
        test = self._regression if self.decision == "regression" else self._fine
        other = self.rule.alpha if test is self._regression else self.rule.alpha_regression
        low, high = test.interval(other)
        return {
            "decision": self.decision,
            "n_used": self.used,
            "n_planned": planned,
            "rule": RULE_NAME,
            "alpha": test.alpha,
            "e_value": test.e_value,
            "ci_low": self.rule.to_score(low),
            "ci_high": self.rule.to_score(high),
            "paired": self.rule.paired,
            "rule_key": self.rule.key,
        }

    def used_ids(self) -> set[str]:
        """The examples of the prefix the decision read."""
        return set(self.order[: self.used])


@dataclass(frozen=True)
class Expected:
    """``--collect-only``: the examples an item is expected to use under its rule."""

    at_baseline: float | None  # mean examples used at the baseline (simulated); None: budget spent
    collapsed: int  # examples used when every reply scores 0
    planned: int
    runs: int  # simulated sequences behind ``at_baseline``


SIMULATED_OBSERVATIONS = 100_000  # per rule: a quarter to a second on one core
SIMULATION_BUDGET = 1_000_000  # per plan: a plan of many distinct rules stays a few seconds
_expected: dict[tuple[str, int, int], Expected] = {}
_spent = [0]  # observations simulated so far in this process


def expected_examples(rule: StopRule, planned: int, rollouts: int = 1) -> Expected:
    """How many of ``planned`` examples the rule reads when the score equals the baseline and
    when it collapses to 0 (every reply wrong). Value gates: each example right with the
    baseline's probability, its rollouts agreeing (the widest spread, so the figure is not
    optimistic). Paired gates: a model scoring the reference's mean with replies independent
    of the reference's (every example's reference score drawn from the reference run, every
    example shared with it). Seeded simulations; cached per rule, so a sweep over seeds or
    models pays once; once :data:`SIMULATION_BUDGET` observations are spent, ``at_baseline``
    is None."""
    key = (rule.key, planned, rollouts)
    if key not in _expected:
        _expected[key] = _simulate(rule, planned)
    return _expected[key]


def _used(rule: StopRule, observations: Sequence[float], horizon: int) -> int:
    """Examples read until either side is certain (all of them when neither is)."""
    regression = SequentialTest(rule.regression_below, "below", rule.alpha_regression, horizon)
    fine = SequentialTest(rule.fine_above, "above", rule.alpha, horizon)
    for used, y in enumerate(observations, 1):
        if regression.add(y) or fine.add(y):
            return used
    return len(observations)


def _simulate(rule: StopRule, planned: int) -> Expected:
    rng = random.Random(0)  # the same figures at every --collect-only
    runs = max(10, min(200, SIMULATED_OBSERVATIONS // max(1, planned)))
    if _spent[0] and _spent[0] + runs * planned > SIMULATION_BUDGET:
        runs = 0  # the plan's budget is spent: say so rather than slow the plan down
    if rule.reference is not None:  # paired: observations are (candidate - reference + 1) / 2
        scores = [float(v) for v in rule.reference.values()]
        mean = math.fsum(scores) / len(scores) if scores else 0.0

        def observation() -> float:
            return ((rng.random() < mean) - rng.choice(scores) + 1.0) / 2.0

        def collapse() -> float:
            return (1.0 - rng.choice(scores)) / 2.0
    else:

        def observation() -> float:  # rollouts of one example agree: 0 or 1
            return float(rng.random() < rule.baseline)

        def collapse() -> float:
            return 0.0

    collapsed = _used(rule, [collapse() for _ in range(planned)], planned)
    if not runs:
        return Expected(None, collapsed, planned, 0)
    _spent[0] += runs * planned
    total = sum(_used(rule, [observation() for _ in range(planned)], planned) for _ in range(runs))
    return Expected(total / runs, collapsed, planned, runs)
