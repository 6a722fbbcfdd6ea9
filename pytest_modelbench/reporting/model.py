"""What every report is drawn from: a run's items (:class:`ItemRecord`) as one :class:`RunData`.

Everything comes from the run store: the manifest, each item's ``summary.json`` and its
saved record (``result.json``: the verdict), so ``modelbench report RUN`` rebuilds the
same reports without pytest. A session passes its records and their pytest outcomes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pytest_modelbench.names import checkpoint_of, safe_component
from pytest_modelbench.store.records import ItemStatus
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runlog import RunItem, read_run, run_status
from pytest_modelbench.store.setup import SetupRecord
from pytest_modelbench.store.summary import ItemSummary, MetricSummary
from pytest_modelbench.store.verdict import Verdict

LEADERBOARD_JSON = "leaderboard.json"


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None  # NaN -> None


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class ItemRecord:
    """One model x variant x seed item as the reports show it."""

    item_id: str
    model: str
    env: str
    variant: str
    seed: int
    metric: str = ""
    score: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    stderr: float | None = None
    n: int = 0
    errors: int = 0
    truncated: int = 0  # replies cut off by max_tokens (finish_reason length)
    truncated_in_reasoning: int = 0  # of those, cut off before any answer
    sandbox: str = ""  # code suites: how generated code was isolated (bwrap, namespaces, ...)
    baseline: float | None = None
    delta: float | None = None
    p_value: float | None = None
    verdict: Verdict | None = None  # None: not gated
    holm_pending: bool = False  # --mb-correction holm has yet to decide the verdict
    rule: str | None = None
    message: str = ""  # the gate's paragraph, or the error that stopped the item
    duration_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    from_store: bool = False
    outcome: str = ""  # pytest outcome of this session ("" when read from the store only)
    status: ItemStatus | None = None  # run store status: finished | running | error ...
    module: str = ""
    fingerprint: str = ""
    path: str = ""  # item directory name inside the run directory
    gate: Mapping[str, Any] | None = field(default=None, compare=False)
    setup: SetupRecord | None = field(default=None, compare=False)  # what produced the scores

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def checkpoint(self) -> tuple[str, int] | None:
        """``(family, step)`` for checkpoint-sweep models named ``<name>-step<N>``."""
        return checkpoint_of(self.model)

    @property
    def failed(self) -> bool:
        return (self.verdict is not None and self.verdict.failed) or self.outcome == "failed"

    @property
    def verdict_text(self) -> str:
        """The verdict as reports show it (``fail (Holm pending)``; "" when not gated)."""
        return self.verdict.text(self.holm_pending) if self.verdict is not None else ""

    @property
    def shown(self) -> str:
        """The verdict column: the verdict, else the item's status, else ``-``."""
        return self.verdict_text or (self.status.value if self.status else "") or "-"

    def as_dict(self) -> dict[str, Any]:
        """``leaderboard.json``'s item: the verdict and status as the text reports show."""
        data = asdict(self)
        del data["holm_pending"]
        data["verdict"] = self.verdict_text
        data["status"] = self.status.value if self.status is not None else ""
        data["gate"] = dict(self.gate) if self.gate is not None else None
        data["setup"] = self.setup.to_json() if self.setup is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ItemRecord:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        setup = data.get("setup")  # a record, or its JSON form (leaderboard.json)
        values["setup"] = setup if isinstance(setup, SetupRecord) else SetupRecord.from_json(setup)
        values["status"] = ItemStatus.of(values.get("status"))
        return cls(**values)


def _sandbox_text(sandbox: Any) -> str:
    """``namespaces`` / ``bwrap``, or ``audit-hook (not isolated)``, from ``summary.json``."""
    if not isinstance(sandbox, Mapping) or not sandbox.get("isolation"):
        return ""
    level = str(sandbox["isolation"])
    return level if sandbox.get("full") else f"{level} (not isolated)"


