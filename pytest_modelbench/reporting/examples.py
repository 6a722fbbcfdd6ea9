"""Every example of a run, browsable: one compact record per journal row, embedded compressed.

``report.html`` embeds the records as zlib-compressed JSON (the browser inflates them with
``DecompressionStream('deflate')``, no library, no network) and renders them a page at a
time; ``modelbench view`` serves the same records from the run store instead
(:mod:`pytest_modelbench.reporting.view`). Filtering is the same in both: by item, outcome
and free text, with the state in the URL fragment (``#examples?item=..&outcome=..&q=..``).
"""

from __future__ import annotations

import base64
import json
import threading
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from pytest_modelbench.reporting.model import ItemRecord, RunData
from pytest_modelbench.reporting.rows import PreparedRow, item_rows, score_of

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
OUTCOMES = ("right", "wrong", "error", "truncated")
# a report embeds at most this many compressed bytes (base64 adds a third: ~24 MB on disk);
# a larger run keeps its summary and points at ``modelbench view``
EMBED_LIMIT_BYTES = 18_000_000
MAX_FIELD = 20_000  # characters of one text field embedded in report.html (the viewer: all)
# zlib's default level: level 1 takes a third of the time (every session end pays it, ~0.14 s
# on 2000 medqa-like rows) but embeds about a tenth fewer examples under EMBED_LIMIT_BYTES
COMPRESS_LEVEL = 6
PAGE_SIZE = 50  # examples rendered at a time
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # one per process
CHUNK_CHARS = 1 << 18  # JSON compressed at a time, in a thread (the last one is waited for)


def outcome_of(row: Mapping[str, Any], score: float | None) -> str:
    """``error`` (no score), ``truncated`` (``finish_reason == "length"``), ``right`` (full
    marks: score >= 1) or ``wrong``."""
    if row.get("error"):
        return "error"
    if row.get("finish_reason") == "length":
        return "truncated"
    return "right" if score is not None and score >= 1.0 else "wrong"


def gold_view(gold: Any) -> dict[str, Any]:
    """The gold as people read it: a multiple-choice gold (``{"answer": "B", "options": [...]}``)
    as lettered options, text as text, anything else as indented JSON."""
    if isinstance(gold, Mapping):
        options, answer = gold.get("options"), gold.get("answer")
        if isinstance(options, list) and isinstance(answer, str) and len(options) <= 26:
            letters = LETTERS[: len(options)]  # as suites/prompting.py letters them
            return {
                "options": [
                    [letter, str(text)] for letter, text in zip(letters, options, strict=True)
                ],
                "answer": answer,
            }
    if gold is None:
        return {"text": ""}
    if isinstance(gold, str):
        return {"text": gold}
    return {"text": json.dumps(gold, indent=2, ensure_ascii=False, sort_keys=True, default=str)}


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _clip(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit} more characters: modelbench view shows all)"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def example_record(
    index: int, item: ItemRecord, row: Mapping[str, Any], clip: int | None = MAX_FIELD
) -> dict[str, Any]:
    """One journal row as the page shows it (short keys: the report carries thousands).

    ``i`` item index, ``id`` example id, ``r`` rollout, ``o`` outcome, ``s`` score,
    ``p`` prompt, ``c`` completion, ``th`` reasoning, ``g`` gold view, ``x`` extracted,
    ``tk`` [prompt, completion, reasoning] tokens, ``l`` latency s, ``f`` finish reason,
    ``e`` error.
    """
    return {"i": index, **record_fields(row, item.metric, clip)}


