"""Observed tokens per example: remembered as items finish, then used by ``--collect-only``'s
plan and by the scheduler's costs in place of the suite's static figure (a reasoning model
thinks for far longer than that figure says)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from pytest_modelbench.backends.jsonl_suite import JsonlSuite
from pytest_modelbench.scheduling.costs import TOKENS_PER_S
from pytest_modelbench.scheduling.tokens import (
    ESTIMATED,
    OBSERVED,
    OBSERVED_ENV,
    OBSERVED_VARIANT,
    SCHEMA_VERSION,
    TOKENS_KEY,
    ObservedTokens,
    read_tokens,
)
from pytest_modelbench.store.summary import ItemSummary
from tests.conftest import Project, configure
from tests.scheduler.test_costs import Backend, costs, item, variant

STATIC = JsonlSuite.tokens_per_example  # the jsonl suite's static figure


def plan_row(result: pytest.RunResult, item_id: str) -> list[str]:
    """The cells of one item's line in the ``--collect-only`` plan."""
    (line,) = [line for line in result.outlines if line.startswith(f"{item_id} ")]
    cells = line.split()
    return [*cells[:7], " ".join(cells[7:])]  # the "from" column may hold a space


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["in-process", "xdist"])
def test_a_reasoning_run_is_planned_next_time_with_its_observed_tokens(
    project: Project, sim: Any, workers: tuple[str, ...]
) -> None:
    """The controller remembers what the run used (under xdist too: it reads the record the
    worker saved), and the next plan shows it, labelled, for the item and its other seeds."""
    configure(project, "http://placeholder", n=6)
    server = sim(lookup=project.lookup("qa"), accuracy=1.0, reasoning_words=1000, seed=1)
    configure(project, server.base_url, n=6)
    env = project.root / "configs" / "envs" / "qa.yaml"
    (qa,) = yaml.safe_load(env.read_text())
    qa["sampling_args"] = {"max_tokens": 2000}  # room for the thinking: nothing is truncated
    env.write_text(yaml.safe_dump([qa]))

    before = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--collect-only")
    assert plan_row(before, "alpha-qa-seed0")[5:] == [str(STATIC), f"{6 * STATIC:,}", ESTIMATED]
    before.stdout.fnmatch_lines(["1 items, 1 model(s) (alpha), 6 examples, ~1,200 tokens"])

    ran = project.pytester.runpytest("benchmarks/", "--model", "alpha", *workers)
    ran.assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    assert summary["truncated"] == 0 and summary["tokens"]["reasoning"] == 6 * 1000
    seen = (summary["tokens"]["prompt"] + summary["tokens"]["completion"]) / summary["n_scored"]
    assert seen > 1000 > 4 * STATIC  # the thinking is counted: far above the static figure

    # seed 1 never ran: it borrows seed 0's figure (same model × variant)
    after = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--seeds", "0,1", "--collect-only"
    )
    assert plan_row(after, "alpha-qa-seed0")[4:] == [
        "6",
        f"{round(seen):,}",
        f"{round(6 * seen):,}",
        OBSERVED,
    ]
    assert plan_row(after, "alpha-qa-seed1")[5:] == [
        f"{round(seen):,}",
        f"{round(6 * seen):,}",
        OBSERVED_VARIANT,
    ]
    after.stdout.fnmatch_lines(["2 items, 1 model(s) (alpha), 12 examples, ~* tokens (2 of 2 *)"])


def test_observed_tokens_set_the_job_cost_and_the_calibration() -> None:
    """The observed figure replaces the static one in an item's cost, and seconds per token are
    calibrated against it: a long-thinking model is not mistaken for a slow server."""
    qa, math = variant("qa"), variant("math")
    qa_long = dataclasses.replace(variant("qa-long"), env="qa")  # another variant of env qa
    items = [item("thinker", qa), item("thinker", qa, seed=1), item("thinker", qa_long)]
    items.append(item("thinker", math))
    per_example = 4000.0  # observed; the suite says 400
    observed = {
        "thinker-qa-seed0": ObservedTokens("thinker", "qa", "qa", int(50 * per_example), 50)
    }

    c = costs(items, Backend(examples=50, tokens=400), observed=observed)
    for item_id, source in [
        ("thinker-qa-seed0", OBSERVED),
        ("thinker-qa-seed1", OBSERVED_VARIANT),
        ("thinker-qa-long-seed0", OBSERVED_ENV),
    ]:
        cost = c.cost(item_id)
        assert (cost.source, cost.tokens_from) == ("tokens", source)
        assert cost.seconds == pytest.approx(50 * per_example / TOKENS_PER_S)
    assert c.cost("thinker-math-seed0").tokens_from == ESTIMATED
    assert c.cost("thinker-math-seed0").seconds == pytest.approx(50 * 400 / TOKENS_PER_S)
    nodeid = "benchmarks/test_models.py::test_benchmark[thinker-qa-seed1]"
    assert c.job(0, nodeid).cost == pytest.approx(50 * per_example / TOKENS_PER_S)

    # 200 s for 50 × 4000 observed tokens: 1 ms a token, so math's 50 × 400 take 20 s (the
    # static figure would have made it 0.01 s a token, and math 200 s)
    timed = costs(
        items,
        Backend(examples=50, tokens=400),
        observed=observed,
        durations={"thinker-qa-seed0": 200.0},
    )
    assert timed.cost("thinker-qa-seed0").source == "duration"
    assert timed.cost("thinker-qa-seed1").seconds == pytest.approx(200.0)
    assert timed.cost("thinker-math-seed0").seconds == pytest.approx(20.0)


