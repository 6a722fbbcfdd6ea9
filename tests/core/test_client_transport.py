"""The client on aiohttp against small real servers: framing, keep-alive, the pool's retry
policy, routing over several URLs, errors that say what happened (TLS, redirects, encodings)."""

from __future__ import annotations

import asyncio
import gzip
import inspect
import json
import socket
import ssl
import struct
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.running.client import (
    Completion,
    EndpointUnavailable,
    OpenAIClient,
    RequestFailed,
    RetryPolicy,
)
from pytest_modelbench.running.urls import UrlSet

CHAT = "/chat/completions"


@dataclass
class Seen:
    """One request as the server read it."""

    conn: int  # 1-based connection number
    nth: int  # 0-based request number on that connection
    method: str
    target: str
    version: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def prompt(self) -> str:
        payload = json.loads(self.body)
        if "messages" in payload:
            return str(payload["messages"][0]["content"])
        return str(payload["prompt"])


@dataclass
class Reply:
    """What the server writes back: bytes (in pieces, if several), then maybe a close."""

    data: bytes | Sequence[bytes] = b""
    close: bool = False
    reset: bool = False  # close with an RST


Respond = Callable[[Seen], "Reply | bytes | Awaitable[Reply | bytes]"]


class RawServer:
    """An HTTP/1.1 server on a raw socket that answers each request with ``respond``."""

    def __init__(
        self, respond: Respond, *, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.respond = respond
        self.tls = tls
        self.host = host
        self.connections = 0
        self.requests: list[Seen] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, self.host, 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def url(self, path: str = "/v1") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        conn = self.connections
        try:
            for nth in range(1_000_000):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, version = lines[0].split(" ")
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                seen = Seen(conn, nth, method, target, version, headers, body)
                self.requests.append(seen)
                reply = self.respond(seen)
                if inspect.isawaitable(reply):
                    reply = await reply
                if isinstance(reply, bytes):
                    reply = Reply(reply)
                pieces = [reply.data] if isinstance(reply.data, bytes) else reply.data
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)  # let the client read each piece on its own
                if reply.reset:
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                if reply.close or reply.reset:
                    return
        except (ConnectionError, ssl.SSLError, asyncio.CancelledError):
            return  # a cancelled handler is the server stopping
        finally:
            writer.close()
            self._tasks.discard(task)


def http(
    body: bytes = b"",
    status: int = 200,
    *,
    headers: Sequence[tuple[str, str]] = (),
    version: str = "HTTP/1.1",
    length: bool = True,
) -> bytes:
    """A whole response; ``Content-Length`` unless ``length`` is false."""
    lines = [f"{version} {status} {HTTPStatus(status).phrase}", *(f"{k}: {v}" for k, v in headers)]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def answer(text: str) -> bytes:
    """A completion body that answers ``text`` (to chat and to plain completions)."""
    return json.dumps(
        {
            "id": "cmpl-1",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "text": text,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2},
        }
    ).encode()


def echo(seen: Seen) -> bytes:
    """Answer each request with its own prompt."""
    return http(answer(seen.prompt), headers=[("Content-Type", "application/json")])


def chunked(body: bytes, size: int) -> list[bytes]:
    """A chunked response in pieces: upper-case hex sizes, extensions on every other chunk,
    two trailers."""
    pieces = [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ]
    for n, start in enumerate(range(0, len(body), size)):
        piece = body[start : start + size]
        ext = f';ext{n}="v"' if n % 2 else ""
        pieces.append(f"{len(piece):X}{ext}\r\n".encode() + piece + b"\r\n")
    pieces.append(b"0\r\nX-Checksum: abc\r\nX-Count: 2\r\n\r\n")
    return pieces


def client(
    *urls: str | UrlSet, retries: int = 2, timeout_s: float = 5.0, api_key: str | None = None
) -> OpenAIClient:
    """A client with tiny backoff, so retries cost no time."""
    first = urls[0]
    return OpenAIClient(
        first if isinstance(first, UrlSet) else [str(u) for u in urls],
        api_key=api_key,
        timeout_s=timeout_s,
        retry=RetryPolicy(max_retries=retries, backoff_s=0.001, max_backoff_s=0.002),
    )


