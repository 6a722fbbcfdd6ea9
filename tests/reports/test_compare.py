"""``modelbench compare``: known paired deltas, exact McNemar p-values and HELM-style win rates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_modelbench.cli import main
from pytest_modelbench.reporting.changes import compare_changes
from pytest_modelbench.reporting.compare import compare_runs, model_pairs
from pytest_modelbench.reporting.leaderboard import win_rates
from pytest_modelbench.reporting.model import load_run
from tests.reports.conftest import craft_run

BOOTSTRAP_FLOOR = 1 / 2001  # every resample equals the observed difference: (0 + 1) / (2000 + 1)


def item(model: str, variant: str, scores: list[float] | list[list[float]]) -> dict[str, object]:
    return {"model": model, "variant": variant, "scores": scores}


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Run A (m1, m2) and run B (m1, m2, m3) on a 0/1 variant and a continuous one."""
    qa_a = [1.0] * 10 + [0.0] * 10  # 0.50
    qa_b = [0.0] + [1.0] * 9 + [1.0] * 6 + [0.0] * 4  # 0.75: 6 wrong->right, 1 right->wrong
    m2_qa = [1.0] * 12 + [0.0] * 8  # 0.60 in both runs
    cont_a = [0.25] * 4 + [0.5] * 4  # 0.375
    cont_b = [v + 0.125 for v in cont_a]  # 0.5, every example +0.125
    craft_run(
        tmp_path,
        "run-a",
        {
            "m1-qa-seed0": item("m1", "qa", qa_a),
            "m1-cont-seed0": item("m1", "cont", cont_a),
            "m2-qa-seed0": item("m2", "qa", m2_qa),
            "m2-cont-seed0": item("m2", "cont", [[0.0, 1.0]] * 8),
        },
        created_at="2025-01-01T00:00:00+0000",
    )
    craft_run(
        tmp_path,
        "run-b",
        {
            "m1-qa-seed0": item("m1", "qa", qa_b),
            "m1-cont-seed0": item("m1", "cont", cont_b),
            "m2-qa-seed0": item("m2", "qa", m2_qa),
            "m2-cont-seed0": item("m2", "cont", [[1.0, 1.0]] * 8),
            "m3-qa-seed0": item("m3", "qa", [1.0] * 18 + [0.0] * 2),
            "m3-cont-seed0": item("m3", "cont", [0.25] * 8),
        },
        created_at="2025-01-02T00:00:00+0000",
    )
    return tmp_path


def test_known_paired_deltas_and_p_values(runs: Path) -> None:
    comparison = compare_runs(load_run(runs / "run-a"), load_run(runs / "run-b"))
    deltas = {(d.model_a, d.variant): d for d in comparison.deltas}
    assert set(deltas) == {("m1", "qa"), ("m1", "cont"), ("m2", "qa"), ("m2", "cont")}

    m1_qa = deltas["m1", "qa"]
    assert (m1_qa.n, m1_qa.score_a, m1_qa.score_b) == (20, 0.5, 0.75)
    assert m1_qa.delta == pytest.approx(0.25)
    assert (m1_qa.b_better, m1_qa.a_better) == (6, 1)
    # exact McNemar, two-sided: 2 * P(X <= 1 | n = 7, p = 1/2) = 2 * 8 / 128
    assert m1_qa.p_value == pytest.approx(0.125, abs=1e-12)
    assert m1_qa.test == "exact McNemar"
    assert m1_qa.ci_low is not None and m1_qa.ci_high is not None
    assert m1_qa.ci_low < 0.25 < m1_qa.ci_high

    m2_qa = deltas["m2", "qa"]
    assert m2_qa.delta == 0.0 and m2_qa.p_value == 1.0

    m1_cont = deltas["m1", "cont"]
    assert m1_cont.delta == pytest.approx(0.125)
    assert m1_cont.p_value == pytest.approx(BOOTSTRAP_FLOOR) and m1_cont.test == "paired bootstrap"

    m2_cont = deltas["m2", "cont"]  # two rollouts per example: compared as per-example means
    assert (m2_cont.n, m2_cont.score_a, m2_cont.score_b) == (8, 0.5, 1.0)
    assert m2_cont.p_value == pytest.approx(BOOTSTRAP_FLOOR)


