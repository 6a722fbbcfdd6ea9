"""The verdict of a gate: what the store saves with an item and every report shows.

Defined here, below the gate rules (``gating/gates.py``) that make it, so the item's one
saved record (``store.result.EvalResult``) carries it typed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pytest_modelbench.store.records import TextEnum

NO_BASELINE = "none"  # the rule of an item gated against nothing


class Verdict(TextEnum):
    """An item's final verdict, as every report shows it (its value is the text written)."""

    PASS = "pass"
    FAIL = "fail"
    UNDECIDABLE = "undecidable"  # the data cannot decide; it passes
    NO_BASELINE = "no baseline"  # nothing to gate against
    ERROR = "error"  # the item has no result: its evaluation failed

    @property
    def failed(self) -> bool:
        """Whether the item fails the run (a failed gate or an error)."""
        return self in (Verdict.FAIL, Verdict.ERROR)

    @property
    def rank(self) -> int:
        """How bad it is, for the worst verdict of a group (fail > error > pass > the rest)."""
        return _RANK[self]

    def text(self, pending: bool = False) -> str:
        """As reports show it: ``fail (Holm pending)`` while ``--mb-correction holm`` has yet
        to decide it."""
        return f"{self.value}{HOLM_PENDING}" if pending else self.value


HOLM_PENDING = " (Holm pending)"  # suffix of a verdict --mb-correction holm decides at the end
_RANK = {
    Verdict.FAIL: 4,
    Verdict.ERROR: 3,
    Verdict.PASS: 2,
    Verdict.UNDECIDABLE: 1,
    Verdict.NO_BASELINE: 1,
}


@dataclass(frozen=True)
class GateVerdict:
    """The outcome of gating one item, with every number the report shows.

    ``delta`` is current minus baseline (paired: the mean per-example
    difference on the shared examples), so a regression is negative.
    ``p_value`` is the one-sided p-value for "dropped by more than
    ``margin``"; [``delta_ci_low``, ``delta_ci_high``] is the two-sided
    ``delta_confidence`` (= 1 - 2 alpha) interval for ``delta`` from inverting
    the same ``test``, so ``p_value < alpha`` exactly when ``delta_ci_high <
    -margin``. ``undecidable`` says why a test could not decide (it passes).
    ``p_adjusted`` is set by ``gating.gates.holm_adjust_verdicts`` and then decides
    ``passed``. Paired verdicts carry this run's mean on the shared examples
    (``paired_value``), count examples that got worse/better
    (``n_worse``/``n_better``) and list a few ids of each; ``reference_model`` names
    the reference's model when it is another checkpoint, and ``reference_unfinished``
    counts the rows of an unfinished reference item compared under
    ``--mb-allow-unfinished-baseline``. An item with errored rows (timeouts, 5xx after
    retries) is gated with them counted wrong (``value`` is then that score), so errors never
    turn a fail into a pass; ``value_errors_right`` is the score with them counted right, and
    ``errors_decide`` marks an item that only the errors fail (inconclusive: a failure).
    An item stopped by ``--mb-stop-early`` has ``stopped_at`` of ``planned`` examples and
    the ``e_value`` of the anytime-valid test that decided it (its interval is the test's
    confidence sequence; it takes no part in Holm's final step, decided at alpha / m).
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
    delta_ci_low: float | None = None
    delta_ci_high: float | None = None
    delta_confidence: float | None = None
    undecidable: str = ""
    message: str = ""
    reference_model: str | None = None  # paired: the reference run's model, when named otherwise
    reference_unfinished: int | None = None  # paired: rows of an unfinished reference item used
    errors_excluded: int = 0  # errored rows the score leaves out; the gate counted them wrong
    value_errors_right: float | None = None  # the score with those rows counted right
    errors_decide: bool = False  # fails with them counted wrong, passes counted right
    stopped_at: int | None = None  # --mb-stop-early: examples used when the verdict was certain
    planned: int | None = None  # --mb-stop-early: examples the item would have run
    e_value: float | None = None  # --mb-stop-early: the deciding test's wealth (p <= 1 / e)
    setup_differs: str = ""  # how the baseline's setup differs from this run's (store/setup.py)
    setup_required: bool = False  # --mb-require-same-setup: a setup difference fails the item
    setup_failed: bool = False  # the test passed; the setup difference failed it

    # 2: delta_ci_low/high, delta_confidence, undecidable; exact and score tests, not z
    SCHEMA_VERSION: ClassVar[int] = 2

    @property
    def status(self) -> Verdict:
        """``pass``, ``fail``, ``undecidable`` or ``no baseline`` (the report's verdict column)."""
        if self.rule == NO_BASELINE:
            return Verdict.NO_BASELINE if self.passed else Verdict.FAIL
        if self.undecidable and self.passed:
            return Verdict.UNDECIDABLE
        return Verdict.PASS if self.passed else Verdict.FAIL

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (for ``user_properties``, JUnit and ``summary.json``)."""
        data = dataclasses.asdict(self)
        data["worse_ids"] = list(self.worse_ids)
        data["better_ids"] = list(self.better_ids)
        data["status"] = self.status.value
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
