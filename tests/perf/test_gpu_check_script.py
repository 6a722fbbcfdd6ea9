"""``perf/gpu_check.py --dry-run``: the real-GPU check, up to the GPU, on two fake GPUs.

Every check runs for real (pytest runs with the stand-in engine, ``-n auto`` in both plugin
orders, more workers than GPUs, Ctrl-C and ``kill -9``) without CUDA; the figures are not
asserted, only that each check passed and says what it saw."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "perf" / "gpu_check.py"
CHECKS = ("discovery", "binding", "busy GPU", "-n auto", "workers > GPUs", "Ctrl-C", "kill -9")


def test_gpu_check_dry_run_passes_every_check(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELBENCH_", "CUDA_"))}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--work", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    summary = output.split("summary:", 1)[1].splitlines()[1:]
    assert [line.split()[0] for line in summary] == ["PASS"] * len(CHECKS), output
    for name, line in zip(CHECKS, summary, strict=True):
        assert line.split(None, 1)[1].startswith(name), line
    assert "2 GPU(s) from fake: 0,1" in output
    assert "GPU 0 is busy: 30000 MiB" in output
    assert "created: 2/2 worker" in output
    assert "-n 3 on 2 GPU(s): 3 passed" in output


def test_gpu_check_reports_a_failed_check(tmp_path: Path) -> None:
    """A check that fails says so and the script exits 1 (here: a broken fake GPU list)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELBENCH_", "CUDA_"))}
    env["MODELBENCH_FAKE_GPUS"] = ""  # no GPU at all: discovery fails, nothing else runs
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--work", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL discovery" in done.stdout and "found no GPU" in done.stdout