def _summary_fields(summary: ItemSummary | None, metric: str) -> dict[str, Any]:
    """Score, CI, n, tokens, duration from an item's ``summary.json``."""
    if not summary:
        return {}
    metric = metric or str(summary.primary_metric or "")
    entry = summary.metric(metric) or MetricSummary()
    tokens = summary.tokens or {}
    return {
        "metric": metric,
        "score": _float(entry.value),
        "ci_low": _float(entry.ci_low),
        "ci_high": _float(entry.ci_high),
        "stderr": _float(entry.stderr),
        "n": _int(entry.n),
        "errors": _int(summary.errors),
        "truncated": _int(summary.truncated),
        "truncated_in_reasoning": _int(summary.truncated_in_reasoning),
        "sandbox": _sandbox_text(summary.sandbox),
        "duration_s": _float(summary.duration_s),
        "prompt_tokens": _int(tokens.get("prompt")),
        "completion_tokens": _int(tokens.get("completion")),
        "fingerprint": str(summary.fingerprint or ""),
    }


def _result_fields(result: EvalResult, outcome: str) -> dict[str, Any]:
    """Fields of the item's saved record (``result.json``): verdict, baseline, message."""
    gate = result.verdict
    out: dict[str, Any] = {
        "verdict": result.status,
        "holm_pending": result.gate_deferred,
        "baseline": gate.baseline_value if gate is not None else None,
        "delta": gate.delta if gate is not None else None,
        "p_value": gate.p_value if gate is not None else None,
        "rule": gate.rule if gate is not None else None,
        "gate": gate.as_dict() if gate is not None else None,
        "message": result.message,
        "from_store": result.from_store,
        "outcome": outcome,
        "setup": result.setup,
    }
    return out


def build_item(run_item: RunItem, outcome: str = "") -> ItemRecord:
    """One item of :func:`read_run` as the reports show it: the manifest entry, summary and
    metadata with the item's saved record."""
    entry, metadata, result = run_item.entry, run_item.metadata or {}, run_item.result
    variant_meta = metadata.get("variant") or {}
    model_meta = metadata.get("model") or {}
    data: dict[str, Any] = {
        "item_id": run_item.item_id,
        "model": result.model
        if result
        else str(entry.get("model") or model_meta.get("name") or ""),
        "env": result.env if result else str(entry.get("env") or variant_meta.get("env") or ""),
        "variant": result.variant
        if result
        else str(entry.get("variant") or variant_meta.get("id") or ""),
        "seed": result.seed if result else _int(entry.get("seed", metadata.get("seed"))),
        "module": str(variant_meta.get("module") or ""),
        "path": run_item.path,
    }
    data.update(_summary_fields(run_item.summary, result.metric if result else ""))
    data["status"] = run_item.status
    if result is not None and run_item.current:
        data.update(_result_fields(result, outcome))
    elif run_item.verdict is Verdict.ERROR:
        data.update(verdict=Verdict.ERROR, message=str(entry["error"]))
    data["message"] = str(data.get("message") or "")
    return ItemRecord.from_dict(data)


@dataclass(frozen=True)
class RunData:
    """A run directory's items, ready for reports."""

    run_id: str
    directory: Path
    items: tuple[ItemRecord, ...]
    manifest: Mapping[str, Any] = field(default_factory=dict)
    generated_at: str = ""

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(item.model for item in self.items))

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(item.variant for item in self.items))

    def item_dir(self, item: ItemRecord) -> Path:
        return self.directory / (item.path or safe_component(item.item_id))

    def status(self) -> str:
        """``finished`` | ``failed`` (an item failed its gate or errored) | ``incomplete``:
        :func:`~pytest_modelbench.store.runlog.run_status`'s word for reports."""
        return run_status((item.status, item.failed) for item in self.items).report_word


def load_run(
    directory: Path,
    records: Sequence[EvalResult] | None = None,
    *,
    outcomes: Mapping[str, str] | None = None,
    only_records: bool = False,
) -> RunData:
    """The run's items (:func:`read_run`) as the reports show them; this session's
    ``records`` (with their pytest ``outcomes``) are used as they are.

    ``only_records`` keeps just the session's items (the pytest-html report
    describes the session, the run directory's reports the whole run).
    """
    run = read_run(directory, records, only_records=only_records)
    items = [build_item(item, (outcomes or {}).get(item.item_id, "")) for item in run.items]
    return RunData(
        run_id=run.run_id,
        directory=directory,
        items=tuple(items),
        manifest=run.manifest,
        generated_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
