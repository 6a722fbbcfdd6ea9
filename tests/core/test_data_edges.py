"""Data an item cannot use is one line naming it (issue 43): an empty JSONL file says it has no
rows (not "metric 'exact_match' was not computed; available: exact_match"), and a journal row
whose metric is not a number names that row instead of a ``ValueError`` traceback."""

from __future__ import annotations

import json

from pytest_modelbench.testing.fixtures import SimServerFactory
from tests.conftest import Project, configure


def test_an_empty_jsonl_file_says_it_has_no_rows(project: Project, sim: SimServerFactory) -> None:
    server = sim(accuracy=1.0, lookup={})
    configure(project, server.base_url, n=3)
    (project.root / "qa.jsonl").write_text("\n\n")  # blank lines only
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*env_args.path: qa.jsonl has no rows; write one JSON object per line, e.g. "
            '{"id": "q1", "question": "...", "answer": "..."}'
        ]
    )
    output = result.stdout.str()
    assert "was not computed" not in output and "Traceback" not in output


def test_a_journal_row_with_a_metric_that_is_not_a_number_is_one_line(
    project: Project, sim: SimServerFactory
) -> None:
    configure(project, "http://placeholder", n=5)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    configure(project, server.base_url, n=5)
    args = ("benchmarks/", "--model", "alpha", "--run-id", "r1")
    project.pytester.runpytest(*args).assert_outcomes(passed=1)
    item = project.root / "runs" / "r1" / "alpha-qa-seed0"
    lines = (item / "results.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["metrics"] = {"exact_match": "abc"}
    lines[0] = json.dumps(row)
    (item / "results.jsonl").write_text("\n".join(lines) + "\n")
    for name in ("summary.json", "result.json"):  # as if the run had stopped before its summary
        (item / name).unlink()
    result = project.pytester.runpytest(*args)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            f"results.jsonl: example {row['example_id']!r} (rollout 0): metric 'exact_match' is "
            "'abc', not a number; the journal was edited or written by another tool: delete "
            "that line to evaluate the example again"
        ]
    )
    assert "Traceback" not in result.stdout.str() and "ValueError" not in result.stdout.str()