def chat(prompt: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}


def run(respond: Respond, *prompts: str, **options: Any) -> tuple[list[Completion], RawServer]:
    """Send ``prompts`` one after another to a fresh server; the completions and the server."""

    async def go() -> tuple[list[Completion], RawServer]:
        async with RawServer(respond) as server, client(server.url(), **options) as c:
            return [await c.request(CHAT, chat(p)) for p in prompts], server

    return asyncio.run(go())


def fails(
    respond: Respond, *, first: str | None = None, **options: Any
) -> tuple[RequestFailed, RawServer]:
    """Send one request that must fail for good (after ``first``, which must succeed);
    the failure and the server."""

    async def go() -> tuple[RequestFailed, RawServer]:
        async with RawServer(respond) as server, client(server.url(), **options) as c:
            if first is not None:
                assert (await c.request(CHAT, chat(first))).text == first
            with pytest.raises(RequestFailed) as info:
                await c.request(CHAT, chat("q"))
            return info.value, server

    return asyncio.run(go())


# framing


def test_content_length_response_and_the_request_on_the_wire() -> None:
    (done,), server = run(echo, "what is 2 + 2?", api_key="sk-test")
    assert done.text == "what is 2 + 2?" and done.finish_reason == "stop"
    assert (done.prompt_tokens, done.completion_tokens, done.attempts) == (7, 2, 1)
    assert done.retry_reasons == []
    (seen,) = server.requests
    assert (seen.method, seen.target, seen.version) == ("POST", "/v1/chat/completions", "HTTP/1.1")
    assert seen.headers["host"] == f"127.0.0.1:{server.port}"
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["authorization"] == "Bearer sk-test"
    assert seen.headers["content-length"] == str(len(seen.body))
    assert json.loads(seen.body) == chat("what is 2 + 2?")


def test_chunked_response_with_extensions_and_trailers_keeps_the_connection() -> None:
    def respond(seen: Seen) -> Reply:
        return Reply(chunked(answer(seen.prompt * 20), size=13))

    done, server = run(respond, "first", "second", "third")
    assert [c.text for c in done] == ["first" * 20, "second" * 20, "third" * 20]
    assert server.connections == 1  # the trailers were consumed: the next response parsed


def test_chunked_response_split_into_single_bytes() -> None:
    def respond(seen: Seen) -> Reply:
        data = b"".join(chunked(answer(seen.prompt), size=5))
        return Reply([data[i : i + 1] for i in range(len(data))])

    done, server = run(respond, "one", "two")
    assert [c.text for c in done] == ["one", "two"] and server.connections == 1


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("GZip", gzip.compress),
    ],
)
def test_compressed_response_is_decoded(encoding: str, compress: Callable[[bytes], bytes]) -> None:
    def respond(seen: Seen) -> bytes:
        return http(compress(answer(seen.prompt)), headers=[("Content-Encoding", encoding)])

    done, server = run(respond, "packed", "again")
    assert [c.text for c in done] == ["packed", "again"] and server.connections == 1


def test_compressed_chunked_response_is_decoded() -> None:
    def respond(seen: Seen) -> Reply:
        pieces = chunked(gzip.compress(answer(seen.prompt)), size=16)
        pieces[0] = pieces[0].replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n")
        return Reply(pieces)

    (done,), _ = run(respond, "zipped in chunks")
    assert done.text == "zipped in chunks"


def test_response_delimited_by_the_server_closing() -> None:
    def respond(seen: Seen) -> Reply:
        return Reply(http(answer(seen.prompt), length=False), close=True)

    done, server = run(respond, "a", "b")
    assert [c.text for c in done] == ["a", "b"]
    assert server.connections == 2 and [s.conn for s in server.requests] == [1, 2]


