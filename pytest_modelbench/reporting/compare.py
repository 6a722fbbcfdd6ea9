"""Compare two runs: paired per-variant deltas with p-values, and HELM-style win rates.

Items are paired by model (the models both runs have; or, when each run
has exactly one model, those two) and variant; examples by ``(seed,
example_id)``, each the mean of its rollouts' primary metric. 0/1 scores use
the exact two-sided McNemar test with Tango's score CI; other scores a
seeded paired bootstrap. The delta is B - A.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_modelbench.gating import stats
from pytest_modelbench.reporting.leaderboard import cells, score_table, win_rates
from pytest_modelbench.reporting.model import ItemRecord, RunData
from pytest_modelbench.reporting.rows import item_rows, row_score
from pytest_modelbench.store.setup import compare_setups


@dataclass(frozen=True)
class PairedDelta:
    """Run B minus run A on the examples both scored, for one model pair and variant."""

    variant: str
    model_a: str
    model_b: str
    metric: str
    n: int
    score_a: float | None
    score_b: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    test: str
    b_better: int
    a_better: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    run_a: str
    run_b: str
    deltas: tuple[PairedDelta, ...]
    win_rates: tuple[tuple[str, float | None], ...]  # (contender, mean win rate), best first
    note: str = ""
    setup_differences: tuple[str, ...] = ()  # "model variant: setup differs (...): ..." lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_a": self.run_a,
            "run_b": self.run_b,
            "note": self.note,
            "setup_differences": list(self.setup_differences),
            "deltas": [d.as_dict() for d in self.deltas],
            "win_rates": [{"model": m, "win_rate": r} for m, r in self.win_rates],
        }


def example_scores(run: RunData, items: Sequence[ItemRecord]) -> dict[tuple[int, str], float]:
    """``(seed, example_id) -> mean primary score over rollouts`` for scored examples."""
    sums: dict[tuple[int, str], list[float]] = defaultdict(list)
    for item in items:
        for row in item_rows(run, item):
            score = row_score(item, row)
            if score is not None:
                sums[(item.seed, str(row.get("example_id")))].append(score)
    return {key: math.fsum(values) / len(values) for key, values in sums.items()}


def paired_delta(
    a: Mapping[tuple[int, str], float],
    b: Mapping[tuple[int, str], float],
    *,
    variant: str,
    model_a: str,
    model_b: str,
    metric: str,
) -> PairedDelta:
    shared = [key for key in a if key in b]
    xa = [a[k] for k in shared]
    xb = [b[k] for k in shared]
    n = len(shared)
    b_better = sum(1 for u, v in zip(xa, xb, strict=True) if v > u)
    a_better = sum(1 for u, v in zip(xa, xb, strict=True) if u > v)
    empty = PairedDelta(
        variant,
        model_a,
        model_b,
        metric,
        n,
        None,
        None,
        None,
        None,
        None,
        None,
        "",
        b_better,
        a_better,
    )
    if n == 0:
        return empty
    score_a, score_b = math.fsum(xa) / n, math.fsum(xb) / n
    delta = score_b - score_a
    low: float | None
    high: float | None
    if {*xa, *xb} <= {0.0, 1.0}:
        test = stats.mcnemar_exact(b_better, a_better, "two-sided")
        low, high = stats.paired_proportions_score_ci(b_better, a_better, n)
        p_value, name = test.p_value, test.method
    elif n >= 2:
        boot = stats.paired_bootstrap_test(xb, xa, 0.0, "two-sided", seed=0)
        p_value, name, low, high = boot.p_value, boot.method, boot.ci_low, boot.ci_high
    else:
        p_value, name, low, high = None, "", None, None
    return PairedDelta(
        variant,
        model_a,
        model_b,
        metric,
        n,
        score_a,
        score_b,
        delta,
        low,
        high,
        p_value,
        name,
        b_better,
        a_better,
    )


def model_pairs(run_a: RunData, run_b: RunData) -> tuple[list[tuple[str, str]], str]:
    """The (model in A, model in B) pairs compared, and a note when they are not by name."""
    shared = [m for m in run_a.models if m in run_b.models]
    if shared:
        return [(m, m) for m in shared], ""
    if len(run_a.models) == 1 and len(run_b.models) == 1:
        return [(run_a.models[0], run_b.models[0])], (
            f"no model in both runs: comparing {run_a.models[0]} (A) with {run_b.models[0]} (B)"
        )
    return [], (
        f"no model in both runs (A: {', '.join(run_a.models) or 'none'}; "
        f"B: {', '.join(run_b.models) or 'none'}); only win rates are compared"
    )


def compare_runs(run_a: RunData, run_b: RunData) -> Comparison:
    pairs, note = model_pairs(run_a, run_b)
    deltas = []
    setups: list[str] = []
    for model_a, model_b in pairs:
        for variant in run_a.variants:
            items_a = [i for i in run_a.items if i.model == model_a and i.variant == variant]
            items_b = [i for i in run_b.items if i.model == model_b and i.variant == variant]
            if not items_a or not items_b:
                continue
            difference = compare_setups(items_b[0].setup, items_a[0].setup, ("A", "B")).line
            if difference:
                model = model_a if model_a == model_b else f"{model_a} -> {model_b}"
                setups.append(f"{model} {variant}: {difference}")
            deltas.append(
                paired_delta(
                    example_scores(run_a, items_a),
                    example_scores(run_b, items_b),
                    variant=variant,
                    model_a=model_a,
                    model_b=model_b,
                    metric=items_a[0].metric or items_b[0].metric,
                )
            )
    return Comparison(
        run_a.run_id,
        run_b.run_id,
        tuple(deltas),
        _contender_win_rates(run_a, run_b),
        note,
        tuple(setups),
    )


def _contender_win_rates(run_a: RunData, run_b: RunData) -> tuple[tuple[str, float | None], ...]:
    """Every model of both runs as one contender (``model @ run`` when a name is in both)."""
    both = set(run_a.models) & set(run_b.models)
    scores: dict[str, dict[str, float]] = {}
    for run, tag in ((run_a, "A"), (run_b, "B")):
        for model, per_variant in score_table(cells(run.items)).items():
            scores[f"{model} @ {tag}" if model in both else model] = dict(per_variant)
    rates = win_rates(scores)
    return tuple(sorted(rates.items(), key=lambda mr: -(mr[1] if mr[1] is not None else -1.0)))


def _f(value: float | None, digits: int = 3, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    if value is None:
        return "-"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def comparison_rows(comparison: Comparison) -> list[list[str]]:
    rows = [
        [
            "variant",
            "model (A -> B)",
            "metric",
            "n",
            "A",
            "B",
            "delta (B-A)",
            "95% CI",
            "p",
            "test",
            "B>A",
            "A>B",
        ]
    ]
    for d in comparison.deltas:
        model = d.model_a if d.model_a == d.model_b else f"{d.model_a} -> {d.model_b}"
        ci = (
            "-" if d.ci_low is None or d.ci_high is None else f"[{d.ci_low:+.3f}, {d.ci_high:+.3f}]"
        )
        rows.append(
            [
                d.variant,
                model,
                d.metric,
                str(d.n),
                _f(d.score_a),
                _f(d.score_b),
                _f(d.delta, sign=True),
                ci,
                _p(d.p_value),
                d.test or "-",
                str(d.b_better),
                str(d.a_better),
            ]
        )
    return rows


def render_text(comparison: Comparison, *, markdown: bool = False) -> str:
    rows = comparison_rows(comparison)
    out = [f"compare {comparison.run_a} (A) -> {comparison.run_b} (B)"]
    if comparison.note:
        out.append(f"note: {comparison.note}")
    if comparison.setup_differences:  # above the scores: what the deltas compare
        out += ["", "setup differences (can change outputs):"]
        out += [f"  {line}" for line in comparison.setup_differences]
    if len(rows) > 1:
        out.append("")
        out += _table(rows, markdown)
    out += ["", "HELM-style mean win rate across variants:", ""]
    rate_rows = [["model", "win rate"]] + [[m, _f(r, 3)] for m, r in comparison.win_rates]
    out += _table(rate_rows, markdown)
    return "\n".join(out) + "\n"


def _table(rows: Sequence[Sequence[str]], markdown: bool) -> list[str]:
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        return lines + ["| " + " | ".join(r) + " |" for r in rows[1:]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines
