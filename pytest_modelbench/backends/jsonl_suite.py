"""``module: jsonl`` — a question/answer suite over the user's own JSONL file.

Each line: ``{"id": "...", "question": "...", "answer": "..."}`` (``id`` optional,
defaults to the line number). Scored by normalised exact match of the final
answer (``Answer: X`` / ``The answer is X`` / last line). Useful for private
data and for tests of the pipeline itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, overload

from pytest_modelbench.suites.contract import Example, Score, SuiteArgumentError

_ACCEPTED_ARGS = ("path", "question_field", "answer_field", "system_prompt")
_FINAL = re.compile(r"(?:answer is|answer:)\s*(.+?)\s*\.?\s*$", re.IGNORECASE | re.MULTILINE)
INSTRUCTION = "Answer the question. End with a line of the form 'Answer: <answer>'."


def _normalise(text: str) -> str:
    return " ".join(text.strip().strip(".").lower().split())


def _stat(path: str) -> tuple[str, int, int]:
    """(absolute path, mtime_ns, size): the cache key of a data file while it is unchanged."""
    file = os.path.abspath(path)
    try:
        stat = os.stat(file)
    except OSError as exc:
        raise SuiteArgumentError(f"env_args.path: cannot read {path!r}: {exc.strerror}") from None
    return file, stat.st_mtime_ns, stat.st_size


@dataclass(frozen=True)
class _Columns:
    """What the examples of one data file need, one tuple per field (a 100k-line file holds
    three strings a line, not a parsed row and a built example per line)."""

    checksum: str
    ids: tuple[str, ...]
    questions: tuple[str, ...]
    answers: tuple[str, ...]


@lru_cache(maxsize=4)
def _read_cached(file: tuple[str, int, int], shown: str, q_field: str, a_field: str) -> _Columns:
    """Read a JSONL file line by line (checksum included), keeping only ids, questions, answers."""
    path = file[0]
    digest = hashlib.sha256()
    ids: list[str] = []
    questions: list[str] = []
    answers: list[str] = []
    first_line: dict[str, int] = {}
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                digest.update(raw)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise SuiteArgumentError(
                        f"{path}: line {number}: not UTF-8 text ({exc.reason}); save the file as UTF-8"
                    ) from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SuiteArgumentError(
                        f"{path}: line {number}: invalid JSON: {exc.msg}"
                    ) from None
                if not isinstance(row, dict):
                    raise SuiteArgumentError(f"{path}: line {number}: expected a JSON object")
                row_id = str(row.get("id", number))
                if q_field not in row or a_field not in row:
                    raise SuiteArgumentError(
                        f"{shown}: row {row_id!r} lacks {q_field!r} or {a_field!r} "
                        "(set env_args.question_field / answer_field)"
                    )
                if row_id in first_line:
                    raise SuiteArgumentError(
                        f"{shown}: line {number}: id {row_id!r} is also on line "
                        f"{first_line[row_id]}; ids must be unique (results are kept per id)"
                    )
                first_line[row_id] = number
                ids.append(row_id)
                questions.append(f"{row[q_field]}")
                answers.append(str(row[a_field]))
    except OSError as exc:
        raise SuiteArgumentError(f"env_args.path: cannot read {shown!r}: {exc.strerror}") from None
    if not ids:  # else the item ends in "metric 'exact_match' was not computed"
        raise SuiteArgumentError(
            f"env_args.path: {shown} has no rows; write one JSON object per line, e.g. "
            f'{{"id": "q1", "{q_field}": "...", "{a_field}": "..."}}'
        )
    return _Columns(digest.hexdigest(), tuple(ids), tuple(questions), tuple(answers))


class JsonlExamples(Sequence[Example]):
    """The examples of a data file, built one at a time as they are read (the runner iterates
    once, so a 100k-example item never holds 100k prompts)."""

    def __init__(self, columns: _Columns, system: str | None, index: range | None = None) -> None:
        self._columns = columns
        self._system = system
        self._index = index if index is not None else range(len(columns.ids))

    def _example(self, i: int) -> Example:
        user = f"{self._columns.questions[i]}\n\n{INSTRUCTION}"
        messages: tuple[dict[str, str], ...] = ({"role": "user", "content": user},)
        if self._system:
            messages = ({"role": "system", "content": self._system}, *messages)
        return Example(
            id=self._columns.ids[i],
            messages=messages,
            gold=self._columns.answers[i],
            prompt=user + "\n",
        )

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, index: int) -> Example: ...

    @overload
    def __getitem__(self, index: slice) -> JsonlExamples: ...

    def __getitem__(self, index: int | slice) -> Example | JsonlExamples:
        if isinstance(index, slice):
            return JsonlExamples(self._columns, self._system, self._index[index])
        return self._example(self._index[index])

    def __iter__(self) -> Iterator[Example]:
        for i in self._index:
            yield self._example(i)

    def __repr__(self) -> str:
        return f"<{len(self)} jsonl examples>"


class JsonlSuite:
    """Exact-match QA over a JSONL file given as ``env_args.path``."""

    name = "jsonl"
    primary_metric = "exact_match"
    metrics = ("exact_match",)
    tokens_per_example = 200
    blocking_score = False

    def __init__(self) -> None:
        self._checksum = ""

    def _args(self, env_args: Mapping[str, Any]) -> dict[str, Any]:
        from pytest_modelbench.errors import did_you_mean

        for key in env_args:
            if key not in _ACCEPTED_ARGS:
                raise SuiteArgumentError(
                    f"env_args: unknown key {key!r} for module 'jsonl'{did_you_mean(key, _ACCEPTED_ARGS)}; "
                    f"accepted: {', '.join(_ACCEPTED_ARGS)}"
                )
        if "path" not in env_args:
            raise SuiteArgumentError("env_args.path is required for module 'jsonl' (a JSONL file)")
        return dict(env_args)

    def data_checksum(self) -> str:
        return self._checksum

    def examples(
        self,
        env_args: Mapping[str, Any],
        seed: int,  # noqa: ARG002  # Suite protocol signature; a JSONL file has one order
    ) -> Sequence[Example]:
        args = self._args(env_args)
        shown = str(args["path"])
        columns = _read_cached(
            _stat(shown),
            shown,
            args.get("question_field", "question"),
            args.get("answer_field", "answer"),
        )
        self._checksum = columns.checksum
        system = args.get("system_prompt")
        return JsonlExamples(columns, str(system) if system else None)

    def score(self, example: Example, completion: str) -> Score:
        text = re.sub(r"<think>.*?(</think>|$)", "", completion or "", flags=re.DOTALL)
        matches = _FINAL.findall(text)
        lines = [line for line in text.strip().splitlines() if line.strip()]
        extracted = matches[-1] if matches else (lines[-1] if lines else "")
        correct = _normalise(extracted) == _normalise(str(example.gold))
        return Score(metrics={"exact_match": float(correct)}, extracted=extracted)

    def reference_completion(self, example: Example) -> str:
        return f"Let me think.\nAnswer: {example.gold}"

    def wrong_completion(self, example: Example) -> str:
        return f"Let me think.\nAnswer: not {example.gold}"
