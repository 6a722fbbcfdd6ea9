"""End-to-end runs against the simulated server: scores, run store files, faults, xdist."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import pytest

from pytest_modelbench.testing import is_correct
from tests.conftest import Project


def configure(
    project: Project, url: str, *, n: int = 1000, models: tuple[str, ...] = ("alpha",), **model: Any
) -> None:
    project.qa("qa", n)
    project.models(
        {
            name: {
                "model": "sim-model",
                "api_base_url": url,
                "max_concurrent": 32,
                "retry_backoff": 0.01,
                **model,
            }
            for name in models
        }
    )
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])


def test_known_accuracy_and_run_store(project: Project, sim: Any) -> None:
    configure(project, "http://placeholder")
    server = sim(accuracy=0.7, lookup=project.lookup("qa"))
    configure(project, server.base_url)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*modelbench summary*",
            "model*variant*seed*metric*score*95% CI*n*errors*baseline*verdict",
            "alpha*qa*0*exact_match*0.*1000*0*no baseline",
            "run store: *runs*run-*",
        ]
    )
    (run_dir,) = project.run_dirs()
    item = run_dir / "alpha-qa-seed0"
    summary = json.loads((item / "summary.json").read_text())
    metric = summary["metrics"]["exact_match"]
    # the simulator answers correctly with probability 0.7 per (question, request seed)
    assert metric["n"] == 1000
    assert abs(metric["value"] - 0.7) < 4 * math.sqrt(0.7 * 0.3 / 1000)
    assert metric["ci_low"] < metric["value"] < metric["ci_high"]
    answered = [r for r in server.requests if r.path.endswith("completions")]
    expected = sum(is_correct(r.key, r.seed, 0.7) for r in answered) / len(answered)
    assert metric["value"] == pytest.approx(expected, abs=1e-12)  # exactly what the server answered
    rows = [json.loads(line) for line in (item / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 1000 and {r["example_id"] for r in rows} == {f"qa{i}" for i in range(1000)}
    assert all(r["tokens"]["completion"] > 0 and r["latency_s"] >= 0 for r in rows)
    metadata = json.loads((item / "metadata.json").read_text())
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    for data in (summary, metadata, manifest):
        assert data["schema_version"] == 1
    assert (
        metadata["fingerprint"]
        == summary["fingerprint"]
        == manifest["items"]["alpha-qa-seed0"]["fingerprint"]
    )
    assert manifest["items"]["alpha-qa-seed0"]["status"] == "finished"


def test_faults_every_example_once_with_retries_visible(project: Project, sim: Any) -> None:
    configure(project, "http://placeholder", n=400)
    server = sim(
        accuracy=0.7,
        lookup=project.lookup("qa"),
        latency=0.002,
        seed=3,
        faults={"error_5xx": 0.10, "timeout": 0.05, "reset": 0.02, "hang_s": 3.0},
    )
    # the client's timeout is well under the 3 s hang but far over a 2 ms answer, so that a
    # loaded machine's pause never looks like a hang (a retried answer would count twice)
    configure(project, server.base_url, n=400, timeout=1.5, max_retries=10)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    assert summary["errors"] == 0 and summary["n_scored"] == 400
    answered = Counter(
        r.key for r in server.requests if r.outcome == "ok" and r.path.endswith("completions")
    )
    assert len(answered) == 400 and set(answered.values()) == {
        1
    }  # each example answered exactly once
    reasons = summary["session"]["retry_reasons"]
    assert summary["retries"] > 40 and {"HTTP 500", "timeout"} <= {
        k.split(",")[0] for k in reasons
    } | {"HTTP 500" if any(k.startswith("HTTP 5") for k in reasons) else ""}
    assert any(k.startswith("connection") for k in reasons)


def test_unreachable_endpoint_fails_fast_other_items_run(project: Project, sim: Any) -> None:
    server = sim(accuracy=1.0, lookup={})
    project.qa("qa", 20)
    project.models(
        {
            "down": {"model": "sim-model", "api_base_url": "http://127.0.0.1:9/v1"},
            "up": {"model": "sim-model", "api_base_url": server.base_url},
        }
    )
    project.env(
        "qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}, "seeds": [0, 1]}]
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "down,up")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(
        ["*endpoint http://127.0.0.1:9/v1 is unreachable*start the server*"]
    )
    assert result.duration < 30
    assert "Traceback" not in result.stdout.str()


def test_model_not_served_is_named(project: Project, sim: Any) -> None:
    server = sim(models=["other"])
    configure(project, server.base_url, n=5)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*does not serve model 'sim-model'; it serves: other*"])


def test_error_budget_fails_item_and_keeps_finished(project: Project, sim: Any) -> None:
    server = sim(accuracy=1.0, lookup={}, faults={"error_5xx": 0.5}, seed=1)
    configure(project, server.base_url, n=100, max_retries=0)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*examples failed (*> error budget 5%, --mb-error-budget)*HTTP 50*"]
    )
    (run_dir,) = project.run_dirs()
    rows = [
        json.loads(x)
        for x in (run_dir / "alpha-qa-seed0" / "results.jsonl").read_text().splitlines()
    ]
    ok = {r["example_id"] for r in rows if not r["error"]}
    # the re-run with a healthy server requests only the failed examples
    server.reconfigure(faults={})
    server.clear_log()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    asked = {r.key for r in server.requests if r.path.endswith("completions")}
    assert len(asked) == 100 - len(ok)


def test_rerun_reports_from_store_without_requests(project: Project, sim: Any) -> None:
    server = sim(accuracy=0.5, lookup={})
    configure(project, server.base_url, n=50, models=("alpha", "beta"))
    project.pytester.runpytest("benchmarks/", "--model", "alpha,beta").assert_outcomes(passed=2)
    server.clear_log()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha,beta")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*no baseline (from store)*"])
    # no completion; one /v1/models to confirm the same model still answers there
    assert [r.path for r in server.requests] == ["/v1/models"]


def test_xdist_workers_share_one_consistent_manifest(project: Project, sim: Any) -> None:
    server = sim(accuracy=0.8, lookup={}, latency=0.005)
    configure(project, server.base_url, n=60, models=("alpha", "beta"))
    project.env(
        "qa",
        [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}, "seeds": [0, 1, 2, 3]}],
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha,beta", "-n", "2")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["*modelbench summary*", "beta*qa*3*exact_match*no baseline"])
    (run_dir,) = project.run_dirs()
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    assert sorted(manifest["items"]) == sorted(
        f"{m}-qa-seed{s}" for m in ("alpha", "beta") for s in range(4)
    )
    for entry in manifest["items"].values():
        assert entry["status"] == "finished"
        summary = json.loads((run_dir / entry["path"] / "summary.json").read_text())
        assert summary["fingerprint"] == entry["fingerprint"]
        assert summary["metrics"]["exact_match"]["n"] == 60
    assert not list(run_dir.glob("*.tmp")) and not list(run_dir.glob(".*.tmp"))
