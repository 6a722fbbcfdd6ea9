"""``--mb-stop-early``: a gated item stops once its verdict is certain, reading its results in a
seeded random order (never arrival order), cancels what is in flight, and a resume reaches the
same decision; the verdict, the summary and the table say so."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_modelbench.gating.early import EarlyStopper, StopRule, value_rule
from pytest_modelbench.suites.contract import Example
from pytest_modelbench.suites.selection import sample_order
from tests.conftest import Project

N = 300


def _completions(server: Any) -> int:
    return sum(1 for r in server.requests if r.path.endswith("completions"))


@pytest.fixture
def qa(project: Project, sim: Any) -> tuple[Project, Any]:
    project.qa("qa", N)
    server = sim(accuracy=0.0, lookup=project.lookup("qa"), latency=0.002)
    project.models(
        {"alpha": {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": 4}}
    )
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa: {value: 0.65}\n")
    return project, server


def _summary(project: Project) -> dict[str, Any]:
    (run_dir,) = project.run_dirs()
    data: dict[str, Any] = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    return data


def test_a_collapse_fails_within_a_few_examples(qa: tuple[Project, Any]) -> None:
    project, server = qa
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-stop-early")
    result.assert_outcomes(failed=1)
    summary = _summary(project)
    stopped = summary["stopped_early"]
    used = stopped["n_used"]
    assert stopped["decision"] == "regression" and stopped["n_planned"] == N
    assert used <= 0.05 * N and summary["metrics"]["exact_match"]["n"] == used
    assert _completions(server) <= used + 4  # the rest never sent (4 in flight at most)
    result.stdout.fnmatch_lines(
        [
            f"qa exact_match 0.000 * vs baseline 0.650 (margin 0): stopped at {used} of {N} "
            "examples: regression certain (Δ in ?-0.650, -0.*? at every n, e=* >= 1/0.01, "
            "anytime-valid betting confidence sequence)*",
            f"*fail (stopped at {used} of {N})*",
        ]
    )
    # the same command reads the stopped item back: nothing is sent again
    server.clear_log()
    again = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-stop-early")
    again.assert_outcomes(failed=1)
    assert _completions(server) == 0
    # without --mb-stop-early the item continues from its journal to the end
    full = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    full.assert_outcomes(failed=1)
    assert "stopped_early" not in _summary(project)
    assert N - used - 4 <= _completions(server) <= N - used  # replies past the prefix are kept


def test_a_clear_pass_stops_and_passes(qa: tuple[Project, Any]) -> None:
    project, server = qa
    server.reconfigure(accuracy=1.0)
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa: {value: 0.5}\n")
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-stop-early")
    result.assert_outcomes(passed=1)
    stopped = _summary(project)["stopped_early"]
    assert stopped["decision"] == "no regression" and stopped["n_used"] < N / 4


def test_without_a_baseline_the_item_runs_to_its_end(qa: tuple[Project, Any]) -> None:
    project, server = qa
    (project.root / "configs" / "baselines" / "alpha.yaml").unlink()
    project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-stop-early")
    assert _completions(server) == N and "stopped_early" not in _summary(project)


def test_the_rule_reads_the_samples_order_not_arrival_order() -> None:
    """Hard examples answer late: fed in arrival order (easy first), a rule would see a run of
    right answers; reading the completed prefix, it waits for the hard ones."""
    rule = value_rule(0.5, 0.0, 0.05)
    assert rule is not None
    order = [f"q{i}" for i in range(200)]
    stopper = EarlyStopper(rule, order, 1, "m")
    hard = {f"q{i}" for i in range(0, 200, 2)}  # half are wrong, and they arrive last
    arrival = [q for q in order if q not in hard] + [q for q in order if q in hard]
    for example in arrival[:100]:  # every easy one has arrived, no hard one yet
        assert stopper.add({"example_id": example, "metrics": {"m": 1.0}}) is None
    assert stopper.used == 0  # the prefix stops at the first hard example, still missing
    for example in arrival[100:]:
        stopper.add({"example_id": example, "metrics": {"m": 0.0}})
    assert stopper.decision is None  # a true 0.5 against 0.5: never certain


def test_sample_order_is_a_uniform_shuffle_fixed_by_the_ids() -> None:
    """Every subject's examples are spread over the order as chance has it (a prefix is a
    simple random sample), never the large subjects first."""
    examples = [
        Example(id=f"{s}{i}", messages=(), gold="g", meta={"subject": s})
        for s, size in (("big", 400), *((f"small{j}-", 10) for j in range(20)))
        for i in range(size)
    ]
    order = sample_order(examples)
    assert sorted(e.id for e in order) == sorted(e.id for e in examples)
    assert [e.id for e in order] == [e.id for e in sample_order(list(reversed(examples)))]
    first = [e.meta["subject"] for e in order[:100]]
    assert 19 <= sum(s != "big" for s in first) <= 47  # a third small (± 3 sd), as in the item
    big = [e.id for e in order if e.meta["subject"] == "big"]
    assert big != sorted(big, key=lambda x: int(x[3:]))  # not file order


def test_holm_splits_alpha_over_the_family() -> None:
    rule = value_rule(0.65, 0.0, 0.05 / 20)
    assert isinstance(rule, StopRule)
    assert rule.alpha_regression == pytest.approx(0.05 * 0.2 / 20)


def test_a_backend_with_its_own_loop_runs_to_the_end_and_says_so() -> None:
    """lm-eval and verifiers run their own loop: no rule is handed to them, one warning says so."""
    from types import SimpleNamespace

    from pytest_modelbench.evaluation.evaluate import ItemEvaluator, StopEarlyWarning

    rule = value_rule(0.65, 0.0, 0.05)
    evaluator = SimpleNamespace(stop_rule_for=lambda *_: rule)
    item = SimpleNamespace(item_id="lm-toy-seed42")
    own_loop = SimpleNamespace(name="lm_eval")
    with pytest.warns(StopEarlyWarning, match="lm-toy-seed42: --mb-stop-early: the lm_eval "):
        assert ItemEvaluator._stop_rule(evaluator, item, own_loop, "acc") is None  # type: ignore[arg-type]
    suite = SimpleNamespace(name="jsonl", stops_early=True)
    assert ItemEvaluator._stop_rule(evaluator, item, suite, "acc") is rule  # type: ignore[arg-type]


def test_a_resumed_item_reaches_the_same_decision(qa: tuple[Project, Any]) -> None:
    """Killed after 8 rows (what a kill leaves: the journal, no summary), the same command
    reads those rows in the sample's order and stops at the same example, asking only for the
    rest of the prefix."""
    project, server = qa
    server.reconfigure(accuracy=0.3)  # some right, some wrong: the order matters
    args = ["benchmarks/", "--model", "alpha", "--mb-stop-early"]
    project.pytester.runpytest(*args).assert_outcomes(failed=1)
    first = _summary(project)["stopped_early"]
    (run_dir,) = project.run_dirs()
    item = run_dir / "alpha-qa-seed0"
    lines = (item / "results.jsonl").read_text().splitlines(keepends=True)
    (item / "results.jsonl").write_text("".join(lines[:8]))
    for name in ("summary.json", "result.json", "selection.json"):
        (item / name).unlink()
    server.clear_log()
    project.pytester.runpytest(*args).assert_outcomes(failed=1)
    again = _summary(project)["stopped_early"]
    assert (again["decision"], again["n_used"]) == (first["decision"], first["n_used"])
    assert again["ci_high"] == pytest.approx(first["ci_high"])
    assert _completions(server) <= first["n_used"] - 8 + 4


def test_a_stopped_item_is_not_reused_under_another_baseline(qa: tuple[Project, Any]) -> None:
    """Stopped as a regression against 0.65 (and kept out of --update-baselines: a prefix
    chosen by optional stopping is no baseline); the baseline is then lowered: the old
    decision does not stand, the item continues under the new rule from its journal."""
    project, _ = qa
    args = ["benchmarks/", "--model", "alpha", "--mb-stop-early"]
    baselines = project.root / "configs" / "baselines" / "alpha.yaml"
    result = project.pytester.runpytest(*args, "--update-baselines")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kept 'qa' *alpha-qa-seed0 stopped early (--mb-stop-early)*"])
    assert baselines.read_text() == "qa: {value: 0.65}\n"
    first = _summary(project)["stopped_early"]
    baselines.write_text("qa: {value: 0.02, margin: 0.01}\n")
    again = project.pytester.runpytest(*args)
    assert again.ret in (0, 1), again.stdout.str()
    summary = _summary(project)
    assert summary["stop_rule"] != first["rule_key"]
    assert summary.get("stopped_early", {}).get("rule_key") != first["rule_key"]


def test_collect_only_shows_the_examples_each_item_is_expected_to_use(
    qa: tuple[Project, Any],
) -> None:
    """The plan says, per gated item, how many examples its rule is expected to read if the
    score equals the baseline and if it collapses; the collapse figure is the real run's
    stopping point, and nothing is sent while planning. Without the flag: no such line."""
    project, server = qa
    args = ["benchmarks/", "--model", "alpha", "--collect-only"]
    plain = project.pytester.runpytest(*args)
    assert "expected examples" not in plain.stdout.str()
    result = project.pytester.runpytest(*args, "--mb-stop-early")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "--mb-stop-early: expected examples per gated item (simulated from its rule):",
            f"  alpha-qa-seed0: ~* of {N} examples if it scores the baseline 0.650; "
            "* if it collapses to 0",
        ]
    )
    assert _completions(server) == 0
    line = next(x for x in result.stdout.lines if x.startswith("  alpha-qa-seed0: ~"))
    at_baseline = int(line.split("~")[1].split(" ")[0])
    collapsed = int(line.split("; ")[1].split(" ")[0])
    # at the baseline a side is certain in at most alpha + alpha / 5 of the runs (Ville):
    # on average the rule reads nearly every example
    assert (1 - 0.06) * N <= at_baseline <= N
    project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-stop-early")
    assert _summary(project)["stopped_early"]["n_used"] == collapsed  # the server scores 0
