"""``perf/collection.py`` end to end at a small size: the project it generates collects exactly
the items it promises, and the JSON report carries every figure (values are not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "perf" / "collection.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_collects_exactly_the_generated_items_and_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "collection.json"
    proc = _run("--sizes", "200,300", "--repeat", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["repeat"] == 2
    assert report["cpus"] == os.cpu_count()
    assert len(report["load_before"]) == len(report["load_after"]) == 3
    floor = report["floor"]
    assert (floor["items"], floor["collected"]) == (0, 0)
    sizes = report["sizes"]
    assert [(m["items"], m["collected"]) for m in sizes] == [(200, 200), (300, 300)]
    assert [m["shape"] for m in sizes] == ["10 × 2 × 10", "10 × 3 × 10"]
    for m in (floor, *sizes):
        assert len(m["wall_s"]) == len(m["cpu_s"]) == len(m["peak_rss_mb"]) == 2
        assert m["best_s"] == min(m["wall_s"]) > 0
        assert m["best_cpu_s"] == min(m["cpu_s"]) > 0
        assert m["rss_mb"] == max(m["peak_rss_mb"]) > 0
    table = proc.stdout.splitlines()
    assert any(line.startswith("| 200 items | 10 × 2 × 10 |") for line in table)
    assert any(line.startswith("| 300 items | 10 × 3 × 10 |") for line in table)


def test_a_size_the_project_cannot_have_is_one_line() -> None:
    proc = _run("--sizes", "250", "--repeat", "1")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "--sizes: 250 is not a multiple of 100"
