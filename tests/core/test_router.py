"""The worker's loopback router: one base URL over a model's whole URL set, for the backends
that take a single base URL (lm-eval, verifiers). Requests spread over every URL, the key is
the endpoint's own (never the caller's), streams pass through chunk by chunk, errors keep
their status and text, and a request that fails for good is a 502 that says why."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import aiohttp
import pytest

from pytest_modelbench.errors import EvaluationError
from pytest_modelbench.running.endpoint import Endpoint
from tests.core.test_client_transport import RawServer, Seen, answer, echo, http

MODELS = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()


def serving(seen: Seen) -> bytes:
    """``m`` at ``/models``; every completion echoes its prompt."""
    return http(MODELS) if seen.target.endswith("/models") else echo(seen)


def endpoint(*urls: str, key: str | None = None) -> Endpoint:
    return Endpoint(base_urls=urls, served_model="m", api="chat", api_key=key, backoff_s=0.001)


async def post(url: str, payload: dict[str, Any], **headers: str) -> tuple[int, str, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=payload, headers=headers) as response,
    ):
        return response.status, response.content_type, await response.read()


def chat(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}], **extra}


def test_requests_spread_over_every_url_with_the_endpoints_own_key() -> None:
    async def go() -> tuple[list[tuple[int, str, bytes]], RawServer, RawServer, str]:
        async with RawServer(serving) as one, RawServer(serving) as two:
            target = endpoint(one.url(), two.url(), key="sk-endpoint-key-123456")
            async with target.asingle_url(timeout_s=5, max_retries=0) as base:
                sent = [
                    post(f"{base}/chat/completions", chat(f"q{i}"), Authorization="Bearer theirs")
                    for i in range(20)
                ]
                return list(await asyncio.gather(*sent)), one, two, base

    replies, one, two, base = asyncio.run(go())
    assert base.startswith("http://127.0.0.1:") and base.endswith("/v1")
    assert [json.loads(b)["choices"][0]["message"]["content"] for _, _, b in replies] == [
        f"q{i}" for i in range(20)
    ]
    completions = [s for s in [*one.requests, *two.requests] if s.target.endswith("completions")]
    assert len(completions) == 20 and one.requests and two.requests
    assert {s.headers["authorization"] for s in completions} == {"Bearer sk-endpoint-key-123456"}
    assert [s.target for s in one.requests[:1]] == ["/v1/models"]  # the pre-flight, per URL


def test_a_stream_passes_through_chunk_by_chunk() -> None:
    """The server sends its second event only once the caller has read the first one."""
    events = [b'data: {"choices": [{"delta": {"content": "he"}}]}\n\n', b"data: [DONE]\n\n"]

    async def go() -> list[bytes]:
        first_read = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [h for h in head.lower().split(b"\r\n") if h.startswith(b"content-len")]
                await reader.readexactly(int(length[0].split(b":")[1]) if length else 0)
                if head.startswith(b"GET"):
                    writer.write(http(MODELS))
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                for n, event in enumerate(events):
                    if n:
                        await first_read.wait()
                    writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        async with (
            server,
            endpoint(url).asingle_url(timeout_s=5, max_retries=0) as base,
            aiohttp.ClientSession() as session,
            session.post(f"{base}/chat/completions", json=chat("hi", stream=True)) as response,
        ):
            assert response.content_type == "text/event-stream"
            first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
            first_read.set()
            return [first, await asyncio.wait_for(response.content.read(), 10)]

    assert asyncio.run(go()) == events


def test_client_errors_keep_their_status_and_text() -> None:
    def respond(seen: Seen) -> bytes:
        if seen.target.endswith("/models"):
            return http(MODELS)
        return http(b'{"error": {"message": "context too long"}}', 400)

    async def go() -> tuple[int, str, bytes]:
        async with (
            RawServer(respond) as server,
            endpoint(server.url()).asingle_url(timeout_s=5, max_retries=3) as base,
        ):
            return await post(f"{base}/chat/completions", chat("q"))

    status, kind, body = asyncio.run(go())
    assert (status, kind) == (400, "application/json")
    assert json.loads(body)["error"]["message"] == "context too long"


def test_a_request_that_fails_for_good_is_a_502_saying_why_and_an_unknown_path_a_404() -> None:
    async def go() -> tuple[tuple[int, str, bytes], tuple[int, str, bytes]]:
        server = RawServer(serving)
        await server.__aenter__()
        async with endpoint(server.url()).asingle_url(timeout_s=5, max_retries=0) as base:
            await server.__aexit__()  # the server goes away after the pre-flight
            failed = await post(f"{base}/chat/completions", chat("q"))
            unknown = await post(base.replace("/v1", "x/v1") + "/chat/completions", chat("q"))
        return failed, unknown

    (status, _, body), (missing, _, _) = asyncio.run(go())
    assert status == 502 and "ConnectionRefusedError" in json.loads(body)["error"]["message"]
    assert missing == 404


def test_a_failed_pre_flight_is_raised_where_the_url_was_asked_for() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        with (
            pytest.raises(EvaluationError, match=f"endpoint {url} is unreachable"),
            endpoint(url).single_url(timeout_s=5, max_retries=0),
        ):
            pass


def test_the_answer_is_the_whole_body_when_not_streamed() -> None:
    big = "x" * 200_000

    def respond(seen: Seen) -> bytes:
        return http(MODELS) if seen.target.endswith("/models") else http(answer(big))

    async def go() -> bytes:
        async with (
            RawServer(respond) as server,
            endpoint(server.url()).asingle_url(timeout_s=5, max_retries=0) as base,
        ):
            return (await post(f"{base}/chat/completions", chat("q")))[2]

    assert json.loads(asyncio.run(go()))["choices"][0]["message"]["content"] == big


@pytest.mark.parametrize(
    ("error", "status"),
    [({"message": "model x not allowed", "code": 403}, 403), ({"message": "oops"}, 502)],
)
def test_a_200_that_is_an_error_reaches_the_tool_as_one(error: dict[str, Any], status: int) -> None:
    """A gateway's 200 with an error body: lm-eval and verifiers read a status, not the body,
    so the router gives them the error's own (else 502) with the server's message."""
    failing = json.dumps({"error": error}).encode()

    def gateway(seen: Seen) -> bytes:
        return http(MODELS) if seen.target.endswith("/models") else http(failing)

    async def go() -> tuple[int, str, bytes]:
        async with (
            RawServer(gateway) as server,
            endpoint(server.url()).asingle_url(timeout_s=5, max_retries=0) as base,
        ):
            return await post(f"{base}/chat/completions", chat("q"))

    got, _, body = asyncio.run(go())
    assert got == status and json.loads(body)["error"]["message"] == error["message"]


@pytest.mark.parametrize("status", [401, 200], ids=["error-status", "200-with-error"])
def test_an_upstream_error_body_reaches_the_tool_redacted(status: int) -> None:
    """Issue 43: a gateway that echoes the key it got; lm-eval and verifiers log error bodies."""
    key = "sk-endpoint-key-1234567890"
    echoed = json.dumps(
        {"error": {"message": f"Incorrect API key provided: {key}", "code": 401}}
    ).encode()

    def gateway(seen: Seen) -> bytes:
        return http(MODELS) if seen.target.endswith("/models") else http(echoed, status)

    async def go() -> tuple[int, str, bytes]:
        async with (
            RawServer(gateway) as server,
            endpoint(server.url(), key=key).asingle_url(timeout_s=5, max_retries=0) as base,
        ):
            return await post(f"{base}/chat/completions", chat("q"))

    got, _, body = asyncio.run(go())
    assert got == 401
    assert key not in body.decode()
    assert json.loads(body)["error"]["message"] == "Incorrect API key provided: [REDACTED]"