@pytest.mark.parametrize(
    "head",
    [
        {"headers": [("Connection", "close")]},
        {"headers": [("connection", "Close")]},
        {"version": "HTTP/1.0"},
    ],
    ids=["connection-close", "connection-close-lower", "http10"],
)
def test_response_that_does_not_keep_the_connection(head: dict[str, Any]) -> None:
    """The server leaves the socket open; the client must still not send on it again."""

    def respond(seen: Seen) -> bytes:
        return http(answer(seen.prompt), **head)

    done, server = run(respond, "a", "b", "c")
    assert [c.text for c in done] == ["a", "b", "c"]
    assert server.connections == 3 and {s.nth for s in server.requests} == {0}


def test_http10_response_delimited_by_close() -> None:
    def respond(seen: Seen) -> Reply:
        return Reply(http(answer(seen.prompt), version="HTTP/1.0", length=False), close=True)

    done, server = run(respond, "old", "school")
    assert [c.text for c in done] == ["old", "school"] and server.connections == 2


def test_interim_100_continue_and_103_are_skipped() -> None:
    def respond(seen: Seen) -> Reply:
        return Reply(
            [
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n",
                echo(seen),
            ]
        )

    done, server = run(respond, "patience", "again")
    assert [c.text for c in done] == ["patience", "again"] and server.connections == 1


# keep-alive


def test_sequential_requests_and_preflight_share_one_connection() -> None:
    def respond(seen: Seen) -> bytes:
        if seen.target == "/v1/models":
            return http(json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())
        return echo(seen)

    async def go() -> RawServer:
        async with RawServer(respond) as server, client(server.url()) as c:
            assert await c.preflight("m") == ["m"]
            for i in range(20):
                assert (await c.request(CHAT, chat(f"q{i}"))).text == f"q{i}"
            return server

    server = asyncio.run(go())
    assert server.connections == 1 and [s.nth for s in server.requests] == list(range(21))
    get = server.requests[0]
    assert (get.method, get.target, get.body) == ("GET", "/v1/models", b"")
    assert "content-length" not in get.headers


def test_error_responses_keep_the_connection() -> None:
    def respond(seen: Seen) -> bytes:
        if seen.nth % 2 == 0:
            return http(b'{"error": {"message": "busy"}}', 503)
        return echo(seen)

    (done,), server = run(respond, "after a 503")
    assert done.text == "after a 503" and done.retry_reasons == ["HTTP 503"]
    assert server.connections == 1


def test_server_closing_an_idle_connection_is_not_an_error() -> None:
    """The server closes each connection right after answering, without saying so; the
    client has seen the close before its next request."""
    pause_s = 0.1

    def respond(seen: Seen) -> Reply:
        return Reply(echo(seen), close=True)

    async def go() -> tuple[list[Completion], RawServer]:
        async with RawServer(respond) as server, client(server.url()) as c:
            done = []
            for prompt in ("a", "b", "c"):
                done.append(await c.request(CHAT, chat(prompt)))
                await asyncio.sleep(pause_s)
            return done, server

    done, server = asyncio.run(go())
    assert [c.text for c in done] == ["a", "b", "c"]
    assert [(c.attempts, c.retry_reasons) for c in done] == [(1, [])] * 3
    assert server.connections == 3 and {s.nth for s in server.requests} == {0}


def test_idle_connection_closed_as_the_request_arrives_is_retried() -> None:
    """A kept-alive connection the server drops when the next request comes costs an attempt
    (aiohttp resends only idempotent requests itself; ``KEEPALIVE_S`` closes idle connections
    before common servers do, so this race is rare); the retry goes on a new connection."""

    def respond(seen: Seen) -> Reply:
        return Reply(close=True) if seen.nth else Reply(echo(seen))

    done, server = run(respond, "a", "b", "c", retries=1)
    assert [c.text for c in done] == ["a", "b", "c"]
    assert [(c.attempts, c.retry_reasons) for c in done] == [
        (1, []),
        (2, ["connection error: closed without a response"]),
        (2, ["connection error: closed without a response"]),
    ]
    assert [(s.conn, s.nth) for s in server.requests] == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]


