"""Leaderboards: model x variant scores (seeds pooled), HELM-style mean win rates, and files.

``leaderboard.csv`` has one row per model x variant; ``leaderboard.md`` a
model x variant table ranked by mean win rate; ``leaderboard.json`` both plus
every item (with gate verdicts, so ``modelbench report`` can rebuild reports
from the store). Scores are taken as higher-is-better.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_modelbench.reporting.model import LEADERBOARD_JSON, ItemRecord, RunData
from pytest_modelbench.store.files import atomic_write_text
from pytest_modelbench.store.verdict import Verdict

LEADERBOARD_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Cell:
    """One model on one variant, seeds pooled: mean score and mean CI ends over seeds."""

    model: str
    env: str
    variant: str
    metric: str
    score: float | None
    ci_low: float | None
    ci_high: float | None
    seeds: int
    n: int
    errors: int
    truncated: int  # replies cut off by max_tokens
    baseline: float | None
    delta: float | None
    verdict: Verdict | None  # the worst of the seeds' verdicts (None: none gated)
    tokens: int
    duration_s: float | None
    holm_pending: bool = False  # that verdict waits for --mb-correction holm

    @property
    def verdict_text(self) -> str:
        return self.verdict.text(self.holm_pending) if self.verdict is not None else ""

    def as_dict(self) -> dict[str, Any]:
        """``leaderboard.json``'s cell: the verdict as the text reports show."""
        data = asdict(self)
        del data["holm_pending"]
        data["verdict"] = self.verdict_text
        return data


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) / len(present) if present else None


def _worst(items: Sequence[ItemRecord]) -> ItemRecord | None:
    """The item with the worst verdict (the first of equals); None when none is gated."""
    worst = max(items, key=lambda i: i.verdict.rank if i.verdict is not None else 0, default=None)
    return worst if worst is not None and worst.verdict is not None else None


def cells(items: Sequence[ItemRecord]) -> list[Cell]:
    """Pool seeds per (model, variant). The CI shown is the mean of the seeds' CI ends
    (conservative: seeds share their examples, so their errors are not independent)."""
    grouped: dict[tuple[str, str], list[ItemRecord]] = {}
    for item in items:
        grouped.setdefault((item.model, item.variant), []).append(item)
    out = []
    for (model, variant), group in grouped.items():
        durations = [i.duration_s for i in group if i.duration_s is not None]
        worst = _worst(group)
        out.append(
            Cell(
                model=model,
                env=group[0].env,
                variant=variant,
                metric=group[0].metric,
                score=_mean([i.score for i in group]),
                ci_low=_mean([i.ci_low for i in group]),
                ci_high=_mean([i.ci_high for i in group]),
                seeds=len(group),
                n=sum(i.n for i in group),
                errors=sum(i.errors for i in group),
                truncated=sum(i.truncated for i in group),
                baseline=next((i.baseline for i in group if i.baseline is not None), None),
                delta=_mean([i.delta for i in group]),
                verdict=worst.verdict if worst is not None else None,
                holm_pending=worst.holm_pending if worst is not None else False,
                tokens=sum(i.tokens for i in group),
                duration_s=math.fsum(durations) if durations else None,
            )
        )
    return out


def win_rates(scores: Mapping[str, Mapping[str, float]]) -> dict[str, float | None]:
    """HELM-style mean win rate: per scenario, the fraction of the other models a model beats
    (ties count half), averaged over the scenarios where it has at least one opponent.

    ``scores`` is ``{model: {scenario: score}}``; a model with no opponent anywhere gets None.
    """
    scenarios = {s for per_model in scores.values() for s in per_model}
    rates: dict[str, float | None] = {}
    for model, mine in scores.items():
        per_scenario = []
        for scenario in scenarios:
            if scenario not in mine:
                continue
            others = [o[scenario] for name, o in scores.items() if name != model and scenario in o]
            if not others:
                continue
            wins = sum(
                1.0 if mine[scenario] > v else 0.5 if mine[scenario] == v else 0.0 for v in others
            )
            per_scenario.append(wins / len(others))
        rates[model] = math.fsum(per_scenario) / len(per_scenario) if per_scenario else None
    return rates


