"""Baseline gates: decide whether an item's score regressed, and say so in one paragraph.

A :class:`GateRule` turns the current :class:`ScoreSummary` (and, for paired
rules, the per-example scores) into a :class:`GateVerdict`. Rules are chosen
per baseline entry by :func:`rule_for`: ``min`` gives :class:`MinRule`,
``value`` (+ ``margin``) :class:`NonInferiorityRule`, ``run:`` or
``--baseline-run`` :class:`PairedRule`. Adding a rule is adding a class, its
case in :func:`rule_for`, and its sentence in :func:`_render` (the one-paragraph
message is worded per rule).

Every statistical rule fails an item only when the drop *beyond the margin*
is significant at ``alpha`` (one-sided): a noisy dip passes. Each verdict
carries the (1 - 2 alpha) interval for the difference that inverts the same
test, so a verdict fails exactly when that interval lies below ``-margin``;
a test that cannot decide (one example, or equal scores outside 0..1 against an exact
number) is "undecidable": it passes, unless ``--require-baseline`` makes it fail. Equal
scores are not "no evidence": equal scores in [0, 1] (and equal paired differences of such
scores, as (d + 1) / 2) go to an exact bounded test, or Farrington–Manning on their sum
against a baseline with its own n.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pytest_modelbench.errors import EvaluationError
from pytest_modelbench.gating import stats
from pytest_modelbench.store.verdict import NO_BASELINE, GateVerdict

__all__ = [
    "BaselineEntry",
    "ExampleScores",
    "GateRule",
    "GateVerdict",
    "MinRule",
    "NonInferiorityRule",
    "PairedRule",
    "ScoreSummary",
    "gate_with_errors",
    "holm_adjust_verdicts",
    "holm_decided",
    "min_paired_examples",
    "no_baseline_verdict",
    "require_decided",
    "rule_for",
    "scored_summary",
    "stopped_verdict",
]

DEFAULT_ALPHA = 0.05
MAX_LISTED_IDS = 5

PairedMethod = Literal["auto", "mcnemar", "bootstrap", "t"]

ExampleScores = Mapping[str, float | Sequence[float]]
"""Per-example scores of a run: example id -> its score, or its rollouts' scores."""


@dataclass(frozen=True)
class ScoreSummary:
    """The current item's primary score: what the gate judges and the message shows.

    ``subject`` names what was scored (the environment id, ``medqa``); ``n``
    is the number of examples (or clusters) behind ``stderr``.
    """

    metric: str
    value: float
    n: int
    stderr: float
    ci_low: float | None = None
    ci_high: float | None = None
    subject: str = ""

    @classmethod
    def from_estimate(
        cls, metric: str, estimate: stats.Estimate, subject: str = ""
    ) -> ScoreSummary:
        """Wrap a :class:`stats.Estimate` (as stored in ``summary.json``)."""
        return cls(
            metric,
            estimate.value,
            estimate.n,
            estimate.stderr,
            estimate.ci_low,
            estimate.ci_high,
            subject,
        )


@dataclass(frozen=True)
class BaselineEntry:
    """One entry of ``configs/baselines/<model>.yaml`` as the gates need it.

    ``value`` (non-inferiority), ``min`` (floor) or ``run`` (paired reference
    run id) selects the rule; ``alpha`` overrides the session's; ``path`` is
    the baseline file named in messages; ``source`` says where the number came
    from and ``run_id`` which run produced it (written by ``--update-baselines``).
    """

    metric: str
    value: float | None = None
    min: float | None = None
    margin: float = 0.0
    n: int | None = None
    stderr: float | None = None
    path: str | None = None
    run: str | None = None
    source: str | None = None
    run_id: str | None = None
    alpha: float | None = None

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], *, metric: str, path: str | None = None
    ) -> BaselineEntry:
        """Build from a parsed YAML entry (or ``spec.model_dump()``); ``metric`` is the default."""
        return cls(
            metric=data.get("metric") or metric,
            value=data.get("value"),
            min=data.get("min"),
            margin=float(data.get("margin") or 0.0),
            n=data.get("n"),
            stderr=data.get("stderr"),
            path=path,
            run=data.get("run"),
            source=data.get("source"),
            run_id=data.get("run_id"),
            alpha=data.get("alpha"),
        )


@runtime_checkable
class GateRule(Protocol):
    """A way to decide pass/fail for one item against its baseline."""

    @property
    def name(self) -> str:
        """Short rule name shown in reports (``min``, ``non-inferiority``, ``paired``)."""
        ...

    def evaluate(
        self, current: ScoreSummary, current_scores: ExampleScores | None = None
    ) -> GateVerdict:
        """Judge ``current``; ``current_scores`` (example id -> score or rollout scores) is
        needed by paired rules and lets the value rule pick its test from the rows."""
        ...


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class MinRule:
    """Fail when the score is below a fixed floor (no statistics: the floor is a hard line)."""

    floor: float
    baseline_path: str | None = None
    name: str = "min"

    def evaluate(
        self,
        current: ScoreSummary,
        current_scores: ExampleScores | None = None,  # noqa: ARG002  # GateRule signature; a floor needs no rows
    ) -> GateVerdict:
        return _finish(
            GateVerdict(
                passed=current.value >= self.floor,
                rule=self.name,
                metric=current.metric,
                value=current.value,
                alpha=0.0,
                delta=current.value - self.floor,
                baseline_value=self.floor,
                subject=current.subject,
                ci_low=current.ci_low,
                ci_high=current.ci_high,
                baseline_path=self.baseline_path,
            )
        )


