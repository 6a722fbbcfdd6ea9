"""MATH-500 (competition mathematics, 500 problems), scored with math-verify.

The gold answer is the last ``\\boxed{}`` of the reference solution; the
model's answer is read by math-verify (boxed answers first, then other LaTeX
or plain expressions) and compared symbolically, so ``\\frac{1}{2}``, ``0.5``
and ``x = \\frac12`` all match ``\\frac{1}{2}``. A boxed answer written exactly
as the reference, or a plain integer against an integer reference, is scored
without math-verify (:meth:`MATH500.quick_score`: the verdict math-verify gives
on such text), on the runner's loop. The runner scores the rest in worker
processes (``running.scoring``), in their main threads, where math-verify's time
limits (``SIGALRM``) hold; called from another thread they are off and very long
answers are truncated instead, so scoring always terminates.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pytest_modelbench.suites.args import Arg
from pytest_modelbench.suites.base import SYSTEM_PROMPT_ARG, BuiltinSuite, num_fewshot_arg
from pytest_modelbench.suites.contract import Example, Score
from pytest_modelbench.suites.extract import last_boxed, strip_thinking
from pytest_modelbench.suites.prompting import chat, plain

INSTRUCTION = (
    "Solve the following math problem. Reason step by step, and put your final answer "
    "within \\boxed{{}}.\n\nProblem: {problem}"
)
MAX_ANSWER_CHARS = 4000  # math-verify reads the tail; bounded work without a timer
TIMEOUT_SECONDS = 5
_INTEGER = re.compile(r"-?[0-9]{1,30}")  # compared as numbers without math-verify


def _timeout() -> int | None:
    return TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def parse_gold(answer: str) -> list[Any]:
    from math_verify import parse

    parsed: list[Any] = parse(f"$\\boxed{{{answer}}}$", parsing_timeout=_timeout())
    return parsed


def parse_answer(text: str) -> list[Any]:
    """math-verify's reading of a reply (boxed first); ``[]`` when nothing parses."""
    from math_verify import parse

    visible = strip_thinking(text)
    if not visible:
        return []
    boxed = last_boxed(visible)
    source = f"$\\boxed{{{boxed}}}$" if boxed is not None else visible[-MAX_ANSWER_CHARS:]
    try:
        parsed: list[Any] = parse(source, parsing_timeout=_timeout())
    except Exception:  # math-verify and sympy may raise on adversarial input
        return []
    return parsed


def equivalent(gold: list[Any], answer: list[Any]) -> bool:
    from math_verify import verify

    if not gold or not answer:
        return False
    try:
        return bool(verify(gold, answer, timeout_seconds=_timeout()))
    except Exception:  # a failed comparison is a wrong answer, never a crash
        return False


class MATH500(BuiltinSuite):
    name = "math500"
    primary_metric = "accuracy"
    metrics: tuple[str, ...] = ("accuracy", "boxed")
    tokens_per_example = 1200
    score_in_process = True  # symbolic comparisons take up to TIMEOUT_SECONDS: off the loop
    data_file = "math500/test.jsonl.gz"
    fewshot_file = "math500/fewshot.jsonl.gz"

    def arg_specs(self) -> tuple[Arg, ...]:
        levels = Arg(
            "levels", "int_list", None, "difficulty levels to keep (1..5)", 1, 5, nullable=True
        )
        return (num_fewshot_arg(4), SYSTEM_PROMPT_ARG, levels)

    def build(self, args: Mapping[str, Any], seed: int) -> list[Example]:  # noqa: ARG002  # BuiltinSuite.build signature; only shuffling suites read seed
        shots = [
            (INSTRUCTION.format(problem=shot["problem"]), str(shot["solution"]))
            for shot in self.fewshot[: args["num_fewshot"]]
        ]
        levels = set(args["levels"] or (1, 2, 3, 4, 5))
        examples = []
        for record in self.records:
            if record["level"] not in levels:
                continue
            messages = chat(
                INSTRUCTION.format(problem=record["problem"]), shots, args["system_prompt"]
            )
            examples.append(
                Example(
                    id=record["id"],
                    messages=messages,
                    gold=record["answer"],
                    prompt=plain(messages),
                    meta={"level": record["level"]},
                )
            )
        return examples

    def quick_score(self, example: Example, completion: str) -> Score | None:
        """The score when it needs no parse (microseconds): the boxed answer is the reference
        verbatim, or both are plain integers. None when only math-verify can tell."""
        boxed = last_boxed(strip_thinking(completion))
        if boxed is None:
            return None
        gold = str(example.gold).strip()
        if boxed == gold:
            correct = True
        elif _INTEGER.fullmatch(boxed) and _INTEGER.fullmatch(gold):
            correct = int(boxed) == int(gold)
        else:
            return None
        return Score(metrics={"accuracy": float(correct), "boxed": 1.0}, extracted=boxed)

    def score(self, example: Example, completion: str) -> Score:
        quick = self.quick_score(example, completion)
        if quick is not None:
            return quick
        answer = parse_answer(completion)
        correct = equivalent(parse_gold(str(example.gold)), answer)
        boxed = last_boxed(strip_thinking(completion)) is not None
        extracted = str(answer[-1]) if answer else None
        return Score(
            metrics={"accuracy": float(correct), "boxed": float(boxed)}, extracted=extracted
        )

    def reference_completion(self, example: Example) -> str:
        return str(self.record(example)["solution"])

    def wrong_completion(self, example: Example) -> str:
        gold = parse_gold(str(example.gold))
        for candidate in ("0", "1", "-1", "\\frac{1}{7}", "\\text{none}"):
            if not equivalent(gold, parse_gold(candidate)):
                break
        return f"Working through the problem carefully, I get\n$$\\boxed{{{candidate}}}$$"
