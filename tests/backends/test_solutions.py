"""Solution files: completions generated elsewhere, scored by the built-in suites with no server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_modelbench.suites import BUILTIN_SUITES
from tests.conftest import Project

N = 40


def _write(path: Path, lines: list[Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))


def _gsm8k_solutions(project: Project) -> dict[str, float]:
    """Two shard files for the first N gsm8k examples (every third wrong, one missing) plus bad
    lines; returns the accuracy each example should get."""
    suite = BUILTIN_SUITES["gsm8k"]()
    examples = list(suite.examples({}, 0))[:N]
    expected: dict[str, float] = {}
    rows: list[Any] = []
    for i, example in enumerate(examples[:-1]):  # the last example has no solution
        right = i % 3 != 0
        text = suite.reference_completion(example) if right else suite.wrong_completion(example)
        key = "example_id" if i % 2 else "id"  # both spellings are accepted
        rows.append({key: example.id, "completion": text})
        expected[example.id] = suite.score(example, text).metrics["accuracy"]
    half = len(rows) // 2
    _write(
        project.root / "sols" / "part-0.jsonl",
        [
            *rows[:half],
            "{not json",
            {"id": examples[1].id},  # no completion
            {"id": "gsm8k/test/nope", "completion": "#### 1"},  # not in the suite
        ],
    )
    _write(project.root / "sols" / "part-1.jsonl", [*rows[half:], rows[0], "[1, 2]"])  # duplicate
    return expected


def test_solution_files_scored_without_server_bad_lines_reported(project: Project) -> None:
    expected = _gsm8k_solutions(project)
    project.models({"external": {"solutions": "sols/*.jsonl"}})  # no model, no endpoint, no serve
    project.env("gsm8k", [{"id": "gsm8k", "module": "gsm8k", "num_examples": N}])
    result = project.pytester.runpytest("benchmarks/", "--model", "external")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*SolutionsWarning*external-gsm8k-seed0: 5 problem(s) in solution files*"]
    )
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "external-gsm8k-seed0" / "summary.json").read_text())
    accuracy = summary["metrics"]["accuracy"]
    assert accuracy["n"] == N - 1 and summary["errors"] == 1  # the missing example is an error row
    assert accuracy["value"] == sum(expected.values()) / len(expected)
    problems = summary["solutions"]["problem_lines"]
    assert len(problems) == summary["solutions"]["problems"] == 5
    text = "\n".join(problems)
    for fragment in (
        "part-0.jsonl:",
        "invalid JSON",
        "'completion' must be a string",
        "'gsm8k/test/nope' is not in this suite",
        "duplicate of",
        "expected a JSON object",
    ):
        assert fragment in text
    rows = [
        json.loads(line) for line in (run_dir / "external-gsm8k-seed0" / "results.jsonl").open()
    ]
    missing = [r for r in rows if r["error"]]
    assert len(rows) == N and len(missing) == 1 and "no solution for example" in missing[0]["error"]
    assert all(r["source"].startswith(str(project.root / "sols")) for r in rows if not r["error"])


def test_solution_mapping_reuse_and_changed_file_rescored(project: Project) -> None:
    """Mapping form (env → glob) over the generic jsonl suite; a rerun reuses the finished item,
    a changed solution file changes the fingerprint and is scored again."""
    project.qa("qa", 6)
    sols = project.root / "sols" / "qa.jsonl"
    _write(
        sols, [{"id": f"qa{i}", "completion": f"Answer: {i + 1 if i < 4 else 0}"} for i in range(6)]
    )
    project.models({"offline": {"solutions": {"qa": "sols/qa.jsonl"}, "max_concurrent": 2}})
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    first = project.pytester.runpytest("benchmarks/", "--model", "offline")
    first.assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    summary_path = run_dir / "offline-qa-seed0" / "summary.json"
    assert json.loads(summary_path.read_text())["metrics"]["exact_match"]["value"] == 4 / 6
    again = project.pytester.runpytest("benchmarks/", "--model", "offline")
    again.assert_outcomes(passed=1)
    assert json.loads(summary_path.read_text())["metrics"]["exact_match"]["value"] == 4 / 6
    _write(sols, [{"id": f"qa{i}", "completion": f"Answer: {i + 1}"} for i in range(6)])
    changed = project.pytester.runpytest("benchmarks/", "--model", "offline")
    changed.assert_outcomes(passed=1)
    assert json.loads(summary_path.read_text())["metrics"]["exact_match"]["value"] == 1.0


def test_no_matching_files_is_one_clear_failure(project: Project) -> None:
    project.qa("qa", 3)
    project.models({"offline": {"solutions": "nowhere/*.jsonl"}})
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    result = project.pytester.runpytest("benchmarks/", "--model", "offline")
    result.assert_outcomes(errors=1)  # the mb_eval fixture fails: one paragraph, no traceback
    result.stdout.fnmatch_lines(["*models.offline.solutions: 'nowhere/*.jsonl' matches no file*"])
    assert "Traceback" not in result.stdout.str()


def _humaneval_solutions(project: Project, n: int = 3) -> None:
    suite = BUILTIN_SUITES["humaneval"]()
    examples = list(suite.examples({}, 0))[:n]
    _write(
        project.root / "sols" / "he.jsonl",
        [{"id": ex.id, "completion": suite.reference_completion(ex)} for ex in examples],
    )
    project.models({"external": {"solutions": "sols/*.jsonl"}})
    project.env("humaneval", [{"id": "humaneval", "module": "humaneval", "num_examples": n}])


def test_a_code_suite_states_its_isolation_level(project: Project) -> None:
    _humaneval_solutions(project)
    project.pytester.runpytest("benchmarks/", "--model", "external").assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "external-humaneval-seed0" / "summary.json").read_text())
    assert summary["metrics"]["pass@1"]["value"] == 1.0
    assert summary["sandbox"]["isolation"] in ("bwrap", "namespaces")
    assert summary["sandbox"]["full"] is True
    level = summary["sandbox"]["isolation"]
    page = (run_dir / "report.html").read_text()
    assert f"generated code ran in the sandbox: {level}<" in page


def test_a_code_suite_refuses_the_audit_hook_alone_before_scoring(
    project: Project, monkeypatch: Any
) -> None:
    _humaneval_solutions(project)
    monkeypatch.setenv("MODELBENCH_SANDBOX_ISOLATION", "audit-hook")
    monkeypatch.delenv("MODELBENCH_ALLOW_WEAK_SANDBOX", raising=False)
    result = project.pytester.runpytest_subprocess("benchmarks/", "--model", "external")
    result.assert_outcomes(errors=1)  # the mb_eval fixture fails: one line, no traceback
    result.stdout.fnmatch_lines(["external-humaneval-seed0: humaneval: *--mb-allow-weak-sandbox*"])
    (run_dir,) = project.run_dirs()
    assert not (run_dir / "external-humaneval-seed0" / "results.jsonl").exists()  # nothing scored
    accepted = project.pytester.runpytest_subprocess(
        "benchmarks/", "--model", "external", "--mb-allow-weak-sandbox"
    )
    accepted.assert_outcomes(passed=1)  # the user accepted the audit hook, and is told so
    accepted.stdout.fnmatch_lines(["*audit*hook*"])
