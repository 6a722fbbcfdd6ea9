"""Score pre-generated completions (solution files) with a suite's own scorer, no server.

A model entry with ``solutions: runs/external/*.jsonl`` (or a mapping of
environment/variant id → glob) is evaluated from files instead of requests.
Each JSONL line is ``{"example_id" | "id": ..., "completion": "...", "rollout": 0}``
(``rollout`` optional). Files are read and scored in parallel, each file under
a time limit (the model's ``timeout``); a bad line, an unknown id or a file
that cannot be read is reported in ``summary.json`` and as a warning, never
fatal. Examples without a solution become error rows, so the error budget
decides whether a partial solution set is acceptable.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_modelbench.backends.protocol import ItemContext, Outcome
from pytest_modelbench.backends.suite_backend import SuiteBackend
from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.store.records import JOURNAL_ROW_VERSION
from pytest_modelbench.suites.contract import (
    Example,
    Suite,
    aggregate_extra,
    preflight,
    summary_fields,
)

CHUNK = 32  # units per scoring task: parallel within a big file, deadline checked per unit
MAX_PROBLEMS_KEPT = 50  # problems listed in summary.json (all are counted)


class SolutionsWarning(UserWarning):
    """Some solution lines or files could not be used (they are listed in summary.json)."""


@dataclass(frozen=True)
class Solution:
    """One completion read from a solution file."""

    example_id: str
    rollout: int
    completion: str
    source: str  # "path:line"


@dataclass
class SolutionSet:
    """Everything read from an item's solution files: usable lines and what was wrong."""

    files: tuple[Path, ...]
    by_key: dict[tuple[str, int], Solution] = field(default_factory=dict)
    by_file: dict[Path, list[Solution]] = field(default_factory=dict)
    lines: int = 0
    problems: list[str] = field(default_factory=list)

    def problem(self, message: str) -> None:
        self.problems.append(message)


def solution_globs(item: PlannedItem) -> list[str]:
    """The globs of ``item.model.solutions`` that apply to this item's variant (may be empty)."""
    spec = item.model.solutions
    if spec is None:
        return []
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, list):
        return list(spec)
    for key in (item.variant.id, item.env):
        if key in spec:
            value = spec[key]
            return [value] if isinstance(value, str) else list(value)
    return []


def solution_files(item: PlannedItem) -> tuple[Path, ...]:
    """The files the item's solution globs match, sorted; a usage error when none match."""
    patterns = solution_globs(item)
    where = f"models.{item.model_name}.solutions"
    if not patterns:
        keys = ", ".join(sorted(item.model.solutions or {})) or "(none)"
        raise ModelbenchUsageError(
            f"{where}: no solution files for environment {item.env!r} (variant "
            f"{item.variant.id!r}); the mapping has: {keys}. Add '{item.env}: <glob>' or run "
            "this model only on environments it has solutions for (--env)"
        )
    files: set[Path] = set()
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        matches = glob.glob(expanded, recursive=True)
        if os.path.isdir(expanded):
            matches = glob.glob(os.path.join(expanded, "**", "*.jsonl"), recursive=True)
        files.update(Path(m).resolve() for m in matches if os.path.isfile(m))
    if not files:
        raise ModelbenchUsageError(
            f"{where}: {', '.join(repr(p) for p in patterns)} matches no file (relative paths "
            f"are taken from {Path.cwd()}); give a glob of JSONL files like 'solutions/*.jsonl'"
        )
    return tuple(sorted(files))


