"""Multiple-choice suites: MedQA (5 options), MedMCQA, MMLU and its medical subset.

The prompt lists the options as ``A) ...`` and asks for ``Answer: X`` on the
last line; :func:`~pytest_modelbench.suites.extract.extract_choice` reads the
letter robustly. With ``shuffle_answers`` the options are permuted per
example from ``shuffle_seed`` (default: the item seed, so the seed axis means
"another ordering") and the gold letter follows its option.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from pytest_modelbench.suites.args import Arg
from pytest_modelbench.suites.base import SYSTEM_PROMPT_ARG, BuiltinSuite, num_fewshot_arg
from pytest_modelbench.suites.contract import Example, Score
from pytest_modelbench.suites.extract import extract_choice
from pytest_modelbench.suites.prompting import chat, format_options, letter_list, letters_for, plain
from pytest_modelbench.suites.selection import LazyExamples
from pytest_modelbench.suites.vendored import Record

INSTRUCTION = (
    "The following is a multiple-choice question{about}. Think step by step if needed, then "
    'give your final answer on the last line in the form "Answer: X", where X is {letters}.'
    "\n\n{question}\n\n{options}"
)

MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge",
    "college_biology", "college_chemistry", "college_computer_science", "college_mathematics",
    "college_medicine", "college_physics", "computer_security", "conceptual_physics",
    "econometrics", "electrical_engineering", "elementary_mathematics", "formal_logic",
    "global_facts", "high_school_biology", "high_school_chemistry",
    "high_school_computer_science", "high_school_european_history", "high_school_geography",
    "high_school_government_and_politics", "high_school_macroeconomics",
    "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history",
    "high_school_world_history", "human_aging", "human_sexuality", "international_law",
    "jurisprudence", "logical_fallacies", "machine_learning", "management", "marketing",
    "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
    "philosophy", "prehistory", "professional_accounting", "professional_law",
    "professional_medicine", "professional_psychology", "public_relations",
    "security_studies", "sociology", "us_foreign_policy", "virology", "world_religions",
)  # fmt: skip
# the six MMLU clinical topics of MultiMedQA (Singhal et al., 2023)
MMLU_MEDICAL = (
    "anatomy",
    "clinical_knowledge",
    "college_biology",
    "college_medicine",
    "medical_genetics",
    "professional_medicine",
)
MEDMCQA_SUBJECTS = (
    "Anaesthesia", "Anatomy", "Biochemistry", "Dental", "ENT", "Forensic Medicine",
    "Gynaecology & Obstetrics", "Medicine", "Microbiology", "Ophthalmology", "Orthopaedics",
    "Pathology", "Pediatrics", "Pharmacology", "Physiology", "Psychiatry", "Radiology",
    "Skin", "Social & Preventive Medicine", "Surgery", "Unknown",
)  # fmt: skip


def subject_slug(value: str) -> str:
    """``"High School Biology"`` / ``"high-school-biology"`` -> ``"high_school_biology"``."""
    return "_".join(value.strip().lower().replace("-", " ").split())


def _medmcqa_name(value: str) -> str:
    wanted = subject_slug(value)
    return next((s for s in MEDMCQA_SUBJECTS if subject_slug(s) == wanted), value)


def permutation(count: int, seed: int, example_id: str) -> list[int]:
    """Deterministic option order for one example (string seeding is stable across runs)."""
    order = list(range(count))
    random.Random(f"{seed}:{example_id}").shuffle(order)
    return order


class MultipleChoiceSuite(BuiltinSuite):
    """One option-letter benchmark; the class attributes say which data and subjects."""

    primary_metric = "accuracy"
    metrics: tuple[str, ...] = ("accuracy", "answered")
    tokens_per_example = 400
    version = "2"  # 2: quoted letters, "... is E." and a last sentence naming one option are read
    topic = ""  # "about medicine" in the instruction; per-subject for MMLU
    max_fewshot = 5
    subjects: tuple[str, ...] | None = None  # allowed values of the ``subjects`` env arg
    default_subjects: tuple[str, ...] | None = None
    subject_field = "subject"

    def subject_normaliser(self, value: str) -> str:
        return subject_slug(value)

    def arg_specs(self) -> tuple[Arg, ...]:
        specs = [
            num_fewshot_arg(self.max_fewshot),
            SYSTEM_PROMPT_ARG,
            Arg("shuffle_answers", "bool", False, "permute the options of every question"),
            Arg(
                "shuffle_seed",
                "int",
                None,
                "seed of the permutation (default: the item seed)",
                nullable=True,
            ),
        ]
        if self.subjects is not None:
            specs.append(
                Arg(
                    "subjects",
                    "str_list",
                    self.default_subjects,
                    "keep only these subjects",
                    choices=self.subjects,
                    normalise=self.subject_normaliser,
                    nullable=True,
                )
            )
        return tuple(specs)

    def uses_seed(self, args: Mapping[str, Any]) -> bool:
        return bool(args["shuffle_answers"]) and args["shuffle_seed"] is None

    def about(self, record: Record) -> str:  # noqa: ARG002  # MMLU overrides it per record
        return f" about {self.topic}" if self.topic else ""

    def user_turn(self, record: Record, options: Sequence[str]) -> str:
        letters = letters_for(options)
        return INSTRUCTION.format(
            about=self.about(record),
            letters=letter_list(letters),
            question=str(record["question"]).strip(),
            options=format_options(options, letters),
        )

    def shots_for(self, record: Record, count: int) -> list[tuple[str, str]]:  # noqa: ARG002  # MMLU overrides it per record
        return [
            (self.user_turn(shot, shot["options"]), f"Answer: {shot['answer']}")
            for shot in self.fewshot[:count]
        ]

    def selected(self, args: Mapping[str, Any]) -> list[Record]:
        """The records of the wanted subjects, in file order."""
        records = self.records
        return [records[index] for index in self._selected_indexes(args)]

    def _selected_indexes(self, args: Mapping[str, Any]) -> Sequence[int]:
        """Positions of :meth:`selected`'s records, read from the subject column alone."""
        wanted = args.get("subjects") or self.default_subjects
        if not wanted:
            return range(len(self.records))
        keep = set(wanted)
        subjects = self.records.column(self.subject_field)
        return [index for index, subject in enumerate(subjects) if subject in keep]

    def build(self, args: Mapping[str, Any], seed: int) -> LazyExamples[Example]:
        """Made on use: ``--num-examples`` parses and formats only the records it runs."""
        shuffle_seed = args["shuffle_seed"] if args["shuffle_seed"] is not None else seed
        records = self.records
        indexes = self._selected_indexes(args)
        subjects = records.column(self.subject_field)
        strata = [str(subjects[index]) for index in indexes]  # meta["subject"]
        return LazyExamples(
            strata, lambda at: self._example(records[indexes[at]], args, shuffle_seed)
        )

    def _example(self, record: Record, args: Mapping[str, Any], shuffle_seed: int) -> Example:
        options = list(record["options"])
        letters = letters_for(options)
        gold_index = letters.index(str(record["answer"]))
        order = None
        if args["shuffle_answers"]:
            order = permutation(len(options), shuffle_seed, str(record["id"]))
            options = [options[i] for i in order]
            gold_index = order.index(gold_index)
        shots = self.shots_for(record, args["num_fewshot"])
        messages = chat(self.user_turn(record, options), shots, args["system_prompt"])
        meta: dict[str, Any] = {"subject": record.get(self.subject_field)}
        if order is not None:
            meta["permutation"] = order
        return Example(
            id=str(record["id"]),
            messages=messages,
            gold={"answer": letters[gold_index], "options": options},
            prompt=plain(messages) + "Answer:",
            meta=meta,
        )

    def score(self, example: Example, completion: str) -> Score:
        gold = example.gold
        letter = extract_choice(completion, gold["options"])
        return Score(
            metrics={
                "accuracy": float(letter == gold["answer"]),
                "answered": float(letter is not None),
            },
            extracted=letter,
        )

    def reference_completion(self, example: Example) -> str:
        gold = example.gold
        text = gold["options"][letters_for(gold["options"]).index(gold["answer"])]
        return f"Weighing each option, the best supported one is: {text}\nAnswer: {gold['answer']}"

    def wrong_completion(self, example: Example) -> str:
        letters = letters_for(example.gold["options"])
        wrong = letters[(letters.index(example.gold["answer"]) + 1) % len(letters)]
        return f"Weighing each option, I would pick ({wrong}).\nAnswer: {wrong}"


