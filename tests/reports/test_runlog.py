"""``read_run()``: a run read back with typed statuses and verdicts; the one run resolver."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_modelbench.cli import main
from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.reporting.model import load_run
from pytest_modelbench.store.records import ItemStatus
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runlog import (
    RunNotFound,
    RunStatus,
    find_latest_run,
    find_run,
    read_run,
    resolve_run,
    resolve_run_ref,
)
from pytest_modelbench.store.runstore import ItemStore
from pytest_modelbench.store.verdict import GateVerdict, Verdict
from tests.reports.conftest import craft_run


def _gate(run_dir: Path, item_id: str, *, passed: bool, deferred: bool = False) -> None:
    """Save the item's record with a paired verdict, as the worker that gated it does."""
    directory = run_dir / item_id
    summary = ItemStore(directory).read_summary() or {}
    verdict = GateVerdict(
        passed=passed, rule="paired", metric="accuracy", value=0.5, alpha=0.05, p_value=0.01
    )
    EvalResult(
        item_id=item_id,
        model="m",
        env="qa",
        variant=item_id.split("-")[1],
        seed=0,
        metric="accuracy",
        summary=summary,
        directory=directory,
        verdict=verdict,
        gate_deferred=deferred,
    ).save()


def _three_items(parent: Path, run_id: str = "r1", **kwargs: str) -> Path:
    run_dir = craft_run(
        parent,
        run_id,
        {
            "m-qa-seed0": {"model": "m", "variant": "qa", "scores": [1.0, 0.0]},
            "m-mc-seed0": {"model": "m", "variant": "mc", "scores": [1.0]},
            "m-code-seed0": {"model": "m", "variant": "code", "scores": [0.0]},
        },
        **kwargs,
    )
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    manifest["items"]["m-code-seed0"].update(status="error", error="server died")
    (run_dir / "run_manifest.json").write_text(json.dumps(manifest))
    _gate(run_dir, "m-qa-seed0", passed=False, deferred=True)
    _gate(run_dir, "m-mc-seed0", passed=True)
    return run_dir


def test_read_run_gives_each_item_a_typed_status_and_verdict(tmp_path: Path) -> None:
    run = read_run(_three_items(tmp_path))
    items = {item.item_id: item for item in run.items}
    assert [(i.status, i.verdict, i.holm_pending) for i in items.values()] == [
        (ItemStatus.FINISHED, Verdict.FAIL, True),
        (ItemStatus.FINISHED, Verdict.PASS, False),
        (ItemStatus.ERROR, Verdict.ERROR, False),  # from its manifest entry: no record saved
    ]
    assert items["m-qa-seed0"].result is not None
    assert items["m-qa-seed0"].result.verdict is not None
    assert items["m-qa-seed0"].result.verdict.p_value == 0.01
    assert run.status() is RunStatus.ERROR
    assert (run.count(ItemStatus.FINISHED), run.gate_failures()) == (2, 1)
    # the reports read the same record: one failing verdict shown with its Holm suffix
    shown = {i.item_id: (i.verdict_text, i.failed) for i in load_run(run.directory).items}
    assert shown == {
        "m-qa-seed0": ("fail (Holm pending)", True),
        "m-mc-seed0": ("pass", False),
        "m-code-seed0": ("error", True),
    }


