"""An atomic write that fails for any reason leaves no ``.tmp`` file behind (issue 28)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pytest_modelbench.store import files
from pytest_modelbench.store.files import StoreWriteError, atomic_write_text, link_or_copy


def test_an_error_while_writing_leaves_no_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(text: str) -> str:
        raise ValueError("cannot write this text")

    monkeypatch.setattr(files, "redact", broken)
    with pytest.raises(ValueError, match="cannot write this text"):
        atomic_write_text(tmp_path / "summary.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_a_lone_surrogate_is_written_as_its_escape(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "summary.json", '{"text": "a lone surrogate \udc80"}')
    assert (tmp_path / "summary.json").read_bytes() == b'{"text": "a lone surrogate \\udc80"}'


def test_ctrl_c_mid_write_leaves_no_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(tmp_path / "summary.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_full_disk_names_the_file_and_leaves_no_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(StoreWriteError, match=r"cannot write .*summary.json: No space left"):
        atomic_write_text(tmp_path / "summary.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_mid_copy_leaves_no_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.write_text("rows")
    (tmp_path / "dst").mkdir()

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        link_or_copy(src, tmp_path / "dst" / "results.jsonl")
    assert list((tmp_path / "dst").iterdir()) == []
