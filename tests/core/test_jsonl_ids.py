"""Duplicate ids in a jsonl data set are refused: results are kept per id, so one would be lost."""

from __future__ import annotations

import json

import pytest

from tests.conftest import Project


def test_duplicate_ids_are_refused_naming_both_lines(project: Project) -> None:
    rows = [
        {"id": "q1", "question": "1 + 1?", "answer": "2"},
        {"id": "q2", "question": "2 + 2?", "answer": "4"},
        {"id": "q1", "question": "3 + 3?", "answer": "6"},
    ]
    (project.root / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    project.models({"alpha": {"model": "m", "api_base_url": "http://127.0.0.1:9/v1"}})
    plan = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--collect-only")
    plan.stdout.fnmatch_lines(
        ["*?*qa.jsonl: line 3: id 'q1' is also on line 1; ids must be unique*"]
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*qa.jsonl: line 3: id 'q1' is also on line 1; ids must be unique*"]
    )
    assert "Traceback" not in result.stdout.str()
