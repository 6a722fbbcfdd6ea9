"""The records modelbench persists or sends from workers, each defined once, field by field.

Every record has its own schema version, written with it. Files on disk:
``results.jsonl`` (one :class:`JournalRow` per example and rollout),
``summary.json`` (:class:`ItemSummary`), ``metadata.json`` (:class:`ItemMetadata`)
and the entries of ``run_manifest.json`` (:class:`ManifestEntry`). An item's one
record, ``result.json`` (identity, summary, verdict), is ``store.result.EvalResult``.
Journal rows and summaries stay plain dicts at run time (typed as ``TypedDict``),
since rows are written once per request and summaries are what tests receive.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, TypedDict

JOURNAL_ROW_VERSION = 1  # the "v" field of every journal row
SUMMARY_VERSION = 1
# summary.json fields of --mb-stop-early (gating.early decides, backends write, reuse reads)
STOPPED = "stopped_early"  # the record of an item stopped once its verdict was certain
RULE_USED = "stop_rule"  # the key of the rule that read an item while it ran
METADATA_VERSION = 1
MANIFEST_VERSION = 1
PROPERTY_PREFIX = "mb_"


class TextEnum(str, Enum):
    """An enum whose members are their text: written to files and shown as their value
    (``enum.StrEnum`` from Python 3.11; this works on 3.10 too)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class ItemStatus(TextEnum):
    """Where an item stands in the run store (its manifest entry's and summary's ``status``)."""

    RUNNING = "running"  # begun; its journal is being written
    FINISHED = "finished"  # summarised: its results stand
    ERROR = "error"  # stopped by an error (or over its error budget)
    INTERRUPTED = "interrupted"  # stopped mid-way (Ctrl-C, a timeout, a killed session)

    @classmethod
    def of(cls, value: Any) -> ItemStatus | None:
        """The status a file holds, or None (absent or unknown)."""
        try:
            return cls(value)
        except ValueError:
            return None


class JournalRow(TypedDict, total=False):
    """One line of ``results.jsonl``: one example (and rollout) as requested, answered and scored.

    The last row for an (``example_id``, ``rollout``) key wins; a row with an ``error``
    is retried by the next run.
    """

    v: int  # JOURNAL_ROW_VERSION
    example_id: str  # the example's id in its data set
    rollout: int  # 0-based rollout of this example (rollouts_per_example > 1)
    prompt: str  # the prompt as text (the last user message for chat)
    gold: Any  # the reference answer
    completion: str | None  # the model's answer (thinking removed); None when the request failed
    reasoning: str  # the model's thinking (reasoning field or <think> block); absent if none
    reasoning_tokens: int  # usage.completion_tokens_details.reasoning_tokens; absent if not sent
    system_fingerprint: str  # the response's system_fingerprint (the build); absent if not sent
    finish_reason: str | None  # as the server reported it ("stop", "length": out of tokens)
    extracted: Any  # what the scorer extracted from the completion (an option letter, a number)
    metrics: dict[str, float]  # metric name -> value for this example
    score: float | None  # the primary metric's value
    tokens: dict[str, int | None]  # {"prompt": n, "completion": n}
    latency_s: float | None  # request latency, seconds
    attempts: int  # requests made for this row (1 + retries)
    error: str | None  # why this example has no score (request or scorer failure)
    detail: dict[str, Any]  # backend-specific extras (per-test results of code suites ...)


class MetricSummary(TypedDict, total=False):
    """One metric of an item with its uncertainty."""

    value: float | None  # the mean over scored examples (rollouts included)
    stderr: float | None  # standard error (cluster-robust over rollouts)
    ci_low: float | None  # 95% interval (Wilson for 0/1 scores, else t)
    ci_high: float | None
    n: int  # scored units
    examples: int  # distinct examples behind ``n``
    ci_method: str  # how the interval was computed


