"""A journal answers every example it holds, whatever --num-examples says: a larger N asks only
for the new examples, a smaller N asks for nothing, and the summary covers exactly the selection."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import Project, configure


def _completions(server: Any) -> int:
    return sum(1 for r in server.requests if r.path.endswith("completions"))


def _summary(project: Project) -> dict[str, Any]:
    (run_dir,) = project.run_dirs()
    data: dict[str, Any] = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    return data


def test_changing_num_examples_sends_exactly_the_missing_examples(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.5, lookup={}, latency=0.001)
    configure(project, server.base_url, n=100)

    def run(n: int) -> Any:
        server.clear_log()
        result = project.pytester.runpytest(
            "benchmarks/", "--model", "alpha", "--num-examples", str(n)
        )
        result.assert_outcomes(passed=1)
        return result

    run(60)
    assert _completions(server) == 60
    run(80)
    assert _completions(server) == 20  # only the 20 new examples
    assert _summary(project)["metrics"]["exact_match"]["n"] == 80
    smaller = run(40)
    assert _completions(server) == 0  # all 40 are in the journal
    summary = _summary(project)
    assert summary["metrics"]["exact_match"]["n"] == 40 and summary["num_examples"] == 40
    assert "configuration changed" not in smaller.stdout.str()
    run(40)
    assert server.requests == [] or _completions(server) == 0
    assert (
        "(from store)"
        in project.pytester.runpytest(
            "benchmarks/", "--model", "alpha", "--num-examples", "40"
        ).stdout.str()
    )
