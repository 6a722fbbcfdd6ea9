"""``module: jsonl`` — a question/answer suite over the user's own JSONL file.

Each line: ``{"id": "...", "question": "...", "answer": "..."}`` (``id`` optional,
defaults to the line number). Scored by normalised exact match of the final
answer (``Answer: X`` / ``The answer is X`` / last line). Useful for private
data and for tests of the pipeline itself.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from pytest_modelbench.tasks import Example, Score, SuiteArgumentError

_ACCEPTED_ARGS = ("path", "question_field", "answer_field", "system_prompt")
_FINAL = re.compile(r"(?:answer is|answer:)\s*(.+?)\s*\.?\s*$", re.IGNORECASE | re.MULTILINE)
INSTRUCTION = "Answer the question. End with a line of the form 'Answer: <answer>'."


def _normalise(text: str) -> str:
    return " ".join(text.strip().strip(".").lower().split())


def _read(path: str) -> tuple[tuple[dict[str, Any], ...], str]:
    """Rows and checksum of a JSONL file, cached while the file is unchanged."""
    file = Path(path).resolve()
    try:
        stat = file.stat()
    except OSError as exc:
        raise SuiteArgumentError(f"env_args.path: cannot read {path!r}: {exc.strerror}") from None
    return _read_cached(str(file), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=16)
def _read_cached(path: str, mtime_ns: int, size: int) -> tuple[tuple[dict[str, Any], ...], str]:
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise SuiteArgumentError(f"env_args.path: cannot read {path!r}: {exc.strerror}") from None
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SuiteArgumentError(f"{path}: line {number}: invalid JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise SuiteArgumentError(f"{path}: line {number}: expected a JSON object")
        row.setdefault("id", str(number))
        rows.append(row)
    return tuple(rows), hashlib.sha256(raw).hexdigest()


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

    def examples(self, env_args: Mapping[str, Any], seed: int) -> Sequence[Example]:
        args = self._args(env_args)
        rows, self._checksum = _read(str(args["path"]))
        q_field = args.get("question_field", "question")
        a_field = args.get("answer_field", "answer")
        system = args.get("system_prompt")
        examples = []
        for row in rows:
            if q_field not in row or a_field not in row:
                raise SuiteArgumentError(
                    f"{args['path']}: row {row['id']!r} lacks {q_field!r} or {a_field!r} "
                    "(set env_args.question_field / answer_field)"
                )
            user = f"{row[q_field]}\n\n{INSTRUCTION}"
            messages: tuple[dict[str, str], ...] = ({"role": "user", "content": user},)
            if system:
                messages = ({"role": "system", "content": str(system)}, *messages)
            examples.append(
                Example(
                    id=str(row["id"]), messages=messages, gold=str(row[a_field]), prompt=user + "\n"
                )
            )
        return examples

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
