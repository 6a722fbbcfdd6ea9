"""What answered is part of the fingerprint: stored results never answer for another endpoint."""

from __future__ import annotations

from typing import Any

from tests.conftest import Project, configure


def _completions(server: Any) -> int:
    return sum(1 for r in server.requests if r.path.endswith("completions"))


def test_a_different_endpoint_is_evaluated_not_read_from_the_store(
    project: Project, sim: Any
) -> None:
    good = sim(accuracy=1.0, lookup=project_lookup(project), latency=0.001)
    configure(project, good.base_url, n=30)
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
        "qa:\n  value: 1.0\n  margin: 0.05\n  n: 1000\n"
    )
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    regressed = sim(accuracy=0.2, lookup=project_lookup(project), latency=0.001)
    configure(project, regressed.base_url, n=30)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(failed=1)  # the regressed model is gated, not the stored answers
    assert _completions(regressed) == 30
    result.stdout.fnmatch_lines(["*configuration changed: endpoint.*"])
    assert "from store" not in result.stdout.str()


def test_lf_forgets_old_failures_once_the_model_behind_the_endpoint_is_fixed(
    project: Project, sim: Any
) -> None:
    broken = sim(accuracy=0.1, lookup=project_lookup(project), latency=0.001)
    configure(project, broken.base_url, n=30)
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa:\n  min: 0.8\n")
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(failed=1)
    fixed = sim(accuracy=1.0, lookup=project_lookup(project), latency=0.001)
    configure(project, fixed.base_url, n=30)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--lf")
    result.assert_outcomes(passed=1)
    assert _completions(fixed) == 30


def test_the_same_url_serving_another_model_build_is_evaluated_again(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.5, lookup={}, latency=0.001, max_model_len=4096)
    configure(project, server.base_url, n=10)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    server.reconfigure(max_model_len=8192)  # what /v1/models reports for the model changed
    server.clear_log()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    assert _completions(server) == 10
    result.stdout.fnmatch_lines(
        ["*configuration changed: endpoint.model.max_model_len: 4096 -> 8192*"]
    )


def project_lookup(project: Project) -> dict[str, tuple[str, str]]:
    if not (project.root / "qa.jsonl").exists():
        project.qa("qa", 30)
    return project.lookup("qa")


def test_an_endpoint_that_answers_without_the_model_is_not_trusted_with_stored_results(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=1.0, lookup={}, latency=0.001)
    configure(project, server.base_url, n=10)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    server.reconfigure(models=("another-model",))  # same URL, answers: it serves something else
    server.clear_log()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*does not serve model 'sim-model'; it serves: another-model*"])
    assert "from store" not in result.stdout.str() and _completions(server) == 0
