"""The records modelbench persists or sends from workers, each defined once, field by field.

Every record has its own schema version, written with it. Files on disk:
``results.jsonl`` (one :class:`JournalRow` per example and rollout),
``summary.json`` (``store.summary.ItemSummary``), ``metadata.json`` (:class:`ItemMetadata`)
and the entries of ``run_manifest.json`` (:class:`ManifestEntry`). An item's one
record, ``result.json`` (identity, summary, verdict), is ``store.result.EvalResult``.
Journal rows stay plain dicts at run time (typed as ``TypedDict``), since rows are
written once per request.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from pytest_modelbench.store.summary import ItemSummary

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
        cls, summary: ItemSummary, *, model: str, env: str, variant: str, seed: int
    ) -> ManifestEntry:
        """The entry of a finished (or over-budget) item with this summary."""
        metric = summary.metric()
        return cls(
            status=summary.status or ItemStatus.ERROR,
            fingerprint=summary.fingerprint,
            model=model,
            env=env,
            variant=variant,
            seed=seed,
            score=metric.value if metric is not None else None,
            duration_s=summary.duration_s,
            errors=summary.errors,
            resumed_examples=summary.resumed_examples,
        )

    def fields(self) -> dict[str, Any]:
        """The fields to merge into the manifest (unset optional fields are left as they are)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k in _ALWAYS}

    def differs_from(self, entry: Mapping[str, Any]) -> bool:
        """Whether a manifest entry disagrees with this one on what decides reuse."""
        return any(entry.get(k) != getattr(self, k) for k in ("status", "fingerprint", "score"))


_ALWAYS = frozenset({"fingerprint", "score"})
