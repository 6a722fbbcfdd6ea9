"""Per-example data in one normalised shape for every backend: ``results.parquet`` and CSV.

Every backend writes ``results.jsonl`` rows with ``example_id``, ``rollout``,
``metrics``, ``score``, ``tokens``, ``latency_s``, ``error`` (plus prompt,
completion, gold, extracted); :func:`normal_row` turns one into the
versioned schema below, documented in ``docs/reports.md``. pyarrow is
imported only when a parquet file is written.
"""

from __future__ import annotations

import csv
import hashlib
import heapq
import io
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_modelbench.reporting.model import ItemRecord, RunData
from pytest_modelbench.store.runstore import ItemStore

PARQUET_SCHEMA_VERSION = 2  # 2: reasoning_tokens, reasoning
PARQUET_NAME = "results.parquet"

# (column, arrow type name, meaning) — the documented schema, version PARQUET_SCHEMA_VERSION
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("schema_version", "int32", "version of this schema"),
    ("run_id", "string", "run directory name"),
    ("item_id", "string", "pytest item id: <model>-<variant>-seed<seed>"),
    ("model", "string", "model name (checkpoints: <name>-step<N>)"),
    ("environment", "string", "environment name (configs/envs/<name>.yaml or module)"),
    ("variant", "string", "environment variant id"),
    ("module", "string", "backend module (gsm8k, jsonl, verifiers:<id>, lm_eval:<task>)"),
    ("seed", "int64", "item seed"),
    ("example_id", "string", "example id within the variant"),
    ("rollout", "int32", "rollout index (0 when one rollout per example)"),
    ("metric", "string", "name of the item's primary metric"),
    ("score", "float64", "primary metric of this example; null when it errored"),
    ("metrics", "map<string,float64>", "every numeric metric of this example"),
    ("prompt_tokens", "int64", "prompt tokens reported by the server (null if unknown)"),
    ("completion_tokens", "int64", "completion tokens reported by the server (null if unknown)"),
    ("latency_s", "float64", "request latency in seconds, retries included"),
    ("attempts", "int32", "requests made for this example (1 = no retry)"),
    ("error", "string", "why the example has no score (null when scored)"),
    ("finish_reason", "string", "the server's finish_reason"),
    ("prompt", "string", "the prompt (last user message for chat)"),
    ("completion", "string", "the model's answer"),
    ("gold", "string", "reference answer (JSON text when not a string)"),
    ("extracted", "string", "answer extracted for scoring (JSON text when not a string)"),
    ("reasoning_tokens", "int64", "of the completion tokens, thinking (null if unknown)"),
    ("reasoning", "string", "the model's thinking (null when it sent none)"),
)
COLUMN_NAMES = tuple(name for name, _, _ in COLUMNS)
# made once: json.dumps with options builds an encoder per call (thousands per session end)
_TEXT = json.JSONEncoder(ensure_ascii=False, sort_keys=True, default=str)
_LINE = json.JSONEncoder(allow_nan=False)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return _TEXT.encode(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _optional_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def row_score(item: ItemRecord, row: Mapping[str, Any]) -> float | None:
    """The example's primary score (``score``, else ``metrics[item.metric]``); None if errored."""
    return score_of(row, item.metric)


def score_of(row: Mapping[str, Any], metric: str) -> float | None:
    """:func:`row_score` with the item's metric given by name."""
    if row.get("error"):
        return None
    score = _number(row.get("score"))
    if score is None:
        metrics = row.get("metrics")
        if isinstance(metrics, Mapping):
            score = _number(metrics.get(metric))
    return score


def normal_row(run_id: str, item: ItemRecord, row: Mapping[str, Any]) -> dict[str, Any]:
    """One journal row in the normalised schema (missing fields become null)."""
    columns = {**item_columns(run_id, item), **row_columns(row, item.metric)}
    return {name: columns[name] for name in COLUMN_NAMES}


def item_columns(run_id: str, item: ItemRecord) -> dict[str, Any]:
    """The columns every row of ``item`` shares."""
    return {
        "schema_version": PARQUET_SCHEMA_VERSION,
        "run_id": run_id,
        "item_id": item.item_id,
        "model": item.model,
        "environment": item.env,
        "variant": item.variant,
        "module": item.module or None,
        "seed": item.seed,
        "metric": item.metric or None,
    }


def row_columns(row: Mapping[str, Any], metric: str) -> dict[str, Any]:
    """The columns of one journal row; ``metric`` (the item's) scores a row without a
    ``score`` of its own."""
    raw_metrics = row.get("metrics") or {}
    metrics = (
        {str(k): v for k, v in ((k, _number(v)) for k, v in raw_metrics.items()) if v is not None}
        if isinstance(raw_metrics, Mapping)
        else {}
    )
    error = row.get("error")
    raw_tokens = row.get("tokens")
    tokens: Mapping[str, Any] = raw_tokens if isinstance(raw_tokens, Mapping) else {}
    return {
        "example_id": str(row.get("example_id")),
        "rollout": _optional_int(row.get("rollout")) or 0,
        "score": score_of(row, metric),
        "metrics": metrics,
        "prompt_tokens": _optional_int(tokens.get("prompt")),
        "completion_tokens": _optional_int(tokens.get("completion")),
        "reasoning_tokens": _optional_int(row.get("reasoning_tokens")),
        "latency_s": _number(row.get("latency_s")),
        "attempts": _optional_int(row.get("attempts")),
        "error": _text(error) if error else None,
        "finish_reason": _text(row.get("finish_reason")),
        "prompt": _text(row.get("prompt")),
        "completion": _text(row.get("completion")),
        "reasoning": _text(row.get("reasoning")),
        "gold": _text(row.get("gold")),
        "extracted": _text(row.get("extracted")),
    }


def needs_metric(row: Mapping[str, Any]) -> bool:
    """Whether the row's score depends on its item's metric (it has no ``score`` of its own)."""
    return not row.get("error") and _number(row.get("score")) is None


def row_line(row: Mapping[str, Any], metric: str) -> bytes:
    """The row's columns as the JSON object :func:`parquet_line` completes."""
    columns = row_columns(row, metric)
    columns["metrics"] = [{"key": k, "value": v} for k, v in columns["metrics"].items()]
    return _utf8_line(_LINE.encode(columns))


def item_line(run_id: str, item: ItemRecord) -> bytes:
    """The item's columns as JSON members (no braces) for :func:`parquet_line`."""
    return _utf8_line(_LINE.encode(item_columns(run_id, item)))[1:-1]


def _utf8_line(line: str) -> bytes:
    """An ASCII JSON line as bytes; a lone surrogate's escape (text from a network) as U+FFFD's,
    as Arrow's strings are UTF-8 and refuse one."""
    if "\\ud" in line or "\\uD" in line:
        text = json.dumps(json.loads(line), ensure_ascii=False)
        line = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return line.encode()


def parquet_line(item_part: bytes, row_part: bytes) -> bytes:
    """One JSON line of Arrow's reader: the item's members, then the row's (the reader
    matches columns by name, so their order is free)."""
    return b"{" + item_part + b", " + row_part[1:] + b"\n"


def item_rows(run: RunData, item: ItemRecord) -> Iterator[dict[str, Any]]:
    """The item's journal rows (last row per example/rollout), in journal order, streamed:
    memory does not grow with the item."""
    return ItemStore(run.item_dir(item)).journal.latest()


def iter_rows(run: RunData) -> Iterator[dict[str, Any]]:
    """Every example of every item of the run, normalised."""
    for item in run.items:
        for row in item_rows(run, item):
            yield normal_row(run.run_id, item, row)


@dataclass(frozen=True)
class Example:
    """A wrong or errored example shown in reports."""

    example_id: str
    rollout: int
    score: float | None
    error: str | None
    prompt: str
    completion: str
    gold: str
    extracted: str
    reasoning: str = ""  # the model's thinking ("" when it sent none)
    finish_reason: str = ""  # "length": the reply ran out of tokens


class FailingPicker:
    """The first ``limit`` errored or wrong examples of one item (errors first, then score 0,
    then lowest), from its rows seen one by one: at most 3 × ``limit`` rows are kept, however
    large the item. :meth:`close` once every row was seen keeps only the examples."""

    def __init__(self, item: ItemRecord, limit: int) -> None:
        self.item = item
        self.limit = limit
        self.picked: list[Example] | None = None  # set by close()
        self._seen = 0
        self._errored: list[_Kept] = []
        self._first: list[_Kept] = []  # the first scored rows: all may score 0
        self._lowest: list[tuple[float, int, _Kept]] = []  # max-heap of the lowest
        self._top: float | None = None

    def add(self, row: Mapping[str, Any]) -> None:
        self._add(row, bool(row.get("error")), row_score(self.item, row))

    def add_prepared(self, ready: PreparedRow) -> None:
        """A row made while its item ran: its score is known, its JSON is parsed only if
        it is picked."""
        self._add(ready, ready.errored, ready.score)

    def _add(self, row: _Kept, errored: bool, score: float | None) -> None:
        i, self._seen = self._seen, self._seen + 1
        limit = self.limit
        if limit <= 0:
            return
        if errored:
            if len(self._errored) < limit:
                self._errored.append(row)
            return
        if score is None:
            return
        self._top = score if self._top is None else max(self._top, score)
        if len(self._first) < limit:
            self._first.append(row)
        entry = (-score, -i, row)
        if len(self._lowest) < limit:
            heapq.heappush(self._lowest, entry)
        elif entry[:2] > self._lowest[0][:2]:
            heapq.heapreplace(self._lowest, entry)

    @property
    def complete(self) -> bool:
        return self.picked is not None

    def close(self, run_id: str) -> None:
        """Every row was seen: keep the picked examples, drop the rows."""
        self.picked = self.examples(run_id)
        self._errored, self._first, self._lowest = [], [], []

    def examples(self, run_id: str) -> list[Example]:
        if self.picked is not None:
            return self.picked
        wanted = self.limit - len(self._errored)
        wrong: list[_Kept] = []
        if wanted > 0 and self._top is not None:
            if self._top <= 0:  # everything scored 0: all of them are wrong, in journal order
                wrong = self._first[:wanted]
            else:
                below = sorted(((-s, -i), row) for s, i, row in self._lowest if -s < self._top)
                wrong = [row for _, row in below[:wanted]]
        rows = [normal_row(run_id, self.item, _row_of(kept)) for kept in (*self._errored, *wrong)]
        return [
            Example(
                str(r["example_id"]),
                int(r["rollout"]),
                r["score"],
                r["error"],
                r["prompt"] or "",
                r["completion"] or "",
                r["gold"] or "",
                r["extracted"] or "",
                r["reasoning"] or "",
                r["finish_reason"] or "",
            )
            for r in rows
        ]


def failing_examples(run: RunData, item: ItemRecord, limit: int) -> list[Example]:
    """The first ``limit`` errored or wrong examples (errors first, then score 0, then lowest),
    in one streamed pass over the item's journal."""
    picker = FailingPicker(item, limit)
    if limit > 0:
        for row in item_rows(run, item):
            picker.add(row)
    return picker.examples(run.run_id)


class PreparedRow:
    """A journal row with what session end makes of it: made while its item runs
    (:mod:`pytest_modelbench.reporting.digest`), or at session end from the file (:meth:`of`).
    ``row`` is parsed from the journal line only when asked for (the failing-example picker
    needs only ``score`` and ``errored`` to choose); that parse, kept, is the only change
    after it is made."""

    __slots__ = ("_row", "errored", "line", "record", "score")

    def __init__(
        self,
        row: Mapping[str, Any] | bytes,
        line: bytes,
        record: str | None = None,
        *,
        score: float | None,
        errored: bool,
    ) -> None:
        self._row = row  # bytes: the journal line, parsed on first use
        self.line = line  # row_line(row, the item's metric)
        self.record = record  # its report record without the item's index, when made early
        self.score = score  # score_of(row, the item's metric)
        self.errored = errored

    @classmethod
    def of(cls, row: Mapping[str, Any], metric: str) -> PreparedRow:
        """A row read at session end, made here."""
        return cls(
            row, row_line(row, metric), score=score_of(row, metric), errored=bool(row.get("error"))
        )

    @property
    def row(self) -> Mapping[str, Any]:
        row = self._row
        if isinstance(row, bytes):
            row = self._row = json.loads(row)
        return row


_Kept = Mapping[str, Any] | PreparedRow  # a row the picker holds, parsed or not


def _row_of(kept: _Kept) -> Mapping[str, Any]:
    return kept.row if isinstance(kept, PreparedRow) else kept


RowSink = Callable[[int, ItemRecord, PreparedRow], None]
"""Called with (the item's index in the run, the item, its row) for every row."""
Prepared = Callable[[ItemRecord], "Iterable[PreparedRow] | None"]
"""An item's rows made while it ran (in :meth:`Journal.latest` order), or None: read them."""


class ParquetUnavailable(Exception):
    """pyarrow is not installed; the message names the extra to install."""


def arrow_schema() -> Any:
    """The pyarrow schema of ``results.parquet`` (imports pyarrow)."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ParquetUnavailable(
            "results.parquet needs pyarrow: pip install 'pytest-modelbench[parquet]'"
        ) from None
    types = {
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "string": pa.string(),
        "map<string,float64>": pa.map_(pa.string(), pa.float64()),
    }
    return pa.schema(
        [pa.field(name, types[kind]) for name, kind, _ in COLUMNS],
        metadata={
            "modelbench.schema_version": str(PARQUET_SCHEMA_VERSION),
            "modelbench.schema": "results",
        },
    )


def parquet_inputs_key(run: RunData) -> str:
    """What ``results.parquet`` is made of, cheaply: each item's columns and its journal's size
    and modification time. Equal keys mean an equal file (nothing is read to tell)."""
    parts: list[Any] = [PARQUET_SCHEMA_VERSION, run.run_id]
    for item in run.items:
        journal = ItemStore(run.item_dir(item)).journal.path
        try:
            stat = journal.stat()
            state: tuple[int, int] | None = (stat.st_size, stat.st_mtime_ns)
        except OSError:
            state = None
        fields = (item.item_id, item.model, item.env, item.variant, item.module, item.seed)
        parts.append([*fields, item.metric, state])
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def write_parquet_if_changed(
    run: RunData,
    path: Path,
    pickers: Mapping[str, FailingPicker] | None = None,
    on_row: RowSink | None = None,
    prepared: Prepared | None = None,
) -> bool:
    """Write ``results.parquet`` unless it was written from the same inputs (kept in a sidecar
    file); True when written (and ``pickers`` and ``on_row`` saw every row). A finished run
    re-reported from the store imports no pyarrow."""
    sidecar = path.with_name(f".{path.name}.inputs")
    key = parquet_inputs_key(run)
    try:
        if path.exists() and sidecar.read_text() == key:
            return False
    except OSError:
        pass
    write_parquet(run, path, pickers=pickers, on_row=on_row, prepared=prepared)
    tmp = sidecar.with_name(f"{sidecar.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(key)
        os.replace(tmp, sidecar)
    except BaseException:  # a full disk, Ctrl-C: no .tmp left beside the reports
        tmp.unlink(missing_ok=True)
        raise
    return True


def write_parquet(
    run: RunData,
    path: Path,
    batch_rows: int = 10_000,
    pickers: Mapping[str, FailingPicker] | None = None,
    on_row: RowSink | None = None,
    prepared: Prepared | None = None,
) -> int:
    """Write every example row to ``path`` atomically; returns the number of rows. Each
    item's rows also go to its picker in ``pickers`` and to ``on_row`` with the item's index
    (the HTML report's failing and embedded examples, read in the same pass); ``prepared``
    gives the rows of items that were made while they ran.

    Rows reach Arrow through its JSON reader, not ``pa.array`` / ``Table.from_pylist``: those
    import pandas to look for pandas objects (about 0.45 s on every run's write path).
    """
    schema = arrow_schema()
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        count = 0
        with pq.ParquetWriter(str(tmp), schema) as writer:
            batch: list[bytes] = []
            for index, item in enumerate(run.items):
                picker = (pickers or {}).get(item.item_id)
                item_part = item_line(run.run_id, item)
                for ready in _prepared_rows(run, item, prepared):
                    if picker is not None:
                        picker.add_prepared(ready)
                    if on_row is not None:
                        on_row(index, item, ready)
                    batch.append(parquet_line(item_part, ready.line))
                    if len(batch) >= batch_rows:
                        writer.write_table(_arrow_table(batch, schema))
                        count += len(batch)
                        batch = []
                if picker is not None:
                    picker.close(run.run_id)
            if batch:
                writer.write_table(_arrow_table(batch, schema))
                count += len(batch)
            elif count == 0:
                writer.write_table(pa.Table.from_batches([], schema=schema))
        os.replace(tmp, path)
    except BaseException:  # a full disk, Ctrl-C: no .tmp left beside the reports
        tmp.unlink(missing_ok=True)
        raise
    return count


def _prepared_rows(
    run: RunData, item: ItemRecord, prepared: Prepared | None
) -> Iterable[PreparedRow]:
    ready = prepared(item) if prepared is not None else None
    if ready is not None:
        return ready
    return (PreparedRow.of(row, item.metric) for row in item_rows(run, item))


def _arrow_table(lines: list[bytes], schema: Any) -> Any:
    """JSON lines → a table of ``schema`` (``metrics`` read as key/value pairs, then a map)."""
    import pyarrow as pa
    import pyarrow.json as pj

    index = schema.get_field_index("metrics")
    pair = pa.struct([("key", pa.string()), ("value", pa.float64())])
    read_schema = schema.set(index, pa.field("metrics", pa.list_(pair)))
    data = b"".join(lines)
    table = pj.read_json(
        io.BytesIO(data),
        read_options=pj.ReadOptions(block_size=max(1 << 20, len(data) + 1)),  # one block
        parse_options=pj.ParseOptions(
            explicit_schema=read_schema, unexpected_field_behavior="error"
        ),
    )
    pairs = table.column(index).combine_chunks()
    field = schema.field(index)
    metrics = pa.MapArray.from_arrays(
        pairs.offsets, pairs.values.field("key"), pairs.values.field("value")
    )
    if metrics.type != field.type:  # not on pyarrow 14-25: its default is the schema's type
        metrics = metrics.cast(field.type)
    table = table.set_column(index, field, metrics)
    # the reader kept the schema's types: assembled, not cast (a cast imports pyarrow.compute
    # and loads its kernels, after the last request)
    return pa.Table.from_arrays([table.column(name) for name in schema.names], schema=schema)


def write_csv(run: RunData, path: Path) -> int:
    """The same rows as CSV; ``metrics`` becomes one ``metric:<name>`` column per metric."""
    rows = list(iter_rows(run))
    metric_names = sorted({name for row in rows for name in row["metrics"]})
    header = [c for c in COLUMN_NAMES if c != "metrics"] + [f"metric:{m}" for m in metric_names]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            for row in rows:
                flat = [row[c] for c in COLUMN_NAMES if c != "metrics"]
                writer.writerow(
                    ["" if v is None else v for v in flat]
                    + [
                        "" if row["metrics"].get(m) is None else row["metrics"][m]
                        for m in metric_names
                    ]
                )
        os.replace(tmp, path)
    except BaseException:  # a full disk, Ctrl-C: no .tmp left beside the reports
        tmp.unlink(missing_ok=True)
        raise
    return len(rows)
