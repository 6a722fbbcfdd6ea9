"""Terminal output: the plan for ``--collect-only`` and the end-of-session summary table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_modelbench.scheduling.tokens import ESTIMATED, TokenMemory, read_tokens
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runstore import RunStore

if TYPE_CHECKING:  # imported where used, lazily, for pytest's start-up time
    from pytest_modelbench.gating.baselines import BaselineBook
    from pytest_modelbench.planning.item import PlannedItem


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
    config: pytest.Config, items: Sequence[PlannedItem], backend_for: Callable[[str], Any]
) -> dict[str, int]:
    """The dry-run plan: one line per item with its example count, tokens per example and
    estimated tokens, and where the tokens per example come from: ``observed`` in an earlier
    run (``scheduling/tokens.py``) or ``estimated`` from the suite's static figure. Returns
    each item's example count (before rollouts; an item whose data is broken is left out)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return {}
    planned: dict[str, int] = {}
    observed = TokenMemory(read_tokens(config))  # one cache read, then lookups
    rows = [["item", "model", "variant", "seed", "examples", "tokens/ex", "est. tokens", "from"]]
    total_examples = total_tokens = from_runs = 0
    backends: dict[str, Any] = {}
    # what an item counts depends on its variant, seed and limit, not on its model:
    # a sweep over many models counts each (variant, seed) once
    counts: dict[tuple[int, int, int], int | Exception] = {}
    for item in items:
        module = item.variant.module
        if module not in backends:
            backends[module] = backend_for(module)
        backend = backends[module]
        key = (id(item.variant), item.seed, item.num_examples)
        if key not in counts:
            try:
                counts[key] = backend.count_examples(item)
            except Exception as exc:  # the plan must print even when one variant's data is broken
                counts[key] = exc
        count = counts[key]
        if isinstance(count, Exception):
            cells = [item.item_id, item.model_name, item.variant.id, str(item.seed), "?"]
            rows.append([*cells, "", "", f"({count})"])
            continue
        planned[item.item_id] = count
        count *= item.variant.rollouts_per_example
        known = observed.per_example(item)
        per_example, source = known or (backend.tokens_per_example(), ESTIMATED)
        tokens = round(count * per_example)
        total_examples += count
        total_tokens += tokens
        from_runs += int(source != ESTIMATED)
        rows.append(
            [
                item.item_id,
                item.model_name,
                item.variant.id,
                str(item.seed),
                str(count),
                f"{round(per_example):,}",
                f"{tokens:,}",
                source,
            ]
        )
    models = sorted({i.model_name for i in items})
    reporter.write_sep("=", "modelbench plan")
    reporter.ensure_newline()
    # one write for the whole table: per-line terminal writes dominate at 10k+ items
    reporter.write("\n".join(_table(rows, right={3, 4, 5, 6})) + "\n")
    seen = f" ({from_runs} of {len(items)} items from observed tokens)" if from_runs else ""
    reporter.write_line(
        f"{len(items)} items, {len(models)} model(s) ({', '.join(models)}), "
        f"{total_examples:,} examples, ~{total_tokens:,} tokens{seen}"
    )
    return planned


