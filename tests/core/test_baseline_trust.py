"""Nothing silent in gating: a baseline that matches nothing, or a smaller run replacing it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.conftest import Project, configure


def test_a_baseline_entry_that_matches_nothing_is_a_usage_error(project: Project) -> None:
    configure(project, "http://127.0.0.1:9/v1", n=5)
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
        "qaa:\n  min: 0.5\n"  # a typo for qa: today the item would pass as "no baseline"
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: configs/baselines/alpha.yaml: entry 'qaa' matches no environment or "
            "variant (did you mean 'qa'?), so it would gate nothing*"
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_entries_for_other_configured_variants_are_fine(project: Project) -> None:
    configure(project, "http://127.0.0.1:9/v1", n=5, envs=("qa", "qb"))
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
        "qa:\n  min: 0.5\nqb:\n  min: 0.5\n"
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--env", "qa", "--co")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()


def _baseline(project: Project) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(
        (project.root / "configs" / "baselines" / "alpha.yaml").read_text()
    )
    return data


def test_update_baselines_keeps_a_baseline_measured_on_more_examples(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.5, lookup={}, latency=0.001)
    configure(project, server.base_url, n=20)
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
        "# curated\nqa:\n  value: 0.0\n  margin: 0.5\n  n: 1319\n  source: lm-eval\n"
    )
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--num-examples", "5", "--update-baselines"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*configs/baselines/alpha.yaml: kept 'qa' (n=1319); this run measured only n=5*"]
    )
    assert _baseline(project)["qa"] == {"value": 0.0, "margin": 0.5, "n": 1319, "source": "lm-eval"}
    replaced = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--num-examples", "5", "--update-baselines",
        "--mb-replace-baselines",
    )  # fmt: skip
    replaced.assert_outcomes(passed=1)
    assert _baseline(project)["qa"]["n"] == 5
