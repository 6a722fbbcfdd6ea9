"""Terminal output: the plan for ``--collect-only`` and the end-of-session summary table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_modelbench.store.runstore import RunStore

if TYPE_CHECKING:
    from pytest_modelbench.planning.item import PlannedItem
    from pytest_modelbench.session.core import ModelbenchSession


def _table(rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def write_plan(
    config: pytest.Config, items: Sequence[PlannedItem], session: ModelbenchSession
) -> None:
    """The dry-run plan: one line per item with its example count and estimated tokens."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    rows = [["item", "model", "variant", "seed", "examples", "est. tokens"]]
    total_examples = total_tokens = 0
    backends: dict[str, Any] = {}
    # what an item counts depends on its variant, seed and limit, not on its model:
    # a sweep over many models counts each (variant, seed) once
    counts: dict[tuple[int, int, int], int | Exception] = {}
    for item in items:
        module = item.variant.module
        if module not in backends:
            backends[module] = session.backend_for(module)
        backend = backends[module]
        key = (id(item.variant), item.seed, item.num_examples)
        if key not in counts:
            try:
                counts[key] = backend.count_examples(item)
            except Exception as exc:  # the plan must print even when one variant's data is broken
                counts[key] = exc
        count = counts[key]
        if isinstance(count, Exception):
            rows.append(
                [item.item_id, item.model_name, item.variant.id, str(item.seed), "?", f"({count})"]
            )
            continue
        count *= item.variant.rollouts_per_example
        tokens = count * backend.tokens_per_example()
        total_examples += count
        total_tokens += tokens
        rows.append(
            [
                item.item_id,
                item.model_name,
                item.variant.id,
                str(item.seed),
                str(count),
                f"{tokens:,}",
            ]
        )
    models = sorted({i.model_name for i in items})
    reporter.write_sep("=", "modelbench plan")
    reporter.ensure_newline()
    # one write for the whole table: per-line terminal writes dominate at 10k+ items
    reporter.write("\n".join(_table(rows, right={3, 4, 5})) + "\n")
    reporter.write_line(
        f"{len(items)} items, {len(models)} model(s) ({', '.join(models)}), "
        f"{total_examples:,} examples, ~{total_tokens:,} tokens"
    )


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def write_summary_table(
    reporter: Any, records: Sequence[dict[str, Any]], run_dir: Path | None
) -> None:
    """Model × environment table: score ± CI half-width, n, errors, baseline, Δ, verdict."""
    rows = [
        [
            "model",
            "variant",
            "seed",
            "metric",
            "score",
            "95% CI",
            "n",
            "errors",
            "baseline",
            "Δ",
            "verdict",
        ]
    ]
    for rec in _ordered(records):
        ci = _ci_text(rec)
        verdict = rec.get("verdict") or rec.get("outcome", "-")
        if rec.get("from_store") and verdict != "error":
            unchecked = "; endpoint not checked" if rec.get("endpoint_unchecked") else ""
            verdict += f" (from store{unchecked})"
        rows.append(
            [
                str(rec.get("model")),
                str(rec.get("variant")),
                _fmt(rec.get("seed")),
                _fmt(rec.get("metric")),
                _fmt(rec.get("score")),
                ci,
                _fmt(rec.get("n")),
                _fmt(rec.get("errors")),
                _fmt(rec.get("baseline")),
                _fmt(rec.get("delta")),
                verdict,
            ]
        )
    reporter.write_sep("=", "modelbench summary")
    for line in _table(rows, right={2, 4, 6, 7, 8, 9}):
        reporter.write_line(line)
    if run_dir is not None:
        reporter.write_line(f"run store: {run_dir}")
        write_from_store(reporter, records, run_dir)


MAX_LISTED = 5


def write_from_store(reporter: Any, records: Sequence[dict[str, Any]], run_dir: Path) -> None:
    """Which items were read back from the store instead of evaluated, from which run, when."""
    stored = [r for r in _ordered(records) if r.get("from_store")]
    if not stored:
        return
    store = RunStore(run_dir)
    manifest = store.read_manifest().get("items") or {}
    reporter.write_line(
        f"from store ({len(stored)} of {len(records)} items, not evaluated again; "
        "--force -k ITEM recomputes):"
    )
    for rec in stored[:MAX_LISTED]:  # only the listed items' summaries are read
        item = str(rec.get("item"))
        summary = store.item(item).read_summary() or {}
        run = (manifest.get(item) or {}).get("seeded_from") or run_dir.name
        reporter.write_line(f"  {item}: {run}, finished {summary.get('finished_at', '?')}")
    if len(stored) > MAX_LISTED:
        reporter.write_line(f"  ... and {len(stored) - MAX_LISTED} more (see run_manifest.json)")


def write_recomputed(reporter: Any, records: Sequence[dict[str, Any]]) -> None:
    """One line per item recomputed instead of reused, saying why (``--force``, changed fields)."""
    for rec in sorted(records, key=lambda r: str(r.get("item"))):
        if rec.get("recomputed"):
            reporter.write_line(f"recomputed {rec.get('item')}: {rec['recomputed']}")


def _ordered(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records by model, variant, seed: the order of every table."""
    return sorted(
        records, key=lambda r: (str(r.get("model")), str(r.get("variant")), r.get("seed", 0))
    )


def _ci_text(rec: dict[str, Any]) -> str:
    low, high = rec.get("ci_low"), rec.get("ci_high")
    return f"[{low:.3f}, {high:.3f}]" if isinstance(low, float) and isinstance(high, float) else "-"


def write_markdown_summary(
    path: Path, records: Sequence[dict[str, Any]], run_dir: Path | None
) -> None:
    """Append a Markdown table to a CI job summary file (``$GITHUB_STEP_SUMMARY``)."""
    lines = [
        "## modelbench",
        "",
        "| model | variant | seed | metric | score | 95% CI | n | baseline | Δ | verdict |",
        "|---|---|---:|---|---:|---|---:|---:|---:|---|",
    ]
    for rec in _ordered(records):
        ci = _ci_text(rec)
        lines.append(
            f"| {rec.get('model')} | {rec.get('variant')} | {rec.get('seed')} | {_fmt(rec.get('metric'))} | "
            f"{_fmt(rec.get('score'))} | {ci} | {_fmt(rec.get('n'))} | {_fmt(rec.get('baseline'))} | "
            f"{_fmt(rec.get('delta'))} | {rec.get('verdict') or rec.get('outcome')} |"
        )
    if run_dir is not None:
        lines += ["", f"Run store: `{run_dir.name}`"]
    with path.open("a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n\n")
