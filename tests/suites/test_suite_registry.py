"""The suite registry, env args, prompts, shuffling, and end-to-end scoring of gold answers."""

from __future__ import annotations

import math
import random

import pytest

from pytest_modelbench.suites import BUILTIN_SUITES, load_suite
from pytest_modelbench.suites.contract import Suite, SuiteArgumentError, aggregate_extra

TEXT_SUITES = ["gsm8k", "math500", "medqa", "medmcqa", "pubmedqa", "mmlu", "mmlu-medical"]


def test_registry_names() -> None:
    assert set(BUILTIN_SUITES) == {
        "gsm8k",
        "math500",
        "medqa",
        "medmcqa",
        "pubmedqa",
        "mmlu",
        "mmlu-medical",
        "humaneval",
        "mbpp",
    }


@pytest.mark.parametrize("name", sorted(BUILTIN_SUITES))
def test_every_suite_satisfies_the_contract(name: str) -> None:
    suite = load_suite(name)
    assert isinstance(suite, Suite)
    assert suite.name == name
    assert suite.primary_metric in suite.metrics
    assert suite.tokens_per_example > 0
    assert suite.blocking_score == (name in ("humaneval", "mbpp"))
    example = suite.examples({}, 0)[0]
    assert example.messages[-1]["role"] == "user"
    assert example.prompt and example.last_user_text
    score = suite.score(example, suite.reference_completion(example))
    assert set(score.metrics) == set(suite.metrics)


def test_unknown_suite_suggests_a_name() -> None:
    with pytest.raises(SuiteArgumentError, match=r"'gsm8kk' \(did you mean 'gsm8k'\?\)"):
        load_suite("gsm8kk")


@pytest.mark.parametrize(
    ("name", "env_args", "message"),
    [
        (
            "gsm8k",
            {"num_fewshots": 3},
            r"unknown env arg 'num_fewshots' \(did you mean 'num_fewshot'\?\)",
        ),
        ("gsm8k", {"num_fewshot": 9}, r"'num_fewshot' got 9; expected an integer from 0 to 8"),
        ("gsm8k", {"num_fewshot": "three"}, r"'num_fewshot' got 'three'"),
        ("humaneval", {"num_fewshot": 1}, r"from 0 to 0"),
        (
            "medqa",
            {"shuffle_answers": "maybe"},
            r"'shuffle_answers' got 'maybe'; expected true or false",
        ),
        ("medqa", {"subjects": ["anatomy"]}, r"unknown env arg 'subjects'"),
        ("mmlu", {"subjects": ["anatomyy"]}, r"got 'anatomyy' \(did you mean 'anatomy'\?\)"),
        (
            "mmlu-medical",
            {"subjects": ["astronomy"]},
            r"got 'astronomy'.*expected a list of: anatomy",
        ),
        ("math500", {"levels": [0]}, r"'levels' got 0"),
        ("mbpp", {"timeout": 0}, r"'timeout' got 0"),
    ],
)
def test_bad_env_args_name_the_fix(name: str, env_args: dict[str, object], message: str) -> None:
    with pytest.raises(SuiteArgumentError, match=message):
        load_suite(name).examples(env_args, 0)


def test_mmlu_subjects() -> None:
    mmlu = load_suite("mmlu")
    anatomy = mmlu.examples({"subjects": ["anatomy"]}, 0)
    assert len(anatomy) == 135
    assert all(example.id.startswith("mmlu/test/anatomy/") for example in anatomy)
    assert "about anatomy" in anatomy[0].last_user_text
    two = mmlu.examples({"subjects": "High School Biology, virology"}, 0)
    assert len(two) == 310 + 166
    medical = load_suite("mmlu-medical").examples({}, 0)
    assert {e.meta["subject"] for e in medical} == {
        "anatomy",
        "clinical_knowledge",
        "college_biology",
        "college_medicine",
        "medical_genetics",
        "professional_medicine",
    }
    assert len(load_suite("medmcqa").examples({"subjects": ["dental"]}, 0)) == 1318


@pytest.mark.parametrize(
    ("name", "shots"),
    [
        ("gsm8k", 8),
        ("math500", 4),
        ("medqa", 5),
        ("medmcqa", 5),
        ("mmlu", 5),
        ("pubmedqa", 3),
        ("mbpp", 3),
    ],
)
def test_few_shot_turns(name: str, shots: int) -> None:
    suite = load_suite(name)
    plain = suite.examples({}, 0)[3]
    few = suite.examples({"num_fewshot": shots, "system_prompt": "Be brief."}, 0)[3]
    assert len(plain.messages) == 1
    assert len(few.messages) == 2 * shots + 2
    assert few.messages[0] == {"role": "system", "content": "Be brief."}
    assert [m["role"] for m in few.messages[1:]] == ["user", "assistant"] * shots + ["user"]
    assert few.messages[-1] == plain.messages[-1]
    assert few.id == plain.id
    if name == "mmlu":  # exemplars come from the same subject and never the question itself
        assert plain.last_user_text not in [m["content"] for m in few.messages[1:-1]]


