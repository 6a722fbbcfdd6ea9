"""``--mb-correction holm``: an item's final verdict is its pytest outcome in every channel.

For random mixes of baselines the terminal counts, the exit code, JUnit, ``--lf``, pytest-html,
the leaderboard and the ``pytest_modelbench_item_finished`` hook all say the same, with and
without xdist. Those mixes' items are decided when they finish (their p-values are far from
the band in between); ``WAITING`` below has two items that wait for Holm's final step, one it
fails and one it passes, and each reporter has its own test for them.
"""

from __future__ import annotations

import html
import json
import random
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from tests.conftest import Project

ENVS = ("qa", "qb", "qc", "qd", "qe")
ALPHA = 0.05

HOOK = """
import json, pathlib

def pytest_modelbench_item_finished(item_id, result):
    with pathlib.Path("finished.jsonl").open("a") as handle:
        handle.write(json.dumps({"item": item_id, "verdict": result.verdict_text}) + "\\n")
"""


def holm(p_values: dict[str, float], alpha: float = ALPHA) -> dict[str, bool]:
    """Which hypotheses Holm's step-down rejects (a textbook implementation, for reference)."""
    m = len(p_values)
    rejected: dict[str, bool] = dict.fromkeys(p_values, False)
    for rank, (name, p) in enumerate(sorted(p_values.items(), key=lambda kv: kv[1])):
        if p > alpha / (m - rank):
            break
        rejected[name] = True
    return rejected


@pytest.fixture
def five(project: Project, sim: Any) -> Project:
    for env in ENVS:
        project.qa(env, 200)
    server = sim(accuracy=0.7, lookup=project.lookup(*ENVS))
    project.models(
        {"alpha": {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": 32}}
    )
    for env in ENVS:
        project.env(env, [{"id": env, "module": "jsonl", "env_args": {"path": f"{env}.jsonl"}}])
    (project.root / "conftest.py").write_text(HOOK)
    return project


def _junit(project: Project) -> dict[str, tuple[bool, dict[str, str]]]:
    cases: dict[str, tuple[bool, dict[str, str]]] = {}
    for case in ET.parse(project.root / "junit.xml").iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        cases[props["mb_item"]] = (case.find("failure") is not None, props)
    return cases


def _html_results(project: Project) -> dict[str, str]:
    page = (project.root / "page.html").read_text()
    blob = json.loads(html.unescape(re.search(r'data-jsonblob="([^"]*)"', page)[1]))  # type: ignore[index]
    return {
        re.search(r"\[(.*)\]", nodeid)[1]: tests[0]["result"]  # type: ignore[index]
        for nodeid, tests in blob["tests"].items()
    }


@pytest.mark.parametrize("workers", [None, "2"])
@pytest.mark.parametrize("mix", [1, 2, 3])
def test_every_channel_shows_the_final_holm_verdict(
    five: Project, mix: int, workers: str | None
) -> None:
    project = five
    rng = random.Random(mix)
    # around the true 0.7: passes, failures at once (p <= alpha/m) and items that must wait
    values = {env: round(rng.choice([0.66, 0.74, 0.76, 0.77, 0.78, 0.8, 0.86]), 2) for env in ENVS}
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
        "".join(f"{env}: {{value: {value}}}\n" for env, value in values.items())
    )
    args = ["benchmarks/", "--model", "alpha", "--mb-correction", "holm"]
    args += ["--junitxml", "junit.xml", "--html", "page.html", "-p", "no:randomly"]
    if workers:
        args += ["-n", workers]
    result = project.pytester.runpytest(*args)

    junit = _junit(project)
    p_values = {item: float(props["mb_p_value"]) for item, (_, props) in junit.items()}
    expected = holm(p_values)  # item -> fails
    failing = {item for item, fails in expected.items() if fails}
    assert len(p_values) == len(ENVS)

    result.assert_outcomes(passed=len(ENVS) - len(failing), failed=len(failing))
    assert result.ret == (pytest.ExitCode.TESTS_FAILED if failing else pytest.ExitCode.OK)
    assert "holm-pending" not in result.stdout.str().splitlines()[-1]
    # terminal: the counts above, one short-summary line per failure, nothing left waiting
    for item in failing:
        result.stdout.fnmatch_lines([f"FAILED *[[]{item}[]]*"])
    # JUnit: each testcase, and the testsuite's counters
    for item, (has_failure, props) in junit.items():
        assert has_failure == (item in failing), (item, p_values)
        assert props["mb_verdict"] == ("fail" if item in failing else "pass")
    suite = ET.parse(project.root / "junit.xml").find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("tests")) == (str(len(failing)), str(len(ENVS)))
    lastfailed = json.loads(
        (project.root / ".pytest_cache" / "v" / "cache" / "lastfailed").read_text()
        if failing
        else "{}"
    )
    assert {re.search(r"\[(.*)\]", k)[1] for k in lastfailed} == failing  # type: ignore[index]
    # pytest-html: each test, and the page's counts
    assert _html_results(project) == {
        item: "Failed" if item in failing else "Passed" for item in expected
    }
    page = (project.root / "page.html").read_text()
    assert f"{len(failing)} Failed" in page and f"{len(ENVS) - len(failing)} Passed" in page
    (run,) = project.run_dirs()
    board = json.loads((run / "leaderboard.json").read_text())
    verdicts = {row["item_id"]: row["verdict"] for row in board["items"]}
    assert {row["item_id"]: row["outcome"] for row in board["items"]} == {
        item: "failed" if item in failing else "passed" for item in expected
    }
    assert verdicts == {item: "fail" if item in failing else "pass" for item in expected}
    finished = [json.loads(line) for line in (project.root / "finished.jsonl").open()]
    assert {row["item"]: row["verdict"] for row in finished} == verdicts
    assert len(finished) == len(ENVS)


