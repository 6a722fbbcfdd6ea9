"""``perf/item_memory.py`` end to end with a small item: every example is evaluated against the
simulated server and the JSON report carries every memory figure (values are not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "perf" / "item_memory.py"

FIELDS = {
    "examples",
    "n",
    "errors",
    "completed",
    "score",
    "session_wall_s",
    "item_wall_s",
    "requests_per_s",
    "before_item_mb",
    "after_item_mb",
    "item_peak_mb",
    "growth_mb",
    "session_peak_mb",
    "samples",
}


def test_runs_every_example_and_reports_the_memory_figures(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--examples", "400", "--small", "0", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["small"] is None
    big = report["big"]
    assert set(big) == FIELDS
    assert big["examples"] == 400
    assert big["completed"] is True
    assert big["n"] + big["errors"] == 400
    assert big["errors"] == 0  # a healthy simulated server: every example scored
    assert 0.0 <= big["score"] <= 1.0
    assert 0 < big["before_item_mb"] <= big["item_peak_mb"] <= big["session_peak_mb"]
    assert big["growth_mb"] == pytest.approx(big["item_peak_mb"] - big["before_item_mb"])
    assert big["samples"] > 0
    assert any(line.startswith("| 400 |") for line in proc.stdout.splitlines())
