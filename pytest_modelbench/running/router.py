"""The worker's loopback router: one base URL that spreads over a model's whole URL set.

lm-eval and the verifiers harnesses take a single ``base_url``. Each gets a mount of this
router instead of the first configured URL: ``http://127.0.0.1:PORT/<token>/v1``, whose
requests go through an :class:`~.pool.EndpointPool` (least-busy routing over the live
:class:`~.pool.UrlSet`, the breaker, retries, dead-endpoint detection, the API key and the
item's ``extra_headers``, which win over the tool's own headers of the same name), so an
endpoint list and replicas joining mid-item work for every backend. A 200 whose body is an
error (``{"error": ...}``, as some gateways answer) reaches the tool with the error's status,
so lm-eval and the verifiers harnesses report the server's message instead of a missing
``choices``. Server-sent events
(verifiers asks for streamed chat completions) pass through chunk by chunk.

One router per process (an xdist worker), an ``aiohttp.web`` server on 127.0.0.1 in a daemon
thread with its own event loop, started on the first mount. The token is a random path
segment per mount: another local user cannot borrow the key the router adds.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from aiohttp import web

from pytest_modelbench.running.pool import EndpointPool, RequestFailed, Stream, error_status
from pytest_modelbench.secrets import redact

T = TypeVar("T")

# not forwarded: hop-by-hop headers, framing aiohttp redoes, and the caller's credentials
# (the pool sends the endpoint's own key)
_DROPPED = frozenset(
    {
        "host",
        "authorization",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "accept-encoding",
    }
)


def _redacted(body: bytes) -> bytes:
    """An upstream error body without any key or token in it (``secrets.redact``)."""
    text = body.decode("utf-8", "replace")
    shown = redact(text)
    return body if shown == text else shown.encode()


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "modelbench_router", "code": status}}
    return web.Response(status=status, body=json.dumps(body), content_type="application/json")


class Router:
    """Mounts endpoint pools on loopback, each under its own secret path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.ServerRunner | None = None
        self._port = 0
        self._mounts: dict[str, EndpointPool] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop, self._thread = start_loop("modelbench-router", self._serve)
            return self._loop

    async def _serve(self) -> None:
        server = web.Server(self._handle, access_log=None)
        runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    def close(self) -> None:
        """Stop serving (mounts still open are closed); a later mount starts it again."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        stop_loop(loop, thread, self._shutdown)

    async def _shutdown(self) -> None:
        pools = list(self._mounts.values())
        self._mounts.clear()
        for pool in pools:
            await pool.__aexit__(None, None, None)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- mounts ------------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._started()))

    async def _open(
        self,
        make: Callable[[], EndpointPool],
        ready: Callable[[EndpointPool], Awaitable[None]] | None,
    ) -> str:
        pool = make()
        pool.resolve()  # the proxies of its URLs, before NO_PROXY names loopback (see below)
        await pool.__aenter__()
        try:
            if ready is not None:
                await ready(pool)
        except BaseException:
            await pool.__aexit__(None, None, None)
            raise
        token = secrets.token_urlsafe(16)
        self._mounts[token] = pool
        return token

    async def _close(self, token: str) -> None:
        pool = self._mounts.pop(token, None)
        if pool is not None:
            await pool.__aexit__(None, None, None)

    def _url(self, token: str) -> str:
        return f"http://127.0.0.1:{self._port}/{token}/v1"

    @contextmanager
    def mount(
        self,
        make: Callable[[], EndpointPool],
        ready: Callable[[EndpointPool], Awaitable[None]] | None = None,
    ) -> Iterator[str]:
        """A loopback base URL whose requests go through the pool ``make`` builds (in the
        router's thread); ``ready(pool)`` (the pre-flight) runs first and raises here."""
        loop = self._started()
        token = asyncio.run_coroutine_threadsafe(self._open(make, ready), loop).result()
        try:
            with loopback_direct():
                yield self._url(token)
        finally:
            if self._loop is not None:
                asyncio.run_coroutine_threadsafe(self._close(token), self._loop).result(timeout=30)

    @asynccontextmanager
    async def amount(
        self,
        make: Callable[[], EndpointPool],
        ready: Callable[[EndpointPool], Awaitable[None]] | None = None,
    ) -> AsyncIterator[str]:
        """:meth:`mount` for a caller inside an event loop (which keeps running meanwhile)."""
        token = await self._run(self._open(make, ready))
        try:
            with loopback_direct():
                yield self._url(token)
        finally:
            if self._loop is not None:
                await self._run(self._close(token))

    # -- forwarding --------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        token, _, rest = request.path[1:].partition("/")
        pool = self._mounts.get(token)
        if pool is None or not rest.startswith("v1/"):
            return _error(404, f"{request.method} {request.path}: no such modelbench route")
        path = rest[2:]
        if request.query_string:
            path = f"{path}?{request.query_string}"
        body = await request.read() if request.body_exists else None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
        try:
            async with pool.exchange(request.method, path, body, headers=headers) as reply:
                if isinstance(reply, Stream):
                    return await _relay(request, reply)
                failed = error_status(reply.body) if reply.status == 200 else None
                status = failed or reply.status  # a 200 that is an error: the tool sees one
                return web.Response(
                    status=status,
                    # an error body may echo the key the gateway got: the tool logs it
                    body=_redacted(reply.body) if status >= 400 else reply.body,
                    headers={"Content-Type": reply.headers.get("Content-Type", "application/json")},
                )
        except RequestFailed as exc:
            return _error(503 if pool.dead is not None else 502, exc.reason)


async def _relay(request: web.BaseRequest, stream: Stream) -> web.StreamResponse:
    out = web.StreamResponse(
        status=stream.status,
        headers={
            "Content-Type": stream.headers.get("Content-Type", "text/event-stream"),
            "Cache-Control": "no-cache",
        },
    )
    await out.prepare(request)
    async for chunk in stream.chunks:
        await out.write(chunk)
    await out.write_eof()
    return out


_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy")
_LOOPBACK = "127.0.0.1"


@contextmanager
def loopback_direct() -> Iterator[None]:
    """While a tool talks to the router: ``NO_PROXY`` (both spellings) also names 127.0.0.1,
    so a tool that reads ``HTTP_PROXY`` (httpx, requests, lm-eval's aiohttp, a harness
    subprocess) reaches the router directly rather than through a proxy, which cannot reach
    this machine's loopback. Nothing changes without a proxy variable."""
    if not any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARS):
        yield
        return
    names = ("no_proxy", "NO_PROXY")
    saved = {name: os.environ.get(name) for name in names}
    current = saved["no_proxy"] if saved["no_proxy"] is not None else saved["NO_PROXY"]
    entries = [e for e in (current or "").split(",") if e.strip()]
    if _LOOPBACK not in entries and "*" not in entries:
        for name in names:
            os.environ[name] = ",".join([*entries, _LOOPBACK])
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def start_loop(
    name: str, setup: Callable[[], Coroutine[Any, Any, object]]
) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """A new event loop in a daemon thread, returned once ``setup()`` has run on it (a
    failure is raised here, and the loop stopped)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=run_forever, args=(loop,), name=name, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(setup(), loop).result(timeout=30)
    except BaseException:
        stop_loop(loop, thread)
        raise
    return loop, thread


def stop_loop(
    loop: asyncio.AbstractEventLoop,
    thread: threading.Thread,
    shutdown: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Run ``shutdown()`` on a loop of :func:`start_loop`, then stop it and its thread."""
    try:
        if shutdown is not None:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


def run_forever(loop: asyncio.AbstractEventLoop) -> None:
    """A background thread's event loop: runs until stopped, then cancels what is left and
    closes it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


_router = Router()


def worker_router() -> Router:
    """This process's router (it starts serving on its first mount)."""
    return _router
