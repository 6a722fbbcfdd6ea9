"""The simulated model's answer policy: right with a known probability, deterministically.

Whether the simulator answers a prompt correctly depends only on the prompt's
key, the request's ``seed`` and the accuracy, through :func:`is_correct`. A
test can therefore compute the true accuracy of the simulated model on any set
of examples without talking to the server.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_modelbench.suites.contract import Example

Lookup = Mapping[str, tuple[str, str]]
"""Key (last user message or prompt) → (correct completion, wrong completion)."""

FALLBACK_TEXT = "I am a simulated model and have no answer for this prompt."

_SCALE = float(1 << 64)


def uniform(*parts: object) -> float:
    """A uniform number in [0, 1) drawn from the SHA-256 of ``parts`` (stable across runs)."""
    text = "\x1f".join(str(part) for part in parts)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def is_correct(key: str, seed: int | None, accuracy: float) -> bool:
    """Whether the simulator answers ``key`` correctly under request seed ``seed``.

    ``sha256(key, seed)`` mapped to [0, 1) is compared with ``accuracy``, so over
    many keys the fraction answered correctly is ``accuracy`` up to sampling noise,
    and the same (key, seed) always gets the same verdict.
    """
    if accuracy >= 1.0:
        return True
    if accuracy <= 0.0:
        return False
    return uniform("answer", key, seed) < accuracy


def lookup_from_examples(
    examples: Iterable[Example],
    correct_fn: Callable[[Example], str],
    wrong_fn: Callable[[Example], str],
    *,
    chat: bool = True,
) -> dict[str, tuple[str, str]]:
    """Build a lookup from examples, keyed the way the simulator keys requests.

    ``chat=True`` keys on :attr:`Example.last_user_text` (what chat requests
    send last), ``chat=False`` on :attr:`Example.prompt` (completion requests).
    Pass a suite's ``reference_completion`` / ``wrong_completion`` as the two
    functions to simulate a model of known accuracy on that suite.
    """
    lookup: dict[str, tuple[str, str]] = {}
    for example in examples:
        key = example.last_user_text if chat else example.prompt
        lookup[key] = (correct_fn(example), wrong_fn(example))
    return lookup


@dataclass(frozen=True)
class AnswerPolicy:
    """Chooses the completion text for a key: the lookup's correct or wrong answer.

    ``overrides`` gives a per-key accuracy in place of ``accuracy``; keys missing
    from ``lookup`` are answered with ``fallback``.
    """

    accuracy: float = 1.0
    lookup: Lookup = field(default_factory=dict)
    overrides: Mapping[str, float] = field(default_factory=dict)
    fallback: str = FALLBACK_TEXT

    def accuracy_for(self, key: str) -> float:
        """The probability that ``key`` is answered correctly."""
        return self.overrides.get(key, self.accuracy)

    def correct(self, key: str, seed: int | None) -> bool:
        """Whether ``key`` is answered correctly under ``seed`` (see :func:`is_correct`)."""
        return is_correct(key, seed, self.accuracy_for(key))

    def answer(self, key: str, seed: int | None) -> str:
        """The completion text the simulator sends for ``key`` under ``seed``."""
        pair = self.lookup.get(key)
        if pair is None:
            return self.fallback
        return pair[0] if self.correct(key, seed) else pair[1]

    def expected_accuracy(self, keys: Iterable[str], seed: int | None) -> float:
        """The exact fraction of ``keys`` answered correctly under ``seed`` (the true score)."""
        verdicts = [self.correct(key, seed) for key in keys]
        return sum(verdicts) / len(verdicts) if verdicts else 0.0


def load_lookup(path: str | Path) -> dict[str, tuple[str, str]]:
    """Read a lookup file: JSON ``{key: [correct, wrong]}``, or ``{"key", "correct", "wrong"}``
    records as a JSON list or a ``.jsonl`` file."""
    text = Path(path).read_text(encoding="utf-8")
    rows: Any
    if str(path).endswith(".jsonl"):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = json.loads(text)
    lookup: dict[str, tuple[str, str]] = {}
    if isinstance(rows, dict):
        for key, pair in rows.items():
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError(f"{path}: key {key!r}: expected [correct, wrong], got {pair!r}")
            lookup[str(key)] = (str(pair[0]), str(pair[1]))
        return lookup
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON object or a list of records")
    for number, row in enumerate(rows, 1):
        if not (isinstance(row, dict) and {"key", "correct", "wrong"} <= row.keys()):
            raise ValueError(f"{path}: record {number}: expected keys 'key', 'correct', 'wrong'")
        lookup[str(row["key"])] = (str(row["correct"]), str(row["wrong"]))
    return lookup
