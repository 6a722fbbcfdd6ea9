""":class:`EvalResult`: an item's one record: identity, summary, verdict.

The worker that evaluated and gated an item saves it as ``result.json`` beside the item's
``summary.json`` (:meth:`EvalResult.save`); the controller, the reports, the JUnit properties,
the trackers and the ``pytest_modelbench_item_finished`` hook read that record
(:meth:`EvalResult.load`). Under ``--mb-correction holm`` it is rewritten once, when Holm
settles the item. A test function receives it from the ``mb_eval`` fixture.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pytest_modelbench.secrets import redact
from pytest_modelbench.store.files import atomic_write_json, read_json
from pytest_modelbench.store.records import PROPERTY_PREFIX
from pytest_modelbench.store.runstore import RESULT, ItemStore
from pytest_modelbench.store.setup import SetupRecord
from pytest_modelbench.store.summary import EMPTY, ItemSummary, MetricSummary
from pytest_modelbench.store.verdict import GateVerdict, Verdict


@dataclass(frozen=True)
class EvalResult:
    """The finished evaluation of one item: scores with uncertainty, per-example rows, and
    the gate's verdict.

    Example::

        def test_gsm8k_floor(mb_eval):
            assert mb_eval.score >= 0.3, mb_eval.describe()
    """

    item_id: str
    model: str
    env: str
    variant: str
    seed: int
    metric: str  # the primary metric ("" for an item that failed before it had a score)
    summary: ItemSummary  # the item's summary.json (a mapping given here is read as one)
    directory: Path  # the item's directory in the run store
    from_store: bool = False  # read back from the run store, nothing requested
    recompute_reason: str | None = None  # why stored results were not reused
    endpoint_checked: bool = True  # False: read from the store, the endpoint's identity unknown
    verdict: GateVerdict | None = field(default=None, compare=False)  # once gated
    gate_deferred: bool = False  # --mb-correction holm: decided at session end
    holm_family: int | None = None  # --mb-correction holm: the number of items tested
    error: str | None = None  # why the item has no result (then ``verdict`` is None)
    model_path: str | None = None  # the HF id or local path evaluated
    setup: SetupRecord | None = field(default=None, compare=False)  # what produced the scores

    SCHEMA_VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        if not isinstance(self.summary, ItemSummary):  # a summary.json object, or {}
            summary = ItemSummary.from_json(self.summary) if self.summary else EMPTY
            object.__setattr__(self, "summary", summary)

    @property
    def status(self) -> Verdict:
        """``pass``, ``fail``, ``undecidable``, ``no baseline`` or ``error``: the final verdict."""
        if self.error is not None:
            return Verdict.ERROR
        return self.verdict.status if self.verdict is not None else Verdict.NO_BASELINE

    @property
    def verdict_text(self) -> str:
        """:attr:`status` as reports show it, with ``(Holm pending)`` while
        ``--mb-correction holm`` has yet to decide it."""
        return self.status.text(pending=self.gate_deferred)

    @property
    def message(self) -> str:
        """The gate's one paragraph (a failing one says how many replies ran out of tokens),
        or the error that stopped the item."""
        if self.error is not None:
            return self.error
        if self.verdict is None:
            return ""
        if self.verdict.passed or not self.truncated:
            return self.verdict.message
        return f"{self.verdict.message.rstrip('.')}; {self.truncation_note()}"

    @property
    def truncated(self) -> int:
        """Replies that ran out of tokens (``finish_reason: length``)."""
        return self.summary.truncated or 0

    def truncation_note(self) -> str:
        """``"12 of 200 replies were truncated (...)"``: how many replies ran out of tokens,
        how many of them while still thinking, and the fix; "" when none did."""
        if not self.truncated:
            return ""
        replies = self.summary.replies
        thinking = self.summary.truncated_in_reasoning or 0
        during = f", {thinking} while still thinking" if thinking else ""
        # reasoning_effort is advice only for a model that reasons (one that sent thinking)
        reasons = thinking or self.summary.reasoning_replies or 0
        return (
            f"{self.truncated} of {replies} replies were truncated "
            f"(finish_reason length{during}): raise max_tokens"
            + (" or lower reasoning_effort" if reasons else "")
        )

    @property
    def empty_answers(self) -> int:
        """Replies that ended (not cut off) with no answer: scored 0 whatever the model knew."""
        return self.summary.empty_answers or 0

    def empty_answer_note(self) -> str:
        """``"7 of 200 replies had no answer (...)"``, with the likely cause; "" when none."""
        if not self.empty_answers:
            return ""
        replies = self.summary.replies
        in_reasoning = self.summary.answers_in_reasoning or 0
        if in_reasoning:
            return (
                f"{self.empty_answers} of {replies} replies had no answer, {in_reasoning} of "
                "them only thinking (content null, finish_reason stop): is the server's "
                "reasoning parser the model's own? (vllm serve --reasoning-parser)"
            )
        return (
            f"{self.empty_answers} of {replies} replies had no answer (finish_reason stop, "
            "empty content): each scored 0; look at them in report.html"
        )

    # -- the record on disk --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """``result.json``: every field but the summary (``summary.json``) and the directory."""
        data = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("summary", "directory", "verdict", "setup")
        }
        data["verdict"] = self.verdict.as_dict() if self.verdict is not None else None
        data["setup"] = self.setup.to_json() if self.setup is not None else None
        data["summary_fingerprint"] = self.summary.fingerprint  # what it was made from
        return {"schema_version": self.SCHEMA_VERSION, **data}

    def save(self) -> None:
        """Write ``result.json`` (atomically) in the item's directory; a record that is
        already there as it is (a re-report from the store) is not written again."""
        data = json.loads(json.dumps(self.to_json(), default=str))
        if read_json(self.directory / RESULT) != data:
            atomic_write_json(self.directory / RESULT, data)

    @classmethod
    def load(cls, directory: Path) -> EvalResult | None:
        """The record saved in an item directory, or None (none saved, another schema, or
        stale: made from another ``summary.json`` than the one there now)."""
        data = read_json(directory / RESULT)
        if not isinstance(data, dict) or data.get("schema_version") != cls.SCHEMA_VERSION:
            return None
        summary = ItemStore(directory).read_summary() or EMPTY
        if data.get("summary_fingerprint") != summary.fingerprint:
            return None
        known = {f.name for f in dataclasses.fields(cls)} - {
            "summary",
            "directory",
            "verdict",
            "setup",
        }
        gate = data.get("verdict")
        return cls(
            **{k: v for k, v in data.items() if k in known},
            summary=summary,
            directory=directory,
            verdict=GateVerdict.from_dict(gate) if isinstance(gate, dict) else None,
            setup=SetupRecord.from_json(data.get("setup")),
        )

    @staticmethod
    def stored_setup(directory: Path) -> SetupRecord | None:
        """The setup saved with the record in an item directory (results read back or seeded
        keep the setup that produced them); None when none was saved."""
        data = read_json(directory / RESULT)
        return SetupRecord.from_json(data.get("setup")) if isinstance(data, dict) else None

    def properties(self) -> list[tuple[str, Any]]:
        """The item as ``mb_*`` pytest user properties (JUnit XML, pytest-html): written for
        those readers only; modelbench itself reads :meth:`load`."""
        verdict = self.verdict
        low, high = self.ci
        values: dict[str, Any] = {
            "item": self.item_id,
            "model": self.model,
            "env": self.env,
            "variant": self.variant,
            "seed": self.seed,
        }
        if self.error is None:
            values.update(
                metric=self.metric,
                score=self.score,
                ci_low=low,
                ci_high=high,
                stderr=self.stderr,
                n=self.n,
                errors=self.errors,
                truncated=self.truncated,
                truncated_in_reasoning=self.summary.truncated_in_reasoning or 0,
                from_store=self.from_store,
                duration_s=self.summary.duration_s,
                model_path=self.model_path,
            )
        if self.setup is not None:
            values["setup"] = self.setup.describe()
        values["verdict"] = self.verdict_text
        if verdict is not None and verdict.setup_differs:
            values["setup_differs"] = verdict.setup_differs
        if verdict is not None:
            gate = {
                "baseline": verdict.baseline_value,
                "delta": verdict.delta,
                "p_value": verdict.p_value,  # none for a rule without a test: no property
                "rule": verdict.rule,
            }
            values.update((k, v) for k, v in gate.items() if v is not None)
            if verdict.stopped_at is not None:  # --mb-stop-early
                values.update(n_used=verdict.stopped_at, n_planned=verdict.planned)
        for key, value in (("recomputed", self.recompute_reason), ("error", self.error)):
            if value:
                values[key] = value
        return [
            (PROPERTY_PREFIX + k, redact(v) if isinstance(v, str) else v) for k, v in values.items()
        ]

    def _metric(self) -> MetricSummary:
        return self.summary.metric(self.metric or None) or MetricSummary()

    @property
    def score(self) -> float | None:
        """The primary metric's value."""
        value = self._metric().value
        return None if value is None else float(value)

    @property
    def ci(self) -> tuple[float | None, float | None]:
        entry = self._metric()
        return entry.ci_low, entry.ci_high

    @property
    def stderr(self) -> float | None:
        value = self._metric().stderr
        return None if value is None else float(value)

    @property
    def n(self) -> int:
        return int(self._metric().n or 0)

    @property
    def errors(self) -> int:
        return int(self.summary.errors or 0)

    @property
    def metrics(self) -> dict[str, float | None]:
        """Every metric's value by name."""
        return {name: entry.value for name, entry in (self.summary.metrics or {}).items()}

    def rows(self) -> list[dict[str, Any]]:
        """Per-example rows from ``results.jsonl`` (prompt, completion, gold, metrics, error...):
        exactly the examples the summary covers, each rollout once, whatever else the journal
        holds (a larger ``--num-examples`` of an earlier session)."""
        return ItemStore(self.directory).selected_rows(self.summary)

    def check_baseline(self) -> None:
        """Fail the calling test with the gate's one-paragraph message on a significant regression."""
        verdict = self.verdict
        if verdict is not None and not verdict.passed and not self.gate_deferred:
            import pytest

            pytest.fail(self.message, pytrace=False)

    def describe(self) -> str:
        low, high = self.ci
        ci = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        score = "n/a" if self.score is None else f"{self.score:.3f}"
        return f"{self.item_id}: {self.metric} {score}{ci} (n={self.n}, errors={self.errors})"
