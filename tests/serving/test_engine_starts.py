"""Server starts that go wrong say why in one line: a program that is not there, a health path
the server refuses, a server that refuses its flags; and the setup record says where it ran.

The ``command`` engine runs the project's simulated server (``python -m
pytest_modelbench.testing``), as a user trying the engine would.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.serving.fakevllm import write_models

SEEDS = 4  # fakevllm's qa environment


def simulator(*extra: str) -> list[str]:
    return [
        sys.executable,
        *("-m", "pytest_modelbench.testing", "--port", "{port}", "--models", "{served_name}"),
        *extra,
    ]


def command_model(root: Path, command: list[str], **serve: object) -> None:
    write_models(
        root,
        {
            "m1": {
                "model": "org/m1",
                "serve": {"engine": "command", "command": command, "startup_timeout": 60, **serve},
                "max_concurrent": 4,
            }
        },
    )


def test_a_program_missing_at_launch_fails_its_items_with_one_line(
    pytester: pytest.Pytester, fake_vllm: Path
) -> None:
    """A program named by a placeholder is only known at launch: the items are errors that
    name it, not "cannot write to the run directory" nor interrupted."""
    write_models(
        pytester.path,
        {
            "m1": {
                "model": "./no-such-server",
                "serve": {"engine": "command", "command": ["{model}", "--port", "{port}"]},
            }
        },
    )
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "m1")
    result.assert_outcomes(errors=SEEDS)
    result.stdout.fnmatch_lines(
        [
            "m1: no-such-server server for './no-such-server' on * could not start: "
            "'./no-such-server' not found (No such file or directory): install it or give "
            "its full path"
        ]
    )
    out = result.stdout.str()
    assert "cannot write" not in out and "interrupted" not in out and "Traceback" not in out


def test_a_program_that_is_not_executable_is_a_usage_error_before_anything_runs(
    pytester: pytest.Pytester, fake_vllm: Path
) -> None:
    (pytester.path / "server.sh").write_text("#!/bin/sh\n")  # not chmod +x
    command_model(pytester.path, ["./server.sh", "--port", "{port}"])
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "m1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: configs/models.yaml: models.m1.serve.command[0]: './server.sh' not found "
            "(or not executable): install it or give its full path"
        ]
    )
    assert "Traceback" not in result.stderr.str()


def test_a_health_path_the_live_server_refuses_fails_at_once_naming_it(
    pytester: pytest.Pytester, fake_vllm: Path
) -> None:
    """The simulator answers 404 on /helth and 200 on /v1/models: a wrong path, not a slow
    start (the old wait ran to serve.startup_timeout and named neither)."""
    command_model(pytester.path, simulator(), health="/helth", startup_timeout=600)
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "m1", "--seeds", "0")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "m1: serve.health '/helth' answers 404 (/v1/models answers 200): fix serve.health "
            "in models.yaml, or remove it to probe /v1/models"
        ]
    )


def test_a_server_that_dies_at_start_leads_with_its_cause_and_shows_only_this_start(
    pytester: pytest.Pytester, fake_vllm: Path
) -> None:
    """argparse's refusal is the cause; the log shown is this start's, though the log file
    holds the earlier session's start and every item's."""
    command_model(pytester.path, simulator("--bogus"))
    args = ("benchmarks/", "--model", "m1", "--run-id", "r")
    pytester.runpytest_subprocess(*args).assert_outcomes(errors=SEEDS)
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(errors=SEEDS)
    result.stdout.fnmatch_lines(
        [
            "m1: python server for 'org/m1' on CPU exited with code 2 while starting: "
            "error: unrecognized arguments: --bogus.",
            "  log: *-m1.log (this start, last 40 lines):",
        ]
    )
    (log_path,) = (pytester.path / "runs" / "r" / "servers").glob("*-m1.log")
    log = log_path.read_text()
    assert log.count(": starting: ") == 2 * SEEDS
    starts = [line for line in log.splitlines() if ": starting: " in line]
    ports = [line.split("--port ")[1].split()[0] for line in starts]
    shown = result.stdout.str()
    assert not [p for p in ports[:SEEDS] if f"--port {p} " in shown]  # not the earlier session's
    assert all(f"--port {p} " in shown for p in ports[SEEDS:])  # each item's own start


def test_a_model_served_on_the_cpu_is_recorded_as_such(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve.gpus asks for one GPU; the machine has none: the header names the engine, the
    setup says CPU."""
    monkeypatch.delenv("MODELBENCH_FAKE_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    command_model(pytester.path, simulator())
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "--seeds", "0", "--junitxml", "junit.xml"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["modelbench: no GPU on this machine: models are served on the CPU (command); *"]
    )
    props = {
        p.get("name"): p.get("value")
        for p in ET.parse(pytester.path / "junit.xml").iter("property")
    }
    assert props["mb_setup"].startswith("command, CPU")