def test_idle_connection_that_answers_part_of_a_response_is_an_attempt() -> None:
    def respond(seen: Seen) -> Reply:
        return Reply(b"HTTP/1.1 200 OK\r\nContent-", close=True) if seen.nth else Reply(echo(seen))

    failure, server = fails(respond, retries=0, first="warm up")
    assert failure.attempts == 1 and "closed mid-response" in failure.reason
    assert [(s.conn, s.nth) for s in server.requests] == [(1, 0), (1, 1)]


def test_idle_connection_reset_as_the_request_arrives_is_an_attempt() -> None:
    """An RST after the server read the request is a server fault, not a keep-alive timeout."""

    def respond(seen: Seen) -> Reply:
        return Reply(reset=True) if seen.nth else Reply(echo(seen))

    failure, server = fails(respond, retries=0, first="warm up")
    assert failure.attempts == 1
    assert failure.retry_reasons == ["connection error: ConnectionResetError"]
    assert "last error: ConnectionResetError: Connection reset by peer" in failure.reason
    assert [(s.conn, s.nth) for s in server.requests] == [(1, 0), (1, 1)]


# errors


def test_server_closing_without_responding_is_retried_then_fails() -> None:
    failure, server = fails(lambda _seen: Reply(close=True), retries=2)
    assert failure.attempts == 3 and len(server.requests) == 3
    assert "closed without a response" in failure.reason
    assert failure.retry_reasons == ["connection error: closed without a response"] * 3


def test_server_closing_mid_response_is_retried() -> None:
    def respond(seen: Seen) -> Reply:
        if seen.conn == 1:
            return Reply(http(answer(seen.prompt))[:-5], close=True)
        return Reply(echo(seen))

    (done,), _ = run(respond, "cut short")
    assert done.text == "cut short" and done.attempts == 2
    assert len(done.retry_reasons) == 1 and "closed mid-response" in done.retry_reasons[0]


@pytest.mark.parametrize(
    "garbage",
    [b"SPAM SPAM SPAM\r\n\r\n", b"HTTP/1.1 OK\r\n\r\n", b"\x00\xff\xfe garbage\r\n\r\n"],
)
def test_garbage_status_line_is_retried_then_fails_clearly(garbage: bytes) -> None:
    failure, server = fails(lambda _seen: Reply(garbage), retries=1)
    assert failure.attempts == 2 and len(server.requests) == 2
    assert "unparseable response" in failure.reason
    assert server.connections == 2  # a connection that spoke garbage is not reused


def test_oversized_header_is_unparseable() -> None:
    huge = http(answer("x"), headers=[("X-Padding", "p" * 70_000)])
    failure, _ = fails(lambda _seen: Reply(huge), retries=0)
    assert "unparseable response" in failure.reason


def test_corrupt_gzip_body_is_retried() -> None:
    def respond(seen: Seen) -> bytes:
        if seen.conn == 1:
            return http(b"not gzip at all", headers=[("Content-Encoding", "gzip")])
        return echo(seen)

    (done,), _ = run(respond, "fine")
    assert done.text == "fine" and done.attempts == 2
    assert done.retry_reasons == ["bad Content-Encoding"]


@pytest.mark.parametrize("encoding", ["foo", "br, gzip"])
def test_an_encoding_nobody_decodes_fails_saying_so(encoding: str) -> None:
    """A ``Content-Encoding`` aiohttp does not decode (unknown, or ``br`` without Brotli) is
    not read as JSON: the error names the encoding."""
    body = gzip.compress(answer("x"))
    failure, _ = fails(
        lambda _seen: http(body, headers=[("Content-Encoding", encoding)]), retries=0
    )
    assert failure.retry_reasons == ["bad Content-Encoding"]
    assert "last error: bad Content-Encoding" in failure.reason
    assert "malformed" not in failure.reason


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_not_followed_and_the_error_names_its_target(status: int) -> None:
    target = "https://new-home.example/v1/chat/completions"

    async def go() -> tuple[RequestFailed, str, RawServer]:
        async with RawServer(
            lambda _s: http(b"", status, headers=[("Location", target)])
        ) as server:
            async with client(server.url(), retries=3) as c:
                with pytest.raises(RequestFailed) as info:
                    await c.request(CHAT, chat("q"))
                with pytest.raises(EndpointUnavailable) as down:
                    await c.preflight("m")
            return info.value, str(down.value), server

    failure, message, server = asyncio.run(go())
    assert failure.attempts == 1 and len(server.requests) == 2  # not retried, not followed
    assert f"HTTP {status} from {server.url()}/chat/completions: redirected to {target}" in (
        failure.reason
    )
    assert f"redirected to {target}; set api_base_url" in message
    assert "unreachable" not in message


