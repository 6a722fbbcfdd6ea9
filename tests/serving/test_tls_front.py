"""The mutual-TLS front that lends an engine without TLS of its own (SGLang, ``command``)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pytest_modelbench.running import blocking
from pytest_modelbench.running.router import start_loop, stop_loop
from pytest_modelbench.serving.slot import Launch, build_server
from pytest_modelbench.serving.tls import SessionTls, session_tls
from pytest_modelbench.serving.tls_front import FrontedServer, TlsFront
from pytest_modelbench.testing import SimConfig, SimServer

KEY = "s" * 32
Recorder = tuple[str, list[dict[str, Any]], threading.Event]


@pytest.fixture(scope="module")
def worker() -> SessionTls:
    return session_tls()[1]


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with SimServer(SimConfig()) as server:
        yield server


@pytest.fixture
def front(
    sim: SimServer, worker: SessionTls, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TlsFront]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing answers there
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    proxy = TlsFront(sim.url, worker, KEY, host="127.0.0.1")
    proxy.start()
    yield proxy
    proxy.stop()


def chat(stream: bool = False) -> bytes:
    body: dict[str, Any] = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "max_tokens": 16,
        "seed": 3,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def call(
    url: str, context: ssl.SSLContext | None, key: str | None = KEY, **kw: Any
) -> blocking.Reply:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return blocking.request(url, headers=headers, context=context, timeout_s=10, **kw)


def unnumbered(body: bytes) -> bytes:
    """The simulator numbers its replies and stamps them with the second: equal otherwise."""
    return re.sub(rb'"created": ?\d+', b'"created": 0', re.sub(rb"-sim\d+", b"-sim", body))


def test_the_front_forwards_chat_completions_and_streams(
    sim: SimServer, front: TlsFront, worker: SessionTls
) -> None:
    context = worker.client_context()
    root = front.root_url
    assert root.startswith("https://127.0.0.1:")
    for stream in (False, True):
        fronted = call(f"{root}/v1/chat/completions", context, method="POST", data=chat(stream))
        direct = call(
            f"{sim.url}/v1/chat/completions", None, None, method="POST", data=chat(stream)
        )
        assert fronted.status == direct.status == 200
        assert unnumbered(fronted.body) == unnumbered(direct.body)
        if stream:
            assert fronted.body.rstrip().endswith(b"data: [DONE]")
    assert call(f"{root}/v1/models", context).status == 200
    assert [r.path for r in sim.requests].count("/v1/chat/completions") == 4


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    """An engine that records what reaches it and answers fixed bytes, in chunks (SSE)."""
    seen: list[dict[str, Any]] = []
    runner: list[web.AppRunner] = []
    first_read = threading.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        seen.append(
            {
                "method": request.method,
                "path_qs": request.path_qs,
                "headers": dict(request.headers),
                "body": await request.read(),
            }
        )
        response = web.StreamResponse(status=207, headers={"X-Engine": "yes"})
        response.content_type = "text/event-stream"
        await response.prepare(request)
        await response.write(b'data: {"a": 1}\n\n')
        if request.path == "/v1/stream":  # the rest once the client has read the first event
            read = await asyncio.get_running_loop().run_in_executor(None, first_read.wait, 10)
            seen[-1]["first event read"] = read
        for part in (b"data: \xff\x00binary\n\n", b"data: [DONE]\n\n"):
            await response.write(part)
        await response.write_eof()
        return response

    async def setup() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner.append(web.AppRunner(app, access_log=None))
        await runner[0].setup()
        await web.TCPSite(runner[0], "127.0.0.1", 0).start()

    loop, thread = start_loop("engine", setup)
    port = runner[0].addresses[0][1]
    yield f"http://127.0.0.1:{port}", seen, first_read

    async def down() -> None:
        await runner[0].cleanup()

    stop_loop(loop, thread, down)


def test_the_front_forwards_everything_but_the_key(recorder: Recorder, worker: SessionTls) -> None:
    url, seen, _ = recorder
    proxy = TlsFront(url, worker, KEY, host="127.0.0.1")
    proxy.start()
    try:
        reply = call(
            f"{proxy.root_url}/v1/any/path?x=1&y=%20z",
            worker.client_context(),
            method="PATCH",
            data=b"\x00raw body\xff",
        )
    finally:
        proxy.stop()
    assert reply.status == 207
    assert reply.body == b'data: {"a": 1}\n\ndata: \xff\x00binary\n\ndata: [DONE]\n\n'
    (got,) = seen
    assert (got["method"], got["path_qs"], got["body"]) == (
        "PATCH",
        "/v1/any/path?x=1&y=%20z",
        b"\x00raw body\xff",
    )
    assert got["headers"]["Content-Type"] == "application/json"
    assert "Authorization" not in got["headers"]
    assert KEY not in json.dumps(got["headers"])


def test_the_front_refuses_a_request_without_the_key(
    sim: SimServer, front: TlsFront, worker: SessionTls
) -> None:
    context = worker.client_context()
    for key in (None, "wrong", KEY + "x", KEY.upper()):
        reply = call(
            f"{front.root_url}/v1/chat/completions", context, key, method="POST", data=chat()
        )
        assert reply.status == 401, key
    assert sim.requests == []  # nothing reached the engine


def test_the_front_refuses_a_client_without_a_certificate_of_the_session(
    sim: SimServer, front: TlsFront, worker: SessionTls
) -> None:
    ca_only = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts the CA, shows no certificate
    ca_only.check_hostname = False
    ca_only.load_verify_locations(cadata=worker.ca)
    stranger = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts this CA, shows another's
    stranger.check_hostname = False
    stranger.load_verify_locations(cadata=worker.ca)
    with session_tls()[1].files() as (foreign, _ca):  # another session's worker certificate
        stranger.load_cert_chain(foreign)
    for context in (ca_only, stranger):
        with pytest.raises(blocking.Unreachable):
            call(f"{front.root_url}/v1/models", context)
    with socket.create_connection(("127.0.0.1", front.port), timeout=10) as raw:
        raw.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")  # in clear
        answer = raw.recv(4096)
    assert not answer.startswith(b"HTTP/")
    assert sim.requests == []


@pytest.mark.parametrize("engine", ["command", "sglang"])
def test_an_engine_that_serves_other_nodes_is_fronted(
    tmp_path: Path, worker: SessionTls, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """build_server: an engine without TLS of its own stays on loopback with no key in its
    argv; the front's https URL is the server's once it is ready, and stopping the server
    stops the front."""
    import sys

    from tests.serving import fakesglang

    command: tuple[str, ...] = ()
    if engine == "command":
        command = (sys.executable, "-m", "pytest_modelbench.testing.simserver", "--port", "{port}")
    else:
        fakesglang.install(tmp_path, monkeypatch)
        monkeypatch.syspath_prepend(str(tmp_path / "fakesglang"))
    launch = Launch("m1", "sim-model", "sim-model", {}, 0, 30.0, engine=engine, command=command)
    listen = {"host": "127.0.0.1", "api_key": KEY, "tls": worker}
    server = build_server(launch, None, tmp_path / "server.log", tmp_path, listen)
    assert isinstance(server, FrontedServer)
    inner = server.server
    server.start(30.0)
    try:
        assert server.lend_url.startswith("https://127.0.0.1:")
        assert inner.base_url.startswith("http://127.0.0.1:")
        assert server.base_url == inner.base_url  # its own worker's items: no front between
        argv = inner.process.argv  # type: ignore[attr-defined]
        assert KEY not in " ".join(argv) and "--api-key" not in argv
        assert argv[argv.index("--port") + 1] == str(urllib.parse.urlsplit(inner.base_url).port)
        reply = call(f"{server.lend_url}/models", worker.client_context())
        assert reply.status == 200 and b"sim-model" in reply.body
        assert call(f"{server.lend_url}/models", worker.client_context(), "no").status == 401
        front_url = server.lend_url
    finally:
        server.stop()
    assert not inner.is_alive()
    with pytest.raises(blocking.Unreachable):
        call(f"{front_url}/models", worker.client_context())
    if engine == "sglang":
        (started,) = fakesglang.starts(tmp_path / "sglang-starts.jsonl")
        assert started["host"] == "127.0.0.1" and started["api_key"] is None


def test_the_front_passes_each_event_on_as_it_comes(recorder: Recorder, worker: SessionTls) -> None:
    """The engine sends its second event only once the client has read the first: a front
    that held the answer back until its end would keep the client waiting for it."""
    import aiohttp

    url, seen, first_read = recorder
    proxy = TlsFront(url, worker, KEY, host="127.0.0.1")
    proxy.start()

    async def read() -> bytes:
        connector = aiohttp.TCPConnector(ssl=worker.client_context())
        async with aiohttp.ClientSession(connector=connector) as session:
            headers = {"Authorization": f"Bearer {KEY}"}
            async with session.post(f"{proxy.root_url}/v1/stream", headers=headers) as answer:
                first = await answer.content.readuntil(b"\n\n")
                first_read.set()
                return first + await answer.content.read()

    try:
        body = asyncio.run(read())
    finally:
        proxy.stop()
    assert body == b'data: {"a": 1}\n\ndata: \xff\x00binary\n\ndata: [DONE]\n\n'
    assert seen[-1]["first event read"] is True


def test_a_fronted_server_restarted_after_its_engine_died_serves_at_the_same_url(
    tmp_path: Path, worker: SessionTls
) -> None:
    """The slot restarts a dead server once: the engine starts again, the front stays."""
    import os
    import signal
    import sys

    command = (sys.executable, "-m", "pytest_modelbench.testing.simserver", "--port", "{port}")
    launch = Launch("m1", "sim-model", "sim-model", {}, 0, 30.0, engine="command", command=command)
    listen = {"host": "127.0.0.1", "api_key": KEY, "tls": worker}
    server = build_server(launch, None, tmp_path / "server.log", tmp_path, listen)
    assert isinstance(server, FrontedServer)
    server.start(30.0)
    try:
        url = server.lend_url
        os.kill(server.server.process.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while server.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.is_alive()
        assert "killed by signal 9" in (server.death_report() or "")
        assert call(f"{url}/models", worker.client_context()).status == 502
        server.restart(30.0)
        assert server.is_alive() and server.lend_url == url
        assert call(f"{url}/models", worker.client_context()).status == 200
    finally:
        server.stop()
