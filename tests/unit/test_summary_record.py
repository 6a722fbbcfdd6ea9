"""``summary.json`` as a typed record: files written by earlier releases read back equal and
are written again byte for byte; what a backend adds that the record does not know survives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_modelbench.api import ItemSummary, MetricSummary, Outcome
from pytest_modelbench.evaluation.evaluate import summarise
from pytest_modelbench.store.records import ItemStatus, ManifestEntry
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runstore import ItemStore

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name", ["summary_stopped_early.json", "summary_reasoning.json"])
def test_a_summary_written_by_the_previous_release_reads_back_and_writes_the_same_bytes(
    tmp_path: Path, name: str
) -> None:
    text = (DATA / name).read_text()  # summary.json of a test run, before the record was typed
    store = ItemStore(tmp_path / "item")
    store.directory.mkdir()
    store.summary_path.write_text(text)
    summary = store.read_summary()
    assert isinstance(summary, ItemSummary)
    assert summary == json.loads(text)
    assert summary.status is ItemStatus.FINISHED
    assert summary.metric() == json.loads(text)["metrics"]["exact_match"]
    assert summary.extra == {"session": json.loads(text)["session"]}  # the suite's own field
    store.write_summary(summary)
    assert store.summary_path.read_text() == text


def test_the_reasoning_record_reads_its_fields_as_attributes() -> None:
    summary = ItemSummary.from_json(json.loads((DATA / "summary_reasoning.json").read_text()))
    assert (summary.n_scored, summary.reasoning_replies, summary.tokens) == (
        40,
        40,
        {"completion": 820, "prompt": 720, "reasoning": 600},
    )
    assert summary.value() == 0.5 and summary.system_fingerprints == ("modelbench-sim",)


def test_a_third_party_backends_metrics_and_fields_survive_the_store(tmp_path: Path) -> None:
    """A backend's own metric entries (lm-eval's ``alias``), its own summary fields, a metric
    whose value is null and a status this release does not know are written as they came."""
    store = ItemStore(tmp_path / "item")
    store.directory.mkdir()
    rows = store.open_rows()
    rows.append({"v": 1, "example_id": "a", "rollout": 0, "metrics": {"acc": 1.0}, "score": 1.0})
    rows.close()
    outcome = Outcome(
        expected=1,
        selected=lambda _key: True,
        metric_names=["acc"],
        metrics={"acc": {"value": 1.0, "stderr": None, "alias": "arc_easy", "n": 1}},
        extra_metrics={"pass@k": {"value": None, "k": 3}},
        fields={"harness": {"name": "mine", "version": 2}},
    )
    summary = summarise(rows, outcome).with_fields(item_id="x", status="paused")
    store.finish(
        summary, ManifestEntry.of_summary(summary, model="m", env="e", variant="v", seed=0)
    )
    data = json.loads(store.summary_path.read_text())
    assert data["metrics"] == {
        "acc": {"value": 1.0, "stderr": None, "alias": "arc_easy", "n": 1},
        "pass@k": {"value": None, "k": 3},
    }
    assert data["harness"] == {"name": "mine", "version": 2}
    assert data["status"] == "paused"
    again = store.read_summary()
    assert again is not None and again == data
    acc = again.metric("acc")
    assert acc == MetricSummary.of(value=1.0, stderr=None, alias="arc_easy", n=1)
    assert acc is not None and (acc.value, acc.stderr, acc.extra) == (
        1.0,
        None,
        {"alias": "arc_easy"},
    )
    assert again.extra["harness"] == {"name": "mine", "version": 2}
    assert again.status is None  # not a status this release knows: kept, never guessed
    assert json.loads((tmp_path / "item" / "selection.json").read_text())["keys"] == [["a", 0]]


def test_a_result_made_from_a_plain_summary_object_reads_it_as_the_record(tmp_path: Path) -> None:
    data = json.loads((DATA / "summary_stopped_early.json").read_text())
    result = EvalResult(
        item_id="alpha-qa-seed0",
        model="alpha",
        env="qa",
        variant="qa",
        seed=0,
        metric="exact_match",
        summary=data,
        directory=tmp_path,
    )
    assert isinstance(result.summary, ItemSummary)
    assert result.summary.stopped_early == data["stopped_early"]
    assert (result.score, result.n, result.summary["n_rows"]) == (1.0, 15, 15)


def test_a_metrics_entry_that_is_not_an_object_leaves_the_others_typed(tmp_path: Path) -> None:
    """A backend's bare number beside its metric objects (``extra_metrics={"pass@k": 0.7}``),
    or an older file's ``alias`` string: the objects stay typed (the score reads), the others
    are written as they came, never as a record's repr."""
    store = ItemStore(tmp_path / "item")
    store.directory.mkdir()
    rows = store.open_rows()
    rows.append({"v": 1, "example_id": "a", "rollout": 0, "metrics": {"acc": 1.0}, "score": 1.0})
    rows.close()
    outcome = Outcome(
        expected=1,
        selected=lambda _key: True,
        metric_names=["acc"],
        extra_metrics={"pass@k": 0.7},
    )
    summary = summarise(rows, outcome).with_fields(item_id="x", primary_metric="acc")
    assert summary.value() == 1.0
    store.finish(
        summary, ManifestEntry.of_summary(summary, model="m", env="e", variant="v", seed=0)
    )
    data = json.loads(store.summary_path.read_text())
    assert data["metrics"]["pass@k"] == 0.7 and data["metrics"]["acc"]["value"] == 1.0
    old = {"metrics": {"acc": {"value": 0.5}, "alias": "arc"}, "primary_metric": "acc"}
    read = ItemSummary.from_json(old)
    assert read.value() == 0.5 and read == old and read.to_json() == old
    copied = read.copy()
    copied["seen"] = 1  # a plain dict
    assert json.loads(json.dumps(copied))["metrics"] == old["metrics"]
