"""Journals read while their items run (reporting.digest): session end gets exactly the rows,
parquet lines and report records that reading the file there gives, or reads the file."""

from __future__ import annotations

import base64
import json
import os
import zlib
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.reporting import digest as digest_module
from pytest_modelbench.reporting.digest import Digests, JournalDigest
from pytest_modelbench.reporting.examples import _COMPACT, example_record, indexed
from pytest_modelbench.reporting.model import ItemRecord, RunData, load_run
from pytest_modelbench.reporting.rows import (
    FailingPicker,
    PreparedRow,
    item_rows,
    normal_row,
    write_parquet,
)
from tests.conftest import Project, configure
from tests.reports.conftest import craft_run

pq = pytest.importorskip("pyarrow.parquet")


def _row(n: int, score: float | None = 1.0, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "v": 1,
        "example_id": f"ex{n}",
        "rollout": 0,
        "prompt": f"question {n} é </script>",
        "completion": f"answer {n}",
        "gold": {"answer": "B", "options": ["x", "y"]},
        "extracted": "B",
        "metrics": {"accuracy": 1.0 if score is None else score},
        "error": None,
        "tokens": {"prompt": 10, "completion": 5},
        "latency_s": 0.1,
    }
    if score is not None:
        row["score"] = score
    row.update(extra)
    return row