def record_fields(
    row: Mapping[str, Any], metric: str, clip: int | None = MAX_FIELD
) -> dict[str, Any]:
    """:func:`example_record` without the item's index (``metric``: the item's)."""
    score = score_of(row, metric)
    raw_tokens = row.get("tokens")
    tokens: Mapping[str, Any] = raw_tokens if isinstance(raw_tokens, Mapping) else {}
    gold = gold_view(row.get("gold"))
    if "text" in gold:
        gold["text"] = _clip(gold["text"], clip)
    return {
        "id": str(row.get("example_id")),
        "r": _int_or_none(row.get("rollout")) or 0,
        "o": outcome_of(row, score),
        "s": score,
        "p": _clip(_text(row.get("prompt")), clip),
        "c": _clip(_text(row.get("completion")), clip),
        "th": _clip(_text(row.get("reasoning")), clip),
        "g": gold,
        "x": _clip(_text(row.get("extracted")), clip),
        "tk": [
            _int_or_none(tokens.get("prompt")),
            _int_or_none(tokens.get("completion")),
            _int_or_none(row.get("reasoning_tokens", tokens.get("reasoning"))),
        ],
        "l": row.get("latency_s") if isinstance(row.get("latency_s"), (int, float)) else None,
        "f": _text(row.get("finish_reason")),
        "e": _text(row.get("error")),
    }


def record_text(row: Mapping[str, Any], metric: str) -> str:
    """The row's embedded record as JSON, without the item's index (:func:`indexed` adds it:
    the index is known only once the run's items are)."""
    return _COMPACT.encode(record_fields(row, metric))


def indexed(index: int, text: str) -> str:
    """:func:`record_text` with the item's index in front: ``_COMPACT.encode`` of
    :func:`example_record`, character for character."""
    return f'{{"i":{index},{text[1:]}'


def item_meta(run: RunData) -> list[dict[str, Any]]:
    """What the page needs of each item to label and filter examples."""
    return [
        {
            "id": i.item_id,
            "model": i.model,
            "variant": i.variant,
            "seed": i.seed,
            "metric": i.metric,
        }
        for i in run.items
    ]


def iter_records(run: RunData, clip: int | None = MAX_FIELD) -> Iterator[dict[str, Any]]:
    """Every example of every item, in item then journal order, streamed."""
    for index, item in enumerate(run.items):
        try:
            for row in item_rows(run, item):
                yield example_record(index, item, row, clip)
        except OSError:  # an item without a journal (errored before its first example)
            continue


# --------------------------------------------------------------------------- filtering