def test_shuffled_options_keep_the_gold_answer() -> None:
    suite = load_suite("medqa")
    original = suite.examples({}, 0)
    seed1 = suite.examples({"shuffle_answers": True}, 1)
    seed1_again = load_suite("medqa").examples({"shuffle_answers": True}, 1)
    seed2 = suite.examples({"shuffle_answers": True}, 2)
    fixed = suite.examples({"shuffle_answers": True, "shuffle_seed": 7}, 1)
    assert [e.gold for e in seed1] == [e.gold for e in seed1_again]  # deterministic
    assert [e.gold for e in seed1] != [e.gold for e in seed2]  # the seed axis matters
    assert [e.gold for e in fixed] == [
        e.gold for e in suite.examples({"shuffle_answers": True, "shuffle_seed": 7}, 99)
    ]
    moved = 0
    for before, after in zip(original, seed1, strict=True):
        assert before.id == after.id
        text = before.gold["options"]["ABCDE".index(before.gold["answer"])]
        assert after.gold["options"]["ABCDE".index(after.gold["answer"])] == text
        assert sorted(after.gold["options"]) == sorted(before.gold["options"])
        assert f"{after.gold['answer']}) {text.strip()}" in after.last_user_text
        moved += after.gold["answer"] != before.gold["answer"]
    assert moved > len(original) * 0.6
    letters = [e.gold["answer"] for e in seed1]
    assert max(letters.count(x) for x in "ABCDE") < 0.3 * len(letters)


def test_examples_are_stable_across_instances() -> None:
    first = load_suite("mmlu").examples({"num_fewshot": 2}, 3)
    second = load_suite("mmlu").examples({"num_fewshot": 2}, 3)
    assert first == second


@pytest.mark.parametrize("name", TEXT_SUITES)
def test_reference_scores_one_and_wrong_scores_zero_on_every_example(name: str) -> None:
    suite = load_suite(name)
    multiple_choice = name in ("medqa", "medmcqa", "mmlu", "mmlu-medical")
    for env_args in ({}, {"shuffle_answers": True}) if multiple_choice else ({},):
        for example in suite.examples(env_args, 5):
            right = suite.score(example, suite.reference_completion(example))
            wrong = suite.score(example, suite.wrong_completion(example))
            assert right.metrics[suite.primary_metric] == 1.0, (example.id, right)
            assert wrong.metrics[suite.primary_metric] == 0.0, (example.id, wrong)


@pytest.mark.parametrize("name", sorted(BUILTIN_SUITES))
def test_simulated_model_with_accuracy_p_scores_p(name: str) -> None:
    """A model that answers the gold with probability p gets p, within sampling noise."""
    suite = load_suite(name)
    examples = list(suite.examples({}, 0))
    rng = random.Random(f"simulate:{name}")
    if name in ("humaneval", "mbpp"):
        examples = rng.sample(examples, 24)
    p = 0.7
    correct = 0
    for example in examples:
        good = rng.random() < p
        completion = (suite.reference_completion if good else suite.wrong_completion)(example)
        score = suite.score(example, completion).metrics[suite.primary_metric]
        assert score == float(good), example.id
        correct += int(score)
    mean = correct / len(examples)
    assert abs(mean - p) < 4 * math.sqrt(p * (1 - p) / len(examples))


def test_aggregate_extra_is_empty_for_single_answer_suites() -> None:
    assert aggregate_extra(load_suite("gsm8k"), {"a": [{"accuracy": 1.0}]}) == {}
    assert aggregate_extra(load_suite("humaneval"), {"a": [{"pass@1": 1.0}] * 2}) == {"pass@2": 1.0}


def test_registry_gives_each_modules_own_class() -> None:
    """Looked up lazily, a name gives the class its module defines (the scoring pool's
    ``BUILTIN_SUITES.get(name) is type(suite)`` check relies on it)."""
    from pytest_modelbench.suites import coding, gsm8k, math500, multiple_choice, pubmedqa

    assert dict(BUILTIN_SUITES) == {
        "gsm8k": gsm8k.GSM8K,
        "math500": math500.MATH500,
        "medqa": multiple_choice.MedQA,
        "medmcqa": multiple_choice.MedMCQA,
        "pubmedqa": pubmedqa.PubMedQA,
        "mmlu": multiple_choice.MMLU,
        "mmlu-medical": multiple_choice.MMLUMedical,
        "humaneval": coding.HumanEval,
        "mbpp": coding.MBPP,
    }
    assert BUILTIN_SUITES.get("mmlu") is type(load_suite("mmlu"))
    assert BUILTIN_SUITES.get("nope") is None and "nope" not in BUILTIN_SUITES
    with pytest.raises(KeyError):
        BUILTIN_SUITES["nope"]


LOOKUP = """
import sys
from pytest_modelbench.backends.registry import known_module_names, resolve_builtin
from pytest_modelbench.running.scoring import in_process_pool
names = known_module_names()
backend = resolve_builtin("mmlu")
assert backend is not None and resolve_builtin("nope") is None
loaded = sorted(
    m for m in sys.modules
    if m.startswith(("pytest_modelbench.suites.", "pytest_modelbench.sandbox"))
)
print("NAMES:" + ",".join(names))
print("LOADED:" + ",".join(loaded))
"""


def test_resolving_one_suite_imports_only_its_module() -> None:
    """A session that runs mmlu does not import the other suites, nor the code suites'
    sandbox (start-up time)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", LOOKUP], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)
    assert lines["NAMES"].split(",") == [
        *sorted([*BUILTIN_SUITES, "jsonl"]),
        "verifiers:<env_id>",
        "lm_eval:<task>",
    ]
    loaded = set(lines["LOADED"].split(","))
    assert "pytest_modelbench.suites.multiple_choice" in loaded
    assert not {m for m in loaded if m.startswith("pytest_modelbench.sandbox")}
    others = {"coding", "gsm8k", "math500", "pubmedqa"}
    assert not {m for m in loaded if m.rsplit(".", 1)[-1] in others}
