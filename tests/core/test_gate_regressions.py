"""The regressions a CI gate meets every week are caught: a verdict reads exactly this run's
selection, a reference must be finished, a failed item never lowers its own baseline, Holm's
final verdict shows in pytest-html, checkpoints pair across model names, and an echoed bearer
token is in no artifact."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Project
from tests.core.test_secrets import gateway  # noqa: F401  # the key-echoing gateway fixture

TOKEN = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2Vu.QmVhcmVyT25seQ"


def _baselines(project: Project, model: str, text: str) -> Path:
    path = project.root / "configs" / "baselines" / f"{model}.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def qa40(project: Project, sim: Any) -> tuple[Project, Any]:
    project.qa("qa", 40)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    project.models(
        {"alpha": {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": 8}}
    )
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    return project, server


def _verdict(run_dir: Path, item: str = "alpha-qa-seed0") -> dict[str, Any]:
    verdict: dict[str, Any] = json.loads((run_dir / item / "result.json").read_text())["verdict"]
    return verdict


# --------------------------------------------------------------------------- the selection


def test_a_smaller_num_examples_is_gated_on_its_own_examples(qa40: tuple[Project, Any]) -> None:
    """5 wrong, then 15 more right, then --num-examples 5 in the same run directory: 0/5 against
    an exact 0.9 fails, as it does in a fresh run (before: the gate read all 20 rows, found they
    did not reproduce the summary and passed it on a zero standard error)."""
    project, server = qa40
    run = project.pytester.runpytest
    server.reconfigure(accuracy=0.0)
    run("benchmarks/", "--model", "alpha", "--num-examples", "5").assert_outcomes(passed=1)
    server.reconfigure(accuracy=1.0)
    run("benchmarks/", "--model", "alpha", "--num-examples", "20").assert_outcomes(passed=1)
    _baselines(project, "alpha", "qa: {value: 0.9}\n")
    result = run("benchmarks/", "--model", "alpha", "--num-examples", "5")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*qa exact_match 0.000 * vs baseline 0.900*regression*p<0.001*"])
    (run_dir,) = project.run_dirs()
    assert len((run_dir / "alpha-qa-seed0" / "results.jsonl").read_text().splitlines()) == 20
    # the README's "write your own test": mb_eval.rows() are the 5 the summary covers
    (project.root / "benchmarks" / "test_rows.py").write_text(
        "def test_rows(mb_eval):\n"
        "    assert mb_eval.n == 5 and len(mb_eval.rows()) == 5, len(mb_eval.rows())\n"
    )
    run("benchmarks/test_rows.py", "--model", "alpha", "--num-examples", "5").assert_outcomes(
        passed=1
    )


# --------------------------------------------------------------------------- references


def _kill_after(run_dir: Path, item: str, kept: int) -> None:
    """What a kill of the reference after ``kept`` examples leaves: those journal lines, no
    summary, the manifest entry still running."""
    item_dir = run_dir / item
    lines = (item_dir / "results.jsonl").read_text().splitlines(keepends=True)
    (item_dir / "results.jsonl").write_text("".join(lines[:kept]))
    for name in ("summary.json", "result.json", "selection.json"):
        (item_dir / name).unlink(missing_ok=True)
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    manifest["items"][item]["status"] = "running"
    (run_dir / "run_manifest.json").write_text(json.dumps(manifest))


def test_an_unfinished_reference_is_an_error_naming_it(qa40: tuple[Project, Any]) -> None:
    project, server = qa40
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (reference,) = project.run_dirs()
    _kill_after(reference, "alpha-qa-seed0", 8)
    server.reconfigure(accuracy=0.7)
    args = ["benchmarks/", "--model", "alpha", "--baseline-run", reference.name]
    result = project.pytester.runpytest(*args, "--mb-no-auto-resume")
    result.assert_outcomes(errors=1)  # before: a 30-point regression passed on 8 examples
    result.stdout.fnmatch_lines(
        [
            f"*reference run {reference.name!r}: alpha-qa-seed0 is unfinished (running, 8 "
            "example(s) scored in its journal)*--mb-allow-unfinished-baseline*"
        ]
    )
    project.pytester.runpytest(*args, "--mb-allow-unfinished-baseline").assert_outcomes(passed=1)
    message = _verdict(project.run_dirs()[-1])["message"]
    assert (
        f"vs run {reference.name} (unfinished: 8 rows, --mb-allow-unfinished-baseline) 1.000 "
        "(margin 0, 8 paired examples" in message
    )


def test_checkpoints_pair_across_model_names(project: Project, sim: Any) -> None:
    """Yesterday's run of ckpt-0601 is today's reference for ckpt-0602."""
    project.qa("qa", 30)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    models = {
        name: {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": 8}
        for name in ("ckpt-0601", "ckpt-0602", "ckpt-0603")
    }
    project.models(models)
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    run = project.pytester.runpytest
    run("benchmarks/", "--model", "ckpt-0601").assert_outcomes(passed=1)
    (yesterday,) = project.run_dirs()
    server.reconfigure(accuracy=0.5)
    result = run("benchmarks/", "--model", "ckpt-0602", "--baseline-run", yesterday.name)
    result.assert_outcomes(failed=1)  # before: an error, "run that item there first"
    result.stdout.fnmatch_lines(
        [f"*qa exact_match 0.* vs ckpt-0601 in run {yesterday.name} 1.000 *regression*"]
    )
    # a reference with two models needs to be told which: one line, then it pairs
    run("benchmarks/", "--model", "ckpt-0602", "--mb-run-id", "two").assert_outcomes(passed=1)
    run("benchmarks/", "--model", "ckpt-0601", "--mb-run-id", "two").assert_outcomes(passed=1)
    ambiguous = run("benchmarks/", "--model", "ckpt-0603", "--baseline-run", "two")
    ambiguous.assert_outcomes(errors=1)
    ambiguous.stdout.fnmatch_lines(
        [
            "*reference run 'two' has no model 'ckpt-0603' (it holds ckpt-0601, ckpt-0602): "
            "pass --mb-baseline-model NAME*"
        ]
    )
    args = ["--baseline-run", "two", "--mb-baseline-model", "ckpt-0601"]
    run("benchmarks/", "--model", "ckpt-0603", *args).assert_outcomes(passed=1)
    results = [d / "ckpt-0603-qa-seed0" / "result.json" for d in project.run_dirs()]
    latest = max((r for r in results if r.is_file()), key=lambda r: r.stat().st_mtime_ns)
    verdict = _verdict(latest.parent.parent, "ckpt-0603-qa-seed0")
    assert "vs ckpt-0601 in run two 0.467 (margin 0, 30 paired examples)" in verdict["message"]


# --------------------------------------------------------------------------- baselines


def test_update_baselines_never_writes_a_failed_items_score(qa40: tuple[Project, Any]) -> None:
    project, server = qa40
    path = _baselines(project, "alpha", "qa: {value: 0.95, n: 40}\n")
    server.reconfigure(accuracy=0.3)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--update-baselines")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "--update-baselines: kept 'qa' in configs/baselines/alpha.yaml: alpha-qa-seed0 "
            "failed its gate (pass --mb-update-failed-baselines to write a failed score *)"
        ]
    )
    assert yaml.safe_load(path.read_text()) == {"qa": {"value": 0.95, "n": 40}}
    forced = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--update-baselines", "--mb-update-failed-baselines"
    )
    forced.assert_outcomes(failed=1)
    assert yaml.safe_load(path.read_text())["qa"]["value"] < 0.5


# --------------------------------------------------------------------------- Holm in pytest-html


def _html_tests(page: Path) -> dict[str, dict[str, Any]]:
    blob = json.loads(html.unescape(re.search(r'data-jsonblob="([^"]*)"', page.read_text())[1]))  # type: ignore[index]
    return {
        re.search(r"\[(.*)\]", nodeid)[1]: tests[0]  # type: ignore[index]
        for nodeid, tests in blob["tests"].items()
    }


def test_pytest_html_shows_holms_final_verdict(project: Project, sim: Any) -> None:
    """Three items each significant alone (p about 0.02-0.04) that Holm passes together: the
    row, its verdict cell and its paragraph in pytest-html all say pass."""
    envs = ("qa", "qb", "qc")
    for env in envs:
        project.qa(env, 100)
        project.env(env, [{"id": env, "module": "jsonl", "env_args": {"path": f"{env}.jsonl"}}])
    lookup = project.lookup(*envs)
    server = sim(accuracy=1.0, lookup=lookup)
    # 80 of 100 right in each environment: exact binomial vs 0.87 gives p = 0.031
    wrong = [key for key in lookup if key.split(":")[0] in envs]
    server.reconfigure(accuracy_overrides={key: 0.0 for key in wrong if int(key.split()[3]) >= 80})
    project.models({"alpha": {"model": "sim-model", "api_base_url": server.base_url}})
    _baselines(project, "alpha", "".join(f"{env}: {{value: 0.87}}\n" for env in envs))
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--mb-correction", "holm", "--html", "page.html"
    )
    result.assert_outcomes(passed=3)
    tests = _html_tests(project.root / "page.html")
    assert len(tests) == 3
    for test in tests.values():
        assert test["result"] == "Passed"
        (verdict,) = [c for c in test["resultsTableRow"] if "col-mbverdict" in c]
        assert ">pass<" in verdict and "fail" not in verdict, verdict
        (extra,) = [e for e in test["extras"] if e["name"] == "modelbench"]
        assert "Holm pending" not in extra["content"] and "regression" not in extra["content"]
        assert "Holm-adjusted p=" in extra["content"]


# --------------------------------------------------------------------------- credentials


@pytest.mark.parametrize("workers", [None, "2"])
def test_an_echoed_bearer_token_is_in_no_artifact(
    project: Project,
    gateway: str,  # noqa: F811  # the fixture imported from test_secrets
    workers: str | None,
) -> None:
    project.qa("qa", 6)
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    project.models(
        {
            "alpha": {
                "model": "sim-model",
                "api_base_url": gateway,
                "max_retries": 0,
                "sampling_args": {"extra_headers": {"Authorization": f"Bearer {TOKEN}"}},
            }
        }
    )
    args = ["benchmarks/", "--model", "alpha", "--junitxml", "junit.xml", "-rA"]
    args += ["--html", "page.html", "--mb-no-auto-resume"]
    if workers:
        args += ["-n", workers]
    result = project.pytester.runpytest(*args)
    result.assert_outcomes(errors=1)
    output = result.stdout.str() + result.stderr.str()
    assert "Incorrect API key provided: [REDACTED]" in output  # the gateway echoed the token
    assert TOKEN not in output
    # everything modelbench and its reporters wrote (the user's own models.yaml holds the token)
    written = [p for p in project.root.rglob("*") if p.is_file() and p.name != "models.yaml"]
    names = {p.name for p in written}
    assert {"results.jsonl", "report.html", "junit.xml", "page.html"} <= names
    for path in written:
        assert TOKEN.encode() not in path.read_bytes(), path


# --------------------------------------------------------------------------- excluded errors


def test_server_errors_within_the_budget_cannot_pass_a_regression(
    project: Project, sim: Any
) -> None:
    """Every answer right, a few 5xx after retries (inside a 20% error budget): 1.000 on the
    examples answered, but counted wrong the errors fail an exact 1.0 baseline: the errors
    decide it, so the item fails and says so; against 0.5 the same errors cannot matter."""
    project.qa("qa", 60)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"), faults={"error_5xx": 0.08}, seed=4)
    project.models(
        {"alpha": {"model": "sim-model", "api_base_url": server.base_url, "max_retries": 0}}
    )
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    _baselines(project, "alpha", "qa: {value: 1.0}\n")
    args = ["benchmarks/", "--model", "alpha", "--mb-error-budget", "0.2"]
    result = project.pytester.runpytest(*args)
    result.assert_outcomes(failed=1)  # before: 1.000 on the answered examples, a pass
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    errors = summary["errors"]
    assert 0 < errors <= 12 and summary["metrics"]["exact_match"]["value"] == 1.0
    result.stdout.fnmatch_lines(
        [
            f"qa exact_match {(60 - errors) / 60:.3f} * vs baseline 1.000 (margin 0): "
            f"inconclusive, fails with the {errors} errored rows counted wrong*; {errors} errored "
            f"row(s) (timeouts, server errors): {(60 - errors) / 60:.3f} counted wrong (gated), "
            f"1.000 counted right; the {errors} error(s) decide it*"
        ]
    )
    _baselines(project, "alpha", "qa: {value: 0.5}\n")
    project.pytester.runpytest(*args).assert_outcomes(passed=1)


def test_a_reference_run_may_be_named_by_its_absolute_path(qa40: tuple[Project, Any]) -> None:
    """A CI artifact elsewhere (``--baseline-run /ci/artifacts/run-x``), as ``--restart``
    takes one; a relative path that climbs out stays refused."""
    project, server = qa40
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (reference,) = project.run_dirs()
    server.reconfigure(accuracy=0.5)
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--baseline-run", str(reference.absolute())
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*vs run * 1.000 (margin 0, 40 paired examples)*"])
