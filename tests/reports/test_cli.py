"""The ``modelbench`` console command: report, export, runs, models, and bad input."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.cli import main
from pytest_modelbench.store.records import ItemStatus
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runlog import RunStatus, run_status
from pytest_modelbench.store.runstore import ItemStore
from tests.conftest import Project, configure
from tests.reports.conftest import craft_run


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_modelbench.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "nope"], "report: error: nope: not a run directory"),
        (["compare", "a", "b", "--run-dir", "elsewhere"], "compare: error: a: not a run directory"),
        (["export", "nope", "--format", "csv"], "export: error: nope: not a run directory"),
        (["view", "nope"], "view: error: nope: not a run directory"),
        (["runs", "--run-dir", "missing"], "runs: error: --run-dir missing: no such directory"),
        (["models", "--api-base-url", "localhost:8000"], "expected http(s)://host:port/v1"),
        (
            ["models", "--api-base-url", "http://127.0.0.1:9/v1"],
            "cannot reach http://127.0.0.1:9/v1/models",
        ),
        (
            ["models", "--api-base-url", "http://me:sk-SECRET123@127.0.0.1:9/v1"],
            "--api-base-url http://***@127.0.0.1:9/v1 carries credentials",
        ),
        (["export", "x", "--format", "xml"], "invalid choice: 'xml'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_is_one_clear_line_and_status_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "SECRET123" not in result.stderr + result.stdout


def test_models_lists_what_the_endpoint_serves(
    sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = sim(models=["alpha-7b", "beta-13b"])
    assert main(["models", "--api-base-url", server.base_url]) == 0
    assert capsys.readouterr().out.split() == [
        "alpha-7b",
        "(max_model_len",
        "4096)",
        "beta-13b",
        "(max_model_len",
        "4096)",
    ]
    assert main(["models", "--api-base-url", server.base_url.removesuffix("/v1")]) == 2
    assert "HTTP 404" in capsys.readouterr().err


def test_report_rebuilds_from_the_store_keeping_verdicts(
    project: Project, sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = sim(accuracy=0.5, lookup={})
    configure(project, server.base_url, ("alpha", "beta"), n=30)
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa: {min: 0.9}\n")
    project.pytester.runpytest("benchmarks/", "--model", "alpha,beta").assert_outcomes(
        passed=1, failed=1
    )
    (run_dir,) = project.run_dirs()
    # every report goes: the verdicts are each item's saved record (result.json), never
    # read back from an earlier report
    for name in ("report.html", "leaderboard.md", "leaderboard.json", "results.parquet"):
        (run_dir / name).unlink()
    assert main(["report", run_dir.name, "--run-dir", str(run_dir.parent)]) == 0
    out = capsys.readouterr().out
    assert f"{run_dir.name}: 2 items, status failed" in out
    assert (run_dir / "report.html").exists() and (run_dir / "results.parquet").exists()
    board = json.loads((run_dir / "leaderboard.json").read_text())
    verdicts = {i["item_id"]: i["verdict"] for i in board["items"]}
    assert verdicts == {"alpha-qa-seed0": "fail", "beta-qa-seed0": "no baseline"}
    assert "below floor" in (run_dir / "report.html").read_text()


def test_export_csv_and_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = craft_run(
        tmp_path, "r1", {"m-qa-seed0": {"model": "m", "variant": "qa", "scores": [1.0, 0.0, 1.0]}}
    )
    assert (
        main(["export", str(run_dir), "--format", "csv", "--output", str(tmp_path / "o.csv")]) == 0
    )
    assert "wrote 3 rows" in capsys.readouterr().out
    lines = (tmp_path / "o.csv").read_text().splitlines()
    assert lines[0].startswith(
        "schema_version,run_id,item_id,model,environment,variant,module,seed,"
    )
    assert lines[0].endswith(",metric:accuracy") and len(lines) == 4
    assert main(["export", "r1", "--run-dir", str(tmp_path), "--format", "parquet"]) == 0
    assert (run_dir / "results.parquet").exists()


def test_runs_lists_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    craft_run(
        tmp_path,
        "done",
        {"m-qa-seed0": {"model": "m", "variant": "qa", "scores": [1.0]}},
        created_at="2025-01-01T00:00:00+0000",
    )
    craft_run(
        tmp_path,
        "broken",
        {"m-qa-seed0": {"model": "m", "variant": "qa", "scores": [1.0], "status": "error"}},
        created_at="2025-01-02T00:00:00+0000",
    )
    craft_run(
        tmp_path,
        "stale",
        {"m-qa-seed0": {"model": "m", "variant": "qa", "scores": [1.0], "status": "running"}},
        created_at="2025-01-03T00:00:00+0000",
    )
    assert main(["runs", "--run-dir", str(tmp_path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["status"]) for r in rows] == [
        ("done", "finished"),
        ("broken", "error"),
        ("stale", "interrupted"),
    ]
    assert main(["runs", "--run-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == [
        "run",
        "name",
        "created",
        "items",
        "finished",
        "errors",
        "gate",
        "fails",
        "status",
    ]


def test_run_status_running_when_recently_updated() -> None:
    now = dt.datetime(2025, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    running = [(ItemStatus.RUNNING, False)]
    assert run_status(running, "2025-01-01T11:58:00+0000", now) is RunStatus.RUNNING
    assert run_status(running, "2025-01-01T10:00:00+0000", now) is RunStatus.INTERRUPTED
    assert run_status([(ItemStatus.FINISHED, True)], None, now) is RunStatus.FAILED
    assert run_status([], None, now) is RunStatus.EMPTY


def test_an_error_never_leaves_a_stale_verdict_in_the_store(
    project: Project, sim: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--mb-force`` with the endpoint down: the session shows the error, and the store keeps
    the finished item's own verdict (nothing was recomputed). A record made from another
    summary is never read back, and clearing a summary clears its record."""
    server = sim(accuracy=0.5, lookup={})
    configure(project, server.base_url, n=10)
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa: {min: 0.0}\n")
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    server.stop()
    forced = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-force")
    assert forced.ret == pytest.ExitCode.TESTS_FAILED
    forced.stdout.fnmatch_lines(["alpha *qa *error"])
    (run_dir,) = project.run_dirs()
    (run_dir / "leaderboard.json").unlink()
    assert main(["report", run_dir.name, "--run-dir", str(run_dir.parent)]) == 0
    board = json.loads((run_dir / "leaderboard.json").read_text())
    assert [i["verdict"] for i in board["items"]] == ["pass"]
    item = run_dir / "alpha-qa-seed0"
    summary = json.loads((item / "summary.json").read_text())
    (item / "summary.json").write_text(json.dumps({**summary, "fingerprint": "other"}))
    assert EvalResult.load(item) is None  # made from another summary: stale
    ItemStore(item).clear_summary()
    assert not (item / "result.json").exists()