def _line(row: dict[str, Any]) -> bytes:
    return (json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode()


def _run(tmp_path: Path, rows: list[dict[str, Any]]) -> tuple[RunData, ItemRecord, Path]:
    run_dir = craft_run(
        tmp_path, "run-a", {"m-qa-seed0": {"model": "m", "variant": "qa", "seed": 0, "scores": []}}
    )
    run = load_run(run_dir)
    (item,) = run.items
    journal = run.item_dir(item) / "results.jsonl"
    journal.write_bytes(b"".join(_line(r) for r in rows))
    return run, item, journal


def _cold(run: RunData, item: ItemRecord) -> list[PreparedRow]:
    return [PreparedRow.of(r, item.metric) for r in item_rows(run, item)]


def _assert_same(made: list[PreparedRow] | None, run: RunData, item: ItemRecord) -> None:
    cold = _cold(run, item)
    assert made is not None
    assert [p.row for p in made] == [p.row for p in cold]
    assert [p.line for p in made] == [p.line for p in cold]
    assert [(p.score, p.errored) for p in made] == [(p.score, p.errored) for p in cold]
    for p in made:  # the report's record, index added, is the one encoded from the row
        assert p.record is not None
        assert indexed(7, p.record) == _COMPACT.encode(example_record(7, item, p.row))


def _grow(digests: Digests, journal: Path, *chunks: bytes) -> None:
    """Append each chunk, then let the digest read it (as the thread does)."""
    for chunk in chunks:
        with journal.open("ab") as handle:
            handle.write(chunk)
        digests.advance()


def test_rows_read_as_the_journal_grows_equal_the_file_read_at_the_end(tmp_path: Path) -> None:
    run, item, journal = _run(tmp_path, [])
    digests = Digests(poll_s=3600)  # stepped by hand
    digests.started("bench.py::test[m-qa-seed0]", journal)
    retried = _row(1, score=None, error="HTTP 503", metrics={})
    torn = _line(_row(4))
    _grow(
        digests,
        journal,
        _line(_row(0)) + _line(retried),
        b"\n" + _line(_row(2, score=0.0)) + torn[:20],  # a blank line, and a line half written
        torn[20:] + _line(_row(1, score=0.5)),  # the retry of ex1 replaces its error
        _line(_row(3, score=None)),  # scored by the item's metric: made at session end
    )
    made = digests.prepared(run, item)
    _assert_same(made, run, item)
    assert made is not None and [p.row["example_id"] for p in made] == [
        "ex0",
        "ex2",
        "ex4",
        "ex1",
        "ex3",
    ]
    assert [normal_row(run.run_id, item, p.row)["score"] for p in made] == [1.0, 0.0, 1.0, 0.5, 1.0]


def test_the_picker_chooses_from_made_rows_and_parses_only_those_it_picks(
    tmp_path: Path,
) -> None:
    rows = [_row(n, score=1.0) for n in range(40)]
    rows[5] = _row(5, score=None, error="HTTP 500", metrics={})
    rows[9] = _row(9, score=0.0)
    rows[17] = _row(17, score=None, metrics={"accuracy": 0.25})  # scored by the item's metric
    rows[30] = _row(30, score=0.5)
    run, item, journal = _run(tmp_path, [])
    digests = Digests(poll_s=3600)
    digests.started("bench.py::test[m-qa-seed0]", journal)
    _grow(digests, journal, b"".join(_line(r) for r in rows))
    made = digests.prepared(run, item)
    assert made is not None
    picker, cold = FailingPicker(item, 3), FailingPicker(item, 3)
    for ready in made:
        picker.add_prepared(ready)
    for row in item_rows(run, item):
        cold.add(row)
    picked = picker.examples(run.run_id)
    assert picked == cold.examples(run.run_id)
    assert [(e.example_id, e.score) for e in picked] == [
        ("ex5", None),
        ("ex9", 0.0),
        ("ex17", 0.25),
    ]
    # the private slot on purpose: whether the row was parsed is what this test is about
    parsed = [p.row["example_id"] for p in made if not isinstance(p._row, bytes)]
    assert parsed == ["ex5", "ex9", "ex17"]  # the metric-scored row is parsed to be scored


def test_lines_written_after_the_last_poll_are_read_at_session_end(tmp_path: Path) -> None:
    run, item, journal = _run(tmp_path, [])
    digests = Digests(poll_s=3600)
    digests.started("t[m-qa-seed0]", journal)
    _grow(digests, journal, _line(_row(0)))
    with journal.open("ab") as handle:
        handle.write(_line(_row(1)) + _line(_row(2)))
    _assert_same(digests.prepared(run, item), run, item)


def test_a_replaced_journal_is_read_again(tmp_path: Path) -> None:
    run, item, journal = _run(tmp_path, [])
    digests = Digests(poll_s=3600)
    digests.started("t[m-qa-seed0]", journal)
    _grow(digests, journal, _line(_row(0)) + _line(_row(1)))
    # the journal moved aside and started over (a stale item, a repair): a new file
    os.replace(journal, journal.with_name("results.stale.jsonl"))
    _grow(digests, journal, _line(_row(5)))
    made = digests.prepared(run, item)
    _assert_same(made, run, item)
    assert made is not None and [p.row["example_id"] for p in made] == ["ex5"]


def test_a_journal_replaced_after_the_last_read_is_not_taken(tmp_path: Path) -> None:
    digest = JournalDigest(tmp_path / "results.jsonl")
    digest.path.write_bytes(_line(_row(0)))
    digest.advance(1 << 20)
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(_line(_row(9)))
    os.replace(replacement, digest.path)
    assert digest.prepared("accuracy") is None


def test_a_finished_item_closes_its_journal_and_a_later_change_is_read(tmp_path: Path) -> None:
    run, item, journal = _run(tmp_path, [])
    digests = Digests(poll_s=3600)
    digests.started("t[m-qa-seed0]", journal)
    _grow(digests, journal, _line(_row(0)))
    with journal.open("ab") as handle:  # written after the last poll, before the item ended
        handle.write(_line(_row(1)))
    digests.finished("t[m-qa-seed0]")
    assert all(d._handle is None for d in digests._digests.values())  # no file left open
    _assert_same(digests.prepared(run, item), run, item)

    run, item, journal = _run(tmp_path / "later", [])
    digests = Digests(poll_s=3600)
    digests.started("t[m-qa-seed0]", journal)
    _grow(digests, journal, _line(_row(0)))
    digests.finished("t[m-qa-seed0]")
    with journal.open("ab") as handle:  # changed once its item had ended
        handle.write(_line(_row(1)))
    assert digests.prepared(run, item) is None


def test_many_items_hold_no_more_files_than_items_running(tmp_path: Path) -> None:
    digests = Digests(poll_s=3600)
    before = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").exists() else None
    for n in range(300):
        journal = tmp_path / f"item{n}" / "results.jsonl"
        journal.parent.mkdir()
        digests.started(f"t[i{n}]", journal)
        _grow(digests, journal, _line(_row(n)))
        digests.finished(f"t[i{n}]")
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) <= before + 1
    assert sum(len(d._made) for d in digests._digests.values()) == 300
    digests.close()


