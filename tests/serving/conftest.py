"""Fixtures for the serving tests: a fake ``python`` that behaves like a vLLM server."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_modelbench.serving.gpu_discovery import BUSY_ENV, FAKE_ENV

FAKE_VLLM = r'''
"""Stands in for `python -m vllm.entrypoints.openai.api_server ...` (mode from FAKE_VLLM_MODE)."""
import http.server
import json
import os
import subprocess
import sys
import time

args = sys.argv[1:]


def opt(name):
    return args[args.index(name) + 1]


mode = os.environ.get("FAKE_VLLM_MODE", "serve")
print("fake vllm argv:", " ".join(args), flush=True)
print("fake vllm CUDA_VISIBLE_DEVICES=%r" % os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
if mode == "hang":
    for i in range(60):
        print(f"log line {i:02d}", flush=True)
    time.sleep(600)
elif mode == "crash":
    print("Traceback (most recent call last):", flush=True)
    print("ValueError: head_dim 16 is not supported by the CPU attention backend", flush=True)
    sys.exit(3)
elif mode == "port-race":
    counter = os.environ["FAKE_VLLM_COUNTER"]
    n = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(n + 1))
    if n == 0:
        print("OSError: [Errno 98] Address already in use", flush=True)
        sys.exit(1)

served = opt("--served-model-name")
# A grandchild in the same process group, like vLLM's EngineCore: stop() must kill it too.
subprocess.Popen(["sleep", "600"])


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = b""
        elif self.path == "/v1/models":
            body = json.dumps({"data": [{"id": served}]}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


print("ready", flush=True)
http.server.HTTPServer(("127.0.0.1", int(opt("--port"))), Handler).serve_forever()
'''


@pytest.fixture
def fake_vllm_python(tmp_path: Path) -> Path:
    """An executable used as ``python=``: ignores ``-m vllm...`` and acts per FAKE_VLLM_MODE."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
    script.chmod(0o755)
    return script


@pytest.fixture
def gpu_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A clean GPU environment: no CUDA_VISIBLE_DEVICES, no fake GPUs, default threshold."""
    for name in ("CUDA_VISIBLE_DEVICES", FAKE_ENV, BUSY_ENV):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


def proc_state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (``Z`` zombie), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0]
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    state = proc_state(pid)
    return state is not None and state != "Z"


def group_rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


requires_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")


@pytest.fixture
def fake_vllm(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake vLLM on the pytester run's PYTHONPATH, a qa benchmark; the server start log."""
    from tests.serving import fakevllm

    return fakevllm.install(pytester.path, monkeypatch)