class ItemSummary(TypedDict, total=False):
    """``summary.json``: what one item scored, written when the item finishes."""

    schema_version: int  # SUMMARY_VERSION
    item_id: str
    fingerprint: str  # digest of everything that produced the results (planning/fingerprint.py)
    primary_metric: str  # the metric gates and reports use
    status: str  # "finished", or "error" when more examples failed than the error budget allows
    metrics: dict[str, MetricSummary]
    n_rows: int  # journal rows summarised (the last per example and rollout)
    n_scored: int  # rows with a score
    expected: int  # units the item should have (examples x rollouts)
    errors: int  # units without a score after retries
    error_rate: float  # errors / expected
    retries: int  # retried requests
    truncated: int  # answered units cut off by the token budget (finish_reason "length")
    truncated_in_reasoning: int  # of ``truncated``: cut off while thinking, no answer yet
    tokens: dict[str, int]  # {"prompt": n, "completion": n, "reasoning": n (where reported)}
    latency_s: dict[str, float | None]  # mean, p50, p95
    resumed_examples: int  # units taken from the journal instead of requested again
    duration_s: float  # wall time for the whole item (scaled up when part was resumed)
    wall_s: float  # this session's wall time
    duration_estimated: bool  # duration_s was scaled from a partial run
    finished_at: str  # local time, ISO 8601
    num_examples: int  # the --num-examples cap the summary covers (-1 = all)


@dataclass(frozen=True)
class ItemMetadata:
    """``metadata.json``: the resolved configuration of an item (never a secret) and its
    fingerprint, written before the first request so a later run can tell what changed."""

    item_id: str
    fingerprint: str  # digest of ``fingerprint_parts``
    fingerprint_parts: dict[str, Any]  # what changes results: model, sampling, data, seed...
    model: dict[str, Any]  # the model's name and its models.yaml entry (key names, not keys)
    variant: dict[str, Any]  # env, id, module, env_args, source file
    seed: int
    num_examples: int  # -1 = all
    versions: dict[str, str]  # python and package versions that produced the results

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": METADATA_VERSION, **asdict(self)}


@dataclass(frozen=True)
class ManifestEntry:
    """An item's entry in ``run_manifest.json`` (merged into what is there, under a lock)."""

    status: ItemStatus
    fingerprint: str | None
    model: str
    env: str
    variant: str
    seed: int
    score: float | None = None  # the primary metric's value, once finished
    duration_s: float | None = None
    errors: int | None = None
    resumed_examples: int | None = None
    host: str | None = None  # where it ran (multi-node runs)
    error: str | None = None  # why the item stopped, when status is "error"
    seeded_from: str | None = None  # --restart: the run whose finished item was taken
    seeded_from_path: str | None = None

    @classmethod
    def running(cls, metadata: ItemMetadata) -> ManifestEntry:
        variant = metadata.variant
        return cls(
            status=ItemStatus.RUNNING,
            fingerprint=metadata.fingerprint,
            model=str(metadata.model.get("name")),
            env=str(variant.get("env")),
            variant=str(variant.get("id")),
            seed=metadata.seed,
            host=platform.node(),
        )

    @classmethod
    def of_summary(
        cls, summary: Mapping[str, Any], *, model: str, env: str, variant: str, seed: int
    ) -> ManifestEntry:
        """The entry of a finished (or over-budget) item with this summary."""
        metric = summary.get("primary_metric")
        return cls(
            status=ItemStatus.of(summary.get("status")) or ItemStatus.ERROR,
            fingerprint=summary.get("fingerprint"),
            model=model,
            env=env,
            variant=variant,
            seed=seed,
            score=summary.get("metrics", {}).get(metric, {}).get("value"),
            duration_s=summary.get("duration_s"),
            errors=summary.get("errors"),
            resumed_examples=summary.get("resumed_examples"),
        )

    def fields(self) -> dict[str, Any]:
        """The fields to merge into the manifest (unset optional fields are left as they are)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k in _ALWAYS}

    def differs_from(self, entry: Mapping[str, Any]) -> bool:
        """Whether a manifest entry disagrees with this one on what decides reuse."""
        return any(entry.get(k) != getattr(self, k) for k in ("status", "fingerprint", "score"))


_ALWAYS = frozenset({"fingerprint", "score"})
