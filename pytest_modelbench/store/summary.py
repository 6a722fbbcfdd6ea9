"""``summary.json``: what one item scored, as a typed record.

:func:`~pytest_modelbench.running.summary.summarise_rows` makes an :class:`ItemSummary`, the
evaluator adds the item's identity and timings, the store writes it
(:meth:`ItemSummary.to_json`) and every reader gets it back (:meth:`ItemSummary.from_json`)
on :class:`~pytest_modelbench.store.result.EvalResult` and
:class:`~pytest_modelbench.store.runlog.RunItem`; the package reads its attributes. A field
absent from the file is ``None`` and stays absent when written again; keys the record does
not know (a backend's own fields, a third-party metric's extras) are kept in ``extra`` and
written back as they were, so the file round-trips byte for byte.

It also reads as a read-only ``Mapping`` of its JSON (``summary["metrics"]``, ``.get``,
``in``, ``items()``): ``mb_eval.summary`` has always handed tests the ``summary.json``
object, and tests that read it keep working; ``.copy()`` or ``to_json()`` gives a plain dict
(for ``json.dumps`` or changing it). The ``pytest_modelbench_item_finished`` hook gets that
plain dict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

from pytest_modelbench.store.journal import Key
from pytest_modelbench.store.records import SUMMARY_VERSION, ItemStatus


def _typed(name: str, value: Any) -> Any:
    """``value`` as field ``name`` holds it, or None when it is not of that field's shape
    (the file's value is then kept as it is, in ``extra``)."""
    if value is None:
        return None
    if name == "status":
        return value if isinstance(value, ItemStatus) else ItemStatus.of(value)
    if name == "metrics":
        return _metrics(value)
    if name == "system_fingerprints":
        return tuple(value) if isinstance(value, (list, tuple)) else None
    return value


@cache
def _known(cls: type) -> tuple[str, ...]:
    """The record's fields written to the file, in order (``extra`` and the like are not)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("json", True))


@dataclass(frozen=True)
class MetricSummary(Mapping[str, Any]):
    """One metric of an item with its uncertainty (an entry of ``metrics``)."""

    value: float | None = None  # the mean over scored examples (rollouts included)
    stderr: float | None = None  # standard error (cluster-robust over rollouts)
    ci_low: float | None = None  # 95% interval (Wilson for 0/1 scores, else t)
    ci_high: float | None = None
    n: int | None = None  # scored units
    examples: int | None = None  # distinct examples behind ``n``
    ci_method: str | None = None  # how the interval was computed
    extra: Mapping[str, Any] = field(default_factory=dict, metadata={"json": False})
    # the known keys the entry has (a metric's value may be null); None: those not None
    present: frozenset[str] | None = field(
        default=None, compare=False, repr=False, metadata={"json": False}
    )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetricSummary:
        known = _known(cls)
        return cls(
            **{k: data[k] for k in known if k in data},
            extra={k: v for k, v in data.items() if k not in known},
            present=frozenset(k for k in known if k in data),
        )

    @classmethod
    def of(cls, **values: Any) -> MetricSummary:
        """An entry with exactly these keys (known ones typed, others kept as extras)."""
        return cls.from_json(values)

    def to_json(self) -> dict[str, Any]:
        present = self.present
        data = {
            k: getattr(self, k)
            for k in _known(type(self))
            if (k in present if present is not None else getattr(self, k) is not None)
        }
        return {**data, **self.extra}

    @cached_property
    def _json(self) -> dict[str, Any]:
        return self.to_json()

    def __getitem__(self, key: str) -> Any:
        return self._json[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)

    def __eq__(self, other: object) -> bool:
        """Equal to a record or a mapping with the same JSON."""
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._json == (other._json if isinstance(other, type(self)) else dict(other))

    __hash__ = None  # type: ignore[assignment]  # a mapping: not hashable


def _metrics(values: Any) -> dict[str, MetricSummary] | None:
    """The metric entries that are objects, typed; None when ``metrics`` is not an object.
    An entry that is not an object (a backend's bare number, an alias) is kept as written,
    beside them (:func:`_other_metrics`)."""
    if not isinstance(values, Mapping):
        return None
    return {
        str(name): m if isinstance(m, MetricSummary) else MetricSummary.from_json(m)
        for name, m in values.items()
        if isinstance(m, Mapping)
    }


def _other_metrics(values: Any) -> dict[str, Any]:
    """The entries of ``metrics`` that are not objects, as written."""
    if not isinstance(values, Mapping):
        return {}
    return {str(name): m for name, m in values.items() if not isinstance(m, Mapping)}


@dataclass(frozen=True)
class ItemSummary(Mapping[str, Any]):
    """``summary.json``: what one item scored, written when the item finishes. A field is
    ``None`` when the file does not have it (an older release, a backend's own summary)."""

    schema_version: int | None = SUMMARY_VERSION
    item_id: str | None = None
    fingerprint: str | None = None  # digest of what produced the results (planning/fingerprint.py)
    primary_metric: str | None = None  # the metric gates and reports use
    status: ItemStatus | None = None  # finished; error when over the error budget
    metrics: Mapping[str, MetricSummary] | None = None  # metric name -> its summary
    n_rows: int | None = None  # journal rows summarised (the last per example and rollout)
    n_scored: int | None = None  # rows with a score
    expected: int | None = None  # units the item should have (examples x rollouts)
    errors: int | None = None  # units without a score after retries
    error_rate: float | None = None  # errors / expected
    retries: int | None = None  # retried requests
    truncated: int | None = None  # answered units cut off by the token budget ("length")
    truncated_in_reasoning: int | None = None  # of ``truncated``: still thinking, no answer
    empty_answers: int | None = None  # replies that ended ("stop") with no answer
    answers_in_reasoning: int | None = None  # of ``empty_answers``: with thinking
    reasoning_replies: int | None = None  # replies that came with thinking
    tokens: Mapping[str, int] | None = None  # prompt, completion, reasoning (where reported)
    latency_s: Mapping[str, float | None] | None = None  # mean, p50, p95
    system_fingerprints: tuple[str, ...] | None = None  # the endpoint's builds (setup record)
    resumed_examples: int | None = None  # units taken from the journal, not requested again
    duration_s: float | None = None  # wall time for the whole item (scaled when resumed)
    wall_s: float | None = None  # this session's wall time
    server_s: float | None = None  # the item's work on one server (the duration memory)
    duration_estimated: bool | None = None  # duration_s was scaled from a partial run
    finished_at: str | None = None  # local time, ISO 8601
    num_examples: int | None = None  # the --num-examples cap the summary covers (-1 = all)
    stopped_early: Mapping[str, Any] | None = None  # --mb-stop-early: the decision's record
    stop_rule: str | None = None  # --mb-stop-early: the key of the rule that read the item
    sandbox: Mapping[str, Any] | None = None  # code suites: the isolation the tests ran under
    extra: Mapping[str, Any] = field(default_factory=dict, metadata={"json": False})
    # entries of ``metrics`` that are not objects (a bare number, an alias), kept as written
    other_metrics: Mapping[str, Any] = field(
        default_factory=dict, compare=False, repr=False, metadata={"json": False}
    )
    # the (example, rollout) keys summarised, kept beside the summary (selection.json)
    selected: tuple[Key, ...] | None = field(
        default=None, compare=False, repr=False, metadata={"json": False}
    )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ItemSummary:
        """The record of a ``summary.json`` object (keys it does not know go to ``extra``)."""
        if isinstance(data, ItemSummary):
            return data
        known = _known(cls)
        values = {k: data[k] for k in known if data.get(k) is not None}
        extra = {k: v for k, v in data.items() if k not in known}
        for k in known:  # a null the file holds is kept as it is
            if k in data and data[k] is None:
                extra[k] = None
        if "schema_version" not in data:
            values["schema_version"] = None
        return cls(extra=extra).with_fields(**values)

    def to_json(self) -> dict[str, Any]:
        """The ``summary.json`` object (without the selected keys, kept beside it)."""
        data: dict[str, Any] = {}
        for name in _known(type(self)):
            value = getattr(self, name)
            if value is None:
                continue
            if name == "status":
                value = value.value
            elif name == "metrics":
                value = {**{k: m.to_json() for k, m in value.items()}, **self.other_metrics}
            elif name == "system_fingerprints":
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            data[name] = value
        return {**data, **self.extra}

    def with_fields(self, **fields: Any) -> ItemSummary:
        """This summary with more fields: known ones set, others added to ``extra``."""
        known = set(_known(type(self)))
        extra = {k: v for k, v in self.extra.items() if k not in fields}
        values: dict[str, Any] = {}
        if "metrics" in fields:
            values["other_metrics"] = _other_metrics(fields["metrics"])
        for name, value in fields.items():
            typed = _typed(name, value) if name in known else None
            if typed is None and value is not None:  # unknown, or not of the known shape
                extra[name] = value
            values[name] = typed
        values = {k: v for k, v in values.items() if k in known or k == "other_metrics"}
        return dataclasses.replace(self, **values, extra=extra)

    # -- what readers ask -------------------------------------------------------------------
    def metric(self, name: str | None = None) -> MetricSummary | None:
        """The summary of metric ``name`` (default: the primary metric), or None."""
        name = name or self.primary_metric
        return (self.metrics or {}).get(name) if name else None

    def value(self, name: str | None = None) -> float | None:
        """Metric ``name``'s value (default: the primary metric's), or None."""
        entry = self.metric(name)
        return None if entry is None or entry.value is None else float(entry.value)

    @property
    def finished(self) -> bool:
        return self.status is ItemStatus.FINISHED

    @property
    def replies(self) -> int:
        """Scored replies (else summarised rows): what the truncation notes count against."""
        return int(self.n_scored or self.n_rows or 0)

    # -- read as the summary.json object ----------------------------------------------------
    @cached_property
    def _json(self) -> dict[str, Any]:
        return self.to_json()

    def __getitem__(self, key: str) -> Any:
        return self._json[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)

    def __eq__(self, other: object) -> bool:
        """Equal to a record or a mapping with the same JSON."""
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._json == (other._json if isinstance(other, type(self)) else dict(other))

    __hash__ = None  # type: ignore[assignment]  # a mapping: not hashable

    def __bool__(self) -> bool:
        return bool(self._json)

    def copy(self) -> dict[str, Any]:
        """The ``summary.json`` object as a new plain dict (``json.dumps`` takes it)."""
        return self.to_json()


EMPTY = ItemSummary(schema_version=None)  # an item with no summary (it failed before one)

__all__ = ["EMPTY", "ItemSummary", "MetricSummary"]