class Cache:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self, key: str, _default: Any) -> Any:
        assert key == TOKENS_KEY
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def test_malformed_token_entries_are_ignored() -> None:
    good = {"model": "m", "env": "qa", "variant": "qa", "tokens": 900, "replies": 3}
    items = {
        "ok": good,
        "float": {**good, "tokens": 900.0},
        "text": {**good, "tokens": "many"},
        "zero": {**good, "replies": 0},
        "negative": {**good, "tokens": -5},
        "nan": {**good, "tokens": float("nan")},
        "bool": {**good, "replies": True},
        "no-model": {**good, "model": None},
        "list": [1, 2],
    }
    read = read_tokens(SimpleNamespace(cache=Cache({"schema_version": 1, "items": items})))  # type: ignore[arg-type]
    assert sorted(read) == ["float", "ok"] and read["ok"].per_example == 300.0
    for junk in (
        None,
        ["ok"],
        {"schema_version": 99, "items": items},
        {"schema_version": SCHEMA_VERSION, "items": "ok"},
        ValueError("torn"),
    ):
        assert read_tokens(SimpleNamespace(cache=Cache(junk))) == {}  # type: ignore[arg-type]
    assert read_tokens(SimpleNamespace()) == {}  # type: ignore[arg-type]  # -p no:cacheprovider


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"schema_version": SCHEMA_VERSION, "items": {"alpha-qa-seed0": {"tokens": 9}}}),
        json.dumps({"alpha-qa-seed0": 5000}),  # shaped like the durations key
    ],
    ids=["torn", "bad-entry", "other-shape"],
)
def test_a_corrupt_token_cache_is_ignored(project: Project, content: str) -> None:
    configure(project, "http://127.0.0.1:9/v1", n=4)
    cache = project.root / ".pytest_cache" / "v" / "modelbench"
    cache.mkdir(parents=True)
    (cache / "tokens").write_text(content)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--collect-only")
    assert result.ret == pytest.ExitCode.OK
    assert plan_row(result, "alpha-qa-seed0")[5:] == [str(STATIC), f"{4 * STATIC:,}", ESTIMATED]


def test_summaries_without_token_counts_teach_nothing() -> None:
    def seen(summary: dict[str, Any]) -> ObservedTokens | None:
        return ObservedTokens.from_summary("m", "qa", "qa", ItemSummary.from_json(summary))

    assert seen({"tokens": {"prompt": 40, "completion": 560}, "n_scored": 2}) == ObservedTokens(
        "m", "qa", "qa", 600, 2
    )
    assert seen({"tokens": {"prompt": 0, "completion": 0}, "n_scored": 2}) is None  # no usage
    assert seen({"tokens": {"prompt": 40, "completion": 560}, "n_scored": 0}) is None
    assert seen({"n_scored": 2}) is None
    assert seen({"tokens": {"prompt": "x", "completion": 5}, "n_scored": 2}) is None


def test_an_item_that_ended_in_error_is_remembered_too(project: Project, sim: Any) -> None:
    """Issue 43: an item over its error budget used tokens for the replies it got; the next
    plan uses them, as for a finished item."""
    configure(project, "http://placeholder", n=20)
    server = sim(lookup=project.lookup("qa"), accuracy=1.0, faults={"error_5xx": 0.5}, seed=3)
    configure(project, server.base_url, n=20, max_retries=0)
    ran = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-error-budget", "0")
    ran.assert_outcomes(errors=1)
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    assert summary["status"] == "error" and summary["n_scored"] > 0
    seen = (summary["tokens"]["prompt"] + summary["tokens"]["completion"]) / summary["n_scored"]
    after = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--collect-only")
    assert plan_row(after, "alpha-qa-seed0")[5:] == [
        f"{round(seen):,}",
        f"{round(20 * seen):,}",
        OBSERVED,
    ]
