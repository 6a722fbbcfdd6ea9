"""GSM8K (grade-school math word problems, 1319 test questions), scored like lm-eval.

Two extractions, as lm-eval's two filters: *strict* reads only an explicit
final-answer format (``#### N``, "The answer is N", ``\\boxed{N}``); *flexible*
takes the last number in the reply. ``accuracy`` (primary) uses the strict
answer when there is one and the flexible one otherwise. Numbers compare as
decimals, so ``18``, ``18.00``, ``$18`` and ``\\frac{36}{2}`` are all 18.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pytest_modelbench.suites.args import Arg
from pytest_modelbench.suites.base import SYSTEM_PROMPT_ARG, BuiltinSuite, num_fewshot_arg
from pytest_modelbench.suites.contract import Example, Score
from pytest_modelbench.suites.extract import (
    extract_last_number,
    extract_strict_number,
    numbers_equal,
)
from pytest_modelbench.suites.prompting import chat, plain

INSTRUCTION = (
    "Solve the following math word problem. Reason step by step, then give the final "
    'answer as a plain number on the last line, in the form "#### <number>".\n\n'
    "Question: {question}"
)


def clean_solution(solution: str) -> str:
    """GSM8K solutions without the ``<<48/2=24>>`` calculator annotations."""
    return re.sub(r"<<[^>]*>>", "", solution)


class GSM8K(BuiltinSuite):
    name = "gsm8k"
    primary_metric = "accuracy"
    metrics: tuple[str, ...] = ("accuracy", "exact_match_strict", "exact_match_flexible")
    tokens_per_example = 450
    data_file = "gsm8k/test.jsonl.gz"
    fewshot_file = "gsm8k/fewshot.jsonl.gz"

    def arg_specs(self) -> tuple[Arg, ...]:
        return (num_fewshot_arg(8), SYSTEM_PROMPT_ARG)

    def build(self, args: Mapping[str, Any], seed: int) -> list[Example]:  # noqa: ARG002  # BuiltinSuite.build signature; only shuffling suites read seed
        shots = [
            (
                INSTRUCTION.format(question=shot["question"]),
                f"{shot['reasoning']}\n#### {shot['answer']}",
            )
            for shot in self.fewshot[: args["num_fewshot"]]
        ]
        examples = []
        for record in self.records:
            messages = chat(
                INSTRUCTION.format(question=record["question"]), shots, args["system_prompt"]
            )
            examples.append(
                Example(
                    id=record["id"],
                    messages=messages,
                    gold=record["answer"],
                    prompt=plain(messages),
                )
            )
        return examples

    def score(self, example: Example, completion: str) -> Score:
        gold = str(example.gold)
        strict = extract_strict_number(completion)
        flexible = extract_last_number(completion)
        chosen = strict if strict is not None else flexible
        return Score(
            metrics={
                "accuracy": float(numbers_equal(chosen, gold)),
                "exact_match_strict": float(numbers_equal(strict, gold)),
                "exact_match_flexible": float(numbers_equal(flexible, gold)),
            },
            extracted=chosen,
            detail={"strict": strict, "flexible": flexible},
        )

    def reference_completion(self, example: Example) -> str:
        return clean_solution(str(self.record(example)["solution"]))

    def wrong_completion(self, example: Example) -> str:
        wrong = int(str(example.gold)) + 1
        return f"Let me add everything up step by step.\nSo the answer is {wrong}.\n#### {wrong}"
