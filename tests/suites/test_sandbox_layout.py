"""The sandbox root's layout: symlink chains, the ELF loader, what is bound and what is masked."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_modelbench.sandbox.layout import elf_interpreter, reproduce, root_layout

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux roots")


def test_reproduce_records_every_symlink_on_the_way(tmp_path: Path) -> None:
    real = tmp_path / "usr" / "lib" / "arch"
    real.mkdir(parents=True)
    (real / "libx.so.1.2").write_text("")
    (tmp_path / "lib").symlink_to("usr/lib")  # relative, like Debian's /lib
    (real / "libx.so.1").symlink_to("libx.so.1.2")  # a soname
    (tmp_path / "lib64").symlink_to(tmp_path / "lib" / "arch")  # absolute, through another
    links: dict[str, str] = {}
    found = reproduce(f"{tmp_path}/lib64/libx.so.1", links)
    assert found == str(real / "libx.so.1.2")
    assert links == {
        f"{tmp_path}/lib64": f"{tmp_path}/lib/arch",
        f"{tmp_path}/lib": "usr/lib",
        f"{real}/libx.so.1": "libx.so.1.2",
    }


def test_the_elf_interpreter_is_read_from_the_program_header(tmp_path: Path) -> None:
    loader = elf_interpreter(os.path.realpath(sys.executable))
    assert loader is None or (loader.startswith("/") and os.path.exists(loader))
    text = tmp_path / "script"
    text.write_text("#!/bin/sh\n")
    assert elf_interpreter(str(text)) is None


def test_the_layout_binds_the_interpreter_and_masks_every_package_directory() -> None:
    layout = root_layout(sys.executable)
    assert layout.interpreter in layout.files and os.access(layout.interpreter, os.X_OK)
    assert any(Path(d, "os.py").exists() for d in layout.dirs)  # the standard library
    package = str(Path(__file__).resolve().parents[2] / "pytest_modelbench")
    bound = [*layout.dirs, *layout.files]
    for path in [package, *layout.masks]:  # masked, or not under anything bound at all
        inside = any(path == b or path.startswith(b + "/") for b in bound)
        assert not inside or path in layout.masks, path
    assert all(not m.endswith("lib-dynload") for m in layout.masks)
    assert all(h not in bound for h in layout.hidden)