def test_429_waits_for_retry_after() -> None:
    stamps: list[float] = []

    def respond(seen: Seen) -> bytes:
        stamps.append(time.monotonic())
        if len(stamps) == 1:
            return http(b'{"error": "slow down"}', 429, headers=[("Retry-After", "1")])
        return echo(seen)

    (done,), _ = run(respond, "patient", retries=3)
    assert done.text == "patient" and done.attempts == 2 and done.retry_reasons == ["HTTP 429"]
    assert stamps[1] - stamps[0] >= 0.9  # the backoff alone would be about a millisecond


def test_400_is_not_retried_and_carries_the_server_message() -> None:
    message = "This model's maximum context length is 4096 tokens"
    failure, server = fails(
        lambda _seen: http(json.dumps({"error": {"message": message}}).encode(), 400), retries=5
    )
    assert failure.attempts == 1 and len(server.requests) == 1
    assert "HTTP 400" in failure.reason and message in failure.reason
    assert failure.retry_reasons == []


def test_malformed_200_is_retried() -> None:
    def respond(seen: Seen) -> bytes:
        return http(b"<html>oops</html>") if seen.conn == 1 and seen.nth == 0 else echo(seen)

    (done,), server = run(respond, "proper")
    assert done.text == "proper" and done.retry_reasons == ["malformed response"]
    assert server.connections == 1


def test_timeout_is_retried_on_a_new_connection() -> None:
    async def respond(seen: Seen) -> bytes:
        if seen.conn == 1:
            await asyncio.sleep(60)  # cancelled when the server stops
        return echo(seen)

    (done,), server = run(respond, "slow then fast", timeout_s=0.2)
    assert done.text == "slow then fast" and done.attempts == 2
    assert done.retry_reasons == ["timeout after 0.2s"]
    assert server.connections == 2


def test_timeouts_exhaust_the_retries() -> None:
    async def respond(seen: Seen) -> bytes:
        await asyncio.sleep(60)
        return b""

    failure, server = fails(respond, retries=1, timeout_s=0.1)
    assert failure.attempts == 2 and "timeout after 0.1s" in failure.reason
    assert server.connections == 2


def test_refused_connection_fails_with_the_reason() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused

        async def go() -> tuple[RequestFailed, str]:
            async with client(f"http://127.0.0.1:{port}/v1", retries=1) as c:
                with pytest.raises(RequestFailed) as info:
                    await c.request(CHAT, chat("q"))
                with pytest.raises(EndpointUnavailable) as down:
                    await c.preflight("m")
            return info.value, str(down.value)

        failure, message = asyncio.run(go())
    assert failure.attempts == 2 and "ConnectionRefusedError" in failure.reason
    assert f"http://127.0.0.1:{port}/v1 is unreachable" in message
    assert "ConnectionRefusedError" in message and "start the server" in message


# concurrency


def test_50_concurrent_requests_each_get_their_own_answer() -> None:
    async def respond(seen: Seen) -> bytes:
        await asyncio.sleep(int(seen.prompt[3:]) % 7 * 0.003)  # answer out of order
        return echo(seen)

    async def go() -> tuple[list[Completion], RawServer]:
        async with RawServer(respond) as server, client(server.url()) as c:
            done = await asyncio.gather(*(c.request(CHAT, chat(f"id-{i}")) for i in range(50)))
            again = await asyncio.gather(*(c.request(CHAT, chat(f"re-{i}")) for i in range(50)))
            return [*done, *again], server

    done, server = asyncio.run(go())
    assert [c.text for c in done] == [f"id-{i}" for i in range(50)] + [f"re-{i}" for i in range(50)]
    assert all(c.attempts == 1 for c in done)
    assert server.connections == 50  # the second wave reused the first wave's connections
    assert len(server.requests) == 100


