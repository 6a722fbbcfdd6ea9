"""What every report is drawn from: a run's items (:class:`ItemRecord`) as one :class:`RunData`.

Everything comes from the run store: the manifest, each item's ``summary.json`` and its
saved record (``result.json``: the verdict), so ``modelbench report RUN`` rebuilds the
same reports without pytest. A session passes its records and their pytest outcomes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pytest_modelbench.names import checkpoint_of, safe_component
from pytest_modelbench.store.files import read_json
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runstore import MANIFEST, RunStore
from pytest_modelbench.store.setup import SetupRecord

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
    verdict: str = ""
    rule: str | None = None
    message: str = ""  # the gate's paragraph, or the error that stopped the item
    duration_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    from_store: bool = False
    outcome: str = ""  # pytest outcome of this session ("" when read from the store only)
    status: str = ""  # run store status: finished | running | error
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
        return self.verdict.startswith(("fail", "error")) or self.outcome == "failed"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gate"] = dict(self.gate) if self.gate is not None else None
        data["setup"] = self.setup.to_json() if self.setup is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ItemRecord:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        setup = data.get("setup")  # a record, or its JSON form (leaderboard.json)
        values["setup"] = setup if isinstance(setup, SetupRecord) else SetupRecord.from_json(setup)
        return cls(**values)


def _sandbox_text(sandbox: Any) -> str:
    """``namespaces`` / ``bwrap``, or ``audit-hook (not isolated)``, from ``summary.json``."""
    if not isinstance(sandbox, Mapping) or not sandbox.get("isolation"):
        return ""
    level = str(sandbox["isolation"])
    return level if sandbox.get("full") else f"{level} (not isolated)"


def _summary_fields(summary: Mapping[str, Any] | None, metric: str) -> dict[str, Any]:
    """Score, CI, n, tokens, duration from an item's ``summary.json``."""
    if not summary:
        return {}
    metric = metric or str(summary.get("primary_metric") or "")
    entry = (summary.get("metrics") or {}).get(metric) or {}
    tokens = summary.get("tokens") or {}
    return {
        "metric": metric,
        "score": _float(entry.get("value")),
        "ci_low": _float(entry.get("ci_low")),
        "ci_high": _float(entry.get("ci_high")),
        "stderr": _float(entry.get("stderr")),
        "n": _int(entry.get("n")),
        "errors": _int(summary.get("errors")),
        "truncated": _int(summary.get("truncated")),
        "truncated_in_reasoning": _int(summary.get("truncated_in_reasoning")),
        "sandbox": _sandbox_text(summary.get("sandbox")),
        "duration_s": _float(summary.get("duration_s")),
        "prompt_tokens": _int(tokens.get("prompt")),
        "completion_tokens": _int(tokens.get("completion")),
        "fingerprint": str(summary.get("fingerprint") or ""),
        "status": str(summary.get("status") or ""),
    }


def _result_fields(result: EvalResult, outcome: str) -> dict[str, Any]:
    """Fields of the item's saved record (``result.json``): verdict, baseline, message."""
    gate = result.verdict
    out: dict[str, Any] = {
        "verdict": result.verdict_text,
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


def build_item(
    item_id: str,
    entry: Mapping[str, Any],
    summary: Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None,
    result: EvalResult | None = None,
    outcome: str = "",
) -> ItemRecord:
    """Merge the manifest entry, summary and metadata with the item's saved record."""
    variant_meta = (metadata or {}).get("variant") or {}
    model_meta = (metadata or {}).get("model") or {}
    data: dict[str, Any] = {
        "item_id": item_id,
        "model": result.model
        if result
        else str(entry.get("model") or model_meta.get("name") or ""),
        "env": result.env if result else str(entry.get("env") or variant_meta.get("env") or ""),
        "variant": result.variant
        if result
        else str(entry.get("variant") or variant_meta.get("id") or ""),
        "seed": result.seed if result else _int(entry.get("seed", (metadata or {}).get("seed"))),
        "module": str(variant_meta.get("module") or ""),
        "status": str(entry.get("status") or ""),
        "path": str(entry.get("path") or safe_component(item_id)),
    }
    data.update(_summary_fields(summary, result.metric if result else ""))
    if not data.get("status"):
        data["status"] = str(entry.get("status") or "")
    current = result is not None and (
        result.error is not None or result.summary.get("fingerprint") == data.get("fingerprint")
    )
    if result is not None and current:
        data.update(_result_fields(result, outcome))
    elif entry.get("status") == "error" and entry.get("error"):
        data.update(verdict="error", message=str(entry["error"]))
    data["verdict"] = str(data.get("verdict") or "")
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
        """``finished`` | ``failed`` (an item failed its gate or errored) | ``incomplete``."""
        statuses = [item.status for item in self.items]
        if any(s == "running" for s in statuses) or not self.items:
            return "incomplete"
        if any(item.failed or item.status == "error" for item in self.items):
            return "failed"
        return "finished"


class RunNotFound(Exception):
    """The named run directory does not exist or is not a run (message says which and why)."""


def resolve_run(name: str, runs_dir: Path) -> Path:
    """A run given as a directory path, a run id under ``runs_dir``, or ``latest``."""
    candidates = [Path(name), runs_dir / name]
    if name == "latest":
        runs = list_runs(runs_dir)
        if not runs:
            raise RunNotFound(f"latest: no runs under {runs_dir} (pass --run-dir DIR)")
        return runs[-1]
    for path in candidates:
        if (path / MANIFEST).is_file():
            return path
    shown = ", ".join(p.name for p in list_runs(runs_dir)[-5:]) or "none"
    raise RunNotFound(
        f"{name}: not a run directory (no {MANIFEST} in {candidates[0]} or {candidates[1]}); "
        f"recent runs in {runs_dir}: {shown} (list them with 'modelbench runs')"
    )


def list_runs(runs_dir: Path) -> list[Path]:
    """Run directories under ``runs_dir``, oldest first (by manifest ``created_at``)."""
    if not runs_dir.is_dir():
        return []
    found: list[tuple[str, str, Path]] = []
    for manifest in runs_dir.glob(f"*/{MANIFEST}"):
        data = read_json(manifest) or {}
        found.append((str(data.get("created_at", "")), manifest.parent.name, manifest.parent))
    return [path for _, _, path in sorted(found)]


def load_run(
    directory: Path,
    records: Sequence[EvalResult] | None = None,
    *,
    outcomes: Mapping[str, str] | None = None,
    only_records: bool = False,
) -> RunData:
    """The run's items: the manifest's, each with its saved record (``result.json``); this
    session's ``records`` (with their pytest ``outcomes``) are used as they are.

    ``only_records`` keeps just the session's items (the pytest-html report
    describes the session, the run directory's reports the whole run).
    """
    store = RunStore(directory)
    manifest = store.read_manifest()
    entries: Mapping[str, Any] = manifest.get("items") or {}
    by_record = {r.item_id: r for r in records or []}
    ids: Iterable[str] = by_record if only_records else dict.fromkeys([*entries, *by_record])
    items = []
    for item_id in ids:
        item_store = store.item(item_id)
        result = by_record.get(item_id) or EvalResult.load(item_store.directory)
        items.append(
            build_item(
                item_id,
                entries.get(item_id) or {},
                result.summary
                if result is not None and result.summary
                else item_store.read_summary(),
                item_store.read_metadata(),
                result,
                (outcomes or {}).get(item_id, ""),
            )
        )
    return RunData(
        run_id=directory.name,
        directory=directory,
        items=tuple(items),
        manifest=manifest,
        generated_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