@dataclass(frozen=True)
class NonInferiorityRule:
    """Fail only when the score is significantly more than ``margin`` below ``value``.

    A one-sided test of H0: true score >= value - margin, chosen from the rows
    (``current_scores``, example id -> rollout scores):

    * 0/1 scores against an exact baseline (no ``n``/``stderr``): the exact
      binomial test, with the Clopper–Pearson interval;
    * 0/1 scores against a baseline with its own ``n`` (or only a ``stderr``:
      then n = value (1 - value) / stderr^2): the Farrington–Manning score test;
    * several rollouts per example: the same tests on Rao–Scott effective
      counts (rows / design effect; a baseline ``n`` counts rows, as
      ``summary.json``'s n does, and is divided by the same design effect);
    * other scores: the one-sample t-test (cluster-robust over rollouts, df =
      examples - 1), Welch's when the baseline has a ``stderr`` or ``n``
      (its spread then assumed equal to this run's).

    All scores equal (zero spread) in [0, 1]: the exact test on the sample maximum
    against an exact baseline, Farrington–Manning on the scores' sum against one with
    its own n. Without rows it is a t-test on the summary's stderr. One example, or equal
    scores outside 0..1 against an exact number, is undecidable: the item passes (fails
    under ``--require-baseline``) and the message says what would decide it.
    """

    value: float
    margin: float = 0.0
    alpha: float = DEFAULT_ALPHA
    baseline_n: int | None = None
    baseline_stderr: float | None = None
    baseline_path: str | None = None
    name: str = "non-inferiority"

    def evaluate(
        self, current: ScoreSummary, current_scores: ExampleScores | None = None
    ) -> GateVerdict:
        result = self.test(current, _rollouts(current_scores))
        base = GateVerdict(
            passed=True,
            rule=self.name,
            metric=current.metric,
            value=current.value,
            alpha=self.alpha,
            margin=self.margin,
            baseline_value=self.value,
            subject=current.subject,
            ci_low=current.ci_low,
            ci_high=current.ci_high,
            baseline_path=self.baseline_path,
        )
        return _finish(_tested(base, result))

    def test(
        self, current: ScoreSummary, rows: Mapping[str, Sequence[float]] | None
    ) -> stats.NonInferiorityResult:
        """The test the data call for (see the class docstring); ``rows`` that do not
        reproduce the summary's value describe something else and are not used."""
        values = [v for scores in rows.values() for v in scores] if rows else []
        mean = math.fsum(values) / len(values) if values else math.nan
        if not abs(mean - current.value) <= 1e-9 * max(1.0, abs(current.value)):
            return self._summary_test(current)
        clusters: dict[Hashable, Sequence[float]] = {key: v for key, v in (rows or {}).items()}
        if all(v in (0.0, 1.0) for v in values):
            return self._binary_test(clusters, len(values), math.fsum(values))
        return self._mean_test(clusters, values)

    def _binary_test(
        self, rows: Mapping[Hashable, Sequence[float]], total: int, successes: float
    ) -> stats.NonInferiorityResult:
        effect = stats.design_effect(rows)
        n, k = total / effect, successes / effect
        baseline_n = self._baseline_n(effect)
        if baseline_n is None:
            result = stats.exact_binomial_test(k, n, self.value, self.margin, self.alpha)
        else:
            result = stats.farrington_manning_test(
                k, n, self.value, baseline_n, self.margin, self.alpha
            )
        if all(len(scores) == 1 for scores in rows.values()):
            return result
        return dataclasses.replace(
            result, method=f"{result.method}, Rao–Scott design effect {effect:.2f}"
        )

    def _baseline_n(self, effect: float) -> float | None:
        """The baseline's effective n for 0/1 scores; None treats it as an exact number."""
        if not 0.0 <= self.value <= 1.0:
            return None  # not a proportion: the exact test fails it whatever the data
        if self.baseline_n:
            return self.baseline_n / effect
        if self.baseline_stderr and 0.0 < self.value < 1.0:
            return self.value * (1.0 - self.value) / self.baseline_stderr**2
        return None

    def _mean_test(
        self, rows: Mapping[Hashable, Sequence[float]], values: Sequence[float]
    ) -> stats.NonInferiorityResult:
        if any(len(scores) > 1 for scores in rows.values()):
            estimate, method = stats.clustered_mean(rows), "cluster-robust t"
        else:
            estimate, method = stats.mean_ci(values), "one-sample t"
        constant = _constant(values)
        if constant and len(rows) > 1 and 0.0 <= values[0] <= 1.0 and 0.0 <= self.value <= 1.0:
            # before any t-test: a t-test on the baseline's stderr alone is not valid here
            return self._constant_test(values[0], len(rows), len(values))
        stderr = 0.0 if constant and len(rows) > 1 else estimate.stderr
        result = self._t_test(estimate.value, stderr, len(values), estimate.n, method)
        if not result.undecidable:
            return result
        if len(rows) < 2:
            reason = f"one example: {result.reason}; more examples would decide it"
        elif constant:
            reason = (
                f"all {len(values)} scores are {_num(values[0])} against {_num(self.value)}, "
                f"not a 0..1 scale, so nothing bounds how they could vary: {result.reason}; "
                "a baseline with its stderr or n "
                "(--update-baselines writes both) or a paired run: reference would decide it"
            )
        else:
            reason = result.reason
        return dataclasses.replace(result, reason=reason)

    def _constant_test(self, value: float, examples: int, rows: int) -> stats.NonInferiorityResult:
        """Every score equals ``value`` in [0, 1]: the exact bounded test against an exact
        baseline, else the Farrington–Manning score test on the scores' sum (a [0, 1] score
        varies at most as a 0/1 one with its mean) against the baseline's n (or the n its
        stderr stands for, v (1 - v) / stderr^2)."""
        if self.baseline_n:
            baseline_n = self.baseline_n * examples / rows  # rollouts: a baseline n counts rows
        elif self.baseline_stderr and 0.0 < self.value < 1.0:
            baseline_n = self.value * (1.0 - self.value) / self.baseline_stderr**2
        else:
            return stats.constant_bounded_test(value, examples, self.value, self.margin, self.alpha)
        result = stats.farrington_manning_test(
            value * examples, examples, self.value, baseline_n, self.margin, self.alpha
        )
        return dataclasses.replace(
            result, method=f"{result.method} on {examples} equal scores in [0, 1]"
        )

    def _summary_test(self, current: ScoreSummary) -> stats.NonInferiorityResult:
        n = current.n
        result = self._t_test(current.value, current.stderr, n, n, "t-test on the summary's stderr")
        if result.undecidable:
            return dataclasses.replace(result, reason=f"the summary's {result.reason}, no rows")
        return result

    def _t_test(
        self, value: float, stderr: float, rows: int, units: int, method: str
    ) -> stats.NonInferiorityResult:
        """t-test on ``units`` independent units (examples) of ``rows`` rows; ``units`` 0 is
        unknown (the normal)."""
        baseline_se, baseline_df = 0.0, math.inf
        if self.baseline_stderr is not None:
            baseline_se = self.baseline_stderr
        elif self.baseline_n:
            baseline_se = stderr * math.sqrt(rows / self.baseline_n)
        if self.baseline_n and units > 0:
            baseline_df = max(1.0, self.baseline_n * units / rows - 1.0)
        if baseline_se > 0.0:
            method = _WELCH_NAMES.get(method, method)
        return stats.mean_noninferiority_test(
            value,
            stderr,
            units - 1.0 if units > 0 else math.inf,
            self.value,
            self.margin,
            self.alpha,
            baseline_stderr=baseline_se,
            baseline_df=baseline_df,
            method=method,
        )