def test_concurrent_requests_spread_over_base_urls() -> None:
    async def respond(seen: Seen) -> bytes:
        await asyncio.sleep(0.01)
        return echo(seen)

    async def go() -> tuple[list[Completion], RawServer, RawServer]:
        async with RawServer(respond) as one, RawServer(respond) as two:
            async with client(one.url(), two.url("/v1/")) as c:
                done = await asyncio.gather(*(c.request(CHAT, chat(f"id-{i}")) for i in range(40)))
            return done, one, two

    done, one, two = asyncio.run(go())
    assert [c.text for c in done] == [f"id-{i}" for i in range(40)]
    assert len(one.requests) == len(two.requests) == 20


# TLS


def test_https_with_an_untrusted_certificate_fails_clearly(
    tls_server_context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)

    async def go() -> tuple[str, RequestFailed, RawServer]:
        async with RawServer(echo, tls=tls_server_context) as server:
            async with client(server.url(), retries=0) as c:
                with pytest.raises(EndpointUnavailable) as down:
                    await c.preflight("m")
                with pytest.raises(RequestFailed) as info:
                    await c.request(CHAT, chat("q"))
            return str(down.value), info.value, server

    message, failure, server = asyncio.run(go())
    assert message.startswith(f"endpoint {server.url()}: TLS verification failed: ")
    assert "self-signed certificate" in message and "SSL_CERT_FILE" in message
    assert "unreachable" not in message and "start the server" not in message
    assert failure.attempts == 1 and failure.reason.startswith("TLS verification failed")
    assert server.requests == []


def test_an_unreadable_ssl_cert_file_is_named(
    tls_server_context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))

    async def go() -> str:
        async with RawServer(echo, tls=tls_server_context) as server:
            async with client(server.url(), retries=0) as c:
                with pytest.raises(EndpointUnavailable) as down:
                    await c.preflight("m")
            return str(down.value)

    assert f"SSL_CERT_FILE={tmp_path / 'missing.pem'} cannot be read" in asyncio.run(go())


def test_https_with_a_trusted_certificate(
    certificate: tuple[Path, Path],
    tls_server_context: ssl.SSLContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))

    async def go() -> tuple[list[str], RawServer]:
        async with RawServer(echo, tls=tls_server_context) as server:
            async with client(server.url()) as c:
                texts = [(await c.request(CHAT, chat(f"secure {i}"))).text for i in range(3)]
            return texts, server

    texts, server = asyncio.run(go())
    assert texts == ["secure 0", "secure 1", "secure 2"]
    assert server.connections == 1
    assert server.requests[0].headers["host"] == f"127.0.0.1:{server.port}"


# URLs


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("", "/chat/completions"),
        ("/", "/chat/completions"),
        ("/v1", "/v1/chat/completions"),
        ("/v1/", "/v1/chat/completions"),
        ("/proxy/openai/v1//", "/proxy/openai/v1/chat/completions"),
    ],
)
def test_base_url_path_prefix(path: str, target: str) -> None:
    async def go() -> RawServer:
        async with RawServer(echo) as server, client(server.url(path)) as c:
            assert (await c.request(CHAT, chat("routed"))).text == "routed"
            assert (await c.request("/completions", {"prompt": "p"})).text == "p"
            return server

    server = asyncio.run(go())
    assert [s.target for s in server.requests] == [target, target.replace("/chat", "")]
    assert {s.headers["host"] for s in server.requests} == {f"127.0.0.1:{server.port}"}


def test_host_header_for_an_ipv6_address() -> None:
    async def go() -> Seen:
        try:
            async with RawServer(echo, host="::1") as server, client(server.url()) as c:
                assert (await c.request(CHAT, chat("six"))).text == "six"
        except OSError:
            pytest.skip("no IPv6 loopback")
        return server.requests[0]

    seen = asyncio.run(go())
    assert seen.headers["host"].startswith("[::1]:") and seen.target == "/v1/chat/completions"
