"""``--mb-tracker``: each item's score in W&B (offline mode) and MLflow (a local store), read
back with the trackers' own formats; one tracker run per session, also under xdist."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.reporting import trackers
from tests.conftest import Project, configure, one_usage_error

SWEEP = ("run7-step100", "run7-step200")  # checkpoint labels: score vs step
SECRET = "sk-tracker-test-0123456789abcdef"


def sweep_project(project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MB_TRACKER_TEST_KEY", SECRET)
    configure(project, "http://placeholder", SWEEP, n=12)
    server = sim(accuracy=0.5, lookup=project.lookup("qa"))
    configure(project, server.base_url, SWEEP, n=12, api_key_var="MB_TRACKER_TEST_KEY")
    (project.root / "configs" / "baselines" / "run7-step100.yaml").write_text(
        "qa: {value: 0.01, n: 12}\n"
    )


def summaries(project: Project) -> dict[str, dict[str, Any]]:
    (run_dir,) = project.run_dirs()
    return {
        model: json.loads((run_dir / f"{model}-qa-seed0" / "summary.json").read_text())
        for model in SWEEP
    }


def test_mlflow_one_run_per_session_score_vs_step(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    sweep_project(project, sim, monkeypatch)
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "run7-step100,run7-step200", "-n", "2", "--mb-tracker", "mlflow",
        "--mb-correction", "holm",  # verdicts decided at session end reach the tracker too
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    assert "modelbench: --mb-tracker" not in result.stdout.str()  # no tracker trouble
    (run_dir,) = project.run_dirs()
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("modelbench")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == run_dir.name
    assert run.info.status == "FINISHED"
    assert run.data.params["models"] == "run7-step100,run7-step200"
    history = client.get_metric_history(run.info.run_id, "run7/qa/seed0/exact_match")
    by_step = {m.step: m.value for m in history}
    expected = {
        int(m.split("step")[1]): s["metrics"]["exact_match"]["value"]
        for m, s in summaries(project).items()
    }
    assert by_step == pytest.approx(expected)
    n_history = client.get_metric_history(run.info.run_id, "run7/qa/seed0/n")
    assert {m.step: m.value for m in n_history} == {100: 12.0, 200: 12.0}
    assert run.data.metrics["run7/qa/seed0/errors"] == 0
    assert run.data.tags["verdict/run7-step100-qa-seed0"] == "pass"
    assert run.data.tags["verdict/run7-step200-qa-seed0"] == "no baseline"
    items = json.loads(
        Path(client.download_artifacts(run.info.run_id, "items.json", str(tmp_path))).read_text()
    )
    items = items["items"]
    assert sorted(i["item"] for i in items) == ["run7-step100-qa-seed0", "run7-step200-qa-seed0"]
    assert {i["step"] for i in items} == {100, 200}
    assert SECRET.encode() not in store.read_bytes()  # no secret reaches the tracker


def wandb_records(run_file: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(kind, {key: value})`` of the history, summary and config records of an offline run
    file (W&B's append-only log: 32 KiB blocks of records with a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending = 7, 32768, b""
    while position + 7 <= len(data):
        left = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if left < 7 or (length == 0 and kind == 0):
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (2, 3):  # first, middle
            pending += chunk
            continue
        raw, pending = pending + chunk, b""
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        which = record.WhichOneof("record_type")
        # read only the record's own kind: touching another member of the oneof resets it
        field = {"history": "item", "summary": "update", "config": "update", "run": "config"}
        if which in field:  # a key with "/" is stored split, in nested_key
            values = getattr(getattr(record, which), field[which])
            if which == "run":  # the config given to wandb.init
                values = values.update
            yield which, {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in values}


def test_wandb_offline_one_run_per_session_score_vs_step(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    sweep_project(project, sim, monkeypatch)
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "run7-step100,run7-step200", "-n", "2",
        "--mb-tracker", "wandb", "--mb-tracker-project", "sweeps",
        "--sampling-args", '{"user": "argv-secret-7f3a9c"}',  # W&B would record the command line
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    assert "modelbench: --mb-tracker" not in result.stdout.str()  # no tracker trouble
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")  # one run for the session
    records = list(wandb_records(run_file))
    history = [values for kind, values in records if kind == "history"]
    scores = {
        h["checkpoint_step"]: h["run7/qa/seed0/exact_match"]
        for h in history
        if "run7/qa/seed0/exact_match" in h
    }
    expected = {
        int(m.split("step")[1]): s["metrics"]["exact_match"]["value"]
        for m, s in summaries(project).items()
    }
    assert scores == pytest.approx(expected)
    assert any("items/_type" in h for h in history)  # the table of every item
    summary: dict[str, Any] = {}
    for kind, values in records:
        if kind == "summary":
            summary.update(values)
    assert summary["run7-step100-qa-seed0/verdict"] == "pass"
    config: dict[str, Any] = {}
    for kind, values in records:
        if kind in ("run", "config"):
            config.update(values)
    (run_dir,) = project.run_dirs()
    assert config["run_id"] == run_dir.name
    assert config["models"] == "run7-step100,run7-step200"
    written = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert SECRET.encode() not in written and b"argv-secret-7f3a9c" not in written


def test_a_tracker_that_cannot_start_warns_and_the_run_goes_on(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://tracker")
    sweep_project(project, sim, monkeypatch)
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "run7-step100", "--mb-tracker", "mlflow"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["modelbench: --mb-tracker mlflow: could not start a run: *"])
    assert result.ret == 0
    assert "Traceback" not in result.stdout.str()


def test_unknown_tracker_is_one_usage_line(base: Project) -> None:
    line = one_usage_error(base, "--model", "alpha", "--mb-tracker", "wandbb")
    assert line == (
        "ERROR: --mb-tracker: unknown tracker 'wandbb' (did you mean 'wandb'?); "
        "use wandb or mlflow (comma-separated for both)"
    )


def test_missing_tracker_package_names_the_extra(
    base: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(trackers.TRACKERS, "mlflow", ("no_such_mlflow", trackers.MlflowTracker))
    line = one_usage_error(base, "--model", "alpha", "--mb-tracker", "mlflow")
    assert line == (
        "ERROR: --mb-tracker mlflow: the no_such_mlflow package is not installed: "
        "pip install 'pytest-modelbench[mlflow]'"
    )


HOOK_CONFTEST = """
import json