def test_the_cli_finds_the_projects_runs_from_a_subdirectory_and_reports_the_latest(
    project: Project, sim: Any
) -> None:
    """``cd benchmarks && modelbench runs`` reads the runs pytest wrote from the project's root
    (found upwards as pytest finds its rootdir), and ``modelbench report`` without RUN reports
    the latest of them, saying which."""
    configure(project, sim(accuracy=1.0, lookup={}).base_url, n=3)
    for run_id in ("first", "second"):
        args = ("benchmarks/", "--model", "alpha", "--mb-run-id", run_id)
        project.pytester.runpytest(*args).assert_outcomes(passed=1)
    inside = project.root / "benchmarks"
    for run_id in ("first", "second"):
        (project.root / "runs" / run_id / "report.html").unlink()

    listed = cli("runs", "--format", "json", cwd=inside)
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ["first", "second"]

    reported = cli("report", cwd=inside)
    assert reported.returncode == 0, reported.stderr
    second = project.root / "runs" / "second"
    assert reported.stdout.splitlines()[:2] == [
        f"no RUN given: reporting the latest run, second ({second})",
        "second: 1 items, status finished",
    ]
    assert (second / "report.html").exists()
    assert not (project.root / "runs" / "first" / "report.html").exists()


@pytest.mark.parametrize("command", [["runs"], ["report"]])
def test_outside_any_project_the_cli_says_so_without_naming_a_flag(
    tmp_path: Path, command: list[str]
) -> None:
    result = cli(*command, cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"modelbench {command[0]}: error: no project in {tmp_path} or above")
    assert "--run-dir" not in line and "Traceback" not in result.stdout


def test_the_cli_reads_the_run_dir_the_ini_names_and_skips_a_pyproject_without_pytest(
    project: Project, sim: Any
) -> None:
    """``modelbench_run_dir = results`` in the rootdir's ini: the plugin writes there, and so
    the CLI reads there; a ``pyproject.toml`` without a pytest section in a subdirectory is
    not the rootdir (pytest passes it by too)."""
    configure(project, sim(accuracy=1.0, lookup={}).base_url, n=3)
    ini = project.root / "pytest.ini"
    ini.write_text(ini.read_text() + "modelbench_run_dir = results\n" if ini.exists() else
                   "[pytest]\nmodelbench_run_dir = results\n")  # fmt: skip
    project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-run-id", "r1")
    assert (project.root / "results" / "r1").is_dir()
    inside = project.root / "benchmarks"
    (inside / "pyproject.toml").write_text("[project]\nname = 'bench'\n")
    listed = cli("runs", "--format", "json", cwd=inside)
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ["r1"]
