"""PubMedQA (expert-labelled test set, 500 questions): yes / no / maybe from an abstract.

The model sees the structured abstract (without its conclusion, which is the
``long_answer``) and the question, and ends with ``Answer: yes|no|maybe``.
Few-shot exemplars come from the non-test half, one per label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_modelbench.suites.args import Arg
from pytest_modelbench.suites.base import SYSTEM_PROMPT_ARG, BuiltinSuite, num_fewshot_arg
from pytest_modelbench.suites.contract import Example, Score
from pytest_modelbench.suites.extract import LABELS, extract_yes_no_maybe
from pytest_modelbench.suites.prompting import chat, plain
from pytest_modelbench.suites.vendored import Record

INSTRUCTION = (
    "Read the abstract and answer the research question with yes, no or maybe. Think briefly "
    'if needed, then give your final answer on the last line as "Answer: yes", "Answer: no" '
    'or "Answer: maybe".\n\nAbstract:\n{abstract}\n\nQuestion: {question}'
)
WRONG = {"yes": "no", "no": "yes", "maybe": "yes"}


def abstract(record: Record) -> str:
    """``BACKGROUND: ...`` paragraphs of the abstract, conclusion excluded."""
    labels = list(record.get("labels") or [])
    parts = []
    for index, text in enumerate(record["contexts"]):
        label = labels[index] if index < len(labels) else ""
        parts.append(f"{label}: {text}" if label else str(text))
    return "\n".join(parts)


class PubMedQA(BuiltinSuite):
    name = "pubmedqa"
    primary_metric = "accuracy"
    metrics: tuple[str, ...] = ("accuracy", "answered")
    tokens_per_example = 700
    data_file = "pubmedqa/test.jsonl.gz"
    fewshot_file = "pubmedqa/fewshot.jsonl.gz"

    def arg_specs(self) -> tuple[Arg, ...]:
        return (num_fewshot_arg(3), SYSTEM_PROMPT_ARG)

    def user_turn(self, record: Record) -> str:
        return INSTRUCTION.format(abstract=abstract(record), question=record["question"])

    def build(self, args: Mapping[str, Any], seed: int) -> list[Example]:  # noqa: ARG002  # BuiltinSuite.build signature; only shuffling suites read seed
        shots = [
            (self.user_turn(shot), f"{shot['long_answer']}\nAnswer: {shot['answer']}")
            for shot in self.fewshot[: args["num_fewshot"]]
        ]
        examples = []
        for record in self.records:
            messages = chat(self.user_turn(record), shots, args["system_prompt"])
            examples.append(
                Example(
                    id=str(record["id"]),
                    messages=messages,
                    gold=record["answer"],
                    prompt=plain(messages) + "Answer:",
                    meta={"pmid": record["pmid"]},
                )
            )
        return examples

    def score(self, example: Example, completion: str) -> Score:
        label = extract_yes_no_maybe(completion)
        return Score(
            metrics={
                "accuracy": float(label == example.gold),
                "answered": float(label in LABELS),
            },
            extracted=label,
        )

    def reference_completion(self, example: Example) -> str:
        return f"{self.record(example)['long_answer']}\nAnswer: {example.gold}"

    def wrong_completion(self, example: Example) -> str:
        return f"{self.record(example)['long_answer']}\nAnswer: {WRONG[str(example.gold)]}"