def test_an_item_run_again_starts_its_journal_over(tmp_path: Path) -> None:
    run, item, journal = _run(tmp_path, [])
    digests = Digests(poll_s=3600)
    digests.started("t[m-qa-seed0]", journal)
    _grow(digests, journal, _line(_row(0)))
    digests.finished("t[m-qa-seed0]")
    digests.started("t[m-qa-seed0]", journal)  # a rerun plugin runs it again
    _grow(digests, journal, _line(_row(0, score=0.0)) + _line(_row(1)))
    digests.finished("t[m-qa-seed0]")
    made = digests.prepared(run, item)
    _assert_same(made, run, item)
    assert made is not None and [p.row["score"] for p in made] == [0.0, 1.0]


def test_a_damaged_line_leaves_the_file_to_session_end(tmp_path: Path) -> None:
    run, item, journal = _run(tmp_path, [])
    digests = Digests(poll_s=3600)
    digests.started("t[m-qa-seed0]", journal)
    _grow(digests, journal, _line(_row(0)) + b"{not json\n" + _line(_row(1)))
    assert digests.prepared(run, item) is None
    with pytest.warns(Warning, match="damaged"):  # the file read warns, as before
        rows = list(item_rows(run, item))
    assert [r["example_id"] for r in rows] == ["ex0", "ex1"]


def test_past_the_budget_the_file_is_read(tmp_path: Path) -> None:
    run, item, journal = _run(tmp_path, [])
    digests = Digests(budget=2000, poll_s=3600)
    digests.started("t[m-qa-seed0]", journal)
    _grow(digests, journal, *(_line(_row(n)) for n in range(10)))
    assert digests.prepared(run, item) is None
    assert digests._held == 0


def test_a_journal_that_never_grows_is_never_read(tmp_path: Path) -> None:
    run, item, journal = _run(tmp_path, [_row(0)])  # an item read from the store
    digests = Digests(poll_s=3600)
    digests.started("t[m-qa-seed0]", journal)
    digests.advance()
    digests.finished("t[m-qa-seed0]")
    assert digests._digests == {}
    assert digests.prepared(run, item) is None


def _embedded(report: Path) -> list[dict[str, Any]]:
    text = report.read_text()
    start = text.index(">", text.index('id="mb-examples-data"')) + 1
    data = base64.b64decode(text[start : text.index("</script>", start)])
    return list(json.loads(zlib.decompress(data)))


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each item's digest gave session end (-1: none, the file was read); the
    thread polls every 0.05 s."""
    monkeypatch.setattr(digest_module, "POLL_S", 0.05)
    counts: list[int] = []
    prepared = Digests.prepared

    def counted(self: Digests, run: RunData, item: ItemRecord) -> list[PreparedRow] | None:
        made = prepared(self, run, item)
        counts.append(-1 if made is None else len(made))
        return made

    monkeypatch.setattr(Digests, "prepared", counted)
    return counts


def test_a_session_writes_the_reports_from_the_rows_it_read_while_running(
    project: Project, sim: Any, taken: list[int], tmp_path: Path
) -> None:
    configure(project, "http://placeholder", ("alpha",), n=120)
    server = sim(accuracy=0.6, lookup=project.lookup("qa"), latency=0.02, slots=4, seed=1)
    configure(project, server.base_url, ("alpha",), n=120)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    assert taken == [120]  # the item's rows came from its digest
    _assert_reports_as_read(project, tmp_path)


def test_under_xdist_the_controller_reads_the_workers_journals(
    project: Project, sim: Any, taken: list[int], tmp_path: Path
) -> None:
    pytest.importorskip("xdist")
    configure(project, "http://placeholder", ("alpha",), n=80, envs=("qa", "math"))
    server = sim(accuracy=0.5, lookup=project.lookup("qa", "math"), latency=0.02, slots=4)
    configure(project, server.base_url, ("alpha",), n=80, envs=("qa", "math"))
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "-n", "2")
    result.assert_outcomes(passed=2)
    assert taken == [80, 80]
    _assert_reports_as_read(project, tmp_path)


def _assert_reports_as_read(project: Project, tmp_path: Path) -> None:
    """The session's results.parquet and report.html examples equal those read from the files."""
    (run_dir,) = project.run_dirs()
    run = load_run(run_dir)
    cold = tmp_path / "cold.parquet"
    write_parquet(run, cold)
    assert pq.read_table(run_dir / "results.parquet").equals(pq.read_table(cold))
    assert _embedded(run_dir / "report.html") == [
        example_record(index, item, row)
        for index, item in enumerate(run.items)
        for row in item_rows(run, item)
    ]
