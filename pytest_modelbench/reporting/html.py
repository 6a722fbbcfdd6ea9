"""``report.html``: one self-contained page per run (inline CSS, SVG charts, a few lines of JS).

The fragments (:func:`summary_fragment`, :func:`item_fragment`) are shared
with the pytest-html integration, so both reports show the same charts,
leaderboard, gate paragraphs and failing examples. The page also carries every
example (:mod:`.examples`) and, for a run gated against a reference run, the
examples that changed (:mod:`.changes`); :func:`render_compare_page` is
``modelbench compare --html``. A Content-Security-Policy forbids every network
request, so the pages work offline and cannot leak what they show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from urllib.parse import urlencode

from pytest_modelbench.reporting import charts
from pytest_modelbench.reporting.changes import CHANGES_CSS, ExampleChange, changes_html
from pytest_modelbench.reporting.changes import reference_changes as find_reference_changes
from pytest_modelbench.reporting.compare import Comparison, comparison_rows
from pytest_modelbench.reporting.examples import TooLarge, examples_section
from pytest_modelbench.reporting.leaderboard import Cell, cells, ranked_models
from pytest_modelbench.reporting.model import ItemRecord, RunData
from pytest_modelbench.reporting.rows import Example, failing_examples
from pytest_modelbench.store.files import atomic_write_text
from pytest_modelbench.store.verdict import Verdict

REPORT_NAME = "report.html"
MAX_TEXT = 2000
# no network: scripts and styles inline, images as data: URIs; the viewer may call its own API
OFFLINE_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
)
VIEWER_CSP = OFFLINE_CSP + "; connect-src 'self'"

CSS = """
.mb-report{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d1d1f}
.mb-report h1{font-size:1.6em;margin:.2em 0}.mb-report h2{font-size:1.2em;margin:1.2em 0 .4em}
.mb-report .mb-meta{color:#555;margin:.2em 0}
.mb-charts{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.mb-charts svg{border:1px solid #ddd;border-radius:6px;max-width:100%;height:auto}
table.mb-table{border-collapse:collapse;font-size:13px;margin:.4em 0}
table.mb-table th,table.mb-table td{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top}
table.mb-table td.num,table.mb-table th.num{text-align:right;font-variant-numeric:tabular-nums}
table.mb-table th{background:#f4f4f6}
table.mb-sortable th{cursor:pointer;user-select:none}
table.mb-sortable th[aria-sort=ascending]::after{content:" \\25B2"}
table.mb-sortable th[aria-sort=descending]::after{content:" \\25BC"}
.mb-pass{color:#17803d;font-weight:600}.mb-fail,.mb-error{color:#c62828;font-weight:600}
.mb-none{color:#777}
.mb-gate{background:#f7f7f9;border-left:4px solid #999;padding:6px 10px;margin:6px 0;
white-space:normal}
.mb-gate.mb-failed{border-left-color:#c62828}
.mb-examples td pre{white-space:pre-wrap;word-break:break-word;max-width:46em;max-height:16em;
overflow:auto;margin:0;font-size:12px}
.mb-report details{margin:4px 0}.mb-report summary{cursor:pointer}
"""

SORT_JS = """
(function () {
  var tables = document.querySelectorAll('table.mb-sortable');
  Array.prototype.forEach.call(tables, function (table) {
    if (!table.tHead || !table.tBodies.length) { return; }
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener('click', function () {
        var asc = th.getAttribute('aria-sort') !== 'ascending';
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
        var numeric = th.getAttribute('data-type') === 'num';
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var key = function (row) {
          var cell = row.cells[col];
          var raw = cell ? (cell.getAttribute('data-sort') || cell.textContent) : '';
          if (!numeric) { return raw.toLowerCase(); }
          var value = parseFloat(raw);
          return isNaN(value) ? null : value;
        };
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          if (x === y) { return 0; }
          if (x === null) { return 1; }
          if (y === null) { return -1; }
          return (x < y ? -1 : 1) * (asc ? 1 : -1);
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
})();
"""


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ci(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"


def verdict_class(verdict: Verdict | None) -> str:
    """The CSS class of a verdict's cell."""
    return _VERDICT_CLASS.get(verdict, "mb-none") if verdict is not None else "mb-none"


_VERDICT_CLASS = {Verdict.PASS: "mb-pass", Verdict.FAIL: "mb-fail", Verdict.ERROR: "mb-error"}


def _clip(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"\n… ({len(text) - MAX_TEXT} more characters)"


# --------------------------------------------------------------------------- charts


def chart_svgs(table: Sequence[Cell]) -> list[str]:
    """The score chart, then one score-vs-step chart per checkpoint family."""
    if not any(c.score is not None for c in table):
        return []
    metrics = {c.metric for c in table if c.metric}
    label = metrics.pop() if len(metrics) == 1 else "score"
    points = [
        charts.Point(
            group=c.variant,
            key=c.model,
            value=c.score,
            low=c.ci_low,
            high=c.ci_high,
            baseline=c.baseline,
            label=f"{c.model} / {c.variant}: {c.metric} {c.score:.3f} {_ci(c.ci_low, c.ci_high)}"
            + (f", baseline {c.baseline:.3f}" if c.baseline is not None else "")
            + (f", {c.seeds} seeds" if c.seeds > 1 else ""),
        )
        for c in table
        if c.score is not None
    ]
    svgs = [charts.score_chart(points, label)]
    families: dict[str, list[charts.Point]] = {}
    for c in table:
        step = ItemRecord(
            item_id="", model=c.model, env=c.env, variant=c.variant, seed=0
        ).checkpoint
        if step is None or c.score is None:
            continue
        family, number = step
        families.setdefault(family, []).append(
            charts.Point(
                group=c.variant,
                key="",
                value=c.score,
                low=c.ci_low,
                high=c.ci_high,
                step=number,
                label=f"{c.model} / {c.variant}: {c.score:.3f} {_ci(c.ci_low, c.ci_high)}",
            )
        )
    svgs.extend(charts.checkpoint_chart(pts, family, label) for family, pts in families.items())
    return svgs


# --------------------------------------------------------------------------- fragments


def leaderboard_table(table: Sequence[Cell]) -> str:
    variants = list(dict.fromkeys(c.variant for c in table))
    by_key = {(c.model, c.variant): c for c in table}
    head = "".join(f'<th class="num" data-type="num">{escape(v)}</th>' for v in variants)
    rows = []
    for rank, model, rate in ranked_models(table):
        tds = [
            f'<td class="num">{rank}</td>',
            f"<td>{escape(model)}</td>",
            f'<td class="num" data-sort="{"" if rate is None else rate}">{_num(rate, 2)}</td>',
        ]
        for variant in variants:
            cell = by_key.get((model, variant))
            if cell is None or cell.score is None:
                tds.append('<td class="num" data-sort="">-</td>')
                continue
            css = verdict_class(cell.verdict)
            title = escape(
                f"{_ci(cell.ci_low, cell.ci_high)} n={cell.n} verdict={cell.verdict_text or '-'}"
            )
            tds.append(
                f'<td class="num {css}" data-sort="{cell.score}" title="{title}">'
                f"{cell.score:.3f}</td>"
            )
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return (
        '<table class="mb-table mb-sortable mb-leaderboard"><thead><tr>'
        '<th class="num" data-type="num">rank</th><th>model</th>'
        f'<th class="num" data-type="num">win rate</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def summary_fragment(run: RunData, *, embed_assets: bool = True) -> str:
    """Charts and the leaderboard (the pytest-html summary section and report.html's top).

    ``embed_assets`` adds the CSS (which then also styles the per-item
    fragments of the page) and the table-sorting script.
    """
    table = cells(run.items)
    svgs = chart_svgs(table)
    heading = "h2"
    parts = [
        '<div class="mb-report mb-summary">' + (f"<style>{CSS}</style>" if embed_assets else "")
    ]
    if svgs:
        parts.append(f'<{heading}>Scores</{heading}><div class="mb-charts">{"".join(svgs)}</div>')
    if table:
        parts.append(
            f"<{heading}>Leaderboard</{heading}>{leaderboard_table(table)}"
            '<p class="mb-meta">Scores: mean over seeds; win rate: HELM-style mean win '
            "rate across variants (click a header to sort).</p>"
        )
    if embed_assets:
        parts.append(f"<script>{SORT_JS}</script>")
    parts.append("</div>")
    return "".join(parts)


def gate_paragraph(item: ItemRecord) -> str:
    text = item.message or (
        f"{item.variant} {item.metric} {_num(item.score)} "
        f"{_ci(item.ci_low, item.ci_high)}: {item.verdict_text or 'not gated'}"
    )
    failed = " mb-failed" if item.failed else ""
    sandbox = (
        f'<p class="mb-sandbox">generated code ran in the sandbox: {escape(item.sandbox)}</p>'
        if item.sandbox
        else ""
    )
    return f'<p class="mb-gate{failed}">{escape(text)}</p>{sandbox}'


def examples_table(examples: Sequence[Example], limit: int) -> str:
    if not examples:
        return ""
    rows = []
    for ex in examples:
        what = f"error: {ex.error}" if ex.error else f"score {_num(ex.score)}"
        if ex.finish_reason == "length":
            what += "; out of tokens" + ("" if ex.completion.strip() else " while thinking")
        cells_html = [f"<pre>{escape(_clip(text))}</pre>" for text in (ex.prompt, ex.completion)]
        if ex.reasoning:  # the thinking, collapsed beside the answer
            cells_html[1] += (
                f'<details class="mb-reasoning"><summary>reasoning ({len(ex.reasoning)} '
                f"characters)</summary><pre>{escape(_clip(ex.reasoning))}</pre></details>"
            )
        cells_html += [f"<pre>{escape(_clip(text))}</pre>" for text in (ex.gold, ex.extracted)]
        rows.append(
            f"<tr><td>{escape(ex.example_id)}"
            + (f" #{ex.rollout}" if ex.rollout else "")
            + f"<br><small>{escape(what)}</small></td>"
            + "".join(f"<td>{cell}</td>" for cell in cells_html)
            + "</tr>"
        )
    return (
        f'<p class="mb-meta">First {len(examples)} wrong or errored example(s) '
        f"(at most {limit}):</p>"
        '<table class="mb-table mb-examples"><thead><tr><th>example</th><th>prompt</th>'
        "<th>completion</th><th>gold</th><th>extracted</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def item_fragment(
    run: RunData, item: ItemRecord, examples: int, shown: list[Example] | None = None
) -> str:
    """The gate paragraph and the first failing examples of one item (``shown`` when they
    were picked already)."""
    if shown is None:
        try:
            shown = failing_examples(run, item, examples)
        except OSError:
            shown = []
    return (
        f'<div class="mb-report mb-item">{gate_paragraph(item)}'
        f"{examples_table(shown, examples)}</div>"
    )


# --------------------------------------------------------------------------- the page

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("item", "text"),
    ("model", "text"),
    ("environment", "text"),
    ("seed", "num"),
    ("metric", "text"),
    ("score", "num"),
    ("95% CI", "text"),
    ("baseline", "num"),
    ("Δ", "num"),
    ("p", "num"),
    ("verdict", "text"),
    ("n", "num"),
    ("errors", "num"),
    ("duration s", "num"),
    ("tokens", "num"),
)


def _item_row(item: ItemRecord) -> str:
    def num(value: float | int | None, digits: int = 3) -> str:
        shown = (
            "-"
            if value is None
            else (str(value) if isinstance(value, int) else f"{value:.{digits}f}")
        )
        return f'<td class="num" data-sort="{"" if value is None else value}">{shown}</td>'

    verdict = item.shown
    if item.from_store and verdict not in ("error", "-"):
        verdict += " (from store)"
    anchor = escape(f"item-{item.item_id}")
    return (
        f'<tr><td><a href="#{anchor}">{escape(item.item_id)}</a></td><td>{escape(item.model)}</td>'
        f"<td>{escape(item.variant)}</td>{num(item.seed)}<td>{escape(item.metric)}</td>"
        f"{num(item.score)}<td>{_ci(item.ci_low, item.ci_high)}</td>{num(item.baseline)}"
        f"{num(item.delta)}{num(item.p_value, 4)}"
        f'<td class="{verdict_class(item.verdict)}">{escape(verdict)}</td>{num(item.n)}'
        f"{num(item.errors)}{num(item.duration_s, 1)}{num(item.tokens)}</tr>"
    )


def _head(title: str, csp: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{escape(title)}</title><link rel="icon" href="data:,"><style>{CSS}'
        f"{CHANGES_CSS}body{{margin:24px;max-width:1400px}}</style></head>"
    )


def reference_section(run: RunData) -> str:
    """ "What changed since the reference run", for a run gated with ``--baseline-run``."""
    reference, changes, notes = find_reference_changes(run)
    if reference is None:
        return ""
    note_html = "".join(f'<p class="mb-meta">{escape(n)}</p>' for n in notes)
    return (
        f'<section id="mb-changes"><h2>What changed since run {escape(reference)}</h2>'
        '<p class="mb-meta">Examples of the paired items whose score differs from the reference '
        "run, worse first; the reference's completion on the left.</p>"
        f"{note_html}{changes_html(changes, f'reference {reference}', run.run_id)}</section>"
    )


def _browse_links(item: ItemRecord) -> str:
    """Links into the Examples section, filtered to this item."""
    query = urlencode({"item": item.item_id})
    return (
        f'<p class="mb-meta mb-browse">Browse this item\'s <a href="#examples?{escape(query)}">'
        f'examples</a> · <a href="#examples?{escape(query)}&amp;outcome=wrong">wrong ones</a>'
        f' · <a href="#examples?{escape(query)}&amp;outcome=error">errors</a></p>'
    )


def render_report(
    run: RunData,
    *,
    examples: int = 5,
    title: str | None = None,
    picked: Mapping[str, list[Example]] | None = None,
    examples_source: str = "embedded",
    run_hint: str = "",
    packed: tuple[str, int] | TooLarge | None = None,
) -> str:
    """The whole ``report.html`` page; ``picked``: failing examples already read, by item;
    ``packed``: the embedded examples already encoded (:class:`EmbeddedExamples`).

    ``examples_source``: ``embedded`` (every example in the page) or ``api`` (the page
    served by ``modelbench view``, which asks its server).
    """
    title = title or f"modelbench report: {run.run_id}"
    counts: dict[str, int] = {}
    for item in run.items:
        key = str(item.verdict or item.status or "unknown")
        counts[key] = counts.get(key, 0) + 1
    count_text = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no items"
    versions = run.manifest.get("versions") or {}
    version_text = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    head = "".join(
        f'<th{" class=num" if kind == "num" else ""} data-type="{kind}">{escape(name)}</th>'
        for name, kind in _COLUMNS
    )
    details = []
    for item in run.items:
        is_open = " open" if item.failed else ""
        details.append(
            f'<details id="{escape(f"item-{item.item_id}")}"{is_open}><summary><b>'
            f'{escape(item.item_id)}</b> — <span class="{verdict_class(item.verdict)}">'
            f"{escape(item.shown)}</span></summary>"
            f"{item_fragment(run, item, examples, (picked or {}).get(item.item_id))}"
            f"{_browse_links(item)}</details>"
        )
    csp = VIEWER_CSP if examples_source == "api" else OFFLINE_CSP
    return (
        _head(title, csp) + f'<body class="mb-report"><h1>{escape(title)}</h1>'
        f'<p class="mb-meta">run <code>{escape(run.run_id)}</code> · '
        f"status {escape(run.status())} · "
        f"{len(run.items)} items: {escape(count_text)} · generated {escape(run.generated_at)}</p>"
        + (f'<p class="mb-meta">{escape(version_text)}</p>' if version_text else "")
        + summary_fragment(run, embed_assets=False)
        + '<h2>Items</h2><table class="mb-table mb-sortable mb-items"><thead><tr>'
        + head
        + "</tr></thead><tbody>"
        + "".join(_item_row(i) for i in run.items)
        + "</tbody></table>"
        + reference_section(run)
        + "<h2>Details</h2>"
        + "".join(details)
        + examples_section(run, source=examples_source, run_hint=run_hint, packed=packed)
        + f"<script>{SORT_JS}</script></body></html>\n"
    )


def write_report(
    run: RunData,
    path: Path | None = None,
    *,
    examples: int = 5,
    picked: Mapping[str, list[Example]] | None = None,
    packed: tuple[str, int] | TooLarge | None = None,
) -> Path:
    path = path or run.directory / REPORT_NAME
    atomic_write_text(path, render_report(run, examples=examples, picked=picked, packed=packed))
    return path


def render_compare_page(comparison: Comparison, changes: list[ExampleChange]) -> str:
    """``modelbench compare A B --html FILE``: the paired table, then the changed examples."""
    title = f"modelbench compare: {comparison.run_a} → {comparison.run_b}"
    rows = comparison_rows(comparison)
    numeric = {"n", "A", "B", "delta (B-A)", "p", "B>A", "A>B"}
    head = "".join(
        f'<th class="num" data-type="num">{escape(h)}</th>'
        if h in numeric
        else f'<th data-type="text">{escape(h)}</th>'
        for h in rows[0]
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{escape(v)}</td>' if h in numeric else f"<td>{escape(v)}</td>"
            for h, v in zip(rows[0], row, strict=True)
        )
        + "</tr>"
        for row in rows[1:]
    )
    rates = "".join(
        f'<tr><td>{escape(m)}</td><td class="num">{_num(r)}</td></tr>'
        for m, r in comparison.win_rates
    )
    note = f'<p class="mb-meta">{escape(comparison.note)}</p>' if comparison.note else ""
    return (
        _head(title, OFFLINE_CSP) + f'<body class="mb-report"><h1>{escape(title)}</h1>'
        f'<p class="mb-meta">A = <code>{escape(comparison.run_a)}</code>, B = '
        f"<code>{escape(comparison.run_b)}</code>. Per variant and model: the paired difference "
        "B − A on the examples both runs scored, its 95% CI and two-sided p-value.</p>"
        f"{note}<h2>Paired comparison</h2>"
        f'<table class="mb-table mb-sortable mb-paired"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
        '<h2>Win rates</h2><table class="mb-table mb-sortable mb-winrates"><thead><tr>'
        '<th>model</th><th class="num" data-type="num">win rate</th></tr></thead>'
        f"<tbody>{rates}</tbody></table>"
        f'<section id="mb-changes"><h2>Examples that changed</h2>'
        f"{changes_html(changes, f'A {comparison.run_a}', f'B {comparison.run_b}')}</section>"
        f"<script>{SORT_JS}</script></body></html>\n"
    )