class MedQA(MultipleChoiceSuite):
    name = "medqa"
    tokens_per_example = 600
    topic = "medicine"
    data_file = "medqa/test.jsonl.gz"
    fewshot_file = "medqa/fewshot.jsonl.gz"


class MedMCQA(MultipleChoiceSuite):
    name = "medmcqa"
    tokens_per_example = 350
    topic = "medicine"
    data_file = "medmcqa/validation.jsonl.gz"
    fewshot_file = "medmcqa/fewshot.jsonl.gz"
    subjects: tuple[str, ...] | None = MEDMCQA_SUBJECTS

    def subject_normaliser(self, value: str) -> str:
        return _medmcqa_name(value)


class MMLU(MultipleChoiceSuite):
    """MMLU; there is no dev split in the vendored data, so few-shot exemplars are the
    first other questions of the same subject (in file order)."""

    name = "mmlu"
    tokens_per_example = 400
    data_file = "mmlu/test.jsonl.gz"
    subjects: tuple[str, ...] | None = MMLU_SUBJECTS

    def about(self, record: Record) -> str:
        return " about " + str(record["subject"]).replace("_", " ")

    def shots_for(self, record: Record, count: int) -> list[tuple[str, str]]:
        if count == 0:
            return []
        pool = self._by_subject.get(str(record["subject"]), [])
        chosen = [other for other in pool if other["id"] != record["id"]][:count]
        return [(self.user_turn(o, o["options"]), f"Answer: {o['answer']}") for o in chosen]

    @cached_property
    def _by_subject(self) -> dict[str, list[Record]]:
        records = self.records
        groups: dict[str, list[Record]] = {}
        for index, subject in enumerate(records.column("subject")):
            if len(groups.get(str(subject), ())) < self.max_fewshot + 1:
                groups.setdefault(str(subject), []).append(records[index])
        return groups


class MMLUMedical(MMLU):
    name = "mmlu-medical"
    subjects: tuple[str, ...] | None = MMLU_MEDICAL
    default_subjects: tuple[str, ...] | None = MMLU_MEDICAL