def pytest_modelbench_item_finished(config, item_id, summary, result):
    with open("finished.jsonl", "a") as out:
        out.write(json.dumps({
            "item": item_id,
            "worker": getattr(config, "workerinput", {}).get("workerid"),
            "score": result.score,
            "summary_score": summary["metrics"][result.metric]["value"],
            "summary": summary,  # the summary.json object, as json.dumps takes it
            "summary_is_dict": type(summary) is dict and summary.update(seen=1) is None,
            "verdict": result.verdict.status if result.verdict else None,
            "from_store": result.from_store,
        }) + "\\n")
"""


def test_item_finished_hook_runs_once_per_item_on_the_controller(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep_project(project, sim, monkeypatch)
    project.pytester.makeconftest(HOOK_CONFTEST)
    args = ("benchmarks/", "--model", "run7-step100,run7-step200", "-n", "2")
    project.pytester.runpytest(*args).assert_outcomes(passed=2)
    project.pytester.runpytest(*args).assert_outcomes(passed=2)  # read back from the store
    lines = (project.root / "finished.jsonl").read_text().splitlines()
    calls = [json.loads(line) for line in lines]
    assert all(c["worker"] is None for c in calls)  # the controller, for every worker's items
    assert sorted((c["item"], c["from_store"]) for c in calls) == [
        ("run7-step100-qa-seed0", False),
        ("run7-step100-qa-seed0", True),
        ("run7-step200-qa-seed0", False),
        ("run7-step200-qa-seed0", True),
    ]
    assert all(c["summary_is_dict"] and "metrics" in c["summary"] for c in calls)
    scores = {c["item"]: c["summary_score"] for c in calls}
    assert all(c["score"] == scores[c["item"]] for c in calls)
    assert {c["item"]: c["verdict"] for c in calls} == {
        "run7-step100-qa-seed0": "pass",
        "run7-step200-qa-seed0": "no baseline",
    }


def test_a_failing_listener_is_one_line_and_the_session_goes_on(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep_project(project, sim, monkeypatch)
    project.pytester.makeconftest(
        "def pytest_modelbench_item_finished(item_id):\n    raise RuntimeError('listener bug')\n"
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "run7-step100")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["modelbench: pytest_modelbench_item_finished raised for run7-step100-qa-seed0: "
         "RuntimeError: listener bug"]
    )  # fmt: skip
