"""A worker's channel to the session's exchange (``serving/exchange.py``): one WebSocket,
held open from the first call to the worker's end, for requests and the events pushed to it.

The connection is the worker's presence: a worker that closes it, or whose process ended
(the controller is told by xdist), has ended. A connection that drops (a network blip, or
this process stalled past the heartbeat) is made again, as the same worker, within
``RESUME_S``; the exchange keeps what the worker holds meanwhile, and replays the events
after the last one this worker received (its :class:`Hello` says which); a call whose effect
must not be lost (``messages.lasting``) is sent again once it is made again. A worker whose exchange
closes the connection, cannot be reached ``FAILURES`` times in a row, or is not reached again
within ``RESUME_S``, stops calling: the failure is kept in :attr:`ExchangeClient.failure`
for the worker to report (replicas only help).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pytest_modelbench.secrets import remember
from pytest_modelbench.serving.messages import (
    CLEAN_CLOSE,
    PATH,
    RESUME_S,
    Ack,
    Hello,
    Message,
    decode_frame,
    encode,
    lasting,
)
from pytest_modelbench.serving.tls import SessionTls

if TYPE_CHECKING:
    import ssl

    from aiohttp import ClientSession, ClientWebSocketResponse

FAILURES = 3  # connections in a row that fail before a worker stops calling
CALL_TIMEOUT_S = 5.0
HEARTBEAT_S = 10.0  # the exchange's silence this long (its node vanished) closes the socket
RETRY_S = 1.0  # while the connection is being made again, how often
WORKERINPUT_KEY = "modelbench_exchange"
HOST_ENV = "MODELBENCH_EXCHANGE_HOST"  # how a node reaches the controller, when ssh cannot say

__all__ = ["HOST_ENV", "WORKERINPUT_KEY", "ExchangeClient", "client_from", "this_node"]


def this_node() -> str:
    """This node, as the exchange tells nodes apart (host name and GPU claim directory)."""
    # lazily: serving loads only when a worker starts a server (pytest start-up)
    import socket

    from pytest_modelbench.serving.gpu_claims import default_lock_dir

    return f"{socket.gethostname()}:{default_lock_dir()}"


def client_from(
    workerinput: Mapping[str, Any] | None, environ: Mapping[str, str]
) -> ExchangeClient | None:
    """A worker's client for the exchange its controller runs, or None. The controller's
    address: ``$MODELBENCH_EXCHANGE_HOST``; on a node reached over the network, where its
    ssh session came from (``$SSH_CONNECTION``), else the controller's host name; on the
    controller's own node, loopback (a ``popen`` worker inherits the user's own ssh login)."""
    given = (workerinput or {}).get(WORKERINPUT_KEY)
    if not isinstance(given, Mapping):
        return None
    remember(str(given["server_key"]))  # redacted wherever a server echoes it
    host = environ.get(HOST_ENV, "")
    if not host and given.get("networked"):
        ssh = environ.get("SSH_CONNECTION", "").split()
        host = ssh[0] if ssh else str(given.get("host") or "")
    tls = given.get("tls")
    return ExchangeClient(
        host or "127.0.0.1",
        int(given["port"]),
        str(given["token"]),
        str(given["server_key"]),
        worker=str((workerinput or {}).get("workerid") or "worker"),
        local=bool(given.get("local")),
        nodes=int(given.get("nodes", 2)),
        tls=SessionTls.of(tls) if isinstance(tls, Mapping) else None,
    )


class ExchangeClient:
    """A worker's requests to the exchange (:meth:`call`, from any thread) and the events it
    pushes (given to :attr:`listener`, in the channel's thread: it must not block)."""

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        server_key: str,
        *,
        worker: str = "worker",
        local: bool = False,
        nodes: int = 2,
        tls: SessionTls | None = None,
    ) -> None:
        """``local``: every node of the session is this one (servers stay on loopback).
        ``tls``: the workers' material from the session's CA (the socket is wss)."""
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
        self.tls = tls
        self.worker = worker
        self._token = token
        self.server_key = server_key
        self.local = local
        self.nodes = nodes  # the session's nodes: with one, nobody serves another's item
        self.failure: str | None = None
        self._listeners: list[Callable[[Message], None]] = []
        self._on_failure: list[Callable[[], None]] = []
        self._failures = 0
        self._closed = False  # by this worker: no call starts the channel again
        self._resuming = False  # the connection dropped: made again until RESUME_S passes
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: ClientSession | None = None
        self._socket: ClientWebSocketResponse[bool] | None = None
        self._connecting: asyncio.Lock | None = None
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._ref = 0
        self._seen = 0  # the last event (seq) received: later ones are replayed on a resume
        self.context: ssl.SSLContext | None = None  # the socket, and servers of other nodes
        try:  # a full or read-only temp dir turns replicas across nodes off, never the items
            self.context = tls.client_context() if tls is not None else None
        except OSError as exc:  # ssl.SSLError is one
            self.failure = f"the session's TLS material could not be loaded ({exc})"

    def listen(self, listener: Callable[[Message], None]) -> None:
        """Give every event the exchange pushes to ``listener`` too (called in the channel's
        thread: it must not block)."""
        self._listeners.append(listener)

    def when_failed(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (in the channel's thread: it must not block) once the connection
        is lost for good and :attr:`failure` says why, so that nobody waits for an event that
        will never be pushed."""
        self._on_failure.append(callback)

    def call(self, message: Message) -> Message | None:
        """The exchange's reply to ``message``; None when it cannot be had."""
        if self.failure is not None:  # gone, or unreachable: replicas across nodes are off
            return None
        loop = self._start()
        if loop is None:  # closed by this worker
            return None
        future = asyncio.run_coroutine_threadsafe(self._call(message), loop)
        bound = CALL_TIMEOUT_S * 3 + (RESUME_S if lasting(message) else 0.0)
        try:
            reply = future.result(timeout=bound)
        except (OSError, ValueError, TimeoutError, asyncio.TimeoutError):
            future.cancel()  # a connection still being made is given up, not left running
            return None
        if isinstance(reply, Ack) and reply.error is not None:
            return None
        return reply

    @property
    def connected(self) -> bool:
        return self._socket is not None and not self._socket.closed

    def close(self) -> None:
        """Close the connection (the exchange takes it as this worker's end) and its thread."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            # lazily: aiohttp loads only for a session with an exchange
            from pytest_modelbench.running.router import stop_loop

            stop_loop(loop, thread, self._shutdown)

    def __repr__(self) -> str:
        return f"ExchangeClient({self.url})"

    # -- the channel's thread --------------------------------------------------------------
    def _start(self) -> asyncio.AbstractEventLoop | None:
        with self._lock:
            if self._loop is None and not self._closed:
                # lazily: aiohttp loads only for a session with an exchange
                from pytest_modelbench.running.router import start_loop

                async def setup() -> None:
                    self._connecting = asyncio.Lock()

                self._loop, self._thread = start_loop(f"modelbench-channel-{self.worker}", setup)
            return self._loop

    async def _call(self, message: Message) -> Message:
        """The reply to ``message``; one whose effect must not be lost is sent again while a
        dropped connection is being made again (within ``RESUME_S``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESUME_S
        while True:
            try:
                return await self._call_once(message)
            except (TimeoutError, asyncio.TimeoutError):
                raise  # no reply on a live connection: sent again, it would only pile up
            except OSError as exc:  # ConnectionError among them: the connection dropped
                again = not self._closed and self.failure is None and loop.time() < deadline
                if not (lasting(message) and again) or _refused(exc):  # refused: it has ended
                    raise
            await asyncio.sleep(min(RETRY_S, max(0.0, deadline - loop.time())))

    async def _call_once(self, message: Message) -> Message:
        socket = await self._connect()
        self._ref += 1
        ref = self._ref
        reply: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[ref] = reply
        try:
            await socket.send_str(encode(message, ref))
            return await asyncio.wait_for(reply, CALL_TIMEOUT_S)
        finally:
            self._pending.pop(ref, None)

    async def _connect(self) -> ClientWebSocketResponse[bool]:
        import aiohttp

        assert self._connecting is not None
        async with self._connecting:
            if self._socket is not None and not self._socket.closed:
                return self._socket
            if self._session is None:  # direct, even when the user has HTTP(S)_PROXY set
                self._session = aiohttp.ClientSession(
                    trust_env=False,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=CALL_TIMEOUT_S),
                )
            try:  # bounded as a whole: a peer may finish TLS and then never upgrade
                socket = await asyncio.wait_for(
                    self._session.ws_connect(
                        self.url + PATH,
                        headers={"Authorization": f"Bearer {self._token}"},
                        ssl=self.context if self.context is not None else False,
                        heartbeat=HEARTBEAT_S,
                        timeout=aiohttp.ClientWSTimeout(ws_close=CALL_TIMEOUT_S),
                    ),
                    CALL_TIMEOUT_S,
                )
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                self._failures += 0 if self._resuming else 1  # resuming: RESUME_S decides
                if self._failures >= FAILURES:
                    self.failure = f"the session's exchange at {self.url} did not answer ({exc})"
                raise OSError(str(exc)) from exc
            self._failures = 0
            self._socket = socket
            asyncio.get_running_loop().create_task(self._read(socket))
            self._ref += 1
            hello: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            self._pending[self._ref] = hello
            try:
                await socket.send_str(encode(Hello(self.worker, seen=self._seen), self._ref))
                answer = await asyncio.wait_for(hello, CALL_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
                # not greeted: not a connection to call on (calls would get "hello first")
                if self._socket is socket:
                    self._socket = None
                await _abandon(socket, DROPPED)
                raise OSError(f"the session's exchange did not answer its hello ({exc})") from exc
            if isinstance(answer, Ack) and answer.error is not None:  # refused for good
                self.failure = f"the session's exchange at {self.url} refused: {answer.error}"
                await socket.close()
                raise OSError(self.failure)
            return socket

    async def _read(self, socket: ClientWebSocketResponse[bool]) -> None:
        """Replies to their calls, events to the listener, until the connection ends: however
        it ends (the exchange closed it, or the socket failed, as when a pong cannot be sent
        after this process stalled past the heartbeat), the worker is told and its pending
        calls fail at once."""
        import aiohttp

        why = "closed the connection"
        dropped = False
        try:
            async for frame in socket:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue
                try:
                    ref, seq, message = decode_frame(frame.data)
                except ValueError:
                    continue
                waiter = self._pending.get(ref) if ref else None
                if waiter is not None and not waiter.done():
                    waiter.set_result(message)
                elif not ref and (not seq or seq > self._seen):  # not one seen already
                    self._seen = max(self._seen, seq)
                    self._tell(message)
            dropped = socket.close_code not in CLEAN_CLOSE  # nobody closed it on purpose
        except Exception as exc:  # a socket that fails: the connection is made again
            why = f"could not be read ({type(exc).__name__}: {exc})"
            dropped = True
        finally:
            if self._socket is socket:  # never used again, whatever state it is in
                self._socket = None
                if not socket.closed:  # not a clean close: the exchange waits for a resume
                    asyncio.get_running_loop().create_task(_abandon(socket, DROPPED))
            why = f"the session's exchange at {self.url}: the connection {why}"
            if dropped and not self._closed and self.failure is None:
                self._dropped(why)
            else:
                self._lost(why)

    def _dropped(self, why: str) -> None:
        """The connection dropped: calls pending on it fail, and it is made again (as this
        worker) in the background, until ``RESUME_S`` passes."""
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError(why))
        if not self._resuming:
            self._resuming = True
            asyncio.get_running_loop().create_task(self._resume(why))

    async def _resume(self, why: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESUME_S
        lost = f"{why}, and was not made again within {RESUME_S:.0f} s"
        try:
            while not self._closed and self.failure is None:
                try:
                    await self._connect()
                    return
                except OSError as exc:  # refused, unreachable, or no hello answered
                    if _refused(exc):  # nothing listens where the exchange was: it has ended
                        lost = f"{why}, and the exchange no longer listens"
                        break
                    if loop.time() >= deadline:
                        break
                    await asyncio.sleep(min(RETRY_S, max(0.0, deadline - loop.time())))
        finally:
            self._resuming = False
        self._lost(lost)

    def _tell(self, message: Message) -> None:
        for listener in list(self._listeners):
            try:
                listener(message)
            except Exception:  # a listener's bug must not close the channel
                continue

    def _lost(self, why: str) -> None:
        """The connection ended: unless this worker closed it, calls stop, pending ones fail,
        and whoever waits for an event is told."""
        if not self._closed and self.failure is None:  # not closed by this worker
            self.failure = why
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError(self.failure or "closed"))
        if self.failure is None:
            return
        for callback in list(self._on_failure):
            try:
                callback()
            except Exception:  # a callback's bug must not hide the failure from the others
                continue

    async def _shutdown(self) -> None:
        if self._socket is not None:
            await _abandon(self._socket)
        if self._session is not None:
            await self._session.close()


DROPPED = 1011  # a close that is no worker's end (a failed read, an unanswered hello)


async def _abandon(socket: ClientWebSocketResponse[bool], code: int = 1000) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(socket.close(code=code), CALL_TIMEOUT_S)


def _refused(exc: BaseException) -> bool:
    """Whether a connect failed because nothing listens there (the controller's exchange
    stopped), not because the network dropped (which a resume rides out)."""
    cause = exc.__cause__
    return isinstance(cause, ConnectionRefusedError) or isinstance(
        getattr(cause, "os_error", None), ConnectionRefusedError
    )
