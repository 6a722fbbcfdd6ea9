""":class:`EvalResult`: what a test function receives from the ``mb_eval`` fixture."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_modelbench.store.runstore import ItemStore

HOLM_PENDING = " (Holm pending)"  # suffix of a verdict --mb-correction holm decides at the end


@dataclass(frozen=True)
class EvalResult:
    """The finished evaluation of one item: scores with uncertainty and per-example rows.

    Example::

        def test_gsm8k_floor(mb_eval):
            assert mb_eval.score >= 0.3, mb_eval.describe()
    """

    item_id: str
    model: str
    env: str
    variant: str
    seed: int
    metric: str
    summary: Mapping[str, Any]
    directory: Path
    from_store: bool = False
    recompute_reason: str | None = None
    endpoint_checked: bool = True  # False: read from the store, the endpoint's identity unknown
    verdict: Any = field(default=None, compare=False)  # a gates.GateVerdict once gated
    gate_deferred: bool = False  # --mb-correction holm: decided at session end

    @property
    def verdict_text(self) -> str:
        """The gate's status as reports show it (``pass``, ``fail``, ``no baseline``), with
        :data:`HOLM_PENDING` while ``--mb-correction holm`` has yet to decide it."""
        status = str(self.verdict.status) if self.verdict is not None else "no baseline"
        return f"{status}{HOLM_PENDING}" if self.gate_deferred else status

    def _metric(self, name: str | None = None) -> Mapping[str, Any]:
        metrics: Mapping[str, Any] = self.summary.get("metrics", {})
        entry: Mapping[str, Any] = metrics.get(name or self.metric, {})
        return entry

    @property
    def score(self) -> float | None:
        """The primary metric's value."""
        value = self._metric().get("value")
        return None if value is None else float(value)

    @property
    def ci(self) -> tuple[float | None, float | None]:
        entry = self._metric()
        return entry.get("ci_low"), entry.get("ci_high")

    @property
    def stderr(self) -> float | None:
        value = self._metric().get("stderr")
        return None if value is None else float(value)

    @property
    def n(self) -> int:
        return int(self._metric().get("n") or 0)

    @property
    def errors(self) -> int:
        return int(self.summary.get("errors", 0))

    @property
    def metrics(self) -> dict[str, float | None]:
        """Every metric's value by name."""
        return {name: entry.get("value") for name, entry in self.summary.get("metrics", {}).items()}

    def rows(self) -> list[dict[str, Any]]:
        """Per-example rows from ``results.jsonl`` (prompt, completion, gold, metrics, error...)."""
        return list(ItemStore(self.directory).journal.read().values())

    def check_baseline(self) -> None:
        """Fail the calling test with the gate's one-paragraph message on a significant regression."""
        verdict = self.verdict
        if verdict is not None and not verdict.passed and not self.gate_deferred:
            import pytest

            pytest.fail(verdict.message, pytrace=False)

    def describe(self) -> str:
        low, high = self.ci
        ci = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        score = "n/a" if self.score is None else f"{self.score:.3f}"
        return f"{self.item_id}: {self.metric} {score}{ci} (n={self.n}, errors={self.errors})"