_WELCH_NAMES = {
    "one-sample t": "Welch t",
    "cluster-robust t": "cluster-robust Welch t",
    "t-test on the summary's stderr": "Welch t-test on the summary's stderr",
}


def min_paired_examples(alpha: float) -> int:
    """The fewest shared examples a paired gate accepts: 5 at alpha = 0.05.

    With d pairs the smallest one-sided exact McNemar p-value is 2^-d, so with
    fewer than this many the gate could never fail, whatever the runs did.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    pairs = 1
    while 0.5**pairs >= alpha:
        pairs += 1
    return pairs


@dataclass(frozen=True)
class PairedRule:
    """Compare per-example scores with a reference run on the examples both have.

    With 0/1 scores (``method="auto"`` or ``"mcnemar"``) and ``margin == 0``
    this is the one-sided exact McNemar test (binomial on the discordant
    pairs), with the exact conditional interval. With a margin > 0 it is
    Tango's one-sided score test of H0: p_new - p_ref >= -margin, whose
    variance uses the restricted maximum likelihood estimate under that null,
    with Tango's score interval. Continuous scores use a seeded paired
    bootstrap (``auto``/``bootstrap``; the interval inverts its shift test) or
    the paired t-test (``t``) of H0: mean(new - ref) >= -margin. Fails when
    p < alpha. With several rollouts per example each example's mean is
    compared (then it is continuous). Fewer than :func:`min_paired_examples`
    shared examples is an :class:`EvaluationError` (``required``: a failure).
    """

    reference: Mapping[str, float]
    margin: float = 0.0
    alpha: float = DEFAULT_ALPHA
    method: PairedMethod = "auto"
    reference_run: str | None = None
    baseline_path: str | None = None
    n_resamples: int = 2000
    seed: int = 0
    current_run: str | None = None
    item: str = ""
    required: bool = False
    reference_model: str | None = None
    reference_unfinished: int | None = None
    name: str = "paired"

    def evaluate(
        self, current: ScoreSummary, current_scores: ExampleScores | None = None
    ) -> GateVerdict:
        if current_scores is None:
            raise ValueError("PairedRule needs the current run's per-example scores")
        rows = _rollouts(current_scores) or {}
        scores = {key: math.fsum(v) / len(v) for key, v in rows.items()}
        shared = [key for key in scores if key in self.reference]
        new = [scores[key] for key in shared]
        ref = [float(self.reference[key]) for key in shared]
        binary = {*new, *ref} <= {0.0, 1.0}
        mcnemar = self.method == "mcnemar" or (self.method == "auto" and binary)
        if mcnemar and not binary:
            raise ValueError("method='mcnemar' needs 0/1 scores in both runs")
        base = GateVerdict(
            passed=True,
            rule=self.name,
            metric=current.metric,
            value=current.value,
            alpha=self.alpha,
            margin=self.margin,
            subject=current.subject,
            ci_low=current.ci_low,
            ci_high=current.ci_high,
            baseline_path=self.baseline_path,
            reference_run=self.reference_run,
            n_shared=len(shared),
            binary=binary,
            reference_model=self.reference_model,
            reference_unfinished=self.reference_unfinished,
        )
        if len(shared) < min_paired_examples(self.alpha):
            return self._too_few(base, current)
        worse = [(n - r, key) for key, n, r in zip(shared, new, ref, strict=True) if n < r]
        better = [(n - r, key) for key, n, r in zip(shared, new, ref, strict=True) if n > r]
        worse.sort(key=lambda item: item[0])  # biggest drops first; stable keeps run order
        better.sort(key=lambda item: -item[0])
        result = self._test(new, ref, mcnemar, len(worse), len(better))
        return _finish(
            dataclasses.replace(
                _tested(base, result),
                baseline_value=math.fsum(ref) / len(ref),
                paired_value=math.fsum(new) / len(new),
                n_worse=len(worse),
                n_better=len(better),
                worse_ids=tuple(key for _, key in worse[:MAX_LISTED_IDS]),
                better_ids=tuple(key for _, key in better[:MAX_LISTED_IDS]),
            )
        )

    def _too_few(self, base: GateVerdict, current: ScoreSummary) -> GateVerdict:
        """Too few shared examples: a failure under ``required``, else an error."""
        if self.required:
            return _finish(dataclasses.replace(base, passed=False))
        shared = base.n_shared or 0
        reference = (
            f"reference run {self.reference_run}" if self.reference_run else "the reference run"
        )
        this = f"run {self.current_run}" if self.current_run else "this run"
        raise EvaluationError(
            f"{self.item or current.subject}: the paired gate shares only {shared} example(s) "
            f"between {this} and {reference}, fewer than the "
            f"{min_paired_examples(self.alpha)} it needs (with fewer, a one-sided exact "
            f"McNemar test cannot reach p < {self.alpha:g}), so nothing was compared; run both "
            "on the same examples, or drop --baseline-run / the baseline's run: entry"
        )

    def _test(
        self, new: list[float], ref: list[float], mcnemar: bool, n_worse: int, n_better: int
    ) -> stats.NonInferiorityResult:
        """The paired test of mean(new - ref) >= -margin and its (1 - 2 alpha) interval."""
        n = len(new)
        estimate = math.fsum(new) / n
        delta = (math.fsum(new) - math.fsum(ref)) / n
        confidence = 1.0 - 2.0 * self.alpha
        if mcnemar and self.margin == 0.0:
            p_value = stats.mcnemar_exact(n_better, n_worse, "less").p_value
            low, high = stats.mcnemar_exact_ci(n_better, n_worse, n, confidence)
            return stats.NonInferiorityResult(
                "exact McNemar", estimate, delta, 0.0, p_value, low, high, confidence
            )
        if mcnemar:
            result = stats.paired_proportions_score_test(
                n_better, n_worse, n, -self.margin, "less", confidence
            )
        else:
            if _constant([a - b for a, b in zip(new, ref, strict=True)]):
                return self._equal_differences(new, ref, estimate, delta, confidence)
            if self.method == "t":
                result = stats.paired_t_test(new, ref, -self.margin, "less", confidence)
            else:
                result = stats.paired_bootstrap_test(
                    new,
                    ref,
                    -self.margin,
                    "less",
                    confidence,
                    n_resamples=self.n_resamples,
                    seed=self.seed,
                )
        return stats.NonInferiorityResult(
            result.method,
            estimate,
            delta,
            self.margin,
            result.p_value,
            result.ci_low,
            result.ci_high,
            confidence,
        )

    def _equal_differences(
        self, new: list[float], ref: list[float], estimate: float, delta: float, confidence: float
    ) -> stats.NonInferiorityResult:
        """Every paired difference equals ``delta``: zero spread, but not zero evidence. With
        both runs' scores in [0, 1] a difference lies in [-1, 1], so (d + 1) / 2 is a [0, 1]
        score and the exact bounded test on equal scores decides (n equal drops of 0.8: p =
        (0.5 / 0.9)^n); its interval maps back to the difference. Off that scale nothing
        bounds how the differences could vary: undecidable, saying what would decide it."""
        n = len(new)
        if not all(0.0 <= v <= 1.0 for v in (*new, *ref)):
            reason = (
                f"every paired difference is {_signed(delta)} and the scores are not on a 0..1 "
                "scale, so nothing bounds how they could vary; more varied examples or a value "
                "baseline with its stderr would decide it"
            )
            test = "paired t-test" if self.method == "t" else "paired bootstrap"
            return stats.NonInferiorityResult(
                test, estimate, delta, self.margin, None, math.nan, math.nan, confidence, reason
            )
        null = (1.0 - self.margin) / 2.0
        result = stats.constant_bounded_test(
            (delta + 1.0) / 2.0, n, null, 0.0, round(0.5 * (1.0 - confidence), 12)
        )
        return stats.NonInferiorityResult(
            f"exact test for {n} equal paired differences in [-1, 1]",
            estimate,
            delta,
            self.margin,
            result.p_value,
            2.0 * (result.ci_low + null) - 1.0,
            2.0 * (result.ci_high + null) - 1.0,
            confidence,
        )


def _rollouts(scores: ExampleScores | None) -> dict[str, tuple[float, ...]] | None:
    """Example id -> its rollouts' scores (a single score is one rollout); None if empty."""
    if not scores:
        return None
    out: dict[str, tuple[float, ...]] = {}
    for key, value in scores.items():
        rows = (float(value),) if isinstance(value, (int, float)) else tuple(map(float, value))
        if rows:
            out[str(key)] = rows
    return out or None


