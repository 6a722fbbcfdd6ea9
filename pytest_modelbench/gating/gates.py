"""Baseline gates: decide whether an item's score regressed, and say so in one paragraph.

A :class:`GateRule` turns the current :class:`ScoreSummary` (and, for paired
rules, the per-example scores) into a :class:`GateVerdict`. Rules are chosen
per baseline entry by :func:`rule_for`: ``min`` gives :class:`MinRule`,
``value`` (+ ``margin``) :class:`NonInferiorityRule`, ``run:`` or
``--baseline-run`` :class:`PairedRule`. Adding a rule is adding a class, its
case in :func:`rule_for`, and its sentence in :func:`_render` (the one-paragraph
message is worded per rule).

Every statistical rule fails an item only when the drop *beyond the margin*
is significant at ``alpha`` (one-sided): a noisy dip passes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pytest_modelbench.gating import stats

__all__ = [
    "BaselineEntry",
    "GateRule",
    "GateVerdict",
    "MinRule",
    "NonInferiorityRule",
    "PairedRule",
    "ScoreSummary",
    "holm_adjust_verdicts",
    "no_baseline_verdict",
    "rule_for",
]

DEFAULT_ALPHA = 0.05
MAX_LISTED_IDS = 5

PairedMethod = Literal["auto", "mcnemar", "bootstrap", "t"]


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


@dataclass(frozen=True)
class GateVerdict:
    """The outcome of gating one item, with every number the report shows.

    ``delta`` is current minus baseline (paired: the mean per-example
    difference on the shared examples), so a regression is negative.
    ``p_value`` is the one-sided p-value for "dropped by more than
    ``margin``"; ``p_adjusted`` is set by :func:`holm_adjust_verdicts` and then
    decides ``passed``. Paired verdicts carry this run's mean on the shared
    examples (``paired_value``), count examples that got worse/better
    (``n_worse``/``n_better``) and list a few ids of each.
    """

    passed: bool
    rule: str
    metric: str
    value: float
    alpha: float
    margin: float = 0.0
    p_value: float | None = None
    delta: float | None = None
    baseline_value: float | None = None
    subject: str = ""
    ci_low: float | None = None
    ci_high: float | None = None
    test: str = ""
    baseline_path: str | None = None
    reference_run: str | None = None
    n_shared: int | None = None
    paired_value: float | None = None
    n_worse: int | None = None
    n_better: int | None = None
    worse_ids: tuple[str, ...] = ()
    better_ids: tuple[str, ...] = ()
    binary: bool = False
    p_adjusted: float | None = None
    correction: str | None = None
    message: str = ""

    SCHEMA_VERSION: ClassVar[int] = 1

    @property
    def status(self) -> str:
        """``pass``, ``fail`` or ``no baseline`` (the report's verdict column)."""
        if self.rule == NO_BASELINE:
            return "no baseline" if self.passed else "fail"
        return "pass" if self.passed else "fail"

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (for ``user_properties``, JUnit and ``summary.json``)."""
        data = dataclasses.asdict(self)
        data["worse_ids"] = list(self.worse_ids)
        data["better_ids"] = list(self.better_ids)
        data["status"] = self.status
        data["schema_version"] = self.SCHEMA_VERSION
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateVerdict:
        """The verdict :meth:`as_dict` wrote (unknown keys, such as ``status``, are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["worse_ids"] = tuple(data.get("worse_ids") or ())
        values["better_ids"] = tuple(data.get("better_ids") or ())
        return cls(**values)


@runtime_checkable
class GateRule(Protocol):
    """A way to decide pass/fail for one item against its baseline."""

    @property
    def name(self) -> str:
        """Short rule name shown in reports (``min``, ``non-inferiority``, ``paired``)."""
        ...

    def evaluate(
        self, current: ScoreSummary, current_scores: Mapping[str, float] | None = None
    ) -> GateVerdict:
        """Judge ``current``; ``current_scores`` (example id -> score) is needed by paired rules."""
        ...


NO_BASELINE = "none"


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
        current_scores: Mapping[str, float] | None = None,  # noqa: ARG002  # GateRule signature; only paired rules use it
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

    One-sided z-test of H0: true score >= value - margin. The baseline's own
    uncertainty is used when known: its ``stderr``, else its ``n`` (assuming
    the same per-example spread as the current run: se_cur * sqrt(n_cur / n));
    with neither, the baseline is treated as an exact number.
    """

    value: float
    margin: float = 0.0
    alpha: float = DEFAULT_ALPHA
    baseline_n: int | None = None
    baseline_stderr: float | None = None
    baseline_path: str | None = None
    name: str = "non-inferiority"

    def baseline_se(self, current: ScoreSummary) -> float:
        """The standard error attributed to the baseline number."""
        if self.baseline_stderr is not None:
            return self.baseline_stderr
        if self.baseline_n and current.n > 0 and math.isfinite(current.stderr):
            return current.stderr * math.sqrt(current.n / self.baseline_n)
        return 0.0

    def evaluate(
        self,
        current: ScoreSummary,
        current_scores: Mapping[str, float] | None = None,  # noqa: ARG002  # GateRule signature; only paired rules use it
    ) -> GateVerdict:
        stderr = current.stderr if math.isfinite(current.stderr) else 0.0
        result = stats.noninferiority_z_test(
            current.value, stderr, self.value, self.margin, self.baseline_se(current)
        )
        return _finish(
            GateVerdict(
                passed=result.p_value >= self.alpha,
                rule=self.name,
                metric=current.metric,
                value=current.value,
                alpha=self.alpha,
                margin=self.margin,
                p_value=result.p_value,
                delta=result.delta,
                baseline_value=self.value,
                subject=current.subject,
                ci_low=current.ci_low,
                ci_high=current.ci_high,
                test="z-test",
                baseline_path=self.baseline_path,
            )
        )


@dataclass(frozen=True)
class PairedRule:
    """Compare per-example scores with a reference run on the examples both have.

    With 0/1 scores (``method="auto"`` or ``"mcnemar"``) and ``margin == 0``
    this is the one-sided exact McNemar test (binomial on the discordant
    pairs). With a margin > 0 it is Tango's one-sided score test of
    H0: p_new - p_ref >= -margin, whose variance uses the restricted maximum
    likelihood estimate under that null. Continuous scores use a seeded paired
    bootstrap (``auto``/``bootstrap``) or the paired t-test (``t``) of
    H0: mean(new - ref) >= -margin. Fails when p < alpha. With several
    rollouts per example, pass each example's mean score (then it is continuous).
    """

    reference: Mapping[str, float]
    margin: float = 0.0
    alpha: float = DEFAULT_ALPHA
    method: PairedMethod = "auto"
    reference_run: str | None = None
    baseline_path: str | None = None
    n_resamples: int = 2000
    seed: int = 0
    name: str = "paired"

    def evaluate(
        self, current: ScoreSummary, current_scores: Mapping[str, float] | None = None
    ) -> GateVerdict:
        if current_scores is None:
            raise ValueError("PairedRule needs the current run's per-example scores")
        shared = [key for key in current_scores if key in self.reference]
        new = [float(current_scores[key]) for key in shared]
        ref = [float(self.reference[key]) for key in shared]
        binary = {*new, *ref} <= {0.0, 1.0}
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
        )
        if not shared:
            return _finish(base)
        worse = [(n - r, key) for key, n, r in zip(shared, new, ref, strict=True) if n < r]
        better = [(n - r, key) for key, n, r in zip(shared, new, ref, strict=True) if n > r]
        worse.sort(key=lambda item: item[0])  # biggest drops first; stable keeps run order
        better.sort(key=lambda item: -item[0])
        p_value, test, delta = self._test(new, ref, binary, len(worse), len(better))
        return _finish(
            dataclasses.replace(
                base,
                passed=p_value >= self.alpha,
                p_value=p_value,
                delta=delta,
                baseline_value=math.fsum(ref) / len(ref),
                paired_value=math.fsum(new) / len(new),
                test=test,
                n_worse=len(worse),
                n_better=len(better),
                worse_ids=tuple(key for _, key in worse[:MAX_LISTED_IDS]),
                better_ids=tuple(key for _, key in better[:MAX_LISTED_IDS]),
            )
        )

    def _test(
        self, new: list[float], ref: list[float], binary: bool, n_worse: int, n_better: int
    ) -> tuple[float, str, float]:
        """(one-sided p-value, test name, mean difference new - ref)."""
        n = len(new)
        delta = (math.fsum(new) - math.fsum(ref)) / n
        use_mcnemar = self.method == "mcnemar" or (self.method == "auto" and binary)
        if use_mcnemar:
            if not binary:
                raise ValueError("method='mcnemar' needs 0/1 scores in both runs")
            if self.margin == 0.0:
                result = stats.mcnemar_exact(n_better, n_worse, "less")
                return result.p_value, result.method, delta
            score = stats.paired_proportions_score_test(n_better, n_worse, n, -self.margin, "less")
            return score.p_value, score.method, delta
        if n < 2:
            return 1.0, "", delta
        if self.method == "t":
            paired = stats.paired_t_test(new, ref, -self.margin, "less")
        else:
            paired = stats.paired_bootstrap_test(
                new, ref, -self.margin, "less", n_resamples=self.n_resamples, seed=self.seed
            )
        return paired.p_value, paired.method, delta


def rule_for(
    entry: BaselineEntry,
    *,
    reference_scores: Mapping[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
    paired_method: PairedMethod = "auto",
) -> GateRule:
    """The rule a baseline entry asks for.

    Per-example ``reference_scores`` (loaded from ``entry.run`` or
    ``--baseline-run``) make it paired; otherwise ``value`` makes it
    non-inferiority and ``min`` a floor. ``entry.alpha`` beats ``alpha``.
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
    verdicts: Sequence[GateVerdict], alpha: float = DEFAULT_ALPHA
) -> list[GateVerdict]:
    """Holm-adjust the p-values of all tested verdicts together and re-decide them.

    Verdicts without a p-value (floors, no baseline, nothing shared) are
    returned unchanged; the others pass iff their adjusted p-value >= alpha.
    """
    tested = [i for i, v in enumerate(verdicts) if v.p_value is not None]
    adjusted = stats.holm_adjust([verdicts[i].p_value or 0.0 for i in tested])
    out = list(verdicts)
    for i, p_adj in zip(tested, adjusted, strict=True):
        out[i] = _finish(
            dataclasses.replace(
                verdicts[i],
                p_adjusted=p_adj,
                correction="holm",
                alpha=alpha,
                passed=p_adj >= alpha,
            )
        )
    return out


# --------------------------------------------------------------------------- messages


def _num(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"


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
    if not v.passed:
        return f"regression of {size}"
    if v.delta > 0:
        return f"improvement of {size}"
    if v.delta == 0:
        return "no change"
    if v.delta >= -v.margin:
        return f"drop of {size} (within margin)"
    return f"drop of {size} (not significant)"


def _flips_text(v: GateVerdict) -> str:
    worse, better = ("correct->wrong", "wrong->correct") if v.binary else ("worse", "better")
    text = f"{v.n_worse} {worse}"
    if v.worse_ids:
        more = ", ..." if (v.n_worse or 0) > len(v.worse_ids) else ""
        text += f" ({', '.join(v.worse_ids)}{more})"
    return f"{text}, {v.n_better} {better}"


def _render(v: GateVerdict) -> str:
    """The one-paragraph message for a verdict (see STYLE.md for the shape)."""
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
        if not v.n_shared:
            return f"{score} vs {run}: no shared examples, not compared{where}"
        against = (
            f"vs {run} {_num(v.baseline_value or 0.0)} ({margin}, {v.n_shared} paired examples"
        )
        if v.paired_value is not None and abs(v.paired_value - v.value) >= 5e-4:
            against += f"; this run {_num(v.paired_value)} on them"
        against += ")"
    else:
        against = f"vs baseline {_num(v.baseline_value or 0.0)} ({margin})"
    text = f"{score} {against}: {_change_text(v)}"
    if v.p_value is not None:
        text += f", {_p(v.p_value)}"
    if v.p_adjusted is not None:
        text += f" (Holm-adjusted p={v.p_adjusted:.3f})"
    if v.test:
        text += f", {v.test}"
    if v.n_worse is not None:
        text += f"; {_flips_text(v)}"
    return text + where


def _finish(verdict: GateVerdict) -> GateVerdict:
    return dataclasses.replace(verdict, message=_render(verdict))
