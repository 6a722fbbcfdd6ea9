"""What changed between two runs: the examples whose score differs, worse first, side by side.

Used by ``modelbench compare A B --html FILE`` (every paired model and variant) and by
``report.html`` of a run gated with ``--baseline-run`` (each paired item against the same
item of its reference run). Examples pair by ``(seed, example_id)``; with rollouts an
example's score is their mean and its first rollout is shown.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from pytest_modelbench.reporting.examples import EXAMPLES_CSS, example_record
from pytest_modelbench.reporting.model import ItemRecord, RunData, load_run
from pytest_modelbench.reporting.rows import item_rows, row_score

MAX_SHOWN = 1000  # changed examples rendered per page (the counts cover all of them)


@dataclass(frozen=True)
class ExampleChange:
    """One example scored differently in run A and run B."""

    variant: str
    model_a: str
    model_b: str
    seed: int
    example_id: str
    score_a: float
    score_b: float
    a: Mapping[str, Any]  # the example's first rollout in A (an examples.example_record)
    b: Mapping[str, Any]

    @property
    def delta(self) -> float:
        return self.score_b - self.score_a


def _rows(run: RunData, items: Sequence[ItemRecord]) -> Iterator[tuple[ItemRecord, Any]]:
    for item in items:
        try:
            for row in item_rows(run, item):
                yield item, row
        except OSError:  # an item without a journal
            continue


def _scores(run: RunData, items: Sequence[ItemRecord]) -> dict[tuple[int, str], float]:
    """``(seed, example_id) -> mean score over rollouts`` of the scored examples."""
    sums: dict[tuple[int, str], list[float]] = {}
    for item, row in _rows(run, items):
        score = row_score(item, row)
        if score is not None:
            sums.setdefault((item.seed, str(row.get("example_id"))), []).append(score)
    return {key: math.fsum(values) / len(values) for key, values in sums.items()}


def _records(
    run: RunData, items: Sequence[ItemRecord], keys: set[tuple[int, str]]
) -> dict[tuple[int, str], dict[str, Any]]:
    """The first rollout's record of each example in ``keys`` (a second pass: memory holds
    the changed examples only, not the run)."""
    found: dict[tuple[int, str], dict[str, Any]] = {}
    for item, row in _rows(run, items):
        key = (item.seed, str(row.get("example_id")))
        if key in keys and (key not in found or (row.get("rollout") or 0) < found[key]["r"]):
            found[key] = example_record(0, item, row)
    return found


def changed_examples(
    run_a: RunData,
    items_a: Sequence[ItemRecord],
    run_b: RunData,
    items_b: Sequence[ItemRecord],
) -> list[ExampleChange]:
    """The examples both scored whose score differs, biggest drop first, then gains."""
    a, b = _scores(run_a, items_a), _scores(run_b, items_b)
    keys = [key for key in a if key in b and a[key] != b[key]]
    wanted = set(keys)
    rec_a, rec_b = _records(run_a, items_a, wanted), _records(run_b, items_b, wanted)
    first_a, first_b = items_a[0], items_b[0]
    changes = [
        ExampleChange(
            first_b.variant,
            first_a.model,
            first_b.model,
            key[0],
            key[1],
            a[key],
            b[key],
            rec_a[key],
            rec_b[key],
        )
        for key in keys
    ]
    changes.sort(key=lambda c: c.delta)  # stable: journal order among equal deltas
    return changes


def compare_changes(
    run_a: RunData, run_b: RunData, pairs: Sequence[tuple[str, str]]
) -> list[ExampleChange]:
    """Every paired model and variant of two runs (``pairs``: the comparison's model pairs)."""
    found: list[ExampleChange] = []
    for model_a, model_b in pairs:
        for variant in run_a.variants:
            items_a = [i for i in run_a.items if i.model == model_a and i.variant == variant]
            items_b = [i for i in run_b.items if i.model == model_b and i.variant == variant]
            if items_a and items_b:
                found += changed_examples(run_a, items_a, run_b, items_b)
    found.sort(key=lambda c: c.delta)
    return found


def reference_changes(run: RunData) -> tuple[str | None, list[ExampleChange], list[str]]:
    """For a run gated against a reference run (``--baseline-run`` or a baseline's ``run:``):
    ``(reference run id, changed examples of the paired items, notes)``."""
    by_reference: dict[str, list[ItemRecord]] = {}
    for item in run.items:
        reference = (item.gate or {}).get("reference_run")
        if reference:
            by_reference.setdefault(str(reference), []).append(item)
    if not by_reference:
        return None, [], []
    notes: list[str] = []
    changes: list[ExampleChange] = []
    for reference, items in by_reference.items():
        directory = Path(reference)
        directory = directory if directory.is_absolute() else run.directory.parent / directory
        try:
            ref = load_run(directory)
        except OSError as exc:
            notes.append(f"reference run {reference}: cannot read {directory}: {exc}")
            continue
        ref_items = {i.item_id: i for i in ref.items}
        for item in items:
            other = ref_items.get(item.item_id)
            if other is None:
                notes.append(f"{item.item_id}: not in reference run {reference}")
                continue
            changes += changed_examples(ref, [other], run, [item])
    changes.sort(key=lambda c: c.delta)
    return ", ".join(by_reference), changes, notes


# --------------------------------------------------------------------------- HTML


def _gold_html(record: Mapping[str, Any], picked_a: str, picked_b: str) -> str:
    gold = record["g"]
    if "options" not in gold:
        return f'<pre class="mb-gold-text">{escape(gold.get("text") or "")}</pre>'
    lines = []
    for letter, text in gold["options"]:
        cls = []
        marks = []
        if letter == gold["answer"]:
            cls.append("mb-gold")
            marks.append("✓ gold")
        if letter == picked_a:
            marks.append("← A")
        if letter == picked_b:
            cls.append("mb-picked")
            marks.append("← B")
        mark = (" " + " ".join(marks)) if marks else ""
        lines.append(f'<li class="{" ".join(cls)}">{escape(letter)}) {escape(text)}{mark}</li>')
    return f'<ol class="mb-options">{"".join(lines)}</ol>'


def _side(label: str, record: Mapping[str, Any], score: float) -> str:
    reasoning = (
        f'<details class="mb-reasoning"><summary>reasoning ({len(record["th"])} characters)'
        f"</summary><pre>{escape(record['th'])}</pre></details>"
        if record["th"]
        else ""
    )
    error = f'<p class="mb-err">error: {escape(record["e"])}</p>' if record["e"] else ""
    return (
        f"<section><h4>{escape(label)}: score {score:.3f} · {escape(record['o'])} · "
        f"extracted {escape(record['x'] or '-')}</h4>{error}"
        f"<pre>{escape(record['c'])}</pre>{reasoning}</section>"
    )


def changes_html(changes: Sequence[ExampleChange], label_a: str = "A", label_b: str = "B") -> str:
    """The changed examples, worse first: the prompt and gold once, both completions."""
    worse = sum(1 for c in changes if c.delta < 0)
    shown = changes[:MAX_SHOWN]
    head = (
        f'<p class="mb-meta" id="mb-changes-count">{len(changes)} example(s) changed score: '
        f"{worse} worse, {len(changes) - worse} better"
        + (f" (the first {MAX_SHOWN} shown)" if len(changes) > MAX_SHOWN else "")
        + ".</p>"
    )
    cards = []
    for n, c in enumerate(shown):
        model = c.model_a if c.model_a == c.model_b else f"{c.model_a} → {c.model_b}"
        direction = "worse" if c.delta < 0 else "better"
        anchor = f"change-{n}"
        cards.append(
            f'<article class="mb-ex mb-change mb-{direction}" id="{anchor}" '
            f'data-example="{escape(c.example_id)}" data-delta="{c.delta:.6g}">'
            f'<header><a href="#{anchor}">{escape(c.variant)} · {escape(model)} · seed {c.seed}'
            f' · {escape(c.example_id)}</a><span class="mb-badge">{direction}</span>'
            f'<span class="mb-meta">{c.score_a:.3f} → {c.score_b:.3f} ({c.delta:+.3f})</span>'
            f'</header><div class="mb-ex-grid"><section><h4>prompt</h4>'
            f"<pre>{escape(c.b['p'])}</pre><h4>gold</h4>"
            f"{_gold_html(c.b, c.a['x'], c.b['x'])}</section>"
            f"{_side(label_a, c.a, c.score_a)}{_side(label_b, c.b, c.score_b)}</div></article>"
        )
    return head + "".join(cards)


CHANGES_CSS = (
    EXAMPLES_CSS + ".mb-change.mb-worse .mb-badge{background:#c62828}"
    ".mb-change.mb-better .mb-badge{background:#17803d}"
)
