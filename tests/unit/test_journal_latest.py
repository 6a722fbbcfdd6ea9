"""Journal.latest: the last row per (example, rollout), in file order, short or long journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_modelbench.store import journal as journal_module
from pytest_modelbench.store.files import StoreWarning
from pytest_modelbench.store.journal import Journal


@pytest.mark.parametrize("held_bytes", [1 << 20, 10], ids=["held", "streamed"])
def test_last_row_per_key_in_file_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_bytes: int
) -> None:
    monkeypatch.setattr(journal_module, "HELD_BYTES", held_bytes)
    journal = Journal(tmp_path / "results.jsonl")
    journal.open()
    for example_id, rollout, score in [
        ("a", 0, 0.0),
        ("b", 0, 1.0),
        ("a", 1, 1.0),
        ("a", 0, 1.0),  # redone: replaces the first row, at its own place
        ("c", 0, 0.5),
    ]:
        journal.append({"example_id": example_id, "rollout": rollout, "score": score})
    journal.close()
    rows = [(r["example_id"], r["rollout"], r["score"]) for r in journal.latest()]
    assert rows == [("b", 0, 1.0), ("a", 1, 1.0), ("a", 0, 1.0), ("c", 0, 0.5)]
    kept = [r["example_id"] for r in journal.latest(lambda key: key[1] == 0)]
    assert kept == ["b", "a", "c"]
    assert list(journal.latest(lambda _key: False)) == []


@pytest.mark.parametrize("held_bytes", [1 << 20, 10], ids=["held", "streamed"])
def test_damaged_lines_are_skipped_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_bytes: int
) -> None:
    monkeypatch.setattr(journal_module, "HELD_BYTES", held_bytes)
    path = tmp_path / "results.jsonl"
    path.write_text('{"example_id": "a", "rollout": 0}\n{not json\n{"example_id": "b"}\n')
    with pytest.warns(StoreWarning, match="skipped 1 damaged line") as caught:
        ids = [row["example_id"] for row in Journal(path).latest()]
    assert ids == ["a", "b"]
    assert len(caught) == 1
