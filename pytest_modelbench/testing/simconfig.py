"""The simulated server's configuration: one frozen value with every knob."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pytest_modelbench.testing.faults import Faults, Latency
from pytest_modelbench.testing.policy import FALLBACK_TEXT, AnswerPolicy, Lookup
from pytest_modelbench.testing.wire import FINGERPRINT

REASONING_FIELDS = ("reasoning_content", "reasoning", "think")


@dataclass(frozen=True)
class SimConfig:
    """Everything the simulated server does, as one value.

    ``latency`` also accepts a number of seconds (fixed) and ``faults`` /
    ``latency`` a mapping of their fields, so ``SimConfig(latency=0.05,
    faults={"error_5xx": 0.1})`` works from kwargs and the command line.
    ``accuracy_overrides`` gives some keys their own accuracy, ``latency_overrides`` their
    own fixed latency in seconds (one slow question, say); ``seed`` seeds
    the fault and latency draws (the answer policy depends only on each
    request's own ``seed``); ``log_path`` appends every request as JSONL.

    ``reasoning_words`` > 0 answers like a reasoning model: that many words of thinking
    (scaled by the request's ``reasoning_effort``: low 0.5, medium 1, high 2) before the
    answer, counted in ``max_tokens``, sent in ``reasoning_field`` (``reasoning_content``,
    ``reasoning``, or ``think`` for a ``<think>`` block in the text).

    ``api_key``: like vLLM's ``--api-key``, every ``/v1`` request must carry
    ``Authorization: Bearer <api_key>`` (else 401).

    ``fingerprint`` is the ``system_fingerprint`` of every answer (a build's identity);
    ``version`` is what ``GET /version`` answers (``{"version": ...}``; 404 when None).
    """

    models: tuple[str, ...] = ("sim-model",)
    slots: int = 64
    latency: Latency = field(default_factory=Latency)
    accuracy: float = 1.0
    lookup: Lookup = field(default_factory=dict)
    accuracy_overrides: Mapping[str, float] = field(default_factory=dict)
    latency_overrides: Mapping[str, float] = field(default_factory=dict)
    fallback: str = FALLBACK_TEXT
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    log_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    max_model_len: int = 4096
    reasoning_words: int = 0
    reasoning_field: str = "reasoning_content"
    api_key: str | None = field(default=None, repr=False)
    fingerprint: str = FINGERPRINT
    version: str | None = None

    def __post_init__(self) -> None:
        coerce = {
            "models": _as_models(self.models),
            "latency": _as_value(Latency, self.latency, "latency"),
            "faults": _as_value(Faults, self.faults, "faults"),
            "log_path": None if self.log_path is None else str(self.log_path),
        }
        for name, value in coerce.items():
            object.__setattr__(self, name, value)
        if not self.models:
            raise ValueError("SimConfig.models: serve at least one model name")
        if self.slots < 1:
            raise ValueError(f"SimConfig.slots={self.slots!r}: need at least 1 slot")
        if self.reasoning_words < 0:
            raise ValueError(f"SimConfig.reasoning_words={self.reasoning_words!r}: use >= 0")
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(
                f"SimConfig.reasoning_field={self.reasoning_field!r}: "
                f"use one of {', '.join(REASONING_FIELDS)}"
            )
        for key, accuracy in [("accuracy", self.accuracy), *self.accuracy_overrides.items()]:
            if not 0.0 <= accuracy <= 1.0:
                raise ValueError(f"SimConfig: accuracy for {key!r} is {accuracy!r}; use [0, 1]")
        for key, seconds in self.latency_overrides.items():
            if not seconds >= 0.0:
                raise ValueError(f"SimConfig: latency for {key!r} is {seconds!r}; use >= 0")

    @property
    def policy(self) -> AnswerPolicy:
        """The answer policy this configuration describes."""
        return AnswerPolicy(self.accuracy, self.lookup, self.accuracy_overrides, self.fallback)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names accepted by the constructor (for kwargs validation)."""
        return tuple(f.name for f in fields(cls))


def _as_models(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    if isinstance(value, Iterable):
        return tuple(str(name) for name in value)
    raise TypeError(f"SimConfig.models={value!r}: give a list of model names")


def _as_value(cls: type[Any], value: object, name: str) -> Any:
    if isinstance(value, cls):
        return value
    if cls is Latency and isinstance(value, (int, float)) and not isinstance(value, bool):
        return Latency.fixed(float(value))
    if isinstance(value, Mapping):
        unknown = set(value) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"SimConfig.{name}: unknown field(s) {sorted(unknown)}")
        return cls(**value)
    raise TypeError(f"SimConfig.{name}={value!r}: give a {cls.__name__} or a mapping")


def needs_draws(config: SimConfig) -> bool:
    """Whether requests need their hash-derived uniforms (skipped on the fast path)."""
    return config.faults.total > 0.0 or config.latency.distribution != "fixed"
