"""Journal.latest from the lines a Journal read at the item's start and appended since: the same
rows (and the same summary) as reading the file, and the file is read whenever it changed."""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.running.summary import summarise_rows
from pytest_modelbench.secrets import REDACTED
from pytest_modelbench.store import journal as journal_module
from pytest_modelbench.store.files import StoreWarning, atomic_write_text, unshare
from pytest_modelbench.store.journal import Journal

Keep = Callable[[tuple[str, int]], bool] | None


def _row(example_id: Any, value: float, **fields: Any) -> dict[str, Any]:
    # runner order, not sorted: the file's rows have their keys sorted
    row: dict[str, Any] = {"v": 1, "example_id": example_id, "rollout": 0, "prompt": "p"}
    row.update(
        completion=f"answer {value}",
        finish_reason="stop",
        metrics={"exact_match": value, "answered": 1.0},
        score=value,
        tokens={"prompt": 3, "completion": 2},
        latency_s=0.25,
        attempts=1,
        error=None,
    )
    row.update(fields)
    return row


class Opaque:
    def __str__(self) -> str:
        return "opaque value"


def session_rows() -> list[Any]:
    """Rows whose read-back differs from the row written, in every way json and redaction do."""
    return [
        _row("a", 0.0),
        _row("b", 0.0, error="HTTP 500: upstream", attempts=3, metrics={}, score=None),
        _row("c", 1.0, gold=("x", ["y", ("z",)]), extracted={10: "ten", 2: "two"}),
        _row("d", 1.0, detail={"value": Opaque(), "path": Path("/tmp/x")}),
        _row("e", 0.0, completion="key sk-abcdefghijklmnopqrstuvwx echoed", reasoning_tokens=4),
        _row("sk-secretexample1234567890", 1.0),  # the id itself is redacted in the file,
        _row("sk-othersecret0987654321", 0.0),  # so this row replaces the one above
        _row("7", 0.0, rollout=1),
        _row(7, 1.0, rollout=True),  # the file's key is ("7", 1) too: replaces the one above
        OrderedDict(_row("f", 0.5, metrics={"exact_match": math.nan})),
        _row("g", 0.0, finish_reason="length", completion=" ", rollout=1),
        _row("h", 0.0, rollout=1),
        _row("h", 1.0, rollout="1"),  # the file's key is ("h", 1) too: replaces the one above
        _row("a", 1.0, attempts=2),  # redone: the later row wins
        _row("b", 1.0),  # an error fixed by a retry
    ]


def file_latest(path: Path, keep: Keep = None) -> list[dict[str, Any]]:
    """What a Journal that holds nothing gives: the file read."""
    return list(Journal(path).latest(keep))


def held_latest(journal: Journal, monkeypatch: pytest.MonkeyPatch, keep: Keep = None) -> list[Any]:
    """``journal.latest(keep)``, failing if it reads the file."""

    def no_read(self: Journal) -> Iterator[Any]:
        raise AssertionError(f"{self.path} was read")

    with monkeypatch.context() as patch:
        patch.setattr(Journal, "_scan", no_read)
        return list(journal.latest(keep))


def same(held: list[Any], read: list[Any]) -> None:
    """Equal rows, with the same key order and types (repr shows both; NaN too)."""
    assert repr(held) == repr(read)
    assert json.dumps(held) == json.dumps(read)


def summary(rows: Any) -> str:
    summary = summarise_rows(rows, ["exact_match"], 10)
    return json.dumps([summary.to_json(), summary.selected], sort_keys=True)


def write(journal: Journal, rows: list[Any]) -> None:
    journal.open()
    for row in rows:
        journal.append(row)
    journal.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "item" / "results.jsonl"


def only_rollout_0(key: tuple[str, int]) -> bool:
    return key[1] == 0