@dataclass(frozen=True)
class Query:
    """The page state (``#examples?item=..&outcome=..&q=..&ex=..``), as the viewer filters."""

    item: str = ""
    outcome: str = ""
    q: str = ""
    ex: str = ""

    def matches(self, record: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> bool:
        if self.item and items[record["i"]]["id"] != self.item:
            return False
        if self.outcome and record["o"] != self.outcome:
            return False
        if self.ex and record["id"] != self.ex:
            return False
        return not self.q or self.q.lower() in haystack(record)


def haystack(record: Mapping[str, Any]) -> str:
    """The text the free-text filter searches (the page's JavaScript joins the same fields)."""
    gold = record["g"]
    gold_text = gold.get("text") or " ".join(t for _, t in gold.get("options") or [])
    parts = (
        record["id"],
        record["p"],
        record["c"],
        record["th"],
        gold_text,
        record["x"],
        record["e"],
    )
    return "\n".join(parts).lower()


# --------------------------------------------------------------------------- the payload


class TooLarge(Exception):
    """The compressed examples exceed the embedding limit (message: how far it got)."""


class _Packer:
    """Records in, ``(base64 of zlib(JSON array), count)`` out; :class:`TooLarge` past
    ``limit`` compressed bytes (checked as it goes: a huge run is not compressed to the end
    first).

    Each :data:`CHUNK_CHARS` of JSON is compressed in a thread of its own, after the chunk
    before it: zlib releases the GIL, so the records after it are encoded meanwhile (on a
    second core, about 0.05 s of every 2000-example session end), and the stream is the one
    a single call makes (deflate's output does not depend on how its input is split)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self._zlib = zlib.compressobj(COMPRESS_LEVEL)
        self._chunks: list[bytes] = []  # compressed, in order (appended by the threads)
        self._running: deque[threading.Thread] = deque()
        self._error: BaseException | None = None
        self._pending: list[str] = ["["]
        self._pending_len = 0

    def add(self, record: Mapping[str, Any]) -> None:
        self.add_text(_COMPACT.encode(record))

    def add_text(self, text: str) -> None:
        """One record already encoded (compactly, as :meth:`add` encodes it)."""
        self._pending.append(("," if self.count else "") + text)
        self._pending_len += len(self._pending[-1])
        self.count += 1
        if self._pending_len > CHUNK_CHARS:
            self._compress("".join(self._pending).encode("utf-8", "backslashreplace"))
            self._pending, self._pending_len = [], 0
            size = sum(len(chunk) for chunk in self._chunks)  # those compressed so far
            if size > self.limit:
                raise TooLarge(
                    f"more than {self.limit:,} compressed bytes after {self.count:,} examples"
                )

    def _compress(self, data: bytes) -> None:
        """Compress ``data`` in a thread once the chunk before it is done (at most four wait,
        so memory stays bounded when compressing is slower than encoding)."""
        while len(self._running) >= 4:
            self._running.popleft().join()
        before = self._running[-1] if self._running else None

        def run() -> None:
            if before is not None:
                before.join()
            try:
                if self._error is None:
                    self._chunks.append(self._zlib.compress(data))
            except BaseException as exc:  # MemoryError: raised again by done()
                self._error = exc

        thread = threading.Thread(target=run, name="modelbench-compress", daemon=True)
        thread.start()
        self._running.append(thread)

    def done(self) -> tuple[str, int]:
        self._pending.append("]")
        self._compress("".join(self._pending).encode("utf-8", "backslashreplace"))
        while self._running:
            self._running.popleft().join()
        if self._error is not None:
            raise self._error
        self._chunks.append(self._zlib.flush())
        data = b"".join(self._chunks)
        if len(data) > self.limit:
            raise TooLarge(f"{len(data):,} compressed bytes for {self.count:,} examples")
        return base64.b64encode(data).decode("ascii"), self.count


def encode_records(records: Iterable[Mapping[str, Any]], limit: int) -> tuple[str, int]:
    """``(base64 of zlib(JSON array), count)``; :class:`TooLarge` past ``limit`` compressed
    bytes (checked as it goes: a huge run is not compressed to the end first)."""
    packer = _Packer(limit)
    for record in records:
        packer.add(record)
    return packer.done()


class EmbeddedExamples:
    """``report.html``'s examples, packed as the ``results.parquet`` pass streams the journals
    (:meth:`add` per row, in :func:`iter_records`' order), so session end reads each journal
    once for both. :attr:`packed` is None until :meth:`done`, after every row was seen."""

    def __init__(self, limit: int = EMBED_LIMIT_BYTES) -> None:
        self._packer = _Packer(limit)
        self._too_large: TooLarge | None = None
        self.packed: tuple[str, int] | TooLarge | None = None

    def add(self, index: int, item: ItemRecord, ready: PreparedRow) -> None:
        """One row, with its :func:`record_text` when it was made while the item ran."""
        if self._too_large is not None:
            return
        record = ready.record
        text = record if record is not None else record_text(ready.row, item.metric)
        try:
            self._packer.add_text(indexed(index, text))
        except TooLarge as exc:
            self._too_large = exc

    def done(self) -> None:
        if self._too_large is not None:
            self.packed = self._too_large
            return
        try:
            self.packed = self._packer.done()
        except TooLarge as exc:
            self.packed = exc


def json_script(element_id: str, data: Any) -> str:
    """Data for the page's script, safe inside ``<script>`` (``</`` cannot close it)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def examples_section(
    run: RunData,
    *,
    source: str = "embedded",
    run_hint: str = "",
    packed: tuple[str, int] | TooLarge | None = None,
) -> str:
    """The "Examples" section: filters, the list, and its data.

    ``source``: ``embedded`` (the compressed records in the page, or, past the limit, a
    pointer to ``modelbench view``) or ``api`` (the viewer's ``api/examples``). ``packed``:
    the embedded records already encoded (:class:`EmbeddedExamples`), else read here.
    """
    hint = run_hint or run.run_id
    payload = ""
    note = ""
    if source == "embedded":
        try:
            if isinstance(packed, TooLarge):
                raise packed
            encoded, count = packed or encode_records(iter_records(run), EMBED_LIMIT_BYTES)
        except TooLarge as exc:
            source = "none"
            note = (
                f"This run's examples are too large to embed in the report ({exc}; the limit is "
                f"{EMBED_LIMIT_BYTES // 1_000_000} MB compressed). Browse them with "
                f"<code>modelbench view {escape(hint)}</code>: a read-only viewer on "
                "127.0.0.1 that reads the run store."
            )
        else:
            payload = (
                f'<script type="application/octet-stream" id="mb-examples-data" '
                f'data-count="{count}">{encoded}</script>'
            )
    outcome_options = "".join(f'<option value="{o}">{o}</option>' for o in OUTCOMES)
    item_options = "".join(
        f'<option value="{escape(i.item_id)}">{escape(i.item_id)}</option>' for i in run.items
    )
    controls = (
        '<div class="mb-ex-filters">'
        f'<label>item <select id="mb-f-item"><option value="">all items</option>{item_options}'
        "</select></label> "
        f'<label>outcome <select id="mb-f-outcome"><option value="">any</option>'
        f"{outcome_options}</select></label> "
        '<label>text <input id="mb-f-q" type="search" placeholder="search prompt, completion, '
        'gold…" size="32"></label> <span id="mb-ex-count" class="mb-meta"></span></div>'
    )
    body = (
        f'<p class="mb-meta">{note}</p>'
        if source == "none"
        else f'{controls}<div id="mb-ex-list"></div>'
        '<button type="button" id="mb-ex-more" hidden>show more</button>'
    )
    return (
        f'<section id="mb-examples" data-source="{source}" data-page="{PAGE_SIZE}">'
        "<h2>Examples</h2>"
        '<p class="mb-meta">Every example of the run. Filter by item, outcome (right: full '
        "marks; truncated: the answer hit the token limit) and text; the address bar keeps "
        "the filter, so a link opens the same view. Click an example's id for a link to it.</p>"
        f"{json_script('mb-items', item_meta(run))}{payload}{body}</section>"
        f"<script>{EXAMPLES_JS}</script>"
    )


EXAMPLES_CSS = """
.mb-ex-filters{display:flex;flex-wrap:wrap;gap:12px;align-items:center;margin:.4em 0;font-size:13px}
.mb-ex{border:1px solid #ddd;border-radius:6px;margin:8px 0;padding:6px 10px;font-size:13px}
.mb-ex header{display:flex;flex-wrap:wrap;gap:10px;align-items:baseline}
.mb-ex .mb-badge{border-radius:4px;padding:0 6px;font-weight:600;color:#fff;background:#777}
.mb-o-right .mb-badge{background:#17803d}.mb-o-wrong .mb-badge{background:#c62828}
.mb-o-error .mb-badge{background:#6a1b9a}.mb-o-truncated .mb-badge{background:#b26a00}
.mb-ex-grid{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:10px;margin-top:6px}
.mb-ex-grid.mb-two{grid-template-columns:repeat(2,minmax(0,1fr))}
.mb-ex h4{margin:.2em 0;font-size:12px;color:#555;text-transform:uppercase}
.mb-ex pre{white-space:pre-wrap;word-break:break-word;max-height:22em;overflow:auto;margin:0;
font-size:12px;background:#fafafa;padding:4px}
.mb-ex ol.mb-options{list-style:none;padding-left:0;margin:0}
.mb-ex ol.mb-options li{padding:1px 4px;border-radius:3px}
.mb-ex li.mb-gold{background:#e3f4e8;font-weight:600}
.mb-ex li.mb-picked{outline:2px solid #c62828}
.mb-ex li.mb-gold.mb-picked{outline-color:#17803d}
.mb-ex .mb-err{color:#6a1b9a}
.mb-ex.mb-target{box-shadow:0 0 0 3px #1565c0}
"""

# The list: decode the records (embedded) or ask the viewer (api), filter, render a page at a
# time with DOM calls (textContent: no example text is ever parsed as HTML).
EXAMPLES_JS = r"""
(function () {
  var root = document.getElementById('mb-examples');
  if (!root || root.getAttribute('data-source') === 'none') { return; }
  var items = JSON.parse(document.getElementById('mb-items').textContent);
  var source = root.getAttribute('data-source');
  var pageSize = parseInt(root.getAttribute('data-page'), 10) || 50;
  var list = document.getElementById('mb-ex-list');
  var more = document.getElementById('mb-ex-more');
  var count = document.getElementById('mb-ex-count');
  var inputs = {item: document.getElementById('mb-f-item'),
                outcome: document.getElementById('mb-f-outcome'),
                q: document.getElementById('mb-f-q')};
  var records = null, matched = [], shown = 0, total = 0, state = {}, loading = null;

  function readHash() {
    var hash = location.hash.replace(/^#/, '');
    var s = {item: '', outcome: '', q: '', ex: ''};
    if (hash.indexOf('examples') !== 0) { return null; }
    var params = new URLSearchParams(hash.slice(hash.indexOf('?') + 1 || hash.length));
    Object.keys(s).forEach(function (k) { s[k] = params.get(k) || ''; });
    return s;
  }
  function writeHash(s) {
    var params = new URLSearchParams();
    Object.keys(s).forEach(function (k) { if (s[k]) { params.set(k, s[k]); } });
    var text = params.toString();
    history.replaceState(null, '', '#examples' + (text ? '?' + text : ''));
  }
  function decode() {
    var node = document.getElementById('mb-examples-data');
    var raw = atob(node.textContent.trim());
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { bytes[i] = raw.charCodeAt(i); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('deflate'));
    return new Response(stream).text().then(function (text) { return JSON.parse(text); });
  }
  function hay(r) {
    if (r._h === undefined) {
      var g = r.g.text !== undefined ? r.g.text
        : r.g.options.map(function (o) { return o[1]; }).join(' ');
      r._h = [r.id, r.p, r.c, r.th, g, r.x, r.e].join('\n').toLowerCase();
    }
    return r._h;
  }
  function matches(r, s) {
    if (s.item && items[r.i].id !== s.item) { return false; }
    if (s.outcome && r.o !== s.outcome) { return false; }
    if (s.ex && r.id !== s.ex) { return false; }
    return !s.q || hay(r).indexOf(s.q.toLowerCase()) >= 0;
  }
  function query(s, offset) {
    if (source === 'api') {
      var params = new URLSearchParams(s);
      params.set('offset', offset); params.set('limit', pageSize);
      return fetch('api/examples?' + params.toString()).then(function (r) { return r.json(); });
    }
    if (offset === 0) { matched = records.filter(function (r) { return matches(r, s); }); }
    return Promise.resolve({total: matched.length, rows: matched.slice(offset, offset + pageSize)});
  }
  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined) { node.textContent = text; }
    return node;
  }
  function block(parent, title, text) {
    parent.appendChild(el('h4', '', title));
    parent.appendChild(el('pre', '', text));
  }
  function num(v, d) { return v === null || v === undefined ? '-' : Number(v).toFixed(d); }
  function link(r) {
    var p = new URLSearchParams({item: items[r.i].id, ex: r.id});
    return '#examples?' + p.toString();
  }
  function card(r) {
    var box = el('article', 'mb-ex mb-o-' + r.o);
    box.setAttribute('data-outcome', r.o);
    box.setAttribute('data-example', r.id);
    var head = el('header');
    var a = el('a', 'mb-ex-id', items[r.i].id + ' · ' + r.id + (r.r ? ' #' + r.r : ''));
    a.href = link(r);
    head.appendChild(a);
    head.appendChild(el('span', 'mb-badge', r.o));
    var tk = r.tk || [];
    var facts = 'score ' + num(r.s, 3) + ' · tokens ' + (tk[0] === null ? '?' : tk[0]) + ' + ' +
      (tk[1] === null ? '?' : tk[1]) + (tk[2] ? ' (reasoning ' + tk[2] + ')' : '') +
      ' · ' + num(r.l, 2) + ' s' + (r.f ? ' · finish ' + r.f : '');
    head.appendChild(el('span', 'mb-meta', facts));
    box.appendChild(head);
    if (r.e) { box.appendChild(el('p', 'mb-err', 'error: ' + r.e)); }
    var grid = el('div', 'mb-ex-grid');
    var left = el('section'), mid = el('section'), right = el('section');
    block(left, 'prompt', r.p);
    block(mid, 'completion', r.c);
    if (r.th) {
      var det = el('details', 'mb-reasoning');
      det.appendChild(el('summary', '', 'reasoning (' + r.th.length + ' characters)'));
      det.appendChild(el('pre', '', r.th));
      mid.appendChild(det);
    }
    right.appendChild(el('h4', '', 'gold'));
    if (r.g.options) {
      var ol = el('ol', 'mb-options');
      r.g.options.forEach(function (o) {
        var cls = (o[0] === r.g.answer ? ' mb-gold' : '') + (o[0] === r.x ? ' mb-picked' : '');
        var mark = (o[0] === r.g.answer ? ' ✓ gold' : '') + (o[0] === r.x ? ' ← extracted' : '');
        ol.appendChild(el('li', cls.trim(), o[0] + ') ' + o[1] + mark));
      });
      right.appendChild(ol);
    } else {
      right.appendChild(el('pre', 'mb-gold-text', r.g.text));
    }
    block(right, 'extracted', r.x);
    grid.appendChild(left); grid.appendChild(mid); grid.appendChild(right);
    box.appendChild(grid);
    return box;
  }
  function append(result) {
    total = result.total;
    result.rows.forEach(function (r) {
      var box = card(r);
      if (state.ex) { box.classList.add('mb-target'); }
      list.appendChild(box);
    });
    shown += result.rows.length;
    count.textContent = total.toLocaleString('en') + ' example(s) match' +
      (shown < total ? ', showing ' + shown.toLocaleString('en') : '');
    more.hidden = shown >= total;
    root.setAttribute('data-state', 'ready');
    root.setAttribute('data-shown', String(shown));
    root.setAttribute('data-total', String(total));
  }
  function render(s) {
    state = s;
    Object.keys(inputs).forEach(function (k) { if (inputs[k].value !== s[k]) { inputs[k].value = s[k]; } });
    list.textContent = ''; shown = 0;
    return query(s, 0).then(append).then(function () {
      if (s.ex && list.firstChild) { list.firstChild.scrollIntoView(); }
    });
  }
  function fromInputs() {
    var s = {item: inputs.item.value, outcome: inputs.outcome.value, q: inputs.q.value, ex: ''};
    writeHash(s);
    render(s);
  }
  var timer = null;
  inputs.item.addEventListener('change', fromInputs);
  inputs.outcome.addEventListener('change', fromInputs);
  inputs.q.addEventListener('input', function () {
    clearTimeout(timer); timer = setTimeout(fromInputs, 200);
  });
  more.addEventListener('click', function () { query(state, shown).then(append); });
  window.addEventListener('hashchange', function () {
    var s = readHash();
    if (s) { loading.then(function () { render(s); }); }
  });
  root.setAttribute('data-state', 'loading');
  var started = performance.now();
  loading = (source === 'api' ? Promise.resolve(null) : decode()).then(function (data) {
    records = data;
    return render(readHash() || {item: '', outcome: '', q: '', ex: ''});
  }).then(function () {
    root.setAttribute('data-ready-ms', String(Math.round(performance.now())));
    root.setAttribute('data-render-ms', String(Math.round(performance.now() - started)));
  }).catch(function (err) {
    root.setAttribute('data-state', 'failed');
    list.textContent = 'could not load the examples: ' + err;
  });
})();
"""