def test_an_item_waiting_for_holm_says_so_and_is_rerun_by_lf(five: Project) -> None:
    project = five
    # one clear regression, one item in Holm's grey zone (alpha/m < p < alpha), three passes
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
        "qa: {value: 0.9}\nqb: {value: 0.75}\nqc: {value: 0.5}\nqd: {value: 0.5}\n"
        "qe: {value: 0.5}\n"
    )
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--mb-correction", "holm", "-v", "-p", "no:randomly"
    )
    result.stdout.fnmatch_lines(["*alpha-qb-seed0* HOLM-PENDING*"])
    outcome = result.parseoutcomes()
    assert outcome.get("failed", 0) >= 1 and "holm-pending" not in outcome
    again = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--mb-correction", "holm", "--lf", "-p", "no:randomly"
    )
    again.assert_outcomes(failed=outcome["failed"])


def test_several_tests_of_one_item_count_it_once(five: Project) -> None:
    """A second test on ``mb_eval`` shares the item: Holm's family stays one per item, every
    waiting test is settled, and the summary has one row per item."""
    project = five
    (project.root / "benchmarks" / "test_extra.py").write_text(
        "def test_extra(mb_eval):\n    assert mb_eval.score is not None\n"
    )
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
        "qa: {value: 0.9}\nqb: {value: 0.75}\nqc: {value: 0.5}\nqd: {value: 0.5}\n"
        "qe: {value: 0.5}\n"
    )
    args = ["benchmarks/", "--model", "alpha", "--mb-correction", "holm", "-p", "no:randomly"]
    result = project.pytester.runpytest(*args, "--junitxml", "junit.xml")
    outcomes = result.parseoutcomes()
    assert "holm-pending" not in outcomes, outcomes
    junit = _junit(project)  # the last testcase of each item
    p_values = {item: float(props["mb_p_value"]) for item, (_, props) in junit.items()}
    failing = {item for item, fails in holm(p_values).items() if fails}  # family of 5, not 10
    assert len(p_values) == len(ENVS)
    table = [line for line in result.outlines if line.startswith("alpha ")]
    assert len(table) == len(ENVS)  # one row per item
    for line in table:
        item = f"alpha-{line.split()[1]}-seed0"
        assert line.split()[-1] == ("fail" if item in failing else "pass"), line
    assert outcomes.get("failed", 0) >= len(failing)


