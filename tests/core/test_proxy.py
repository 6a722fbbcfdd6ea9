"""HTTP(S)_PROXY and NO_PROXY are honoured as requests and curl honour them, through a real
forward proxy (proxy.py) on loopback: absolute-form requests for http, a CONNECT tunnel for https."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.running.proxies import Proxy, proxy_for
from tests.conftest import Project, configure
from tests.core.test_client_transport import CHAT, RawServer, chat, client, echo


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ForwardProxy:
    def __init__(self, log: Path) -> None:
        pytest.importorskip("proxy", reason="proxy.py is installed by scripts/setup.sh (dev extra)")
        self.port = _free_port()
        self.log = log
        self.url = f"http://127.0.0.1:{self.port}"
        self._handle = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", str(self.port),
             "--num-workers", "1", "--num-acceptors", "1"],
            stdout=self._handle,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"proxy.py did not start: {log.read_text()[-2000:]}")

    def seen(self, needle: str, wait_s: float = 15.0) -> bool:
        """Whether the proxy logged a request for ``needle``. It logs when the connection
        closes, which on a loaded machine can come a moment after the client is done."""
        deadline = time.monotonic() + wait_s
        while needle not in self.log.read_text(errors="replace"):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._handle.close()


@pytest.fixture
def forward_proxy(tmp_path: Path) -> Iterator[ForwardProxy]:
    proxy = ForwardProxy(tmp_path / "proxy.log")
    yield proxy
    proxy.stop()


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "url", "expected"),
    [
        ({"HTTPS_PROXY": "http://proxy:3128"}, "https://api.example.com/v1", Proxy("proxy", 3128)),
        ({"https_proxy": "proxy:3128"}, "https://api.example.com/v1", Proxy("proxy", 3128)),
        ({"HTTPS_PROXY": "http://proxy:3128"}, "http://api.example.com/v1", None),
        ({"ALL_PROXY": "http://p:1"}, "http://api.example.com/v1", Proxy("p", 1)),
        (
            {"HTTP_PROXY": "http://p:1", "NO_PROXY": "example.com"},
            "http://api.example.com/v1",
            None,
        ),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": ".example.com"}, "http://example.com/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "127.0.0.0/8"}, "http://127.0.0.1:8000/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "localhost,::1"}, "http://[::1]:8/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "*"}, "http://anything/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "other.com"}, "http://x.com/v1", Proxy("p", 1)),
        (
            {"HTTP_PROXY": "http://me:s%40cret@p:1"},
            "http://x.com/v1",
            Proxy("p", 1, "Basic bWU6c0BjcmV0"),
        ),
    ],
)
def test_proxy_for_reads_the_environment_as_requests_does(
    env: dict[str, str], url: str, expected: Proxy | None
) -> None:
    assert proxy_for(url, env) == expected


def test_http_endpoint_through_a_real_proxy(
    project: Project, sim: Any, forward_proxy: ForwardProxy, proxy_env: Any
) -> None:
    server = sim(accuracy=0.7, lookup={}, latency=0.001)
    proxy_env.setenv("HTTP_PROXY", forward_proxy.url)
    configure(project, server.base_url, n=10)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    assert sum(1 for r in server.requests if r.path.endswith("completions")) == 10
    assert forward_proxy.seen(f"{server.base_url.split('//')[1]}/chat/completions")
    forward_proxy.stop()


def test_no_proxy_sends_loopback_directly(
    project: Project, sim: Any, forward_proxy: ForwardProxy, proxy_env: Any
) -> None:
    server = sim(accuracy=0.7, lookup={}, latency=0.001)
    proxy_env.setenv("HTTP_PROXY", forward_proxy.url)
    proxy_env.setenv("NO_PROXY", "localhost,127.0.0.1")
    configure(project, server.base_url, n=5)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    forward_proxy.stop()  # its log is complete once it has stopped
    assert not forward_proxy.seen("/v1/", wait_s=0)


def test_https_endpoint_through_a_connect_tunnel(
    certificate: tuple[Path, Path],
    tls_server_context: Any,
    forward_proxy: ForwardProxy,
    proxy_env: Any,
) -> None:
    proxy_env.setenv("SSL_CERT_FILE", str(certificate[0]))
    proxy_env.setenv("HTTPS_PROXY", forward_proxy.url)

    async def go() -> tuple[list[str], RawServer]:
        async with RawServer(echo, tls=tls_server_context) as server:
            async with client(server.url()) as c:
                texts = [(await c.request(CHAT, chat(f"tunnelled {i}"))).text for i in range(3)]
            return texts, server

    texts, server = asyncio.run(go())
    assert texts == ["tunnelled 0", "tunnelled 1", "tunnelled 2"]
    assert server.connections == 1  # one tunnel, kept alive
    assert forward_proxy.seen(f"CONNECT 127.0.0.1:{server.port}")
    forward_proxy.stop()


def test_a_proxy_that_refuses_the_tunnel_is_a_clear_error(
    certificate: tuple[Path, Path], proxy_env: Any
) -> None:
    refusing = _free_port()

    async def go() -> str:
        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(refuse, "127.0.0.1", refusing)
        proxy_env.setenv("HTTPS_PROXY", f"http://127.0.0.1:{refusing}")
        async with server, client("https://127.0.0.1:9/v1", retries=0) as c:
            from pytest_modelbench.running.client import RequestFailed

            with pytest.raises(RequestFailed) as info:
                await c.request(CHAT, chat("q"))
            return info.value.reason

    reason = asyncio.run(go())
    assert "refused CONNECT: HTTP/1.1 407 Proxy Authentication Required" in reason
