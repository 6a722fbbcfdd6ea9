"""A mutual-TLS front for an engine server that serves other nodes: every engine is lent alike.

vLLM serves TLS itself (``--ssl-*``) and takes its key from the environment; SGLang, llama.cpp's
server, TGI and other ``command`` engines would show the key in their argv or serve in clear.
Such a server stays on 127.0.0.1 with no key, and :class:`TlsFront` listens on the node's
network in front of it: an ``aiohttp`` reverse proxy in a daemon thread with its own event loop
(as the exchange and the worker's router), with the certificate of the session's CA
(``serving/tls.py``). A client without a certificate of that CA is refused at the handshake; a
request without the session's server key (``Authorization: Bearer``, compared in constant
time) is answered 401 and never reaches the engine. Everything else is forwarded as it is:
method, path, query and body, then the engine's status, headers (minus hop-by-hop ones) and
body chunk by chunk as they come (server-sent events included), never through
``HTTP(S)_PROXY`` and never with the key.

:class:`FrontedServer` is the :class:`~pytest_modelbench.serving.base.ServerHandle` of an
engine server behind its front: its ``base_url`` is the front's https URL once the engine is
ready, and stopping it stops both.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

if TYPE_CHECKING:
    from pytest_modelbench.serving.base import ServerHandle
    from pytest_modelbench.serving.tls import SessionTls

__all__ = ["FrontedServer", "TlsFront"]

# hop-by-hop (RFC 9110 7.6.1), and framing that each side of the front redoes
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = _HOP | {"host", "authorization", "content-length"}  # the key stays here
_MAX_BODY = 256 * 1024 * 1024  # a request body (a long prompt); aiohttp's default is 1 MiB
_CHUNK = 64 * 1024


class TlsFront:
    """The mutual-TLS, keyed reverse proxy to one engine's loopback root URL."""

    def __init__(self, upstream: str, tls: SessionTls, api_key: str, host: str = "0.0.0.0") -> None:
        """``upstream``: the engine's root URL (``http://127.0.0.1:PORT``, read again at each
        request after :meth:`retarget`); ``host``: where the front listens."""
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.port = 0
        self._tls = tls
        self._expected = f"Bearer {api_key}".encode()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._client: ClientSession | None = None

    @property
    def root_url(self) -> str:
        """Where this node's own clients reach it (loopback when it listens everywhere)."""
        here = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"https://{f'[{here}]' if ':' in here else here}:{self.port}"

    def start(self) -> None:
        # lazily: the loop helpers live with the router (running/), loaded only for a front
        from pytest_modelbench.running.router import start_loop

        if self._loop is None:
            self._loop, self._thread = start_loop("modelbench-tls-front", self._serve)

    def retarget(self, upstream: str) -> None:
        """The engine moved (restarted on another port)."""
        self.upstream = upstream.rstrip("/")

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        from pytest_modelbench.running.router import stop_loop

        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            stop_loop(loop, thread, self._shutdown)

    async def _serve(self) -> None:
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(  # a client that leaves cancels its request to the engine
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=1.0,
            handler_cancellation=True,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0, ssl_context=self._tls.server_context())
        await site.start()
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        # never through HTTP(S)_PROXY (trust_env), no pool limit (the engine batches), the
        # engine's own content encoding passed on as it is
        self._client = ClientSession(
            connector=TCPConnector(limit=0),
            trust_env=False,
            auto_decompress=False,
            timeout=ClientTimeout(total=None, sock_connect=30),
        )

    async def _shutdown(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, self._expected):
            return web.json_response(
                {"error": {"message": "the session's server key is required", "code": 401}},
                status=401,
            )
        assert self._client is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        body = await request.read()
        response: web.StreamResponse | None = None
        try:
            async with self._client.request(
                request.method,
                f"{self.upstream}{request.rel_url}",
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
            ) as answer:
                response = web.StreamResponse(status=answer.status, reason=answer.reason)
                for name, value in answer.headers.items():
                    if name.lower() not in _HOP:
                        response.headers.add(name, value)
                await response.prepare(request)
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (ClientError, OSError) as exc:
            if response is not None and response.prepared:
                if request.transport is not None:  # the reply cannot be ended: drop it
                    request.transport.close()
                return response  # the engine or the client left mid-reply: dropped, no trace
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=499)  # the client left: nobody reads an answer
            return web.json_response(
                {"error": {"message": f"the engine behind the TLS front: {exc}", "code": 502}},
                status=502,
            )


class FrontedServer:
    """An engine server on loopback behind a :class:`TlsFront`: its own worker sends to the
    engine (``base_url``), other nodes to the front (``lend_url``, once ready)."""

    def __init__(self, server: ServerHandle, tls: SessionTls, api_key: str, host: str) -> None:
        self.server = server
        self._front = TlsFront("", tls, api_key, host)  # the engine's port: once it started
        self.context = tls.client_context()

    def _root(self) -> str:
        return self.server.base_url.removesuffix("/").removesuffix("/v1")

    @property
    def base_url(self) -> str:
        """The engine's own URL, on loopback: this worker's items go there directly."""
        return self.server.base_url

    @property
    def lend_url(self) -> str:
        """The front's https URL once ready: what other nodes are given."""
        return f"{self._front.root_url}/v1" if self._front.is_alive() else self.server.base_url

    @property
    def served_name(self) -> str:
        return self.server.served_name

    @property
    def log_path(self) -> Path | None:
        return getattr(self.server, "log_path", None)

    @property
    def gpus(self) -> Sequence[str]:
        return tuple(getattr(self.server, "gpus", ()) or ())

    def start(self, deadline_s: float) -> None:
        self.server.start(deadline_s)
        try:
            self._front.retarget(self._root())
            self._front.start()
        except BaseException:
            self.server.stop()
            raise

    def is_alive(self) -> bool:
        return self.server.is_alive() and self._front.is_alive()

    def restart(self, deadline_s: float | None = None) -> None:
        self.server.restart(deadline_s)
        self._front.retarget(self._root())
        self._front.start()

    def stop(self) -> None:
        try:
            self._front.stop()
        finally:
            self.server.stop()

    def cancel(self) -> None:
        """Stop it, and a start under way in another thread (when the engine can)."""
        cancel = getattr(self.server, "cancel", None)
        if cancel is not None:
            cancel()
        self.stop()

    def death_report(self) -> str | None:
        report = self.server.death_report()
        if report is None and self.server.is_alive() and not self._front.is_alive():
            return f"the TLS front of {self.server.served_name!r} stopped"
        return report

    def __repr__(self) -> str:
        return f"<FrontedServer {self.server!r} at {self.lend_url}>"