@pytest.mark.parametrize("keep", [None, only_rollout_0], ids=["all", "kept"])
def test_rows_written_in_this_session_are_the_rows_read_back(
    path: Path, monkeypatch: pytest.MonkeyPatch, keep: Keep
) -> None:
    journal = Journal(path)
    assert journal.finished_keys() == set()
    write(journal, session_rows())
    read = file_latest(path, keep)
    same(held_latest(journal, monkeypatch, keep), read)
    same(held_latest(journal, monkeypatch, keep), read)  # a second pass (aggregating suites)
    assert summary(held_latest(journal, monkeypatch, keep)) == summary(read)
    if keep is None:  # the rows above were those whose keys json and redaction change
        ids = [row["example_id"] for row in read]
        assert ids.count(REDACTED) == 1 and read[ids.index(REDACTED)]["score"] == 0.0
        assert "7" not in ids and read[ids.index(7)]["rollout"] is True
        assert ids.count("h") == 1 and read[ids.index("h")]["rollout"] == "1"
        assert ids.count("a") == 1 and read[ids.index("a")]["attempts"] == 2


def test_resumed_item_holds_the_earlier_sessions_rows_too(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = session_rows()
    write(Journal(path), rows[:7])  # an earlier session
    journal = Journal(path)
    assert journal.finished_keys() == {("a", 0), ("c", 0), ("d", 0), ("e", 0), (REDACTED, 0)}
    write(journal, rows[7:])  # redoes a, b and a redacted id
    read = file_latest(path)
    same(held_latest(journal, monkeypatch), read)
    assert summary(held_latest(journal, monkeypatch)) == summary(read)


def test_rows_are_held_while_the_journal_is_open(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when the endpoint goes away mid-item: the rows are counted before the journal closes."""
    journal = Journal(path)
    journal.finished_keys()
    journal.open()
    for row in session_rows()[:4]:
        journal.append(row)
    same(held_latest(journal, monkeypatch), file_latest(path))
    journal.append(_row("h", 1.0))
    journal.close()
    same(held_latest(journal, monkeypatch), file_latest(path))


def test_a_shared_journal_copied_at_open_is_still_held(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(Journal(path), session_rows()[:3])
    other_run = tmp_path / "other" / "results.jsonl"
    other_run.parent.mkdir()
    os.link(path, other_run)  # seeded from another run: a hard link, copied before appending
    journal = Journal(path)
    journal.finished_keys()
    write(journal, session_rows()[3:])
    assert path.stat().st_nlink == 1
    same(held_latest(journal, monkeypatch), file_latest(path))
    assert len(file_latest(other_run)) == 3  # the other run's journal is unchanged


def _discard(path: Path) -> None:
    Journal(path).discard("stale")


def _repair(path: Path) -> None:
    with open(path, "ab") as handle:
        handle.write(b"{not json\n")
    with pytest.warns(StoreWarning, match="damaged"):
        Journal(path).repair()


def _unshare_and_append(path: Path) -> None:
    os.link(path, path.with_name("link.jsonl"))
    write(Journal(path), [_row("x", 1.0)])


def _append_by_another(path: Path) -> None:
    write(Journal(path), [_row("a", 0.25)])


def _replace(path: Path) -> None:
    """Same size, same modification time: only the inode tells."""
    before = path.stat()
    atomic_write_text(path, path.read_text().replace('"exact_match": 1.0', '"exact_match": 0.0'))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size


def _rewrite_in_place(path: Path) -> None:
    """Same size, same inode: only the modification time tells."""
    before = path.stat()
    data = path.read_bytes().replace(b'"score": 1.0', b'"score": 0.0')
    with open(path, "r+b") as handle:
        handle.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert path.stat().st_size == before.st_size


@pytest.mark.parametrize(
    "change",
    [_discard, _repair, _unshare_and_append, _append_by_another, _replace, _rewrite_in_place],
)
def test_a_journal_changed_behind_the_object_is_read_again(
    path: Path, change: Callable[[Path], None]
) -> None:
    journal = Journal(path)
    journal.finished_keys()
    write(journal, session_rows())
    before = file_latest(path)
    change(path)
    read = file_latest(path)
    assert repr(read) != repr(before)
    same(list(journal.latest()), read)
    assert summary(journal.latest()) == summary(read)


def test_a_journal_appended_to_by_another_while_open_is_read_again(path: Path) -> None:
    journal = Journal(path)
    journal.finished_keys()
    journal.open()
    journal.append(_row("a", 0.0))
    write(Journal(path), [_row("b", 1.0)])
    journal.append(_row("c", 1.0))
    same(list(journal.latest()), file_latest(path))
    journal.close()
    read = file_latest(path)
    assert [row["example_id"] for row in read] == ["a", "b", "c"]
    same(list(journal.latest()), read)


def test_a_journal_that_changes_while_it_is_opened_is_read_again(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(Journal(path), [_row("a", 1.0)])
    os.link(path, path.with_name("link.jsonl"))

    def unshare_then_another_writes(target: Path) -> None:
        unshare(target)
        write(Journal(target), [_row("b", 1.0)])

    monkeypatch.setattr(journal_module, "unshare", unshare_then_another_writes)
    journal = Journal(path)
    journal.finished_keys()
    write(journal, [_row("c", 1.0)])
    read = file_latest(path)
    assert [row["example_id"] for row in read] == ["a", "b", "c"]
    same(list(journal.latest()), read)


def test_damaged_and_torn_lines_are_read_from_the_file_as_before(path: Path) -> None:
    path.parent.mkdir(parents=True)
    good = json.dumps(_row("a", 1.0), sort_keys=True)
    path.write_text(f'{good}\n{{"example_id": "b", "rollout": "x"}}\n{{"example_id": "c"')
    journal = Journal(path)
    with pytest.warns(StoreWarning, match="skipped 1 damaged line") as caught:
        assert journal.finished_keys() == {("a", 0)}
    assert len(caught) == 1
    write(journal, [_row("d", 1.0)])  # joins the torn line: one more damaged line
    with pytest.warns(StoreWarning, match="skipped 2 damaged line"):
        read = file_latest(path)
    with pytest.warns(StoreWarning, match="skipped 2 damaged line"):
        held = list(journal.latest())
    same(held, read)
    assert [row["example_id"] for row in read] == ["a"]


@pytest.mark.parametrize("held_bytes", [10, 2000], ids=["at-start", "while-appending"])
def test_a_journal_larger_than_held_bytes_is_streamed(
    path: Path, monkeypatch: pytest.MonkeyPatch, held_bytes: int
) -> None:
    write(Journal(path), session_rows()[:2])
    monkeypatch.setattr(journal_module, "HELD_BYTES", held_bytes)
    journal = Journal(path)
    journal.finished_keys()
    write(journal, session_rows()[2:])
    assert path.stat().st_size > held_bytes
    assert journal._held is None  # nothing kept in memory beyond what latest() streams
    same(list(journal.latest()), file_latest(path))


def test_an_item_whose_journal_appears_before_open_is_read_again(path: Path) -> None:
    journal = Journal(path)
    journal.finished_keys()  # no file yet
    write(Journal(path), [_row("z", 1.0)])  # another writer got there first
    write(journal, [_row("a", 1.0)])
    read = file_latest(path)
    assert [row["example_id"] for row in read] == ["z", "a"]
    same(list(journal.latest()), read)


def test_lines_parsed_ahead_give_the_same_rows(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = session_rows()
    write(Journal(path), rows[:4])  # an earlier session: lines held as read
    journal = Journal(path)
    journal.finished_keys()
    journal.open()
    for row in rows[4:9]:
        journal.append(row)
    while journal.parse_ahead(3):  # as while the item's last replies are awaited
        pass
    for row in rows[9:]:  # replies that came in meanwhile
        journal.append(row)
    assert journal.parse_ahead(2)
    journal.close()
    same(held_latest(journal, monkeypatch), file_latest(path))


def test_nothing_is_parsed_ahead_for_a_journal_not_held(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "HELD_BYTES", 10)
    journal = Journal(path)
    journal.finished_keys()
    write(journal, session_rows())
    assert not journal.parse_ahead(100)
    same(list(journal.latest()), file_latest(path))
