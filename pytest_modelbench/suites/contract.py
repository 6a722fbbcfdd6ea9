"""The contract between benchmark suites and the runner.

A *suite* turns its data into :class:`Example` prompts and scores completions.
The runner (``runner.py``) owns concurrency, retries and the journal; a suite
never does I/O against a model. Suites are plain classes that satisfy
:class:`Suite`; built-in ones are registered in ``pytest_modelbench.suites``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pytest_modelbench.errors import EvaluationError

JSON = Any  # a JSON-serialisable value

Message = Mapping[str, str]  # {"role": "user", "content": "..."}


@dataclass(frozen=True)
class Example:
    """One prompt of a benchmark, with everything needed to score it.

    ``id`` is stable across runs (it keys the journal for resume); ``gold`` is
    the JSON-serialisable reference the scorer needs; ``messages`` is the chat
    prompt, ``prompt`` the same as plain text for completion endpoints.
    """

    id: str
    messages: tuple[Message, ...]
    gold: JSON
    prompt: str = ""
    meta: Mapping[str, JSON] = field(default_factory=dict)

    @property
    def last_user_text(self) -> str:
        """The text of the last user message (what lookup-based simulators key on)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return message.get("content", "")
        return self.prompt


@dataclass(frozen=True)
class Score:
    """The scorer's verdict on one completion.

    ``metrics`` maps metric name to a float (0/1 for correctness metrics);
    ``extracted`` is the answer the scorer read out of the completion (for
    reports), ``detail`` any extra JSON the scorer wants kept (sandbox status,
    stderr tail...).
    """

    metrics: Mapping[str, float]
    extracted: JSON = None
    detail: Mapping[str, JSON] = field(default_factory=dict)


@runtime_checkable
class Suite(Protocol):
    """A benchmark: data, prompts, scoring.

    Attributes:
        name: registry name (``gsm8k``).
        primary_metric: the metric gates use by default.
        metrics: every metric ``score`` returns.
        tokens_per_example: rough prompt+completion tokens, a cost hint.
        blocking_score: True when ``score`` is slow or blocking (code
            execution); the runner then calls it in a worker thread.
        score_in_process (optional, built-in suites): True when ``score`` is
            CPU-heavy (math500's symbolic comparison); the runner then calls
            it in a pool of worker processes (``running.scoring``).
        quick_score (optional, with ``score_in_process``): ``quick_score(example,
            completion)`` returns the score when it is cheap to tell (math500: the
            boxed answer is the reference verbatim), else None; the runner calls it
            on its loop and sends only the None cases to the pool.
    """

    name: str
    primary_metric: str
    metrics: tuple[str, ...]
    tokens_per_example: int
    blocking_score: bool

    def data_checksum(self) -> str:
        """SHA-256 of the data the examples come from (part of the item fingerprint)."""
        ...

    def examples(self, env_args: Mapping[str, JSON], seed: int) -> Sequence[Example]:
        """All examples for these env args and seed, in a stable order.

        ``seed`` is the item's seed; suites that shuffle answer options use it
        (or ``env_args['shuffle_seed']``) so the seed axis is meaningful.
        Raise :class:`SuiteArgumentError` for an unknown or bad env arg.
        """
        ...

    def score(self, example: Example, completion: str) -> Score:
        """Score one completion. Must not raise on any model output."""
        ...

    def reference_completion(self, example: Example) -> str:
        """A completion that this suite scores as fully correct (for simulators and tests)."""
        ...

    def wrong_completion(self, example: Example) -> str:
        """A plausible completion that this suite scores as wrong."""
        ...


class SuiteArgumentError(ValueError):
    """A suite was given an env arg it does not accept; the message names it and the fix."""


def aggregate_extra(
    suite: Suite, rows_by_example: Mapping[str, Sequence[Mapping[str, float]]]
) -> dict[str, float]:
    """Suite-specific aggregate metrics (e.g. pass@k across rollouts), if the suite defines them.

    A suite may define ``aggregate(rows_by_example) -> dict[str, float]``; the
    runner adds its result to the summary next to the per-row means.
    """
    hook = getattr(suite, "aggregate", None)
    if hook is None:
        return {}
    result: dict[str, float] = hook(rows_by_example)
    return result


def preflight(suite: Suite, item_id: str) -> None:
    """Let a suite refuse before any request (code suites without OS isolation): its
    ``preflight()`` raises a ``RuntimeError`` naming why, which fails the item with that
    message (:class:`EvaluationError`)."""
    hook = getattr(suite, "preflight", None)
    if hook is None:
        return
    try:
        hook()
    except RuntimeError as exc:
        raise EvaluationError(f"{item_id}: {exc}") from None


def summary_fields(suite: Suite) -> dict[str, Any]:
    """Suite-specific ``summary.json`` fields (the code suites' ``sandbox``), if defined."""
    hook = getattr(suite, "summary_fields", None)
    return dict(hook()) if hook is not None else {}
