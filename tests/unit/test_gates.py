"""Gate rules: regressions fail with the documented paragraph, noise and improvements pass."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import pytest

from pytest_modelbench.errors import EvaluationError
from pytest_modelbench.gating import stats
from pytest_modelbench.gating.gates import (
    BaselineEntry,
    GateRule,
    GateVerdict,
    MinRule,
    NonInferiorityRule,
    PairedRule,
    ScoreSummary,
    holm_adjust_verdicts,
    holm_decided,
    no_baseline_verdict,
    rule_for,
)

BASELINE_FILE = "configs/baselines/gpt-oss-20b.yaml"


def summary(value: float, stderr: float = 0.0134, n: int = 1319) -> ScoreSummary:
    half = 1.96 * stderr
    return ScoreSummary("accuracy", value, n, stderr, value - half, value + half, "medqa")


def value_rule(value: float = 0.650, margin: float = 0.01, **kw: Any) -> NonInferiorityRule:
    entry = BaselineEntry("accuracy", value=value, margin=margin, path=BASELINE_FILE, **kw)
    rule = rule_for(entry)
    assert isinstance(rule, NonInferiorityRule)
    return rule


# --------------------------------------------------------------------------- value + margin


def test_regression_fails_with_the_documented_message() -> None:
    rows = {f"q{i}": 1.0 if i < 807 else 0.0 for i in range(1319)}  # 807 of 1319 = 0.612
    current = ScoreSummary("accuracy", 807 / 1319, 1319, 0.0134, 0.586, 0.638, "medqa")
    verdict = value_rule().evaluate(current, rows)
    # exact binomial against the exact baseline: P(X <= 807 | 1319, 0.650 - 0.01) = 0.0181
    assert not verdict.passed
    assert verdict.p_value == pytest.approx(stats.binomial_cdf(807, 1319, 0.64), rel=1e-12)
    assert verdict.delta == pytest.approx(807 / 1319 - 0.65)
    assert verdict.message == (
        "medqa accuracy 0.612 [0.586, 0.638] vs baseline 0.650 (margin 0.01): "
        "regression of 0.038, Δ -0.038, 90% CI [-0.061, -0.016], p=0.018, exact binomial "
        "(configs/baselines/gpt-oss-20b.yaml)"
    )
    assert verdict.status == "fail"
    # rows that do not reproduce the summary's value are not used: the summary's t-test
    assert value_rule().evaluate(summary(0.612), rows).test == "t-test on the summary's stderr"


def test_improvement_passes() -> None:
    verdict = value_rule().evaluate(summary(0.671))
    assert verdict.passed
    assert "improvement of 0.021" in verdict.message
    assert verdict.p_value == pytest.approx(stats.t_cdf(0.031 / 0.0134, 1318))


def test_non_significant_dip_passes() -> None:
    # 0.625 is 0.025 below the baseline, 0.015 beyond the margin, but t = -1.12 (p = 0.13).
    verdict = value_rule().evaluate(summary(0.625))
    assert verdict.passed
    assert verdict.status == "pass"
    assert "drop of 0.025 (not significant), Δ -0.025, 90% CI [-0.047, -0.003], p=0.132" in (
        verdict.message
    )


def test_dip_within_margin_passes() -> None:
    verdict = value_rule().evaluate(summary(0.645, stderr=0.0001))
    assert verdict.passed
    assert "drop of 0.005 (within margin)" in verdict.message


def test_baseline_uncertainty_widens_the_test() -> None:
    current = summary(0.612)
    assert not value_rule().evaluate(current).passed
    # the same numbers, but the baseline itself came from 1319 examples: se * sqrt(2), and
    # Welch's df = (2 se^2)^2 / (2 se^4 / 1318) = 2636
    with_n = value_rule(n=1319).evaluate(current)
    assert with_n.passed and with_n.test == "Welch t-test on the summary's stderr"
    assert with_n.p_value == pytest.approx(stats.t_cdf(-0.028 / (0.0134 * 2**0.5), 2636))
    with_se = value_rule(stderr=0.02).evaluate(current)
    df = (0.0134**2 + 0.02**2) ** 2 / (0.0134**4 / 1318)
    assert with_se.p_value == pytest.approx(stats.t_cdf(-0.028 / (0.0134**2 + 0.02**2) ** 0.5, df))


def test_alpha_from_the_baseline_entry() -> None:
    current = summary(0.612)  # p = 0.018
    assert not value_rule().evaluate(current).passed
    assert value_rule(alpha=0.01).evaluate(current).passed


# --------------------------------------------------------------------------- min, none


def test_min_floor() -> None:
    rule = rule_for(BaselineEntry("accuracy", min=0.60, path=BASELINE_FILE))
    assert isinstance(rule, MinRule)
    ok = rule.evaluate(summary(0.612))
    assert ok.passed and ok.p_value is None
    low = rule.evaluate(ScoreSummary("accuracy", 0.55, 100, 0.05, 0.45, 0.65, "medqa"))
    assert not low.passed
    assert low.message == (
        "medqa accuracy 0.550 [0.450, 0.650] vs min 0.600: below floor by 0.050 "
        "(configs/baselines/gpt-oss-20b.yaml)"
    )


def test_no_baseline() -> None:
    verdict = no_baseline_verdict(summary(0.612))
    assert verdict.passed and verdict.status == "no baseline"
    assert verdict.message.endswith(": no baseline")
    required = no_baseline_verdict(summary(0.612), required=True)
    assert not required.passed and required.status == "fail"
    assert "(--require-baseline)" in required.message


# --------------------------------------------------------------------------- paired


def paired_runs(n: int, worse: int, better: int) -> tuple[dict[str, float], dict[str, float]]:
    """Reference and new 0/1 scores on n examples with the given flips each way."""
    ref = {f"q{i}": float(i % 3 != 0) for i in range(n)}
    new = dict(ref)
    right = [k for k, v in ref.items() if v == 1.0]
    wrong = [k for k, v in ref.items() if v == 0.0]
    for key in right[:worse]:
        new[key] = 0.0
    for key in wrong[:better]:
        new[key] = 1.0
    return ref, new


def test_paired_mcnemar_regression_names_the_flips() -> None:
    ref, new = paired_runs(300, worse=12, better=2)
    rule = rule_for(
        BaselineEntry("accuracy", run="run-0412", path=BASELINE_FILE), reference_scores=ref
    )
    assert isinstance(rule, PairedRule)
    verdict = rule.evaluate(summary(sum(new.values()) / 300, n=300), new)
    # exact one-sided McNemar: P(B <= 2 | B ~ Bin(14, 1/2)) = (1 + 14 + 91) / 2^14
    assert verdict.p_value == pytest.approx(106 / 2**14)
    assert not verdict.passed
    assert (verdict.n_worse, verdict.n_better, verdict.n_shared) == (12, 2, 300)
    assert verdict.worse_ids == ("q1", "q2", "q4", "q5", "q7")
    assert verdict.test == "exact McNemar"
    assert verdict.delta == pytest.approx(-10 / 300)
    # exact conditional interval: Clopper-Pearson for 2 of 14, mapped to (14/300)(2 theta - 1)
    assert (verdict.delta_ci_low, verdict.delta_ci_high) == pytest.approx(
        (-0.0442400622906, -0.0106969629794), abs=1e-11
    )
    assert verdict.message == (
        "medqa accuracy 0.633 [0.607, 0.660] vs run run-0412 0.667 (margin 0, 300 paired "
        "examples): regression of 0.033, Δ -0.033, 90% CI [-0.044, -0.011], p=0.006, "
        "exact McNemar; 12 correct->wrong (q1, q2, q4, q5, q7, ...), 2 wrong->correct "
        "(configs/baselines/gpt-oss-20b.yaml)"
    )


def test_paired_balanced_flips_pass() -> None:
    ref, new = paired_runs(300, worse=7, better=7)
    verdict = PairedRule(ref).evaluate(summary(0.667, n=300), new)
    assert verdict.passed
    assert verdict.p_value == pytest.approx(stats.binomial_half_cdf(7, 14))
    assert verdict.delta == 0.0
    assert "no change" in verdict.message


def test_paired_improvement_passes() -> None:
    ref, new = paired_runs(300, worse=2, better=15)
    verdict = PairedRule(ref).evaluate(summary(0.71, n=300), new)
    assert verdict.passed
    assert "improvement of 0.043" in verdict.message


def test_paired_margin_uses_tango_score_test() -> None:
    ref, new = paired_runs(1000, worse=60, better=30)
    rule = PairedRule(ref, margin=0.01, reference_run="r1")
    verdict = rule.evaluate(summary(0.637, n=1000), new)
    expected = stats.paired_proportions_score_test(30, 60, 1000, -0.01, "less")
    assert verdict.test == "Tango score test"
    assert verdict.p_value == pytest.approx(expected.p_value)
    assert verdict.passed == (expected.p_value >= 0.05)
    # at margin 0 the same data is a clear regression under exact McNemar
    assert not PairedRule(ref).evaluate(summary(0.637, n=1000), new).passed


def test_paired_only_counts_shared_examples() -> None:
    ref, new = paired_runs(300, worse=12, better=2)
    new["extra"] = 1.0
    del ref["q299"]
    verdict = PairedRule(ref, reference_run="r").evaluate(summary(0.6), new)
    assert verdict.n_shared == 299
    assert "299 paired examples; this run" in verdict.message
    with pytest.raises(EvaluationError, match="shares only 0 example"):
        PairedRule({"other": 1.0}, reference_run="r").evaluate(summary(0.6), {"q": 1.0})


def test_paired_continuous_scores() -> None:
    ref = {f"q{i}": (i % 10) / 10 for i in range(200)}
    dropped = {k: v - 0.05 + 0.01 * (i % 3 - 1) for i, (k, v) in enumerate(ref.items())}
    for method in ("bootstrap", "t"):
        verdict = PairedRule(ref, method=method).evaluate(summary(0.40, n=200), dropped)
        assert not verdict.passed
        assert verdict.n_worse == 200 and not verdict.binary
        assert "200 worse" in verdict.message
        tolerated = PairedRule(ref, margin=0.1, method=method)
        assert tolerated.evaluate(summary(0.40, n=200), dropped).passed
    assert PairedRule(ref).evaluate(summary(0.4), dropped).test == "paired bootstrap"


def test_paired_needs_current_scores() -> None:
    with pytest.raises(ValueError, match="per-example scores"):
        PairedRule({"a": 1.0}).evaluate(summary(0.5))
    with pytest.raises(ValueError, match="0/1"):
        PairedRule({"a": 0.5, "b": 1.0}, method="mcnemar").evaluate(
            summary(0.5), {"a": 1.0, "b": 0.0}
        )


# --------------------------------------------------------------------------- factory, holm


def test_rule_for_chooses_by_entry() -> None:
    assert isinstance(rule_for(BaselineEntry("acc", value=0.5)), NonInferiorityRule)
    assert isinstance(rule_for(BaselineEntry("acc", min=0.5)), MinRule)
    paired = rule_for(BaselineEntry("acc", value=0.5), reference_scores={"a": 1.0})
    assert isinstance(paired, PairedRule)
    with pytest.raises(ValueError, match="reference_scores"):
        rule_for(BaselineEntry("acc", run="run-1"))
    with pytest.raises(ValueError, match="none of"):
        rule_for(BaselineEntry("acc"))
    for rule in (MinRule(0.5), NonInferiorityRule(0.5), PairedRule({})):
        assert isinstance(rule, GateRule)


def test_baseline_entry_from_mapping() -> None:
    entry = BaselineEntry.from_mapping(
        {"value": 0.65, "margin": 0.01, "n": 1319, "source": "lm-eval 0.4.5"},
        metric="accuracy",
        path=BASELINE_FILE,
    )
    assert entry == BaselineEntry(
        "accuracy", value=0.65, margin=0.01, n=1319, path=BASELINE_FILE, source="lm-eval 0.4.5"
    )


def _verdict_with_p(p: float) -> GateVerdict:
    # choose the score so the one-sided t-test (df 1318) gives exactly p
    se = 0.01
    value = 0.65 - 0.01 + stats.t_ppf(p, 1318) * se
    return value_rule().evaluate(summary(value, stderr=se))


def test_holm_adjusts_and_redecides() -> None:
    raw = [_verdict_with_p(p) for p in (0.01, 0.04, 0.03, 0.005)]
    raw.append(no_baseline_verdict(summary(0.6)))
    assert [v.passed for v in raw] == [False, False, False, False, True]
    adjusted = holm_adjust_verdicts(raw, alpha=0.05)
    assert [v.p_adjusted for v in adjusted[:4]] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [v.passed for v in adjusted] == [False, True, True, False, True]
    assert adjusted[4] is raw[4]
    assert "(Holm-adjusted p=0.060)" in adjusted[1].message
    assert "drop of" in adjusted[1].message and "regression" not in adjusted[1].message


def test_verdict_is_json_serialisable() -> None:
    ref, new = paired_runs(60, worse=5, better=1)
    verdict = PairedRule(ref, reference_run="r").evaluate(summary(0.6, n=60), new)
    data = json.loads(json.dumps(verdict.as_dict()))
    assert data["status"] == "pass" if verdict.passed else "fail"
    assert data["worse_ids"] == list(verdict.worse_ids)
    assert data["schema_version"] == 2
    assert data["message"] == verdict.message


@pytest.mark.parametrize("family", [1, 2, 5])
def test_holms_early_decision_is_its_final_one(family: int) -> None:
    # an item decided when it finishes is decided as Holm's final step decides it, whatever the
    # other items' p-values turn out to be; p = alpha/m is the edge (kept when the others are 1)
    alpha = 0.05
    rng = random.Random(family)
    for p in (alpha / family, alpha / family / 2, alpha, alpha * 0.99, 0.5, 1e-9):
        verdict = GateVerdict(
            passed=p >= alpha, rule="none", metric="", value=0.0, alpha=alpha, p_value=p
        )
        early = holm_decided(verdict, family)
        for others in ([0.0], [1.0], [alpha / family], [rng.random() for _ in range(3)]):
            rest = [
                dataclasses.replace(verdict, p_value=o) for o in (others * family)[: family - 1]
            ]
            final = holm_adjust_verdicts([verdict, *rest])[0]
            assert early in (None, final.passed), (p, others)
        if p >= alpha or p < alpha / family:
            assert early == (p >= alpha)


def test_holms_early_decision_costs_the_same_at_any_family_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each item is decided when it finishes: adjusting a family of m p-values there would cost
    m per item and m squared per session (about 40 minutes of worker time at 5000 items)."""

    def adjusted(p_values: object) -> list[float]:
        raise AssertionError("the early decision adjusted a whole family")

    monkeypatch.setattr(stats, "holm_adjust", adjusted)
    verdict = GateVerdict(passed=False, rule="none", metric="", value=0.0, alpha=0.05, p_value=1e-9)
    assert holm_decided(verdict, 10**9) is None  # m p = 1: it depends on the others
    assert holm_decided(dataclasses.replace(verdict, p_value=1e-12), 10**9) is False  # m p < a
    assert holm_decided(dataclasses.replace(verdict, p_value=0.5), 10**9) is True  # p >= a