def score_table(table: Sequence[Cell]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for cell in table:
        if cell.score is not None:
            out.setdefault(cell.model, {})[cell.variant] = cell.score
    return out


def ranked_models(table: Sequence[Cell]) -> list[tuple[int, str, float | None]]:
    """``(rank, model, win rate)`` by mean win rate, then mean score; ties share a rank."""
    rates = win_rates(score_table(table))
    models = list(dict.fromkeys(c.model for c in table))
    means = {m: _mean([c.score for c in table if c.model == m]) for m in models}

    def key(model: str) -> tuple[float, float]:
        rate = rates.get(model)
        return (-(rate if rate is not None else -1.0), -(means[model] or 0.0))

    ordered = sorted(models, key=key)
    return [(1 + sum(1 for o in ordered if key(o) < key(m)), m, rates.get(m)) for m in ordered]


def _f(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def leaderboard_csv(table: Sequence[Cell]) -> str:
    rates = win_rates(score_table(table))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            "model",
            "environment",
            "variant",
            "metric",
            "score",
            "ci_low",
            "ci_high",
            "seeds",
            "n",
            "errors",
            "truncated",
            "baseline",
            "delta",
            "verdict",
            "tokens",
            "duration_s",
            "model_win_rate",
        ]
    )
    order = {m: i for i, (_, m, _) in enumerate(ranked_models(table))}
    for c in sorted(table, key=lambda c: (order.get(c.model, 0), c.variant)):
        writer.writerow(
            [
                c.model,
                c.env,
                c.variant,
                c.metric,
                _f(c.score, 6),
                _f(c.ci_low, 6),
                _f(c.ci_high, 6),
                c.seeds,
                c.n,
                c.errors,
                c.truncated,
                _f(c.baseline, 6),
                _f(c.delta, 6),
                c.verdict_text,
                c.tokens,
                _f(c.duration_s, 3),
                _f(rates.get(c.model), 4),
            ]
        )
    return buffer.getvalue()


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def leaderboard_markdown(run: RunData, table: Sequence[Cell]) -> str:
    variants = list(dict.fromkeys(c.variant for c in table))
    by_key = {(c.model, c.variant): c for c in table}
    lines = [f"# modelbench leaderboard: {run.run_id}", ""]
    header = ["rank", "model", "win rate", *variants]
    lines += [
        "| " + " | ".join(_md(h) for h in header) + " |",
        "|---:|---|---:|" + "---:|" * len(variants),
    ]
    for rank, model, rate in ranked_models(table):
        row = [str(rank), _md(model), _f(rate, 2) or "-"]
        for variant in variants:
            cell = by_key.get((model, variant))
            if cell is None or cell.score is None:
                row.append("-")
                continue
            half = (
                (cell.ci_high - cell.ci_low) / 2
                if cell.ci_low is not None and cell.ci_high is not None
                else None
            )
            text = f"{cell.score:.3f}" + (f" ± {half:.3f}" if half is not None else "")
            if cell.verdict is not None and cell.verdict.failed:
                text += f" **{cell.verdict.value}**"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Scores: mean over seeds ± half the 95% CI. Win rate: HELM-style mean win rate "
        "across variants.",
        "",
        "## Items",
        "",
        "| item | metric | score | 95% CI | n | errors | truncated | baseline | Δ | p | verdict |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for item in run.items:
        ci = (
            f"[{item.ci_low:.3f}, {item.ci_high:.3f}]"
            if item.ci_low is not None and item.ci_high is not None
            else "-"
        )
        lines.append(
            f"| {_md(item.item_id)} | {item.metric} | {_f(item.score) or '-'} | {ci} | {item.n} | "
            f"{item.errors} | {item.truncated} | {_f(item.baseline) or '-'} | "
            f"{_f(item.delta) or '-'} | "
            f"{_f(item.p_value) or '-'} | {item.shown} |"
        )
    return "\n".join(lines) + "\n"


def leaderboard_json(run: RunData, table: Sequence[Cell]) -> dict[str, Any]:
    return {
        "schema_version": LEADERBOARD_SCHEMA_VERSION,
        "run_id": run.run_id,
        "generated_at": run.generated_at,
        "status": run.status(),
        "models": [
            {"model": m, "win_rate": rate, "rank": rank} for rank, m, rate in ranked_models(table)
        ],
        "leaderboard": [c.as_dict() for c in table],
        "items": [item.as_dict() for item in run.items],
    }


def write_leaderboards(run: RunData, directory: Path | None = None) -> list[Path]:
    """``leaderboard.csv``, ``.md`` and ``.json`` in ``directory`` (default: the run directory)."""
    directory = directory or run.directory
    table = cells(run.items)
    paths = [
        directory / "leaderboard.csv",
        directory / "leaderboard.md",
        directory / LEADERBOARD_JSON,
    ]
    atomic_write_text(paths[0], leaderboard_csv(table))
    atomic_write_text(paths[1], leaderboard_markdown(run, table))
    atomic_write_text(
        paths[2], json.dumps(leaderboard_json(run, table), indent=2, default=str) + "\n"
    )
    return paths