def test_a_baseline_entry_alpha_is_the_items_own_under_holm(five: Project) -> None:
    """An entry's ``alpha`` decides its item under Holm too, in every channel alike."""
    project = five
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
        "qa: {value: 0.75, alpha: 0.001}\n"  # p of about 0.02: passes at its own alpha
    )
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--env", "qa", "--mb-correction", "holm",
        "--junitxml", "junit.xml",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK
    ((_, props),) = _junit(project).values()
    assert props["mb_verdict"] == "pass"
    assert "regressions after Holm correction" not in result.stdout.str()


# qa fails at once (p <= alpha/m); qb and qe wait (alpha/m < p < alpha); Holm's final step then
# fails qe (second smallest p, <= alpha/4) and passes qb (third, > alpha/3); qc and qd pass at once
WAITING = (
    "qa: {value: 0.9}\nqb: {value: 0.75}\nqc: {value: 0.5}\nqd: {value: 0.5}\nqe: {value: 0.74}\n"
)
WAITED = {"alpha-qb-seed0", "alpha-qe-seed0"}
SETTLED_FAILING = {"alpha-qa-seed0", "alpha-qe-seed0"}


def _run_waiting(project: Project, workers: str | None, *args: str) -> pytest.RunResult:
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(WAITING)
    extra = ["-n", workers] if workers else []
    return project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--mb-correction", "holm", "-p", "no:randomly",
        *extra, *args,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [None, "2"])
def test_holm_settles_the_terminal_counts_and_exit_code(five: Project, workers: str | None) -> None:
    result = _run_waiting(five, workers, "-v")
    for item in sorted(WAITED):
        # -v: "<node id> HOLM-PENDING"; under xdist "[gw0] [ 40%] HOLM-PENDING <node id>"
        result.stdout.re_match_lines([f".*({item}.*HOLM-PENDING|HOLM-PENDING.*{item})"])
    result.assert_outcomes(passed=len(ENVS) - len(SETTLED_FAILING), failed=len(SETTLED_FAILING))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    for item in SETTLED_FAILING:
        result.stdout.fnmatch_lines([f"FAILED *[[]{item}[]]*"])
    result.stdout.fnmatch_lines(["*regressions after Holm correction*", "qe exact_match*"])


@pytest.mark.parametrize("workers", [None, "2"])
def test_holm_settles_junit(five: Project, workers: str | None) -> None:
    _run_waiting(five, workers, "--junitxml", "junit.xml")
    junit = _junit(five)
    p_values = {item: float(props["mb_p_value"]) for item, (_, props) in junit.items()}
    waited = {item for item, p in p_values.items() if ALPHA / len(ENVS) < p < ALPHA}
    assert waited == WAITED, p_values
    assert {item for item, fails in holm(p_values).items() if fails} == SETTLED_FAILING
    for item, (has_failure, props) in junit.items():
        assert has_failure == (item in SETTLED_FAILING), item
        assert props["mb_verdict"] == ("fail" if item in SETTLED_FAILING else "pass")
    suite = ET.parse(five.root / "junit.xml").find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("tests")) == (str(len(SETTLED_FAILING)), "5")


@pytest.mark.parametrize("workers", [None, "2"])
def test_holm_settles_pytest_html(five: Project, workers: str | None) -> None:
    _run_waiting(five, workers, "--html", "page.html")
    assert _html_results(five) == {
        f"alpha-{env}-seed0": "Failed" if f"alpha-{env}-seed0" in SETTLED_FAILING else "Passed"
        for env in ENVS
    }
    page = (five.root / "page.html").read_text()
    assert f"{len(SETTLED_FAILING)} Failed" in page
    assert f"{len(ENVS) - len(SETTLED_FAILING)} Passed" in page


@pytest.mark.parametrize("workers", [None, "2"])
def test_holm_settles_lastfailed(five: Project, workers: str | None) -> None:
    _run_waiting(five, workers)
    lastfailed = json.loads((five.root / ".pytest_cache/v/cache/lastfailed").read_text())
    assert {re.search(r"\[(.*)\]", k)[1] for k in lastfailed} == SETTLED_FAILING  # type: ignore[index]
    again = _run_waiting(five, workers, "--lf")
    again.assert_outcomes(failed=len(SETTLED_FAILING))