def write_expected_examples(
    config: pytest.Config,
    items: Sequence[PlannedItem],
    planned: dict[str, int],
    rule_for: Callable[[PlannedItem], Any],
    gated: Callable[[PlannedItem], bool],
) -> None:
    """``--collect-only --mb-stop-early``: per gated item, the examples its stop rule is
    expected to read if the score equals the baseline and if it collapses to 0
    (:func:`~pytest_modelbench.gating.early.expected_examples`). ``rule_for`` gives an item's
    rule, None where none applies, False where its backend runs its own loop."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    # lazily: only --mb-stop-early plans load the sequential tests
    from pytest_modelbench.gating.early import expected_examples

    lines = []
    for item in items:
        count = planned.get(item.item_id)
        rule = rule_for(item) if count else None
        if rule is False and count and gated(item):
            lines.append(f"  {item.item_id}: runs its own loop to the end ({count:,} examples)")
        if not rule or not count:
            continue
        expected = expected_examples(rule, count, item.variant.rollouts_per_example)
        equal = (
            "the reference's mean (replies independent of the reference's)"
            if rule.paired
            else f"the baseline {rule.baseline:.3f}"
        )
        at_baseline = (
            f"~{round(expected.at_baseline):,}"
            if expected.at_baseline is not None
            else "not simulated (the plan's simulation budget is spent)"
        )
        lines.append(
            f"  {item.item_id}: {at_baseline} of {count:,} examples if it "
            f"scores {equal}; {expected.collapsed:,} if it collapses to 0"
        )
    if lines:
        reporter.write_line(
            "--mb-stop-early: expected examples per gated item (simulated from its rule):"
        )
        for line in lines:
            reporter.write_line(line)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _row(result: EvalResult) -> list[str]:
    """One item's cells: model, variant, seed, metric, score, CI, n, errors, baseline, Δ."""
    verdict = result.verdict
    low, high = result.ci
    ci = f"[{low:.3f}, {high:.3f}]" if isinstance(low, float) and isinstance(high, float) else "-"
    has_score = result.error is None
    return [
        result.model,
        result.variant,
        str(result.seed),
        _fmt(result.metric),
        _fmt(result.score),
        ci,
        _fmt(result.n if has_score else None),
        _fmt(result.errors if has_score else None),
        _fmt(verdict.baseline_value if verdict is not None else None),
        _fmt(verdict.delta if verdict is not None else None),
    ]


def write_summary_table(
    reporter: pytest.TerminalReporter,
    records: Sequence[EvalResult],
    run_dir: Path | None,
    interrupted: Sequence[PlannedItem] = (),
) -> None:
    """Model × environment table: score ± CI half-width, n, errors, baseline, Δ, verdict;
    the items Ctrl-C or SIGTERM stopped (``interrupted``) as rows saying so."""
    header = ["model", "variant", "seed", "metric", "score", "95% CI", "n", "errors"]
    rows = [[*header, "baseline", "Δ", "verdict"]]
    # a "truncated" column (after errors) only in runs where a reply ran out of tokens
    truncation = any(r.truncated for r in records)
    if truncation:
        rows[0].insert(8, "truncated")
    for result in _ordered(records):
        verdict = result.verdict_text
        stopped = result.verdict.stopped_at if result.verdict is not None else None
        if stopped is not None and result.verdict is not None:
            verdict += f" (stopped at {stopped} of {result.verdict.planned})"
        if result.from_store and result.error is None:
            unchecked = "; endpoint not checked" if not result.endpoint_checked else ""
            verdict += f" (from store{unchecked})"
        cells = _row(result)
        if truncation:
            cells.insert(8, _fmt(result.truncated if result.error is None else None))
        rows.append([*cells, verdict])
    blank = ["-"] * (len(rows[0]) - 4)  # no score, CI, n, errors, baseline or delta yet
    for item in sorted(interrupted, key=lambda i: (i.model_name, i.variant.id, i.seed)):
        rows.append([item.model_name, item.variant.id, str(item.seed), *blank, "interrupted"])
    reporter.write_sep("=", "modelbench summary")
    right = {2, 4, 6, 7, 8, 9, 10} if truncation else {2, 4, 6, 7, 8, 9}
    for line in _table(rows, right=right) if len(rows) > 1 else ():
        reporter.write_line(line)
    if run_dir is not None:
        reporter.write_line(f"run store: {run_dir}")
        write_from_store(reporter, records, run_dir)


def write_resume_hint(reporter: pytest.TerminalReporter, advice: str) -> None:
    """After Ctrl-C or SIGTERM (below the ``run store:`` line): how to continue the run."""
    reporter.write_line(
        f"interrupted: the run store keeps every finished example; {advice}", yellow=True
    )


MAX_LISTED = 5
TRUNCATION_WARN = 0.05  # warn when more than this share of an item's replies ran out of tokens
# (or ended with no answer)


def write_truncation_warnings(
    reporter: pytest.TerminalReporter, records: Sequence[EvalResult]
) -> None:
    """One warning line per item with more than :data:`TRUNCATION_WARN` of its replies cut off
    by the token budget: a low score there says "budget too small", not "model got worse"."""
    for result in _ordered(records):
        replies = int(result.summary.n_scored or 0)
        if result.error is None and replies and result.truncated / replies > TRUNCATION_WARN:
            reporter.write_line(
                f"warning: {result.item_id}: {result.truncation_note()}", yellow=True
            )
        if result.error is None and replies and result.empty_answers / replies > TRUNCATION_WARN:
            reporter.write_line(
                f"warning: {result.item_id}: {result.empty_answer_note()}", yellow=True
            )


