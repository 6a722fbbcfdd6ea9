"""Shared machinery of the built-in suites: env-arg parsing, example caching, data checksum.

A concrete suite declares its data files and :class:`~pytest_modelbench.suites.args.Arg`
specs and implements :meth:`BuiltinSuite.build` plus the scoring methods of the
:class:`~pytest_modelbench.suites.contract.Suite` protocol.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from pytest_modelbench.suites.args import Arg, parse_env_args
from pytest_modelbench.suites.contract import JSON, Example, Score
from pytest_modelbench.suites.selection import LazyExamples
from pytest_modelbench.suites.vendored import Record, Records, checksum, load_jsonl

CACHE_SIZE = 8


def num_fewshot_arg(maximum: int) -> Arg:
    return Arg(
        "num_fewshot",
        "int",
        0,
        f"few-shot exemplars as earlier chat turns (fixed exemplars, 0..{maximum})",
        minimum=0,
        maximum=maximum,
    )


SYSTEM_PROMPT_ARG = Arg("system_prompt", "str", None, "a system message to prepend", nullable=True)


class BuiltinSuite(ABC):
    """Base class of the vendored suites (satisfies :class:`pytest_modelbench.suites.contract.Suite`)."""

    name: str
    primary_metric: str
    metrics: tuple[str, ...]
    tokens_per_example: int
    blocking_score: bool = False
    score_in_process: bool = False  # CPU-heavy scoring: run it in running.scoring's processes
    version: str = "1"  # bump when prompts or scoring change (results become incomparable)
    data_file: str
    fewshot_file: str | None = None

    def __init__(self) -> None:
        self._cache: OrderedDict[str, Sequence[Example]] = OrderedDict()
        self._lock = threading.Lock()

    # -- declared by subclasses ------------------------------------------------

    def arg_specs(self) -> tuple[Arg, ...]:
        """The env args this suite accepts."""
        return (SYSTEM_PROMPT_ARG,)

    def uses_seed(self, args: Mapping[str, Any]) -> bool:  # noqa: ARG002  # subclasses read args
        """Whether the item seed changes the examples (answer shuffling)."""
        return False

    @abstractmethod
    def build(self, args: Mapping[str, Any], seed: int) -> Sequence[Example]:
        """All examples for validated ``args`` (a list, or :class:`LazyExamples` made on use)."""

    @abstractmethod
    def score(self, example: Example, completion: str) -> Score: ...

    @abstractmethod
    def reference_completion(self, example: Example) -> str: ...

    @abstractmethod
    def wrong_completion(self, example: Example) -> str: ...

    # -- provided ----------------------------------------------------------------

    def data_checksum(self) -> str:
        files = [self.data_file] + ([self.fewshot_file] if self.fewshot_file else [])
        return checksum(*files)

    def parse_args(self, env_args: Mapping[str, JSON]) -> dict[str, Any]:
        return parse_env_args(self.name, self.arg_specs(), env_args or {})

    def examples(self, env_args: Mapping[str, JSON], seed: int) -> Sequence[Example]:
        args = self.parse_args(env_args)
        key = json.dumps(
            [args, seed if self.uses_seed(args) else None], sort_keys=True, default=list
        )
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        made = self.build(args, seed)
        built = made if isinstance(made, LazyExamples) else tuple(made)
        with self._lock:
            self._cache[key] = built
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return built

    @property
    def records(self) -> Records:
        return load_jsonl(self.data_file)

    @property
    def fewshot(self) -> Sequence[Record]:
        return load_jsonl(self.fewshot_file) if self.fewshot_file else ()

    @cached_property
    def by_id(self) -> dict[str, Record]:
        return {str(record["id"]): record for record in self.records}

    def record(self, example: Example) -> Record:
        """The vendored record behind an example (for reference completions)."""
        return self.by_id[example.id]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
