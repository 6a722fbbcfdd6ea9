"""An item's summary is what its journal file gives, whether this process wrote the rows (held
in memory) or an earlier session did (resumed), failed examples redone; and pyarrow's import
for session end starts once per item that sends requests, never for one read from the store."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.backends.jsonl_suite import JsonlSuite
from pytest_modelbench.running import prefetch
from pytest_modelbench.running.summary import summarise_rows
from pytest_modelbench.store.journal import Journal
from tests.conftest import Project, configure

N = 30


def assert_summary_is_the_files(item_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((item_dir / "summary.json").read_text())
    read = summarise_rows(
        Journal(item_dir / "results.jsonl").latest(), JsonlSuite.metrics, summary["expected"]
    )
    selection = json.loads((item_dir / "selection.json").read_text())["keys"]
    assert selection == [list(key) for key in read.selected or ()]  # kept beside it
    assert json.dumps({key: summary[key] for key in read}, sort_keys=True) == json.dumps(
        read.to_json(), sort_keys=True
    )
    return summary


def test_summary_of_a_resumed_item_with_redone_errors_is_the_journal_files(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.6, lookup={}, faults={"error_5xx": 0.4}, seed=3)
    configure(project, server.base_url, n=N, max_retries=0)
    # over the error budget: the item fails, and the same command redoes the failed examples
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(errors=1)
    (run_dir,) = project.run_dirs()
    item_dir = run_dir / "alpha-qa-seed0"
    first = assert_summary_is_the_files(item_dir)
    assert 0 < first["errors"] < N

    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(errors=1)
    second = assert_summary_is_the_files(item_dir)
    assert second["resumed_examples"] == N - first["errors"]
    assert second["n_rows"] == N and second["errors"] < first["errors"]


def test_session_end_import_starts_once_per_item_that_sends_requests(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = sim(accuracy=0.6, lookup={}, latency=0.05)  # the loop waits on each batch
    configure(project, server.base_url, n=N)
    started: list[Sequence[str]] = []
    monkeypatch.setattr(prefetch, "prefetch", started.append)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    # (the item's start-up may import other modules beside it: only pyarrow's is counted)
    assert [modules for modules in started if "pyarrow" in modules] == [
        prefetch.SESSION_END_MODULES
    ]

    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["alpha*qa*(from store)"])
    assert len([modules for modules in started if "pyarrow" in modules]) == 1
