"""Every built-in suite through the real runner: a simulated model of accuracy p scores p.

The simulator answers each suite's reference completion with probability p
(deterministically per question and request seed) and a wrong one otherwise,
so extraction and scoring are checked end to end against a known truth.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.suites import load_suite
from pytest_modelbench.suites.selection import select_examples
from pytest_modelbench.testing import SimConfig, SimServer, is_correct, lookup_from_examples

BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"
P = 0.7
CASES = [
    ("gsm8k", 300),
    ("math500", 200),
    ("medqa", 300),
    ("medmcqa", 300),
    ("pubmedqa", 300),
    ("mmlu", 300),
    ("mmlu-medical", 300),
    pytest.param("humaneval", 164, marks=pytest.mark.slow),
    pytest.param("mbpp", 150, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("suite_name", "n"), CASES)
def test_suite_scores_known_accuracy(pytester: pytest.Pytester, suite_name: str, n: int) -> None:
    suite = load_suite(suite_name)
    examples = select_examples(suite.examples({}, 0), n)  # what --num-examples n runs
    lookup = lookup_from_examples(examples, suite.reference_completion, suite.wrong_completion)
    (pytester.path / "benchmarks").mkdir()
    (pytester.path / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    with SimServer(SimConfig(accuracy=P, lookup=lookup, slots=32)) as server:
        result = pytester.runpytest(
            "benchmarks/",
            "--model",
            "sim-model",
            "--api-base-url",
            server.base_url,
            "--env",
            suite_name,
            "--num-examples",
            str(n),
            "--max-concurrent",
            "32",
        )
        answered = [r for r in server.requests if r.path.endswith("completions")]
    result.assert_outcomes(passed=1)
    (summary_path,) = Path(pytester.path, "runs").glob(
        f"*/sim-model-{suite_name}-seed0/summary.json"
    )
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    metric = summary["metrics"][summary["primary_metric"]]
    assert summary["errors"] == 0 and metric["n"] == n
    # exactly the fraction the simulator answered correctly ...
    truth = sum(is_correct(r.key, r.seed, P) for r in answered) / len(answered)
    assert len(answered) == n and metric["value"] == pytest.approx(truth, abs=1e-12)
    # ... which is p up to sampling noise
    assert abs(metric["value"] - P) < 4 * math.sqrt(P * (1 - P) / n)