def _constant(values: Sequence[float]) -> bool:
    """Whether the values are all equal, up to rounding (their standard error is then 0, not
    the 1e-17 that floating-point sums leave, which would make any shift "significant")."""
    low, high = min(values), max(values)
    return high - low <= 1e-12 * max(1.0, abs(low), abs(high))


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _tested(base: GateVerdict, result: stats.NonInferiorityResult) -> GateVerdict:
    """``base`` decided by ``result``: passes iff p >= alpha, or when undecidable."""
    return dataclasses.replace(
        base,
        passed=result.p_value is None or result.p_value >= base.alpha,
        p_value=result.p_value,
        delta=result.delta,
        delta_ci_low=_finite_or_none(result.ci_low),
        delta_ci_high=_finite_or_none(result.ci_high),
        delta_confidence=result.confidence,
        test=result.method,
        undecidable=(result.reason or "undecidable") if result.p_value is None else "",
    )


def rule_for(
    entry: BaselineEntry,
    *,
    reference_scores: Mapping[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
    paired_method: PairedMethod = "auto",
    required: bool = False,
    current_run: str | None = None,
    item: str = "",
    reference_model: str | None = None,
    reference_unfinished: int | None = None,
) -> GateRule:
    """The rule a baseline entry asks for.

    Per-example ``reference_scores`` (loaded from ``entry.run`` or
    ``--baseline-run``) make it paired; otherwise ``value`` makes it
    non-inferiority and ``min`` a floor. ``entry.alpha`` beats ``alpha``.
    ``required`` (``--require-baseline``), ``current_run`` and ``item`` are for
    a paired gate with too few shared examples: a failure, or an error naming them.
    ``reference_model`` (another checkpoint's name) and ``reference_unfinished`` (rows of an
    unfinished reference item) are said in a paired verdict's paragraph.
    """
    alpha = entry.alpha if entry.alpha is not None else alpha
    if reference_scores is not None:
        return PairedRule(
            reference=reference_scores,
            margin=entry.margin,
            alpha=alpha,
            method=paired_method,
            reference_run=entry.run,
            baseline_path=entry.path,
            current_run=current_run,
            item=item,
            required=required,
            reference_model=reference_model,
            reference_unfinished=reference_unfinished,
        )
    if entry.run is not None:
        raise ValueError(
            f"baseline for {entry.metric!r} names run {entry.run!r}: "
            "load that run's per-example scores and pass them as reference_scores"
        )
    if entry.value is not None:
        return NonInferiorityRule(
            value=entry.value,
            margin=entry.margin,
            alpha=alpha,
            baseline_n=entry.n,
            baseline_stderr=entry.stderr,
            baseline_path=entry.path,
        )
    if entry.min is not None:
        return MinRule(floor=entry.min, baseline_path=entry.path)
    raise ValueError(f"baseline for {entry.metric!r} has none of 'value', 'min' or 'run'")


def scored_summary(metric: str, rows: Mapping[str, Sequence[float]], subject: str) -> ScoreSummary:
    """What ``summary.json`` would say about these rows (example id -> rollout scores)."""
    values = [v for scores in rows.values() for v in scores]
    clusters = [key for key, scores in rows.items() for _ in scores]
    estimate = stats.summarize_scores(values, clusters)
    return ScoreSummary(
        metric,
        estimate.value,
        len(rows),
        estimate.stderr,
        _finite_or_none(estimate.ci_low),
        _finite_or_none(estimate.ci_high),
        subject,
    )


def gate_with_errors(
    rule: GateRule,
    current: ScoreSummary,
    rows: Mapping[str, Sequence[float]],
    errored: Sequence[str],
) -> GateVerdict:
    """Judge an item whose ``errored`` rows (one example id per errored rollout: timeouts,
    5xx after retries) the score leaves out, so that no error can move the verdict: it is
    gated with them counted wrong, and an item that fails only so (it passes with them
    counted right) is inconclusive, a failure that says how many errors decide it.

    Wrong and right are 0 and 1 on a 0..1 scale, else the lowest and highest score seen
    (in this run, or the paired reference)."""
    if not errored:
        return rule.evaluate(current, rows)
    seen = [v for scores in rows.values() for v in scores]
    if isinstance(rule, PairedRule):
        seen += [float(v) for v in rule.reference.values()]
    low, high = (min(seen, default=0.0), max(seen, default=1.0))
    if low >= 0.0 and high <= 1.0:
        low, high = 0.0, 1.0

    def filled(score: float) -> dict[str, list[float]]:
        out = {key: list(scores) for key, scores in rows.items()}
        for key in errored:
            out.setdefault(key, []).append(score)
        return out

    wrong, right = filled(low), filled(high)
    pessimistic = rule.evaluate(scored_summary(current.metric, wrong, current.subject), wrong)
    optimistic = rule.evaluate(scored_summary(current.metric, right, current.subject), right)
    return _finish(
        dataclasses.replace(
            pessimistic,
            errors_excluded=len(errored),
            value_errors_right=scored_summary(current.metric, right, "").value,
            errors_decide=not pessimistic.passed and optimistic.passed,
        )
    )


def stopped_verdict(
    current: ScoreSummary, stopped: Mapping[str, Any], entry: BaselineEntry
) -> GateVerdict:
    """The verdict of an item ``--mb-stop-early`` stopped once it was certain: decided by the
    anytime-valid test (its confidence sequence is the printed interval; it lies wholly below
    baseline - margin for a regression, above it otherwise), never re-tested at the end."""
    paired = bool(stopped.get("paired"))
    baseline = 0.0 if paired else float(entry.value or 0.0)
    low, high = float(stopped["ci_low"]), float(stopped["ci_high"])
    e_value = float(stopped.get("e_value") or 1.0)
    alpha = float(stopped.get("alpha") or DEFAULT_ALPHA)
    return _finish(
        GateVerdict(
            passed=stopped.get("decision") != "regression",
            rule="paired" if paired else "non-inferiority",
            metric=current.metric,
            value=current.value,
            alpha=alpha,
            margin=entry.margin,
            delta=None if paired else current.value - baseline,
            baseline_value=None if paired else baseline,
            subject=current.subject,
            ci_low=current.ci_low,
            ci_high=current.ci_high,
            test=str(stopped.get("rule") or "anytime-valid test"),
            baseline_path=entry.path,
            reference_run=entry.run if paired else None,
            delta_ci_low=low - baseline,
            delta_ci_high=high - baseline,
            delta_confidence=None,
            stopped_at=int(stopped.get("n_used") or 0),
            planned=int(stopped.get("n_planned") or 0),
            e_value=e_value,
        )
    )


def _stopped_text(v: GateVerdict) -> str:
    """``stopped at 41 of 1319 examples: regression certain (...)``."""
    assert v.delta_ci_low is not None and v.delta_ci_high is not None
    certain = "no regression certain" if v.passed else "regression certain"
    against = "vs " + (f"run {v.reference_run}" if v.reference_run else "reference run")
    if v.baseline_value is not None:
        against = f"vs baseline {_num(v.baseline_value)}"
    what = "Δ" if v.baseline_value is not None else "paired Δ"
    return (
        f"{_score_text(v)} {against} (margin {v.margin:g}): stopped at {v.stopped_at} of "
        f"{v.planned} examples: {certain} ({what} in [{_signed(v.delta_ci_low)}, "
        f"{_signed(v.delta_ci_high)}] at every n, e={_e(v.e_value)} >= 1/{v.alpha:.3g}, {v.test})"
    )


def _e(e_value: float | None) -> str:
    e = e_value or 0.0
    return f"{e:.3g}" if e < 1e6 else f"{e:.1e}"


def require_decided(verdict: GateVerdict) -> GateVerdict:
    """``--require-baseline``: a verdict the data could not decide fails (a CI gate that
    tested nothing must not pass); its paragraph says what would decide it."""
    if not verdict.undecidable or not verdict.passed:
        return verdict
    return _finish(dataclasses.replace(verdict, passed=False))


def no_baseline_verdict(current: ScoreSummary, *, required: bool = False) -> GateVerdict:
    """The verdict of an item without a baseline: passes, unless ``--require-baseline``."""
    return _finish(
        GateVerdict(
            passed=not required,
            rule=NO_BASELINE,
            metric=current.metric,
            value=current.value,
            alpha=0.0,
            subject=current.subject,
            ci_low=current.ci_low,
            ci_high=current.ci_high,
        )
    )


def holm_adjust_verdicts(
    verdicts: Sequence[GateVerdict], alpha: float | None = None
) -> list[GateVerdict]:
    """Holm-adjust the p-values of all tested verdicts together and re-decide them.

    Verdicts without a p-value (floors, no baseline, nothing shared) are
    returned unchanged; the others pass iff their adjusted p-value >= alpha
    (each verdict's own alpha when ``alpha`` is None: a baseline entry may set one).
    """
    tested = [i for i, v in enumerate(verdicts) if v.p_value is not None]
    adjusted = stats.holm_adjust([verdicts[i].p_value or 0.0 for i in tested])
    out = list(verdicts)
    for i, p_adj in zip(tested, adjusted, strict=True):
        level = verdicts[i].alpha if alpha is None else alpha
        kept = _holm_keeps(p_adj, level)
        out[i] = _finish(
            dataclasses.replace(
                verdicts[i],
                p_adjusted=p_adj,
                correction="holm",
                alpha=level,
                passed=kept and not verdicts[i].setup_required,
                setup_failed=kept and verdicts[i].setup_required,
            )
        )
    return out


def _holm_keeps(p_adjusted: float, alpha: float) -> bool:
    """Holm's rule for one hypothesis: kept (the item's test holds) iff its adjusted p-value
    is at least alpha. The final step and the early decision both ask this."""
    return p_adjusted >= alpha


def holm_decided(verdict: GateVerdict, family: int) -> bool | None:
    """Whether Holm keeps ``verdict``'s hypothesis (``True``: the item's test holds) in a family
    of ``family`` tested items, when its own p-value decides that whatever the other p-values
    are; ``None`` when it depends on them (the item waits for Holm's final step).

    Holm's adjusted p-value of the item lies between its values at the two extremes of the
    other p-values, which :func:`~pytest_modelbench.gating.stats.holm_adjust` gives in closed
    form: all others 0, its own p; all others 1, ``min(1, family * p)``. The same rule
    (:func:`_holm_keeps`) is applied to both, so the early decision and the final step at
    session end cannot disagree, at a constant cost per item."""
    if verdict.p_value is None:  # not a test: Holm leaves it as it is
        return verdict.passed or verdict.setup_failed
    p = verdict.p_value
    low, high = p, min(1.0, max(1, family) * p)
    kept = _holm_keeps(low, verdict.alpha), _holm_keeps(high, verdict.alpha)
    return kept[0] if kept[0] == kept[1] else None


# --------------------------------------------------------------------------- messages


def _num(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"


def _signed(x: float) -> str:
    return f"{x:+.3f}" if abs(x) < 100 else f"{x:+.1f}"


def _p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def _score_text(v: GateVerdict) -> str:
    head = f"{v.subject} {v.metric}".strip()
    text = f"{head} {_num(v.value)}"
    if v.ci_low is not None and v.ci_high is not None and math.isfinite(v.ci_low):
        text += f" [{_num(v.ci_low)}, {_num(v.ci_high)}]"
    return text


def _change_text(v: GateVerdict) -> str:
    assert v.delta is not None
    size = _num(abs(v.delta))
    if v.errors_decide and not v.passed:
        return f"inconclusive, fails with the {v.errors_excluded} errored rows counted wrong"
    if v.undecidable and not v.passed:
        return f"undecidable, fails under --require-baseline ({v.undecidable})"
    if v.undecidable:
        return f"undecidable, passes untested ({v.undecidable})"
    if not v.passed:
        return f"regression of {size}"
    if v.delta > 0:
        return f"improvement of {size}"
    if v.delta == 0:
        return "no change"
    if v.delta >= -v.margin:
        return f"drop of {size} (within margin)"
    return f"drop of {size} (not significant)"


def _test_text(v: GateVerdict) -> str:
    """``, Δ -0.038, 90% CI [-0.064, -0.012], p=0.003, exact binomial``: the test and its interval."""
    text = ""
    if v.delta is not None and v.delta_ci_low is not None and v.delta_ci_high is not None:
        level = f"{100 * (v.delta_confidence or 0.0):.10g}%"
        text += (
            f", Δ {_signed(v.delta)}, {level} CI "
            f"[{_signed(v.delta_ci_low)}, {_signed(v.delta_ci_high)}]"
        )
    if v.p_value is not None:
        text += f", {_p(v.p_value)}"
    if v.p_adjusted is not None:
        text += f" (Holm-adjusted p={v.p_adjusted:.3f})"
    if v.test:
        text += f", {v.test}"
    return text


def _flips_text(v: GateVerdict) -> str:
    worse, better = ("correct->wrong", "wrong->correct") if v.binary else ("worse", "better")
    text = f"{v.n_worse} {worse}"
    if v.worse_ids:
        more = ", ..." if (v.n_worse or 0) > len(v.worse_ids) else ""
        text += f" ({', '.join(v.worse_ids)}{more})"
    return f"{text}, {v.n_better} {better}"


def _errors_text(v: GateVerdict) -> str:
    """``; 3 errored rows: 0.810 counted wrong (gated), 0.840 counted right``, and what decides."""
    if not v.errors_excluded or v.value_errors_right is None:
        return ""
    text = (
        f"; {v.errors_excluded} errored row(s) (timeouts, server errors): {_num(v.value)} "
        f"counted wrong (gated), {_num(v.value_errors_right)} counted right"
    )
    if v.errors_decide:
        text += (
            f"; the {v.errors_excluded} error(s) decide it (it passes only with them counted "
            "right): re-run the same command to retry them"
        )
    return text


def _render(v: GateVerdict) -> str:
    """The one-paragraph message for a verdict (see STYLE.md for the shape)."""
    tested = dataclasses.replace(v, passed=True) if v.setup_failed else v
    if v.stopped_at is not None:
        where = f" ({v.baseline_path})" if v.baseline_path else ""
        return _stopped_text(tested) + where + _setup_text(v)
    return _render_verdict(tested) + _errors_text(tested) + _setup_text(v)


def _setup_text(v: GateVerdict) -> str:
    """``; setup differs (engine_version): baseline: vllm 0.32.0, ...; this run: ...``, and
    whether ``--mb-require-same-setup`` failed the item for it."""
    if not v.setup_differs:
        return ""
    if v.setup_required:
        return f"; fails under --mb-require-same-setup: {v.setup_differs}"
    return f"; {v.setup_differs}"


def with_setup(verdict: GateVerdict, difference: str, *, require: bool = False) -> GateVerdict:
    """The verdict with the setup difference (a line of ``store.setup.compare_setups``) in its
    paragraph; under ``--mb-require-same-setup`` a difference fails the item."""
    if not difference:
        return verdict
    return _finish(
        dataclasses.replace(
            verdict,
            setup_differs=difference,
            setup_required=require,
            setup_failed=require and verdict.passed,
            passed=verdict.passed and not require,
        )
    )


def _render_verdict(v: GateVerdict) -> str:
    where = f" ({v.baseline_path})" if v.baseline_path else ""
    score = _score_text(v)
    if v.rule == NO_BASELINE:
        return f"{score}: no baseline" + (" (--require-baseline)" if not v.passed else "")
    if v.rule == "min":
        assert v.baseline_value is not None and v.delta is not None
        verdict = f"below floor by {_num(-v.delta)}" if not v.passed else "at or above floor"
        return f"{score} vs min {_num(v.baseline_value)}: {verdict}{where}"
    margin = f"margin {v.margin:g}"
    if v.reference_run is not None or v.n_shared is not None:
        run = f"run {v.reference_run}" if v.reference_run else "reference run"
        if v.reference_model:
            run = f"{v.reference_model} in {run}"
        if v.reference_unfinished is not None:
            run += f" (unfinished: {v.reference_unfinished} rows, --mb-allow-unfinished-baseline)"
        if v.delta is None:  # too few shared examples to compare (a failure only when required)
            needed = min_paired_examples(v.alpha)
            verdict = "not compared" + (" (--require-baseline)" if not v.passed else "")
            return (
                f"{score} vs {run}: {v.n_shared or 0} shared examples, fewer than the "
                f"{needed} a paired comparison needs, {verdict}{where}"
            )
        against = (
            f"vs {run} {_num(v.baseline_value or 0.0)} ({margin}, {v.n_shared} paired examples"
        )
        if v.paired_value is not None and abs(v.paired_value - v.value) >= 5e-4:
            against += f"; this run {_num(v.paired_value)} on them"
        against += ")"
    else:
        against = f"vs baseline {_num(v.baseline_value or 0.0)} ({margin})"
    text = f"{score} {against}: {_change_text(v)}{_test_text(v)}"
    if v.n_worse is not None:
        text += f"; {_flips_text(v)}"
    return text + where


def _finish(verdict: GateVerdict) -> GateVerdict:
    return dataclasses.replace(verdict, message=_render(verdict))
