"""The vendored data: checksums, counts, licences, and byte-exact rebuild by the script."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_modelbench.suites import BUILTIN_SUITES, vendored
from pytest_modelbench.suites.vendored import DataIntegrityError, data_root, manifest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(str(data_root()))
SUITE_FOLDERS = ("gsm8k", "math500", "medqa", "medmcqa", "pubmedqa", "mmlu", "humaneval", "mbpp")
COUNTS = {
    "gsm8k": 1319,
    "math500": 500,
    "medqa": 1273,
    "medmcqa": 4183,
    "pubmedqa": 500,
    "mmlu": 14042,
    "mmlu-medical": 1089,
    "humaneval": 164,
    "mbpp": 500,
}


def test_every_vendored_file_matches_its_checksum() -> None:
    sums = manifest()
    assert len(sums) >= 3 * len(SUITE_FOLDERS)
    for path, digest in sums.items():
        assert hashlib.sha256((DATA / path).read_bytes()).hexdigest() == digest, path


def test_every_file_in_the_data_folder_is_listed() -> None:
    on_disk = {
        str(path.relative_to(DATA))
        for path in DATA.rglob("*")
        if path.is_file() and path.name != "SHA256SUMS"
    }
    assert on_disk == set(manifest())


def test_data_is_compressed_and_small() -> None:
    total = sum(path.stat().st_size for path in DATA.rglob("*") if path.is_file())
    assert total < 30_000_000
    for path in DATA.rglob("*.jsonl.gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b", path


@pytest.mark.parametrize("folder", SUITE_FOLDERS)
def test_each_suite_carries_licence_and_notice(folder: str) -> None:
    licence = (DATA / folder / "LICENSE").read_text()
    notice = (DATA / folder / "NOTICE").read_text()
    assert "MIT License" in licence or "Creative Commons Attribution 4.0" in licence
    assert "Origin:" in notice and "Licence:" in notice
    if folder == "mbpp":
        assert "CC-BY-4.0" in notice and "creativecommons.org/licenses/by/4.0" in licence


@pytest.mark.parametrize(("name", "count"), sorted(COUNTS.items()))
def test_example_counts(name: str, count: int) -> None:
    examples = BUILTIN_SUITES[name]().examples({}, 0)
    assert len(examples) == count
    assert len({example.id for example in examples}) == count


def test_known_ids_and_gold_answers() -> None:
    gsm8k = {e.id: e for e in BUILTIN_SUITES["gsm8k"]().examples({}, 0)}
    assert gsm8k["gsm8k/test/0"].gold == "18"  # Janet's ducks
    math = {e.id: e for e in BUILTIN_SUITES["math500"]().examples({}, 0)}
    assert math["math500/test/0"].gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    humaneval = BUILTIN_SUITES["humaneval"]().examples({}, 0)
    assert humaneval[0].id == "HumanEval/0" and humaneval[-1].id == "HumanEval/163"
    mbpp = BUILTIN_SUITES["mbpp"]().examples({}, 0)
    assert mbpp[0].id == "mbpp/test/11" and mbpp[-1].id == "mbpp/test/510"
    pubmed = BUILTIN_SUITES["pubmedqa"]().examples({}, 0)
    assert pubmed[0].id == "pubmedqa/test/12377809" and pubmed[0].gold == "yes"
    assert sorted({e.gold for e in pubmed}) == ["maybe", "no", "yes"]


def test_damaged_data_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    path = "gsm8k/test.jsonl.gz"
    monkeypatch.setattr(vendored, "manifest", lambda: {path: "0" * 64})
    with pytest.raises(DataIntegrityError, match="does not match"):
        vendored.read_verified.__wrapped__(path)
    with pytest.raises(DataIntegrityError, match="not listed"):
        vendored.read_verified.__wrapped__("gsm8k/other.jsonl.gz")


def test_data_checksum_is_stable_and_differs_between_suites() -> None:
    checksums = {name: factory().data_checksum() for name, factory in BUILTIN_SUITES.items()}
    assert all(len(value) == 64 for value in checksums.values())
    assert checksums == {name: f().data_checksum() for name, f in BUILTIN_SUITES.items()}
    assert len({checksums[name] for name in checksums if name != "mmlu-medical"}) == 8


@pytest.mark.slow
def test_vendor_script_rebuilds_identical_bytes(tmp_path: Path) -> None:
    """``scripts/vendor_data.py --check`` rebuilds every file from its source, byte for byte."""
    shared = REPO.parent / "shared"
    if not (shared / "datasets" / "pubmedqa").is_dir():
        pytest.skip("../shared/datasets/pubmedqa is not available")
    script = REPO / "scripts" / "vendor_data.py"
    command = [sys.executable, str(script), "--check", "--shared", str(shared)]
    if os.environ.get("MODELBENCH_VENDOR_WHEELS"):
        command += ["--wheel-dir", os.environ["MODELBENCH_VENDOR_WHEELS"]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 and "pip" in done.stderr and "download" in done.stderr:
        pytest.skip(f"cannot download the source wheels: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical" in done.stdout