def test_win_rates_across_both_runs(runs: Path) -> None:
    comparison = compare_runs(load_run(runs / "run-a"), load_run(runs / "run-b"))
    rates = dict(comparison.win_rates)
    # qa: m1@A .50, m1@B .75, m2@A .60, m2@B .60, m3 .90; cont: .375, .5, .5, 1.0, .25
    assert rates == pytest.approx(
        {"m1 @ A": 0.125, "m1 @ B": 0.6875, "m2 @ A": 0.5, "m2 @ B": 0.6875, "m3": 0.5}
    )
    assert comparison.win_rates[-1][0] == "m1 @ A"


def test_helm_win_rate_textbook_case() -> None:
    scores = {
        "m1": {"qa": 0.9, "math": 0.2},
        "m2": {"qa": 0.5, "math": 0.8},
        "m3": {"qa": 0.5, "math": 0.4},
        "solo": {"other": 1.0},
    }
    # m1: beats both on qa, none on math -> (1 + 0) / 2; m2: ties m3 on qa -> (0.25 + 1) / 2
    assert win_rates(scores) == {"m1": 0.5, "m2": 0.625, "m3": 0.375, "solo": None}


def test_cli_compare_json_and_text(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-a", "run-b", "--run-dir", str(runs), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    m1_qa = next(d for d in data["deltas"] if d["model_a"] == "m1" and d["variant"] == "qa")
    assert m1_qa["delta"] == pytest.approx(0.25) and m1_qa["p_value"] == pytest.approx(0.125)
    assert main(["compare", str(runs / "run-a"), str(runs / "run-b")]) == 0
    text = capsys.readouterr().out
    assert "compare run-a (A) -> run-b (B)" in text
    line = next(x for x in text.splitlines() if x.startswith("qa") and " m1 " in x)
    assert "+0.250" in line and "0.125" in line and "exact McNemar" in line
    assert "m1 @ B" in text and "0.688" in text


def test_compare_different_single_models(tmp_path: Path) -> None:
    craft_run(tmp_path, "x", {"old-qa-seed0": item("old", "qa", [1.0, 0.0, 0.0, 1.0])})
    craft_run(tmp_path, "y", {"new-qa-seed0": item("new", "qa", [1.0, 1.0, 1.0, 1.0])})
    comparison = compare_runs(load_run(tmp_path / "x"), load_run(tmp_path / "y"))
    (delta,) = comparison.deltas
    assert (delta.model_a, delta.model_b, delta.delta, delta.b_better) == ("old", "new", 0.5, 2)
    assert delta.p_value == pytest.approx(0.5)  # 2 * P(X <= 0 | n = 2)
    assert "comparing old (A) with new (B)" in comparison.note


def test_changed_examples_agree_with_the_paired_counts(runs: Path) -> None:
    run_a, run_b = load_run(runs / "run-a"), load_run(runs / "run-b")
    comparison = compare_runs(run_a, run_b)
    changes = compare_changes(run_a, run_b, model_pairs(run_a, run_b)[0])
    for d in comparison.deltas:
        mine = [c for c in changes if (c.model_a, c.variant) == (d.model_a, d.variant)]
        assert sum(c.delta < 0 for c in mine) == d.a_better
        assert sum(c.delta > 0 for c in mine) == d.b_better
    assert [c.delta for c in changes] == sorted(c.delta for c in changes)  # worse first
    first = changes[0]
    assert (first.model_a, first.variant, first.example_id, first.delta) == ("m1", "qa", "ex0", -1)
    assert first.a["c"] == "a0" and first.b["c"] == "a0"  # each side's own row
    rollouts = next(c for c in changes if c.model_a == "m2" and c.variant == "cont")
    assert (rollouts.score_a, rollouts.score_b) == (0.5, 1.0)  # mean over the two rollouts


def test_compare_html_unwritable_is_one_line(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = runs / "run-a" / "run_manifest.json" / "cmp.html"  # below a file
    args = ["compare", "run-a", "run-b", "--run-dir", str(runs), "--html", str(target)]
    assert main(args) == 2
    assert f"compare: error: --html {target}: cannot write" in capsys.readouterr().err
