"""The store as an item's state machine: one read of what is stored (``ItemStore.state``),
then one transition (``start`` → rows → ``finish``; ``settle``; ``seeded``), each writing the
item's files and its manifest entry together; the reuse decision reads the state alone."""

from __future__ import annotations

from pathlib import Path

from pytest_modelbench.evaluation.reuse import Reuse, decide, seedable
from pytest_modelbench.store.records import ItemMetadata, ItemStatus, ManifestEntry
from pytest_modelbench.store.runstore import ItemState, RunStore
from pytest_modelbench.store.summary import ItemSummary

ITEM = "m-qa-seed0"


def _metadata(fingerprint: str = "f1") -> ItemMetadata:
    return ItemMetadata(
        item_id=ITEM,
        fingerprint=fingerprint,
        fingerprint_parts={"seed": 0},
        model={"name": "m"},
        variant={"env": "qa", "id": "qa"},
        seed=0,
        num_examples=-1,
        versions={},
    )


def _entry(summary: ItemSummary) -> ManifestEntry:
    return ManifestEntry.of_summary(summary, model="m", env="qa", variant="qa", seed=0)


def _manifest_status(run: RunStore) -> str:
    return str(run.read_manifest()["items"][ITEM]["status"])


def _row(example: str, error: str | None = None) -> dict[str, object]:
    return {"v": 1, "example_id": example, "rollout": 0, "metrics": {"acc": 1.0}, "error": error}


def test_an_item_goes_from_nothing_through_start_and_finish_to_stored(tmp_path: Path) -> None:
    run = RunStore(tmp_path / "run")
    store = run.item(ITEM)
    assert store.state() == ItemState(summary=None, metadata=None, journal=False)
    assert decide(force=False, fingerprint="f1", parts={}, state=store.state()).action is (
        Reuse.SEED
    )
    rows = store.start(_metadata())
    assert _manifest_status(run) == "running"
    rows.append(_row("a"))
    rows.append(_row("b", error="timeout"))
    rows.close()
    summary = ItemSummary(
        item_id=ITEM, fingerprint="f1", status=ItemStatus.FINISHED, n_rows=2, selected=(("a", 0),)
    )
    store.finish(summary, _entry(summary))
    state = store.state()
    assert state.journal and state.stored
    assert state.metadata == _metadata().to_json()
    assert state.summary == summary.to_json() and state.summary.finished
    assert _manifest_status(run) == "finished"
    assert decide(force=False, fingerprint="f1", parts={}, state=state).action is Reuse.STORED
    assert decide(force=False, fingerprint="f2", parts={}, state=state).action is Reuse.RECOMPUTE
    again = store.start(_metadata())  # resumed: the journal's finished units are done
    assert again.done_keys() == frozenset({("a", 0)})
    again.close()


def test_starting_over_moves_the_journal_aside_and_forgets_the_summary(tmp_path: Path) -> None:
    run = RunStore(tmp_path / "run")
    store = run.item(ITEM)
    rows = store.start(_metadata())
    rows.append(_row("a"))
    rows.close()
    summary = ItemSummary(item_id=ITEM, fingerprint="f1", status=ItemStatus.FINISHED)
    store.finish(summary, _entry(summary))
    rows = store.start(_metadata("f2"), start_over="stale")
    assert rows.done_keys() == frozenset()
    rows.close()
    state = store.state()
    assert (state.summary, state.journal) == (None, False)
    assert state.metadata is not None and state.metadata["fingerprint"] == "f2"
    assert _manifest_status(run) == "running"
    assert [p.name for p in store.directory.iterdir() if "stale" in p.name]  # kept aside


def test_a_restart_source_is_taken_only_with_its_journal(tmp_path: Path) -> None:
    summary = ItemSummary.from_json(
        {"fingerprint": "f1", "status": "finished", "item_id": ITEM, "n_rows": 1}
    )
    stored = ItemState(summary=summary, metadata=_metadata().to_json(), journal=True)
    assert seedable("f1", {}, stored, "old") == (True, None)
    no_journal = ItemState(summary=summary, metadata=_metadata().to_json(), journal=False)
    assert seedable("f1", {}, no_journal, "old") == (False, None)
    ok, why = seedable("f2", {"seed": 1}, no_journal, "old")
    assert not ok and why is not None and why.startswith("not reused from old: configuration")
