"""HTTP(S)_PROXY and NO_PROXY as aiohttp reads them (lower-case names win, as in curl and
requests; IPv6 literals in NO_PROXY), through a real forward proxy (proxy.py) on loopback:
absolute-form requests for http, a CONNECT tunnel for https."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pytest_modelbench.running.client import RequestFailed
from pytest_modelbench.running.endpoint import Endpoint
from pytest_modelbench.running.http import Target
from tests.conftest import Project, configure
from tests.core.test_client_transport import CHAT, RawServer, Seen, chat, client, echo, http


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
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def _dead_proxy() -> str:
    """A proxy URL nothing listens at: a request sent through it fails."""
    return f"http://127.0.0.1:{_free_port()}"


@pytest.mark.parametrize(
    ("env", "url", "expected"),
    [
        ({"HTTPS_PROXY": "http://proxy:3128"}, "https://api.example.com/v1", "http://proxy:3128"),
        ({"https_proxy": "proxy:3128"}, "https://api.example.com/v1", "http://proxy:3128"),
        ({"HTTPS_PROXY": "http://proxy:3128"}, "http://api.example.com/v1", None),
        (
            {"HTTP_PROXY": "http://upper:1", "http_proxy": "http://lower:2"},
            "http://api.example.com/v1",
            "http://lower:2",
        ),  # lower case wins, as in curl and requests
        (
            {"HTTP_PROXY": "http://p:1", "NO_PROXY": "example.com"},
            "http://api.example.com/v1",
            None,
        ),
        ({"HTTP_PROXY": "http://p:1", "no_proxy": ".example.com"}, "http://example.com/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "localhost,::1"}, "http://[::1]:8/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "localhost,[::1]"}, "http://[::1]:8/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "[::1]"}, "http://[::2]:8/v1", "http://p:1"),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "*"}, "http://anything/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "other.com"}, "http://x.com/v1", "http://p:1"),
    ],
)
def test_the_proxy_is_read_from_the_environment_as_curl_reads_it(
    proxy_env: pytest.MonkeyPatch, env: dict[str, str], url: str, expected: str | None
) -> None:
    for name, value in env.items():
        proxy_env.setenv(name, value)
    proxy = Target.of(url).proxy
    assert (None if proxy is None else str(proxy)) == expected


def test_proxy_credentials_become_basic_auth(proxy_env: pytest.MonkeyPatch) -> None:
    proxy_env.setenv("HTTP_PROXY", "http://me:s%40cret@p:1")
    target = Target.of("http://x.com/v1")
    assert str(target.proxy) == "http://p:1"
    assert target.proxy_auth is not None
    assert (target.proxy_auth.login, target.proxy_auth.password) == ("me", "s@cret")


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


def test_the_lower_case_variable_wins_through_a_real_proxy(
    forward_proxy: ForwardProxy, proxy_env: pytest.MonkeyPatch
) -> None:
    proxy_env.setenv("HTTP_PROXY", _dead_proxy())
    proxy_env.setenv("http_proxy", forward_proxy.url)

    async def go() -> tuple[list[str], RawServer]:
        async with RawServer(echo) as server, client(server.url(), retries=0) as c:
            return [(await c.request(CHAT, chat(f"via {i}"))).text for i in range(3)], server

    texts, server = asyncio.run(go())
    assert texts == ["via 0", "via 1", "via 2"]
    assert forward_proxy.seen(f"127.0.0.1:{server.port}/v1/chat/completions")
    forward_proxy.stop()


@pytest.mark.parametrize("entry", ["::1", "[::1]"])
def test_no_proxy_with_an_ipv6_literal_goes_direct(
    proxy_env: pytest.MonkeyPatch, entry: str
) -> None:
    proxy_env.setenv("HTTP_PROXY", _dead_proxy())

    async def go(no_proxy: str | None) -> str:
        if no_proxy is None:
            proxy_env.delenv("NO_PROXY", raising=False)
        else:
            proxy_env.setenv("NO_PROXY", f"localhost,{no_proxy}")
        try:
            async with RawServer(echo, host="::1") as server, client(server.url(), retries=0) as c:
                try:
                    return (await c.request(CHAT, chat("six"))).text
                except RequestFailed as exc:
                    return exc.reason
        except OSError:
            pytest.skip("no IPv6 loopback")

    assert asyncio.run(go(entry)) == "six"
    proxied = asyncio.run(go(None))  # the same request without NO_PROXY: through the dead proxy
    assert "proxy 127.0.0.1:" in proxied and "is unreachable (ConnectionRefusedError" in proxied


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

    async def go() -> RequestFailed:
        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(refuse, "127.0.0.1", refusing)
        proxy_env.setenv("HTTPS_PROXY", f"http://127.0.0.1:{refusing}")
        async with server, client("https://127.0.0.1:9/v1", retries=3) as c:
            with pytest.raises(RequestFailed) as info:
                await c.request(CHAT, chat("q"))
            return info.value

    failure = asyncio.run(go())
    assert f"proxy 127.0.0.1:{refusing} refused CONNECT: HTTP 407" in failure.reason
    assert failure.attempts == 1  # the proxy wants credentials: no retry changes that


def test_a_tool_behind_the_router_reaches_it_directly_while_requests_use_the_proxy(
    forward_proxy: ForwardProxy, proxy_env: pytest.MonkeyPatch
) -> None:
    """lm-eval and the verifiers clients read HTTP_PROXY themselves: while they talk to the
    worker's router, NO_PROXY names loopback, so they reach it directly; the router's own
    requests to the endpoint go through the proxy as configured."""
    proxy_env.setenv("HTTP_PROXY", forward_proxy.url)
    models = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()

    def serving(seen: Seen) -> bytes:
        return http(models) if seen.target.endswith("/models") else echo(seen)

    async def go() -> tuple[str, int, RawServer]:
        endpoint = Endpoint(base_urls=(), served_model="m", api="chat")
        async with RawServer(serving) as server:
            endpoint.urls.add(server.url())
            async with (
                endpoint.asingle_url(timeout_s=5, max_retries=0) as base,
                aiohttp.ClientSession(trust_env=True) as tool,  # reads HTTP_PROXY, as httpx does
                tool.post(f"{base}/chat/completions", json=chat("around")) as response,
            ):
                body = await response.json()
            return body["choices"][0]["message"]["content"], int(base.split(":")[2][:5]), server

    text, router_port, server = asyncio.run(go())
    assert text == "around"
    assert forward_proxy.seen(f"127.0.0.1:{server.port}/v1/")  # (one line per connection)
    forward_proxy.stop()
    assert f":{router_port}/" not in forward_proxy.log.read_text(errors="replace")
    assert "no_proxy" not in {k.lower() for k in os.environ}  # restored after the mount


def test_the_sessions_own_servers_are_never_reached_through_a_proxy(
    proxy_env: pytest.MonkeyPatch,
) -> None:
    """A server modelbench started (``UrlSet(own=True)``) carries the session's server key: with
    ``HTTP_PROXY`` set its requests still go straight to it, where a user's endpoint at the
    same address goes through the proxy, as curl would send it."""
    from pytest_modelbench.running.urls import UrlSet

    proxy_env.setenv("HTTP_PROXY", _dead_proxy())

    async def go(own: bool) -> str:
        async with RawServer(echo) as server:
            urls = UrlSet([server.url()], own=own)
            async with client(urls, retries=0, api_key="server-key") as c:
                try:
                    return (await c.request(CHAT, chat("direct"))).text
                except RequestFailed as exc:
                    return exc.reason

    assert asyncio.run(go(own=True)) == "direct"
    assert "proxy 127.0.0.1:" in asyncio.run(go(own=False))
    assert Target.of("http://127.0.0.1:9/v1", direct=True).proxy is None
