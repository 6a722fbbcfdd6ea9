"""An item's failure message never shows an API key: ``mb_eval`` redacts what it reports and
records (a server may echo the key back in an error body)."""

from __future__ import annotations

from typing import Any

from tests.conftest import Project

LEAKY_BACKEND = """
from pytest_modelbench.errors import EvaluationError


class LeakyBackend:
    name = "leaky"

    def primary_metric(self, item):
        return "accuracy"

    def fingerprint_parts(self, item):
        return {"data": "leaky"}

    def count_examples(self, item):
        return 1

    def tokens_per_example(self):
        return 1

    def evaluate(self, ctx):
        raise EvaluationError(
            "endpoint refused the request: HTTP 401 {'error': 'invalid api key "
            "sk-live-0123456789abcdefghij', 'sent': 'Authorization: Bearer tok_0123456789abcdef'}"
        )


def pytest_modelbench_make_backend(config, module):
    return LeakyBackend() if module == "leaky" else None
"""


def test_failure_message_is_redacted_in_output_and_junit(project: Project, sim: Any) -> None:
    server = sim()
    (project.root / "benchmarks" / "conftest.py").write_text(LEAKY_BACKEND)
    project.models({"alpha": {"model": "sim-model", "api_base_url": server.base_url}})
    project.env("leaky", [{"id": "leaky", "module": "leaky"}])
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--junitxml", "j.xml")
    result.assert_outcomes(errors=1)
    output = result.stdout.str() + result.stderr.str()
    junit = (project.root / "j.xml").read_text()
    assert "endpoint refused the request: HTTP 401" in output
    for text in (output, junit):
        assert "sk-live-0123456789abcdefghij" not in text
        assert "tok_0123456789abcdef" not in text
        assert "[REDACTED]" in text
