"""Ctrl-C while a served model starts stops the session at once, says what it stopped, and
leaves no server process behind (issue 28): the start's health wait runs inside the item's
event loop, whose own SIGINT handler would wait until the server is ready."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.resume.conftest import kill_group, start_pytest
from tests.serving.conftest import pid_alive
from tests.serving.fakevllm import models, starts

NEVER_READY = """
import json, os, time
with open(os.environ["FAKE_VLLM_LOG"], "a") as log:
    log.write(json.dumps({"pid": os.getpid()}) + "\\n")
time.sleep(3600)  # loading a large model: never healthy within this test
"""


def test_ctrl_c_while_the_server_starts(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api_server = pytester.path / "fakevllm" / "vllm" / "entrypoints" / "openai" / "api_server.py"
    api_server.write_text(NEVER_READY)
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    models(pytester.path, gpus=1, names=("m1",))  # startup_timeout: 60 s
    log = pytester.path / "pytest.log"
    proc = start_pytest(pytester.path, "benchmarks/", "--model", "m1", "--seeds", "0", log=log)
    try:
        deadline = time.monotonic() + 60
        while not starts(fake_vllm):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the server never started"
            time.sleep(0.05)
        time.sleep(0.5)  # inside the health wait
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)  # well before the 60 s start timeout (PERFORMANCE: within 2 s)
    finally:
        kill_group(proc)
    output = log.read_text(errors="replace")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    (server,) = starts(fake_vllm)
    assert not pid_alive(server["pid"]), output
    assert "m1" in output and "was starting; stopped it and its process group" in output, output
