"""Durability of the run store: fsync points, locked atomic manifest, ENOSPC and EIO."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
from pathlib import Path
from typing import IO, Any

import pytest

from pytest_modelbench.store import journal
from pytest_modelbench.store.runstore import RunStore
from tests.conftest import Project, configure, manifest, rows
from tests.resume.conftest import completions

needs_proc = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="needs /proc to name fds"
)


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@needs_proc
def test_journal_summary_and_manifest_are_fsynced_at_item_end(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(fd_path(fd))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    server = sim(accuracy=0.9, lookup={})
    configure(project, server.base_url, n=10)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    names = [Path(p).name for p in synced]
    journal = names.index("results.jsonl")  # once, at item end, not per example
    assert names.count("results.jsonl") == 1
    # after the journal: the summary (temp file, renamed) and the manifest's final update
    later = names[journal + 1 :]
    assert any(n.startswith(".summary.json.") for n in later)
    assert any(n.startswith(".run_manifest.json.") for n in later)
    assert any(Path(p).name == "alpha-qa-seed0" for p in synced)  # the directory (renames)


def _hammer(directory: str, worker: int, updates: int) -> None:
    run = RunStore(Path(directory))
    for n in range(updates):
        run.update_item(f"item{worker}", count=n + 1, worker=worker)
        run.update_item("shared", **{f"w{worker}": n + 1})


def test_manifest_updates_from_many_processes_are_atomic_and_none_is_lost(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    RunStore(run_dir).init(run_name="run")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(str(run_dir), w, 40)) for w in range(4)]
    for proc in procs:
        proc.start()
    torn = 0
    while any(p.is_alive() for p in procs):  # a reader never sees a half-written manifest
        try:
            json.loads((run_dir / "run_manifest.json").read_text())
        except json.JSONDecodeError:
            torn += 1
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    data = manifest(run_dir)
    assert torn == 0
    assert {data["items"][f"item{w}"]["count"] for w in range(4)} == {40}
    assert {data["items"]["shared"][f"w{w}"] for w in range(4)} == {40}
    assert not list(run_dir.glob(".*.tmp"))


class _FullDisk:
    """A journal file on a disk that fills up after ``room`` lines."""

    def __init__(self, handle: IO[str], room: int) -> None:
        self._handle, self._room = handle, room

    def write(self, text: str) -> int:
        if self._room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= 1
        return self._handle.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def test_disk_full_mid_item_names_the_file_and_keeps_finished_examples(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.7, lookup={}, latency=0.002)
    configure(project, server.base_url, n=60, envs=("qa", "qb"), max_concurrent=4)
    real_open = open

    def full_disk_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(path, mode, *args, **kwargs)
        if mode == "a" and "alpha-qb-seed0" in str(path):
            return _FullDisk(handle, room=25)
        return handle

    with pytest.MonkeyPatch.context() as mp:  # (pytester's own monkeypatch must stay)
        mp.setattr(journal, "open", full_disk_open, raising=False)
        result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*alpha-qb-seed0: writing results failed: cannot append to "
            "*alpha-qb-seed0/results.jsonl: No space left on device. Results finished before "
            "this point are kept in *runs/run-* and will be reused: free disk space (or fix "
            "the file system), then re-run the same command",
        ]
    )
    assert "Traceback" not in result.stdout.str()
    (run_dir,) = project.run_dirs()
    kept = rows(run_dir / "alpha-qb-seed0")
    assert len(kept) == 25 and not (run_dir / "alpha-qb-seed0" / "summary.json").exists()
    assert manifest(run_dir)["items"]["alpha-qb-seed0"]["status"] == "error"
    assert len(rows(run_dir / "alpha-qa-seed0")) == 60  # the other item is untouched

    server.clear_log()  # disk space freed: the same command finishes only what is missing
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=2)
    asked = completions(server)
    assert len(asked) == 60 - 25 and {r.key.split(":")[0] for r in asked} == {"qb"}
    assert {r["prompt"] for r in kept}.isdisjoint(r.key for r in asked)
    assert len(rows(run_dir / "alpha-qb-seed0")) == 60


@needs_proc
def test_io_error_writing_the_summary_names_it_and_the_rerun_needs_no_requests(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.7, lookup={})
    configure(project, server.base_url, n=30)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if Path(fd_path(fd)).name.startswith(".summary.json."):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", failing_fsync)
        result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*alpha-qa-seed0: writing results failed: cannot write *alpha-qa-seed0/summary.json: "
            "Input/output error. Results finished before this point are kept*",
        ]
    )
    (run_dir,) = project.run_dirs()
    item = run_dir / "alpha-qa-seed0"
    assert len(rows(item)) == 30 and not (item / "summary.json").exists()
    assert not list(item.glob(".summary.json.*"))  # no temp file left behind

    server.clear_log()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    assert completions(server) == []
    assert json.loads((item / "summary.json").read_text())["metrics"]["exact_match"]["n"] == 30


def test_a_reader_never_cuts_a_line_being_written(tmp_path: Path) -> None:
    """Only the evaluator's repair (under the item lock) removes a torn tail; readers ignore it."""
    path = tmp_path / "results.jsonl"
    whole = json.dumps({"example_id": "a", "rollout": 0, "score": 1.0}) + "\n"
    path.write_text(whole + '{"example_id": "b", "rol')
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(journal.Journal(path).read()) == [("a", 0)]
    assert path.read_text().endswith('"rol')  # untouched
    with pytest.warns(journal.StoreWarning, match="dropped an unfinished last line"):
        assert journal.Journal(path).repair() == 1
    assert path.read_text() == whole
    assert (tmp_path / "results.damaged.jsonl").read_text() == '{"example_id": "b", "rol\n'
