"""HumanEval and MBPP: reference solutions pass in the sandbox, realistic replies score right."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from pytest_modelbench.sandbox import ExecutionResult, Sandbox
from pytest_modelbench.suites.coding import MBPP, CodeSuite, HumanEval, pass_at_k
from pytest_modelbench.suites.contract import Example
from pytest_modelbench.suites.extract import extract_code

HE0_BODY = """    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False
"""
HE0_FUNCTION = "def has_close_elements(numbers, threshold):\n" + HE0_BODY


def _humaneval0() -> tuple[HumanEval, Example]:
    suite = HumanEval()
    return suite, suite.examples({}, 0)[0]


@pytest.mark.parametrize(
    ("completion", "passes"),
    [
        (f"```python\n{HE0_FUNCTION}```", True),
        (
            f"Here is the solution:\n\n```python\nfrom typing import List\n\n{HE0_FUNCTION}```\n",
            True,
        ),
        (f"```py\n{HE0_FUNCTION}```\nThis runs in O(n^2).", True),
        (HE0_BODY, True),  # completions endpoint: a continuation of the prompt
        (f"<think>use two loops</think>\n```python\n{HE0_FUNCTION}```", True),
        (
            "First a helper:\n```python\ndef dist(a, b):\n    return abs(a - b)\n```\n"
            f"Then:\n```python\n{HE0_FUNCTION}```",
            True,
        ),
        (
            f"```python\n{HE0_FUNCTION}```\nUsage:\n"
            "```python\nprint(has_close_elements([1.0], 0.5))\n```",
            True,
        ),
        (f"```python\n{HE0_FUNCTION}", True),  # truncated before the closing fence
        (
            "```python\ndef has_close_elements(numbers, threshold):\n"
            "    s = sorted(numbers)\n"
            "    return any(b - a < threshold for a, b in zip(s, s[1:]))\n```",
            True,
        ),
        ("```python\ndef has_close_elements(numbers, threshold):\n    return False\n```", False),
        ("```python\ndef has_close_elements(numbers, threshold)\n    return True\n```", False),
        (
            "```python\ndef has_close_elements(numbers, threshold):\n    while True: pass\n```",
            False,
        ),
        ("I cannot help with that.", False),
        ("", False),
        ("```python\nimport os\nos._exit(0)\n```", False),  # exit before the tests run
        ("```python\nimport sys\nsys.exit(0)\n```", False),
        ("<think>I should write a loop that", False),
    ],
)
def test_humaneval_scoring_of_realistic_replies(completion: str, passes: bool) -> None:
    suite, example = _humaneval0()
    example = Example(
        id=example.id,
        messages=example.messages,
        gold={**example.gold, "timeout": 2},
        prompt=example.prompt,
    )
    score = suite.score(example, completion)
    assert score.metrics["pass@1"] == float(passes), score.detail
    assert score.detail["status"] in ("passed", "failed", "timeout", "crashed")


def test_code_extraction_prefers_the_block_that_defines_the_function() -> None:
    reply = "```python\nprint('demo')\n```\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(reply, "f").startswith("def f(x)")
    assert extract_code(reply, None) == "print('demo')\n"
    assert extract_code("    return 1\n") == "    return 1\n"  # indentation kept


def test_mbpp_scoring_of_realistic_replies() -> None:
    suite = MBPP()
    example = suite.examples({}, 0)[0]  # mbpp/test/11: remove_Occ
    assert example.gold["entry_point"] == "remove_Occ"
    good = (
        "```python\ndef remove_Occ(s, ch):\n    i = s.find(ch)\n    if i >= 0:\n"
        "        s = s[:i] + s[i + 1:]\n    j = s.rfind(ch)\n    if j >= 0:\n"
        "        s = s[:j] + s[j + 1:]\n    return s\n```"
    )
    bad = "```python\ndef remove_Occ(s, ch):\n    return s[1:-1]\n```"
    assert suite.score(example, good).metrics["pass@1"] == 1.0
    failed = suite.score(example, bad)
    assert failed.metrics["pass@1"] == 0.0
    assert failed.detail["status"] == "failed" and "AssertionError" in failed.detail["judge_tail"]


def test_all_humaneval_references_pass(sandbox: Sandbox) -> None:
    suite = HumanEval()
    examples = suite.examples({}, 0)
    programs = [suite.program_and_code(e, suite.reference_completion(e))[0] for e in examples]
    results = sandbox.run_many(programs)
    failures = [(e.id, r.reason) for e, r in zip(examples, results, strict=True) if not r.passed]
    assert len(examples) == 164
    assert failures == []


def test_humaneval_wrong_completions_fail(sandbox: Sandbox) -> None:
    suite = HumanEval()
    examples = suite.examples({}, 0)[::4]
    programs = [suite.program_and_code(e, suite.wrong_completion(e))[0] for e in examples]
    assert not any(result.passed for result in sandbox.run_many(programs))


@pytest.mark.slow
def test_mbpp_references_pass(sandbox: Sandbox) -> None:
    suite = MBPP()
    examples = suite.examples({}, 0)
    programs = [suite.program_and_code(e, suite.reference_completion(e))[0] for e in examples]
    results = sandbox.run_many(programs)
    failures = [(e.id, r.reason) for e, r in zip(examples, results, strict=True) if not r.passed]
    assert len(examples) == 500
    assert len(failures) <= 1, failures


def test_mbpp_wrong_completions_fail(sandbox: Sandbox) -> None:
    suite = MBPP()
    examples = suite.examples({}, 0)[::10]
    programs = [suite.program_and_code(e, suite.wrong_completion(e))[0] for e in examples]
    assert not any(result.passed for result in sandbox.run_many(programs))


def _judged(
    sandbox: Sandbox, suite: CodeSuite, examples: list[Example], reference: bool
) -> list[ExecutionResult]:
    """Run each example's reference (or wrong) completion as scoring does: tests by the judge."""
    make = suite.reference_completion if reference else suite.wrong_completion
    parts = [suite.program_and_tests(e, make(e))[:2] for e in examples]
    with ThreadPoolExecutor(max_workers=sandbox.workers) as pool:
        return list(pool.map(lambda part: sandbox.run_tests(*part), parts))