def files_digest(files: Sequence[Path]) -> str:
    """SHA-256 over the files' names and contents (changed solutions → new fingerprint)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path).encode() + b"\x00")
        try:
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        except OSError as exc:
            digest.update(f"unreadable: {exc.strerror}".encode())
    return digest.hexdigest()


def _parse_line(text: str, where: str) -> tuple[Solution | None, str | None]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"{where}: invalid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(row, dict):
        return None, f"{where}: expected a JSON object, got {type(row).__name__}"
    raw_id = row.get("example_id", row.get("id"))
    if raw_id is None or isinstance(raw_id, (dict, list, bool)):
        return None, f"{where}: no 'example_id' (or 'id') field"
    completion = row.get("completion")
    if not isinstance(completion, str):
        got = "missing" if completion is None else type(completion).__name__
        return None, f"{where}: 'completion' must be a string ({got})"
    rollout = row.get("rollout", 0)
    if not isinstance(rollout, int) or isinstance(rollout, bool) or rollout < 0:
        return None, f"{where}: 'rollout' must be a non-negative integer, got {rollout!r}"
    return Solution(str(raw_id), rollout, completion, where), None


def read_file(path: Path, deadline: float) -> tuple[list[Solution], list[str], int]:
    """Solutions, problems and the number of non-empty lines of one file (stops at ``deadline``)."""
    solutions: list[Solution] = []
    problems: list[str] = []
    count = 0
    try:
        with open(path, encoding="utf-8", errors="strict") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                count += 1
                if time.monotonic() > deadline:
                    problems.append(
                        f"{path}: reading timed out at line {number}; the rest is unused"
                    )
                    break
                solution, problem = _parse_line(line, f"{path}:{number}")
                if solution is not None:
                    solutions.append(solution)
                if problem is not None:
                    problems.append(problem)
    except UnicodeDecodeError as exc:
        problems.append(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); the rest is unused"
        )
    except OSError as exc:
        problems.append(f"{path}: cannot read: {exc.strerror}")
    return solutions, problems, count


def read_solutions(
    files: Sequence[Path],
    wanted: Mapping[tuple[str, int], Example],
    known_ids: Iterable[str],
    *,
    workers: int,
    timeout_s: float,
) -> SolutionSet:
    """Read every file in parallel; keep the first line (in file order) for each wanted unit."""
    result = SolutionSet(files=tuple(files))
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(files)))) as pool:
        read = list(pool.map(lambda p: read_file(p, started + timeout_s), files))
    known = set(known_ids)
    for path, (solutions, problems, count) in zip(files, read, strict=True):
        result.lines += count
        result.problems.extend(problems)
        for solution in solutions:
            key = (solution.example_id, solution.rollout)
            if key in result.by_key:
                first = result.by_key[key].source
                result.problem(f"{solution.source}: duplicate of {first}; the first one is used")
            elif key in wanted:
                result.by_key[key] = solution
                result.by_file.setdefault(path, []).append(solution)
            elif solution.example_id not in known:
                result.problem(
                    f"{solution.source}: example id {solution.example_id!r} is not in this suite"
                )
            # else: a known example outside --num-examples / rollouts_per_example: not an error
    return result


class SolutionsBackend:
    """Scores one suite's solution files (the suite part of :class:`SolutionsOrSuite`)."""

    def __init__(self, suites: SuiteBackend) -> None:
        self.suites = suites
        self.suite = suites.suite
        self._lock = threading.Lock()

    def fingerprint_parts(self, item: PlannedItem) -> dict[str, Any]:
        files = solution_files(item)
        return {**self.suites.fingerprint_parts(item), "solutions": files_digest(files)}

    def _row(self, example: Example, rollout: int) -> dict[str, Any]:
        return {
            "v": JOURNAL_ROW_VERSION,
            "example_id": example.id,
            "rollout": rollout,
            "prompt": example.last_user_text if example.messages else example.prompt,
            "gold": example.gold,
            "tokens": None,
            "latency_s": None,
            "attempts": 1,
        }

    def _score(self, example: Example, rollout: int, solution: Solution) -> dict[str, Any]:
        row = self._row(example, rollout)
        row.update(completion=solution.completion, source=solution.source, error=None)
        started = time.perf_counter()
        try:
            result = self.suite.score(example, solution.completion)
        except Exception as exc:  # a scorer bug must not stop the other files
            row.update(
                metrics={},
                score=None,
                extracted=None,
                error=f"scorer raised {type(exc).__name__}: {exc}",
            )
            return row
        metrics = dict(result.metrics)
        row.update(
            metrics=metrics,
            score=metrics.get(self.suite.primary_metric),
            extracted=result.extracted,
            score_s=round(time.perf_counter() - started, 4),
        )
        if result.detail:
            row["detail"] = dict(result.detail)
        return row

    def _append(self, ctx: ItemContext, row: Mapping[str, Any]) -> None:
        with self._lock:
            ctx.rows.append(row)
            ctx.progress.advance(error=row.get("error") is not None)

    def evaluate(self, ctx: ItemContext) -> Outcome:
        item = ctx.item
        examples = self.suites.examples(item)
        rollouts = item.variant.rollouts_per_example
        files = solution_files(item)
        done = ctx.rows.done_keys()
        wanted = {(ex.id, r): ex for ex in examples for r in range(rollouts)}
        todo = {key: ex for key, ex in wanted.items() if key not in done}
        workers = max(1, min(item.model.max_concurrent, (os.cpu_count() or 1) * 4))
        timeout_s = float(item.model.timeout)
        solutions = read_solutions(
            files,
            todo,
            (ex.id for ex in self.suite.examples(item.variant.env_args, item.seed)),
            workers=workers,
            timeout_s=timeout_s,
        )
        ctx.progress.start(item.item_id, len(wanted), len(wanted) - len(todo))
        if todo:
            preflight(self.suite, item.item_id)  # e.g. code suites without OS isolation
        started = time.perf_counter()
        try:
            self._score_all(ctx, solutions, todo, workers, timeout_s)
            for key, example in todo.items():
                if key not in solutions.by_key:
                    row = self._row(example, key[1])
                    row.update(
                        completion=None,
                        metrics={},
                        score=None,
                        extracted=None,
                        error=f"no solution for example {key[0]!r} rollout {key[1]} in "
                        f"{', '.join(solution_globs(item))}",
                    )
                    self._append(ctx, row)
        finally:
            ctx.progress.finish()
        return self._outcome(ctx, wanted, done, solutions, time.perf_counter() - started)

    def _score_all(
        self,
        ctx: ItemContext,
        solutions: SolutionSet,
        todo: Mapping[tuple[str, int], Example],
        workers: int,
        timeout_s: float,
    ) -> None:
        """Score each file's solutions in chunks on a thread pool, each file with its deadline."""
        deadlines: dict[Path, float] = {}

        def chunks() -> Iterator[tuple[Path, list[Solution]]]:
            for path, items in solutions.by_file.items():
                for start in range(0, len(items), CHUNK):
                    yield path, items[start : start + CHUNK]

        def run(path: Path, chunk: list[Solution]) -> None:
            with self._lock:
                deadline = deadlines.setdefault(path, time.monotonic() + timeout_s)
            for solution in chunk:
                key = (solution.example_id, solution.rollout)
                example = todo[key]
                if time.monotonic() > deadline:
                    row = self._row(example, solution.rollout)
                    row.update(
                        completion=solution.completion,
                        source=solution.source,
                        metrics={},
                        score=None,
                        extracted=None,
                        error=f"scoring {path.name} timed out after {timeout_s:g}s "
                        f"(models.{ctx.item.model_name}.timeout)",
                    )
                else:
                    row = self._score(example, solution.rollout, solution)
                self._append(ctx, row)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            for future in [pool.submit(run, path, chunk) for path, chunk in chunks()]:
                future.result()

    def _outcome(
        self,
        ctx: ItemContext,
        wanted: Mapping[tuple[str, int], Example],
        done: frozenset[tuple[str, int]],
        solutions: SolutionSet,
        wall_s: float,
    ) -> Outcome:
        item = ctx.item
        by_example: dict[str, list[dict[str, float]]] = defaultdict(list)
        for row in ctx.rows.rows(wanted.__contains__):
            if not row.get("error"):
                by_example[str(row["example_id"])].append(row.get("metrics") or {})
        extra_metrics = {
            name: {"value": value, "n": len(by_example)}
            for name, value in aggregate_extra(self.suite, by_example).items()
        }
        summary = summary_fields(self.suite)
        summary["solutions"] = {
            "files": [str(p) for p in solutions.files],
            "lines": solutions.lines,
            "used": len(solutions.by_key),
            "problems": len(solutions.problems),
            "problem_lines": solutions.problems[:MAX_PROBLEMS_KEPT],
            "wall_s": round(wall_s, 3),
        }
        if solutions.problems:
            shown = "; ".join(solutions.problems[:3])
            more = (
                f" (and {len(solutions.problems) - 3} more)" if len(solutions.problems) > 3 else ""
            )
            warnings.warn(
                SolutionsWarning(
                    f"{item.item_id}: {len(solutions.problems)} problem(s) in solution files, "
                    f"skipped: {shown}{more}; all are listed in summary.json"
                ),
                stacklevel=2,
            )
        return Outcome(
            expected=len(wanted),
            selected=wanted.__contains__,
            metric_names=self.suite.metrics,
            resumed=len(done & set(wanted)),
            fields=summary,
            extra_metrics=extra_metrics,
        )


