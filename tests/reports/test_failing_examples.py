"""The wrong or errored examples reports show: errors first, then the lowest scores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.reporting.model import ItemRecord, RunData
from pytest_modelbench.reporting.rows import (
    FailingPicker,
    failing_examples,
    write_parquet_if_changed,
)


def run_with(tmp_path: Path, rows: list[dict[str, Any]]) -> tuple[RunData, ItemRecord]:
    item = ItemRecord("m-qa-seed0", "m", "qa", "qa", 0, metric="accuracy", path="m-qa-seed0")
    (tmp_path / item.path).mkdir()
    lines = [json.dumps({"rollout": 0, "prompt": "p", "completion": "c", **r}) for r in rows]
    (tmp_path / item.path / "results.jsonl").write_text("\n".join(lines) + "\n")
    return RunData("run", tmp_path, (item,)), item


def ids(examples: list[Any]) -> list[str]:
    return [e.example_id for e in examples]


def test_errors_first_then_lowest_scores_in_journal_order(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"example_id": "a", "score": 1.0},
        {"example_id": "b", "score": 0.5},
        {"example_id": "c", "error": "timeout"},
        {"example_id": "d", "score": 0.0},
        {"example_id": "e", "score": 0.5},
        {"example_id": "f", "metrics": {"accuracy": 0.0}},
        {"example_id": "b", "score": 1.0},  # redone: its last row counts
    ]
    run, item = run_with(tmp_path, rows)
    assert ids(failing_examples(run, item, 10)) == ["c", "d", "f", "e"]
    assert ids(failing_examples(run, item, 2)) == ["c", "d"]
    assert failing_examples(run, item, 1)[0].error == "timeout"
    assert failing_examples(run, item, 0) == []


def test_when_every_score_is_zero_all_are_wrong(tmp_path: Path) -> None:
    run, item = run_with(tmp_path, [{"example_id": str(i), "score": 0.0} for i in range(5)])
    assert ids(failing_examples(run, item, 3)) == ["0", "1", "2"]


def test_a_perfect_item_has_nothing_to_show(tmp_path: Path) -> None:
    run, item = run_with(tmp_path, [{"example_id": str(i), "score": 1.0} for i in range(5)])
    assert failing_examples(run, item, 3) == []


def test_lowest_scores_of_a_large_item_in_journal_order(tmp_path: Path) -> None:
    rows = [{"example_id": str(i), "score": (i % 97) / 96} for i in range(5000)]
    run, item = run_with(tmp_path, rows)
    shown = failing_examples(run, item, 5)
    assert ids(shown) == ["0", "97", "194", "291", "388"]
    assert all(e.score == 0.0 for e in shown)


def test_the_parquet_pass_picks_the_same_examples(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    rows: list[dict[str, Any]] = [
        {"example_id": "a", "score": 1.0},
        {"example_id": "c", "error": "timeout"},
        {"example_id": "d", "score": 0.0},
        {"example_id": "e", "score": 0.5},
        {"example_id": "d", "score": 0.25},  # redone: its last row counts
    ]
    run, item = run_with(tmp_path, rows)
    pickers = {item.item_id: FailingPicker(item, 10)}
    assert write_parquet_if_changed(run, tmp_path / "results.parquet", pickers)
    assert pickers[item.item_id].complete
    assert pickers[item.item_id].examples(run.run_id) == failing_examples(run, item, 10)
    assert ids(failing_examples(run, item, 10)) == ["c", "d", "e"]
    again = {item.item_id: FailingPicker(item, 10)}  # unchanged: not rewritten, nothing read
    assert not write_parquet_if_changed(run, tmp_path / "results.parquet", again)
    assert not again[item.item_id].complete


def test_picked_per_item_across_batches_of_a_multi_item_run(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from pytest_modelbench.reporting.model import load_run
    from pytest_modelbench.reporting.rows import write_parquet
    from tests.reports.conftest import craft_run

    items = {
        "m-a-seed0": {"model": "m", "variant": "a", "scores": [1.0, 0.0, 0.5, 0.0, 1.0]},
        "m-b-seed0": {"model": "m", "variant": "b", "scores": [0.25, 1.0, 0.0]},
    }
    run = load_run(craft_run(tmp_path, "r", items))
    pickers = {item.item_id: FailingPicker(item, 2) for item in run.items}
    assert write_parquet(run, tmp_path / "o.parquet", batch_rows=2, pickers=pickers) == 8
    for item in run.items:
        assert pickers[item.item_id].complete
        assert pickers[item.item_id].examples(run.run_id) == failing_examples(run, item, 2)
    assert ids(pickers["m-a-seed0"].examples(run.run_id)) == ["ex1", "ex3"]
    assert ids(pickers["m-b-seed0"].examples(run.run_id)) == ["ex2", "ex0"]
