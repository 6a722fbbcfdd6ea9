"""Baseline gates through pytest: messages, verdicts, --update-baselines, --require-baseline, JUnit."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest
import yaml

from tests.conftest import Project


@pytest.fixture
def gated(project: Project, sim: Any) -> tuple[Project, Any]:
    project.qa("qa", 500)
    server = sim(accuracy=0.7, lookup=project.lookup("qa"))
    project.models(
        {"alpha": {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": 32}}
    )
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    return project, server


def baseline(project: Project, text: str) -> None:
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(text)


def test_regression_fails_with_one_paragraph(gated: tuple[Project, Any]) -> None:
    project, _ = gated
    baseline(project, "qa: {metric: exact_match, value: 0.85, margin: 0.01, source: paper}\n")
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*qa exact_match 0.* ?0.*, 0.*? vs baseline 0.850 (margin 0.01): regression of 0.1*, p*"
            "(configs/baselines/alpha.yaml)",
            "alpha*qa*0*exact_match*0.850*-0.1*fail",
        ]
    )
    assert (
        "Traceback" not in result.stdout.str() and "def test_benchmark" not in result.stdout.str()
    )


def test_improvement_and_non_significant_dip_pass(gated: tuple[Project, Any]) -> None:
    project, _ = gated
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    baseline(project, "qa: {value: 0.60, margin: 0.0}\n")
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["alpha*qa*0.600*pass (from store)"])
    # a dip of ~0.01 with n=500 on both sides is noise, not a regression
    score = float(next(line for line in result.outlines if line.startswith("alpha")).split()[4])
    baseline(project, f"qa: {{value: {score + 0.01:.3f}, margin: 0.0, n: 500}}\n")
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)


def test_min_floor(gated: tuple[Project, Any]) -> None:
    project, _ = gated
    baseline(project, "qa: {min: 0.95}\n")
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*vs min 0.950: below floor by 0.*(configs/baselines/alpha.yaml)"])


def test_require_baseline(gated: tuple[Project, Any]) -> None:
    project, _ = gated
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["alpha*qa*no baseline"])
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--require-baseline")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no baseline*"])


def test_update_baselines_round_trip_keeps_comments(gated: tuple[Project, Any]) -> None:
    project, _ = gated
    # another configured environment (a baseline entry must name one), not run here
    project.env("other-env", [{"id": "other-env", "module": "jsonl", "env_args": {"path": "x"}}])
    baseline(
        project,
        "# hand-written notes stay\nother-env:  # and this one\n  value: 0.5\n  source: paper\n",
    )
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--env", "qa", "--update-baselines"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["baselines written: *alpha.yaml"])
    text = (project.root / "configs" / "baselines" / "alpha.yaml").read_text()
    assert "# hand-written notes stay" in text and "# and this one" in text
    data = yaml.safe_load(text)
    assert data["other-env"] == {"value": 0.5, "source": "paper"}
    entry = data["qa"]
    score = float(next(line for line in result.outlines if line.startswith("alpha")).split()[4])
    assert entry["value"] == pytest.approx(score, abs=5e-4) and entry["n"] == 500
    assert (
        entry["metric"] == "exact_match"
        and entry["stderr"] > 0
        and entry["run_id"].startswith("run-")
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--env", "qa")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["alpha*qa*0.000*pass (from store)"])


def test_junit_properties(gated: tuple[Project, Any]) -> None:
    project, _ = gated
    baseline(project, "qa: {value: 0.6}\n")
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--junitxml", "junit.xml"
    )
    result.assert_outcomes(passed=1)
    tree = ET.parse(project.root / "junit.xml")
    props = {p.get("name"): p.get("value") for p in tree.iter("property")}
    assert props["mb_item"] == "alpha-qa-seed0" and props["mb_verdict"] == "pass"
    assert float(props["mb_score"]) > 0.6 and float(props["mb_baseline"]) == 0.6
    assert float(props["mb_p_value"]) > 0.05 and props["mb_rule"] == "non-inferiority"


def test_paired_gate_against_reference_run(gated: tuple[Project, Any]) -> None:
    project, server = gated
    project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--run-id", "ref"
    ).assert_outcomes(passed=1)
    server.reconfigure(accuracy=0.62)  # same request seeds: a strictly worse model
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--run-id", "new", "--baseline-run", "ref"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*regression*correct->wrong (qa*), 0 wrong->correct*"])


def test_github_step_summary(gated: tuple[Project, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    project, _ = gated
    summary = project.root / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    text = summary.read_text()
    assert "| model | variant |" in text and "| alpha | qa | 0 | exact_match |" in text


def test_holm_correction_decides_at_session_end(gated: tuple[Project, Any]) -> None:
    project, _ = gated
    baseline(project, "qa: {value: 0.85}\n")
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--mb-correction", "holm"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*regressions after Holm correction*", "*regression of*"])


def test_junit_has_no_p_value_for_a_rule_without_a_test(gated: tuple[Project, Any]) -> None:
    """A floor (``min``) is not a statistical test: no ``mb_p_value`` property, not "None"."""
    project, _ = gated
    baseline(project, "qa: {min: 0.5}\n")
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--junitxml", "junit.xml"
    )
    result.assert_outcomes(passed=1)
    props = {
        p.get("name"): p.get("value") for p in ET.parse(project.root / "junit.xml").iter("property")
    }
    assert props["mb_verdict"] == "pass" and "mb_rule" in props
    assert "mb_p_value" not in props
