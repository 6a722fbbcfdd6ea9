"""The setup behind a score, for an external endpoint: only what the server reports is
recorded (``/version``, the model card's root, the answers' ``system_fingerprint``), baselines
and reference runs carry it, and a change is shown before the verdict (issue 42)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_modelbench.cli import main
from pytest_modelbench.testing.fixtures import SimServerFactory
from tests.conftest import Project, configure

ARGS = ("benchmarks/", "--model", "alpha", "-p", "no:randomly")


def _setup(run: Path) -> dict[str, Any]:
    (item,) = [p for p in run.iterdir() if (p / "result.json").exists()]
    setup: dict[str, Any] = json.loads((item / "result.json").read_text())["setup"]
    return setup


def test_an_endpoint_whose_build_changes(
    project: Project, sim: SimServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(project, "http://placeholder", n=10)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"), fingerprint="fp_a", version="0.32.0")
    configure(project, server.base_url, n=10, sampling_args={"temperature": 0.0}, max_tokens=64)
    first = project.pytester.runpytest(*ARGS, "--update-baselines", "--run-id", "r1")
    first.assert_outcomes(passed=1)

    recorded = _setup(project.root / "runs" / "r1")
    assert recorded["engine"] == "endpoint"
    assert recorded["engine_version"] == "0.32.0"  # GET /version
    assert recorded["system_fingerprint"] == "fp_a"  # every answer's
    assert recorded["endpoint_root"] == "sim-model"  # the /v1/models card's root
    assert recorded["max_tokens"] == 64
    assert recorded["sampling_args"] == {"temperature": 0.0}
    assert recorded["prompt_format"] == "chat jsonl"
    assert len(recorded["data"]) == 20
    # nothing invented: an endpoint's GPUs, weights and serving args are not known
    for unknown in ("gpu_model", "gpu_count", "driver_version", "weights", "serve_args"):
        assert unknown not in recorded
    baseline = yaml.safe_load((project.root / "configs" / "baselines" / "alpha.yaml").read_text())
    assert baseline["qa"]["setup"] == recorded  # --update-baselines writes it beside the value

    server.reconfigure(fingerprint="fp_b")  # the provider redeployed: same name, new build
    step_summary = project.root / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    second = project.pytester.runpytest(*ARGS, "--run-id", "r2", "--junitxml", "junit.xml")
    second.assert_outcomes(passed=1)
    line = (
        "setup differs (system_fingerprint): baseline: endpoint 0.32.0, max_tokens 64, "
        "system_fingerprint fp_a; this run: endpoint 0.32.0, max_tokens 64, "
        "system_fingerprint fp_b"
    )
    assert line in second.stdout.str()
    junit = (project.root / "junit.xml").read_text()
    assert 'name="mb_setup_differs"' in junit and "system_fingerprint fp_b" in junit
    (item,) = [p for p in (project.root / "runs" / "r2").iterdir() if p.is_dir()]
    verdict = json.loads((item / "result.json").read_text())["verdict"]
    assert verdict["setup_differs"] == line and verdict["passed"]
    assert line in (project.root / "runs" / "r2" / "report.html").read_text()
    assert f"- alpha-qa-seed0: {line}" in step_summary.read_text()
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")

    third = project.pytester.runpytest(*ARGS, "--run-id", "r3", "--mb-require-same-setup")
    third.assert_outcomes(failed=1)
    third.stdout.fnmatch_lines([f"*fails under --mb-require-same-setup: {line}*"])


def test_a_reference_run_carries_its_setup(project: Project, sim: SimServerFactory) -> None:
    configure(project, "http://placeholder", n=30)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"), fingerprint="fp_a")
    configure(project, server.base_url, n=30)
    project.pytester.runpytest(*ARGS, "--run-id", "ref").assert_outcomes(passed=1)
    assert _setup(project.root / "runs" / "ref")["system_fingerprint"] == "fp_a"

    same = project.pytester.runpytest(*ARGS, "--run-id", "r1", "--baseline-run", "ref")
    same.assert_outcomes(passed=1)
    assert "setup differs" not in same.stdout.str()

    server.reconfigure(fingerprint="fp_b")
    changed = project.pytester.runpytest(
        *ARGS, "--run-id", "r2", "--baseline-run", "ref", "--mb-require-same-setup"
    )
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines(
        ["*vs run ref*fails under --mb-require-same-setup: setup differs (system_fingerprint)*"]
    )


def test_collect_only_lists_items_planned_under_another_setup(
    project: Project, sim: SimServerFactory
) -> None:
    configure(project, "http://placeholder", n=10)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"), version="0.32.0")
    configure(project, server.base_url, n=10, max_tokens=64)
    project.pytester.runpytest(*ARGS, "--update-baselines", "--run-id", "r1").assert_outcomes(
        passed=1
    )
    unchanged = project.pytester.runpytest(*ARGS, "--collect-only")
    assert "another setup" not in unchanged.stdout.str()

    configure(project, server.base_url, n=10, max_tokens=32)  # a budget cut, known before a run
    planned = project.pytester.runpytest(*ARGS, "--collect-only")
    planned.stdout.fnmatch_lines(
        [
            "1 item(s) planned under another setup than their baseline:",
            "  alpha-qa-seed0: setup differs (max_tokens): baseline: endpoint 0.32.0, "
            "max_tokens 64; planned: endpoint, max_tokens 32",
        ]
    )
    assert not (project.root / "runs" / "r2").exists()


def test_compare_shows_the_setup_diff_above_the_scores(
    project: Project, sim: SimServerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(project, "http://placeholder", n=10)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"), fingerprint="fp_a", version="0.32.0")
    configure(project, server.base_url, n=10)
    project.pytester.runpytest(*ARGS, "--run-id", "a").assert_outcomes(passed=1)
    server.reconfigure(fingerprint="fp_b", version="0.33.0")
    project.pytester.runpytest(*ARGS, "--run-id", "b").assert_outcomes(passed=1)
    capsys.readouterr()

    assert main(["compare", "a", "b", "--run-dir", str(project.root / "runs")]) == 0
    lines = capsys.readouterr().out.splitlines()
    setup = (
        "  alpha qa: setup differs (engine_version, system_fingerprint): A: endpoint 0.32.0, "
        "system_fingerprint fp_a; B: endpoint 0.33.0, system_fingerprint fp_b"
    )
    assert "setup differences (can change outputs):" in lines and setup in lines
    header = next(i for i, line in enumerate(lines) if line.startswith("variant"))
    assert lines.index(setup) < header  # above the score diff

    assert (
        main(["compare", "a", "b", "--run-dir", str(project.root / "runs"), "--format", "json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["setup_differences"] == [setup.strip()]

    assert main(["compare", "a", "a", "--run-dir", str(project.root / "runs")]) == 0
    assert "setup differ" not in capsys.readouterr().out