def test_the_public_read_run_takes_a_str_refuses_a_wrong_path_and_prints_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``api.read_run("runs/x")`` as docs/api.md shows it; a path that is no run raises
    ``api.RunNotFound`` with one line; ``print(run)`` is one line per object, not kilobytes."""
    import pytest_modelbench.api as api

    _three_items(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    run = api.read_run("runs/r1")
    assert len(run.items) == 3
    assert repr(run) == "RunLog('r1', status=error, items=3)"
    assert repr(run.items[0]) == "RunItem('m-qa-seed0', status=finished, verdict=fail)"
    assert repr(run.items[2]) == "RunItem('m-code-seed0', status=error, verdict=error)"
    for wrong, why in [
        ("nonexistent", "no such directory"),
        ("runs", "no run_manifest.json there"),
    ]:
        with pytest.raises(api.RunNotFound) as caught:
            api.read_run(Path(wrong))
        message = str(caught.value)
        assert message.startswith(f"{wrong}: not a run directory ({why}; "), message
        assert "holds run_manifest.json" in message and "\n" not in message
    assert issubclass(api.RunNotFound, FileNotFoundError)


def test_a_record_of_another_summary_is_no_verdict(tmp_path: Path) -> None:
    run_dir = _three_items(tmp_path)
    summary_path = run_dir / "m-mc-seed0" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps({**summary, "fingerprint": "recomputed"}))
    (item,) = read_run(run_dir, ids=["m-mc-seed0"]).items
    assert (item.status, item.result, item.verdict) == (ItemStatus.FINISHED, None, None)


def test_runs_counts_gate_failures_from_the_saved_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``modelbench runs`` reads each item's verdict, not a report: no leaderboard.json was
    ever written for this run, and its gate failure still counts."""
    run_dir = _three_items(tmp_path)
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    manifest["items"]["m-code-seed0"].update(status="finished", error=None)
    (run_dir / "run_manifest.json").write_text(json.dumps(manifest))
    assert not (run_dir / "leaderboard.json").exists()
    assert main(["runs", "--run-dir", str(tmp_path), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["items"], row["finished"], row["gate_failures"], row["status"]) == (
        3,
        3,
        1,
        "failed",
    )


def test_one_resolver_for_ids_paths_latest_and_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    older = _three_items(runs, "a-1", created_at="2025-01-01T00:00:00+0000")
    newer = _three_items(runs, "a-2", created_at="2025-01-02T00:00:00+0000")
    manifest = json.loads((older / "run_manifest.json").read_text())
    (older / "run_manifest.json").write_text(json.dumps({**manifest, "run_name": "other"}))
    monkeypatch.chdir(tmp_path)
    assert find_run(runs, "latest") == newer
    assert find_run(runs, "a-1") == older  # a run id under the parent
    assert find_run(runs, "runs/a-1") == (tmp_path / "runs/a-1").absolute()  # a path
    assert find_run(runs, str(older)) == older  # an absolute path
    assert find_run(runs, "a-3") is None
    assert find_latest_run(runs, "crafted") == newer
    assert find_latest_run(runs, "other") == older
    with pytest.raises(RunNotFound, match=r"^a-3: not a run directory .*recent runs in .*a-1, a-2"):
        resolve_run("a-3", runs)
    with pytest.raises(ModelbenchUsageError, match="that is the run being written"):
        resolve_run_ref(runs, "a-2", this_run=newer)
    assert resolve_run_ref(runs, "a-1", this_run=newer) == older


def test_the_cli_resolves_a_run_under_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``~/runs/a-1`` names a run for ``modelbench report`` as it does for ``--restart``."""
    _three_items(tmp_path / "runs", "a-1")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(Path(os.sep))
    assert main(["report", "~/runs/a-1", "--examples", "0"]) == 0
    assert "a-1: 3 items, status failed" in capsys.readouterr().out


def test_one_item_is_read_without_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What pytest-html reads after each test: the item's own files, at any run size."""
    run_dir = _three_items(tmp_path)
    _gate(run_dir, "m-qa-seed0", passed=False)

    def no_manifest(self: object) -> dict[str, object]:
        raise AssertionError("the manifest was read")

    monkeypatch.setattr("pytest_modelbench.store.runstore.RunStore.read_manifest", no_manifest)
    (item,) = read_run(run_dir, ids=["m-qa-seed0"], manifest=False).items
    assert item.verdict is Verdict.FAIL and item.status is ItemStatus.FINISHED
    with pytest.raises(AssertionError, match="manifest was read"):
        read_run(run_dir, ids=["m-qa-seed0"])