def write_planned_setups(
    config: pytest.Config, items: Sequence[PlannedItem], book: BaselineBook
) -> None:
    """``--collect-only``: the items whose baseline was measured under another setup than the
    one planned, as far as the plan knows it (serving args, GPU count, weights, chat template,
    sampling, budget; not the engine's version or the GPU model, known once a server runs)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    # lazily: loaded only when this runs, not at every pytest start-up
    from pytest_modelbench.evaluation.setup import planned_setup
    from pytest_modelbench.store.setup import compare_setups

    lines = []
    for item in items:
        baseline = book.planned_baseline_setup(item)
        if baseline is None:
            continue
        line = compare_setups(planned_setup(item), baseline, ("baseline", "planned")).line
        if line:
            lines.append(f"{item.item_id}: {line}")
    if lines:
        reporter.write_line(
            f"{len(lines)} item(s) planned under another setup than their baseline:"
        )
        for line in lines:
            reporter.write_line(f"  {line}", yellow=True)


def write_setup_differences(
    reporter: pytest.TerminalReporter, records: Sequence[EvalResult]
) -> None:
    """One line per item whose baseline was measured under another setup (an engine version,
    GPUs, a token budget): a score compared across setups may move for that alone."""
    for result in _ordered(records):
        verdict = result.verdict
        if verdict is not None and verdict.setup_differs:
            reporter.write_line(f"{result.item_id}: {verdict.setup_differs}", yellow=True)


def write_from_store(
    reporter: pytest.TerminalReporter, records: Sequence[EvalResult], run_dir: Path
) -> None:
    """Which items were read back from the store instead of evaluated, from which run, when."""
    stored = [r for r in _ordered(records) if r.from_store and r.error is None]
    if not stored:
        return
    manifest = RunStore(run_dir).read_manifest().get("items") or {}
    reporter.write_line(
        f"from store ({len(stored)} of {len(records)} items, not evaluated again; "
        "--force -k ITEM recomputes):"
    )
    for result in stored[:MAX_LISTED]:
        run = (manifest.get(result.item_id) or {}).get("seeded_from") or run_dir.name
        finished = result.summary.finished_at or "?"
        reporter.write_line(f"  {result.item_id}: {run}, finished {finished}")
    if len(stored) > MAX_LISTED:
        reporter.write_line(f"  ... and {len(stored) - MAX_LISTED} more (see run_manifest.json)")


def write_recomputed(reporter: pytest.TerminalReporter, records: Sequence[EvalResult]) -> None:
    """One line per item recomputed instead of reused, saying why (``--force``, changed fields)."""
    for result in sorted(records, key=lambda r: r.item_id):
        if result.recompute_reason:
            reporter.write_line(f"recomputed {result.item_id}: {result.recompute_reason}")


def _ordered(records: Sequence[EvalResult]) -> list[EvalResult]:
    """Records by model, variant, seed: the order of every table."""
    return sorted(records, key=lambda r: (r.model, r.variant, r.seed))


def write_markdown_summary(path: Path, records: Sequence[EvalResult], run_dir: Path | None) -> None:
    """Append a Markdown table to a CI job summary file (``$GITHUB_STEP_SUMMARY``)."""
    lines = [
        "## modelbench",
        "",
        "| model | variant | seed | metric | score | 95% CI | n | baseline | Δ | verdict |",
        "|---|---|---:|---|---:|---|---:|---:|---:|---|",
    ]
    for result in _ordered(records):
        cells = _row(result)
        del cells[7]  # errors: not in the step summary
        lines.append(f"| {' | '.join([*cells, result.verdict_text])} |")
    differing = [r for r in _ordered(records) if r.verdict and r.verdict.setup_differs]
    if differing:
        lines.append("")
        lines += [f"- {r.item_id}: {r.verdict.setup_differs}" for r in differing if r.verdict]
    if run_dir is not None:
        lines += ["", f"Run store: `{run_dir.name}`"]
    with path.open("a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n\n")