def test_all_humaneval_references_pass_the_judge(sandbox: Sandbox) -> None:
    suite = HumanEval()
    examples = suite.examples({}, 0)
    results = _judged(sandbox, suite, examples, reference=True)
    failures = [(e.id, r.reason) for e, r in zip(examples, results, strict=True) if not r.passed]
    assert len(examples) == 164
    assert failures == []
    assert all(r.tests == {"total": 1, "passed": 1, "calls": r.tests["calls"]} for r in results)


def test_humaneval_wrong_completions_fail_the_judge(sandbox: Sandbox) -> None:
    suite = HumanEval()
    examples = suite.examples({}, 0)[::4]
    results = _judged(sandbox, suite, examples, reference=False)
    assert not any(result.passed for result in results)
    assert {result.status for result in results} == {"failed"}


@pytest.mark.slow
def test_all_mbpp_references_pass_the_judge(sandbox: Sandbox) -> None:
    suite = MBPP()
    examples = suite.examples({}, 0)
    results = _judged(sandbox, suite, examples, reference=True)
    failures = [(e.id, r.reason) for e, r in zip(examples, results, strict=True) if not r.passed]
    assert len(examples) == 500
    assert failures == []


def test_mbpp_judge_handles_builtin_names_counters_and_the_programs_objects(
    sandbox: Sandbox,
) -> None:
    """mbpp/test/126 tests a function named ``sum``, /40 returns a ``Counter``, /367 passes
    trees built from the reply's own ``Node`` class: all work across the judge's boundary."""
    suite = MBPP()
    examples = [
        e
        for e in suite.examples({}, 0)
        if e.id in {"mbpp/test/40", "mbpp/test/126", "mbpp/test/367"}
    ]
    results = _judged(sandbox, suite, examples, reference=True)
    assert [r.reason for r in results] == ["3 of 3 tests passed"] * 3


def test_mbpp_wrong_completions_fail_the_judge(sandbox: Sandbox) -> None:
    suite = MBPP()
    examples = suite.examples({}, 0)[::10]
    assert not any(r.passed for r in _judged(sandbox, suite, examples, reference=False))


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 3, 1, 0.3),
        (10, 0, 1, 0.0),
        (5, 5, 5, 1.0),
        (5, 0, 5, 0.0),
        (5, 1, 5, 1.0),
        (10, 5, 2, 1 - math.comb(5, 2) / math.comb(10, 2)),
        (20, 4, 10, 1 - math.comb(16, 10) / math.comb(20, 10)),
    ],
)
def test_unbiased_pass_at_k(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_aggregate_adds_pass_at_k_for_rollouts() -> None:
    rows = {
        "a": [{"pass@1": 1.0}, {"pass@1": 0.0}, {"pass@1": 0.0}, {"pass@1": 0.0}, {"pass@1": 1.0}],
        "b": [{"pass@1": 0.0}] * 5,
    }
    result = HumanEval().aggregate(rows)
    assert set(result) == {"pass@2", "pass@5"}
    assert result["pass@2"] == pytest.approx((1 - math.comb(3, 2) / math.comb(5, 2)) / 2)
    assert result["pass@5"] == pytest.approx(0.5)
    assert HumanEval().aggregate({"a": [{"pass@1": 1.0}]}) == {}