class SolutionsOrSuite:
    """A suite's backend that scores solution files instead when the item's model has them."""

    selects_by_example = True  # both keep results per example
    stops_early = True  # --mb-stop-early: the suite's loop stops; solution files are all scored

    def __init__(self, suites: SuiteBackend) -> None:
        self.suites = suites
        self.solutions = SolutionsBackend(suites)
        self.name = suites.name

    @property
    def suite(self) -> Suite:
        return self.suites.suite

    def primary_metric(self, item: PlannedItem) -> str:
        return self.suites.primary_metric(item)

    def fingerprint_parts(self, item: PlannedItem) -> dict[str, Any]:
        if item.model.solutions:
            return self.solutions.fingerprint_parts(item)
        return self.suites.fingerprint_parts(item)

    def count_examples(self, item: PlannedItem) -> int:
        return self.suites.count_examples(item)

    def tokens_per_example(self) -> int:
        return self.suites.tokens_per_example()

    def examples(self, item: PlannedItem) -> Sequence[Example]:
        return self.suites.examples(item)

    def evaluate(self, ctx: ItemContext) -> Outcome:
        if ctx.item.model.solutions:
            return self.solutions.evaluate(ctx)
        return self.suites.evaluate(ctx)


def refuse_solutions(item: PlannedItem) -> None:
    """Backends that cannot score files call this: a model with solutions gets a clear message."""
    if item.model.solutions:
        raise ModelbenchUsageError(
            f"models.{item.model_name}.solutions: solution files are scored with the built-in "
            f"suites and 'jsonl' only; variant {item.variant.id!r} uses {item.variant.module!r}. "
            "Run this model on a built-in suite, or give it an api_base_url instead"
        )


__all__ = [
    "SolutionSet",
    "SolutionsBackend",
    "SolutionsOrSuite",
    "SolutionsWarning",
    "refuse_solutions",
    "solution_files",
    "solution_globs",
]
