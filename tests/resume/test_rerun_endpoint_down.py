"""Re-reporting a finished run needs no network and never damages it: with its endpoint down,
finished items recorded at the same URL are reported from the store, marked as not checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import UNREACHABLE_URL, Project, configure, manifest

ITEMS = ("alpha-qa-seed0", "alpha-qa-seed1")


def _finished_run(project: Project, sim: Any) -> tuple[Any, Path]:
    """Two items at a simulated server, passing a floor; returns (server, run directory)."""
    project.qa("qa", 10)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"), latency=0.001)
    configure(project, server.base_url, n=10, seeds=(0, 1))
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa:\n  min: 0.5\n")
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=2)
    (run_dir,) = project.run_dirs()
    return server, run_dir


def _verdicts(run_dir: Path) -> dict[str, str]:
    board = json.loads((run_dir / "leaderboard.json").read_text())
    return {item["item_id"]: item["verdict"] for item in board["items"]}


def _item_files(run_dir: Path) -> dict[str, bytes]:
    """What a session must not rewrite: each item's summary and journal, byte for byte."""
    return {
        f"{item}/{name}": (run_dir / item / name).read_bytes()
        for item in ITEMS
        for name in ("summary.json", "results.jsonl")
    }


def test_a_finished_run_is_reported_from_the_store_while_its_endpoint_is_down(
    project: Project, sim: Any
) -> None:
    server, run_dir = _finished_run(project, sim)
    port = server.port
    before = _item_files(run_dir)
    assert _verdicts(run_dir) == dict.fromkeys(ITEMS, "pass")
    server.stop()

    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["alpha*qa*0*pass (from store; endpoint not checked)"] * len(ITEMS), consecutive=False
    )
    assert "unreachable" not in result.stdout.str()
    # nothing was requested (the journals hold no new rows) and nothing finished was rewritten
    assert _item_files(run_dir) == before
    assert _verdicts(run_dir) == dict.fromkeys(ITEMS, "pass")
    entries = manifest(run_dir)["items"]
    assert {item: entries[item]["status"] for item in ITEMS} == dict.fromkeys(ITEMS, "finished")
    assert "unreachable" not in (run_dir / "report.html").read_text()

    # the endpoint is back: its identity is checked again, still no completion request
    revived = sim(accuracy=1.0, lookup=project.lookup("qa"), latency=0.001, port=port)
    again = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    again.assert_outcomes(passed=2)
    assert "endpoint not checked" not in again.stdout.str()
    again.stdout.fnmatch_lines(["alpha*qa*pass (from store)"])
    assert [r.path for r in revived.requests] == ["/v1/models"]


def test_a_finished_item_recorded_at_another_url_is_not_reused_while_the_endpoint_is_down(
    project: Project, sim: Any
) -> None:
    server, run_dir = _finished_run(project, sim)
    before = _item_files(run_dir)
    server.stop()
    configure(project, UNREACHABLE_URL, n=10, seeds=(0, 1))  # the URL changed, and is down

    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines([f"*endpoint {UNREACHABLE_URL} is unreachable*"])
    assert "from store" not in result.stdout.str()
    assert _item_files(run_dir) == before  # stored results are kept for when it is back


def test_force_with_the_endpoint_down_recomputes_and_fails(project: Project, sim: Any) -> None:
    server, run_dir = _finished_run(project, sim)
    before = _item_files(run_dir)
    server.stop()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--force")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines([f"*endpoint {server.base_url} is unreachable*"])
    assert "from store" not in result.stdout.str()
    assert _item_files(run_dir) == before  # nothing was sent, so nothing was moved aside
