"""The token memory: tokens per example each finished item used, kept in the pytest cache.

A suite's ``tokens_per_example`` is a guess for a model that answers directly; a reasoning
model thinks first and uses several times more. Once an item has run, the plan
(``--collect-only``) and the scheduler's cost model use what it was seen to use instead.

Observations are kept per item id (pytest cache key ``modelbench/tokens``) with the item's
model, environment and variant, so an item with no observation of its own borrows from its
relatives: first the same model × variant (another seed, another ``--num-examples``), then
the same model × environment (another variant of a matrix). Not the same model × suite
module: one module (``jsonl``, ``lm_eval``) serves datasets of any length. The controller
updates the memory as items finish (``session/resume.py``); the cache is read once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_modelbench.store.pytest_cache import cache_get, cache_set

if TYPE_CHECKING:
    from pytest_modelbench.planning.item import PlannedItem
    from pytest_modelbench.store.summary import ItemSummary

TOKENS_KEY = "modelbench/tokens"
SCHEMA_VERSION = 1

OBSERVED = "observed"  # the item's own earlier run
OBSERVED_VARIANT = "observed (variant)"  # the same model × variant: another seed or example count
OBSERVED_ENV = "observed (env)"  # the same model × environment: another variant
ESTIMATED = "estimated"  # the suite's static tokens_per_example


@dataclass(frozen=True)
class ObservedTokens:
    """What one finished item used: prompt + completion tokens (thinking included, as the
    OpenAI usage counts it) over its scored replies."""

    model: str
    """The model's name in ``models.yaml``."""
    env: str
    """The environment (``configs/envs/<env>.yaml``)."""
    variant: str
    """The variant id."""
    tokens: int
    """Prompt + completion tokens of the scored replies (example × rollout)."""
    replies: int
    """Scored replies: the examples × rollouts the tokens were counted over."""

    @property
    def per_example(self) -> float:
        """Tokens per example and rollout: the unit of a suite's ``tokens_per_example``."""
        return self.tokens / self.replies

    @classmethod
    def from_summary(
        cls, model: str, env: str, variant: str, summary: ItemSummary
    ) -> ObservedTokens | None:
        """The observation in an item's ``summary.json``; None when it counted no tokens (a
        server that sends no usage, stored completions) or scored nothing."""
        counts = summary.tokens
        if not isinstance(counts, Mapping):
            return None
        replies = _whole(summary.n_scored)
        prompt, completion = _whole(counts.get("prompt", 0)), _whole(counts.get("completion", 0))
        if not replies or prompt is None or completion is None or prompt + completion == 0:
            return None
        return cls(model, env, variant, prompt + completion, replies)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "env": self.env,
            "variant": self.variant,
            "tokens": self.tokens,
            "replies": self.replies,
        }

    @classmethod
    def from_json(cls, data: Any) -> ObservedTokens | None:
        """One cache entry, or None when it is not one (ignored like a malformed duration)."""
        if not isinstance(data, dict):
            return None
        model, env, variant = data.get("model"), data.get("env"), data.get("variant")
        tokens, replies = _whole(data.get("tokens")), _whole(data.get("replies"))
        if not (isinstance(model, str) and isinstance(env, str) and isinstance(variant, str)):
            return None
        return cls(model, env, variant, tokens, replies) if tokens and replies else None


def _whole(value: Any) -> int | None:
    """A non-negative whole number (JSON may write it as ``3.0``), or None."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


def read_tokens(config: pytest.Config) -> dict[str, ObservedTokens]:
    """Remembered observations by item id; anything missing or malformed is ignored."""
    raw = cache_get(config, TOKENS_KEY, None)
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        return {}
    items = raw.get("items")
    if not isinstance(items, dict):
        return {}
    observed: dict[str, ObservedTokens] = {}
    for item_id, entry in items.items():
        found = ObservedTokens.from_json(entry)
        if isinstance(item_id, str) and found is not None:
            observed[item_id] = found
    return observed


def write_tokens(config: pytest.Config, observed: Mapping[str, ObservedTokens]) -> None:
    """Remember ``observed`` (all of it: the cache key is replaced whole)."""
    items = {item_id: entry.to_json() for item_id, entry in observed.items()}
    cache_set(config, TOKENS_KEY, {"schema_version": SCHEMA_VERSION, "items": items})


class TokenMemory:
    """Observed tokens per example for planned items: the item's own, else pooled over its
    model × variant, else over its model × environment (lookups only: 10k items stay cheap)."""

    def __init__(self, observed: Mapping[str, ObservedTokens] | None = None) -> None:
        self._items = dict(observed or {})
        by_variant: dict[tuple[str, str, str], list[int]] = {}
        by_env: dict[tuple[str, str], list[int]] = {}
        for entry in self._items.values():
            for sums in (
                by_variant.setdefault((entry.model, entry.env, entry.variant), [0, 0]),
                by_env.setdefault((entry.model, entry.env), [0, 0]),
            ):
                sums[0] += entry.tokens
                sums[1] += entry.replies
        self._variants = {key: tokens / replies for key, (tokens, replies) in by_variant.items()}
        self._envs = {key: tokens / replies for key, (tokens, replies) in by_env.items()}

    def per_example(self, item: PlannedItem) -> tuple[float, str] | None:
        """``(tokens per example, where it comes from)``, or None when nothing was observed."""
        own = self._items.get(item.item_id)
        model, env, variant = item.model_name, item.env, item.variant.id
        if own is not None and (own.model, own.env, own.variant) == (model, env, variant):
            return own.per_example, OBSERVED
        pooled = self._variants.get((model, env, variant))
        if pooled is not None:
            return pooled, OBSERVED_VARIANT
        pooled = self._envs.get((model, env))
        return (pooled, OBSERVED_ENV) if pooled is not None else None
