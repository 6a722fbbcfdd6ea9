"""A simulated OpenAI-compatible server for load, latency and fault-injection tests.

It serves ``/health``, ``/v1/models``, ``/v1/chat/completions`` and
``/v1/completions`` on 127.0.0.1. A request holds one of ``slots`` slots for its
latency (like a server's batch width), answers right with a known probability
(:mod:`.policy`), and meets faults at configured rates (:mod:`.faults`); every
request lands in a log (:mod:`.reqlog`) that tests assert on::

    with SimServer(SimConfig(slots=8, latency=Latency.fixed(0.01), accuracy=0.7)) as srv:
        run_client(srv.base_url)            # "http://127.0.0.1:PORT/v1"
        assert srv.max_in_flight <= 8

Per-request randomness (fault, latency) comes from a hash of the config seed
and the request (path, model, key, seed, attempt number), so the same requests
meet the same faults in every run, whatever order they arrive in.

Run it as a process with ``python -m pytest_modelbench.testing --help``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import signal
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

from aiohttp import web

from pytest_modelbench.running.router import start_loop, stop_loop
from pytest_modelbench.testing import wire
from pytest_modelbench.testing.cli import build_parser, config_from_args
from pytest_modelbench.testing.faults import FaultKind, Faults, Latency
from pytest_modelbench.testing.reqlog import Outcome, Pending, RequestLog, RequestRecord
from pytest_modelbench.testing.simconfig import SimConfig, needs_draws
from pytest_modelbench.testing.slots import SlotGate

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "Faults", "Latency", "SimConfig", "SimServer"]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

_SCALE = float(1 << 64)
_EFFORT = {"minimal": 0.25, "low": 0.5, "medium": 1.0, "high": 2.0}  # reasoning_effort scale
_THINKING = [
    "hmm",
    "let",
    "me",
    "work",
    "through",
    "this",
    "carefully",
    "one",
    "step",
    "at",
    "a",
    "time",
]


_ROUTES = {
    ("GET", "/health"): "health",
    ("GET", "/v1/models"): "models",
    ("GET", "/version"): "version",
    ("POST", CHAT_PATH): "chat",
    ("POST", COMPLETIONS_PATH): "completions",
}


class SimServer:
    """The simulated server, in a background thread (``with``) or your event loop (``async with``).

    ``stop()`` then ``start()`` serves again on the same port, like a server
    that died and came back; requests in flight at ``stop()`` have their
    connections dropped. The request log survives restarts (see :meth:`clear_log`).
    """

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **changes: Any,
    ) -> None:
        """``ssl_context``: serve TLS with it (``https://``), as an engine given a certificate."""
        self._ssl = ssl_context
        config = config or SimConfig()
        self._config = replace(config, **changes) if changes else config
        self._policy = self._config.policy
        self._draws = needs_draws(self._config)
        self.log = RequestLog()
        self._port = self._config.port
        self._ids = itertools.count(1)
        self._runner: web.ServerRunner | None = None
        self._slots: SlotGate | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._hanging: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- addresses ---------------------------------------------------------------------

    @property
    def config(self) -> SimConfig:
        """The configuration in force."""
        return self._config

    @property
    def host(self) -> str:
        return self._config.host

    @property
    def port(self) -> int:
        """The bound port (0 before the first start with ``port=0``)."""
        return self._port

    @property
    def url(self) -> str:
        """The server root, e.g. ``http://127.0.0.1:8123`` (``/health`` lives here)."""
        return f"{'https' if self._ssl else 'http'}://{self.host}:{self._port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:8123/v1``."""
        return self.url + "/v1"

    @property
    def running(self) -> bool:
        return self._runner is not None

    # -- the request log ---------------------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        """A snapshot of every finished request, in completion order."""
        return self.log.records

    @property
    def counts(self) -> Counter[str]:
        """Finished requests per outcome (``ok``, ``5xx``, ``429``, ``timeout`` ...)."""
        return self.log.counts

    @property
    def max_in_flight(self) -> int:
        """The most requests that held a slot at once."""
        return self.log.max_in_flight

    @property
    def in_flight(self) -> int:
        """Requests holding a slot now."""
        return self.log.in_flight

    @property
    def max_pending(self) -> int:
        """The most requests open at once (holding or waiting for a slot, or hanging)."""
        return self.log.max_pending

    def answers_per_key(self) -> Counter[str]:
        """Successful answers per key; a count above 1 means the client asked twice."""
        return self.log.answers_per_key()

    def clear_log(self) -> None:
        """Forget the request log (records, counters, attempt numbers, maxima)."""
        self.log.clear()

    def expected_accuracy(self, keys: Iterable[str], seed: int | None = None) -> float:
        """The true accuracy the client should measure on ``keys`` under request ``seed``."""
        return self._policy.expected_accuracy(keys, seed)

    def reconfigure(self, **changes: Any) -> SimConfig:
        """Change the configuration of a running server (faults, latency, accuracy, ...).

        Requests that arrive afterwards see the change; ``slots`` gets a new
        gate, so requests already waiting keep the old one. ``host`` and
        ``port`` cannot change while running.
        """
        if self.running and {"host", "port"} & changes.keys():
            raise ValueError("SimServer.reconfigure: stop the server before changing host/port")
        config = replace(self._config, **changes)
        if self.running and config.slots != self._config.slots:
            self._slots = SlotGate(config.slots)
        self._config = config
        self._policy = config.policy
        self._draws = needs_draws(config)
        return config

    # -- lifecycle in the caller's event loop --------------------------------------------

    async def astart(self) -> SimServer:
        """Bind and serve in the running event loop (the same port as before on a restart)."""
        if self._runner is not None:
            raise RuntimeError("SimServer is already running")
        config = self._config
        self._slots = SlotGate(config.slots)
        # The low-level server skips aiohttp's router and middlewares: less per-request work.
        server = web.Server(self._dispatch, access_log=None)
        runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, config.host, self._port, backlog=4096, ssl_context=self._ssl)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._port = int(runner.addresses[0][1])
        if config.log_path is not None:
            self.log.open_sink(config.log_path)
        self._runner = runner
        return self

    async def astop(self) -> None:
        """Stop serving: drop every open request's connection, then close the port."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        await runner.cleanup()
        self.log.close_sink()

    async def __aenter__(self) -> SimServer:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.astop()

    # -- lifecycle in a background thread ----------------------------------------------

    def start(self) -> SimServer:
        """Serve from a background thread with its own event loop; returns once bound."""
        if self._thread is not None:
            raise RuntimeError("SimServer is already running")
        self._loop, self._thread = start_loop("modelbench-simserver", self.astart)
        return self

    def stop(self) -> None:
        """Stop a server started with :meth:`start` (in flight requests get dropped)."""
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None and thread is not None:
            stop_loop(loop, thread, self.astop)

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<SimServer {self.base_url} {state} slots={self._config.slots}>"

    # -- handlers ----------------------------------------------------------------------

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request, with the bookkeeping every request gets (log, stop, hang).

        Routing is a dict lookup and the completion endpoints parse inline, so a
        request costs two coroutine frames, not a router and a middleware chain.
        """
        path = request.path
        key = self._config.api_key
        if (
            key is not None
            and path.startswith("/v1")
            and not hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {key}")
        ):
            return wire.json_response(wire.error_body("Unauthorized", wire.INVALID, 401), 401)
        route = _ROUTES.get((request.method, path))
        if route is None:
            if request.method == "GET" and path.startswith("/v1/models/"):
                route = "model"
            else:
                status = 405 if any(p == path for _, p in _ROUTES) else 404
                message = f"{request.method} {path} is not served by the simulator"
                return wire.json_response(wire.error_body(message, wire.INVALID, status), status)
        log = self.log
        pending = Pending(path, time.monotonic())
        task = request.task
        self._tasks.add(task)
        log.arrive()
        try:
            if self._config.faults.hang_forever:
                self._hanging.add(task)
                if route == "chat" or route == "completions":
                    await self._note_hung(request, pending, chat=route == "chat")
                await asyncio.Event().wait()  # until astop() cancels it
            if route == "chat" or route == "completions":
                body = self._parse_body(await request.read(), pending)
                chat = route == "chat"
                keys, prompt_tokens = wire.chat_keys(body) if chat else wire.completion_keys(body)
                return await self._generate(request, pending, body, keys, prompt_tokens, chat)
            return self._answer_info(route, pending)
        except wire.BadRequest as bad:
            self._record(pending, "client_error", bad.status, bad.code)
            return wire.json_response(
                wire.error_body(bad.message, wire.INVALID, bad.code), bad.status
            )
        except asyncio.CancelledError:
            outcome: Outcome = "aborted"
            if task in self._hanging:
                outcome = "hang"
            elif pending.fault == "timeout":
                outcome = "timeout"
            self._record(pending, outcome, 0, "server stopped")
            wire.drop_connection(request, rst=False)
            raise
        finally:
            log.pending -= 1
            self._tasks.discard(task)
            self._hanging.discard(task)

    async def _note_hung(self, request: web.BaseRequest, pending: Pending, *, chat: bool) -> None:
        """Read a request about to hang (best effort), so its record names the model, key and seed."""
        try:
            body = self._parse_body(await request.read(), pending)
            keys, _ = wire.chat_keys(body) if chat else wire.completion_keys(body)
        except wire.BadRequest:
            return
        pending.key = keys[0]

    def _record(self, pending: Pending, outcome: Outcome, status: int, detail: str = "") -> None:
        self.log.add(
            (
                pending.path,
                pending.model,
                pending.key,
                pending.seed,
                outcome,
                status,
                pending.start,
                time.monotonic(),
                pending.attempt,
                pending.queued,
                detail,
            )
        )

    def _answer_info(self, route: str, pending: Pending) -> web.Response:
        """``/health``, ``/v1/models`` and ``/v1/models/{name}``."""
        config = self._config
        if route == "health":
            data = b""
        elif route == "version":  # vLLM's build, when the simulator is given one
            if config.version is None:
                raise wire.BadRequest(404, "GET /version is not served", "not_found")
            data = json.dumps({"version": config.version}).encode()
        elif route == "models":
            cards = [wire.model_card(name, config.max_model_len) for name in config.models]
            data = json.dumps({"object": "list", "data": cards}).encode()
        else:
            pending.model = pending.path[len("/v1/models/") :]
            if pending.model not in config.models:
                raise wire.not_found(pending.model)
            data = json.dumps(wire.model_card(pending.model, config.max_model_len)).encode()
        self._record(pending, "ok", 200)
        if not data:
            return web.Response(status=200)
        return wire.json_response(data)

    def _parse_body(self, raw: bytes, pending: Pending) -> dict[str, Any]:
        """The request's JSON object, with its model checked and its seed noted."""
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError included
            body = None
        if not isinstance(body, dict):
            raise wire.BadRequest(
                400, "We could not parse the JSON body of your request.", "invalid_json"
            )
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise wire.BadRequest(400, "you must provide a model parameter", "missing_model")
        pending.model = model
        if model not in self._config.models:
            raise wire.not_found(model)
        seed = body.get("seed")
        pending.seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
        return body

    async def _generate(
        self,
        request: web.BaseRequest,
        pending: Pending,
        body: dict[str, Any],
        keys: tuple[str, ...],
        prompt_tokens: int,
        chat: bool,
    ) -> web.StreamResponse:
        """Draw the fault, hold a slot for the latency, and answer (or fail) like a server."""
        config = self._config
        seed = pending.seed
        pending.key = keys[0]
        pending.attempt = self.log.next_attempt((pending.path, pending.model, keys[0], seed))
        kind: FaultKind | None = None
        status = 0
        u_latency = 0.5
        outcome: Outcome = "ok"
        if self._draws:
            u_fault, u_latency = self._uniforms(pending)
            kind, status = config.faults.pick(u_fault)
            if kind is not None:
                failed = await self._fail_before_slot(request, pending, kind, config.faults)
                if failed is not None:
                    return failed
                if kind == "timeout":
                    outcome = "timeout"

        choices, completion_tokens, thoughts = self._completions(keys, seed, body, chat)
        delay = config.latency_overrides.get(keys[0]) if config.latency_overrides else None
        if delay is None:
            delay = config.latency.sample(u_latency, completion_tokens)
        await self._hold_slot(pending, delay)

        if kind == "5xx":
            self._record(pending, "5xx", status)
            message = f"Simulated server error {status}; retry the request."
            return wire.json_response(wire.error_body(message, "server_error", status), status)

        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        number = next(self._ids)
        if config.reasoning_words:
            thinking = sum(len(t.split()) for t in thoughts)
            usage["completion_tokens_details"] = {"reasoning_tokens": thinking}
        elif kind is None and body.get("stream") is not True:  # the hot path
            self._record(pending, outcome, 200)
            data = wire.completion_bytes(
                number, pending.model, choices, usage, chat=chat, fingerprint=config.fingerprint
            )
            return wire.json_response(data)
        payload = wire.completion_payload(
            number,
            pending.model,
            choices,
            usage,
            chat=chat,
            thoughts=thoughts if chat and config.reasoning_field != "think" else (),
            reasoning_field=config.reasoning_field,
            fingerprint=config.fingerprint,
        )
        return await self._answer_unusually(request, pending, body, payload, kind, outcome, chat)

    async def _fail_before_slot(
        self, request: web.BaseRequest, pending: Pending, kind: FaultKind, faults: Faults
    ) -> web.StreamResponse | None:
        """Answer the faults that strike before a slot is taken: 429, reset, a timeout that closes.

        None: the request goes on (its fault strikes later, or it is a timeout that answers late).
        """
        if kind == "429":
            self._record(pending, "429", 429)
            message = "Rate limit reached (simulated); retry after the Retry-After header."
            data = wire.error_body(message, "rate_limit_error", "rate_limit_exceeded")
            return wire.json_response(data, 429, wire.retry_after_headers(faults.retry_after))
        if kind == "reset":
            self._record(pending, "reset", 0)
            wire.drop_connection(request, rst=True)
            return web.Response(status=500)  # never sent: the connection is gone
        if kind == "timeout":
            pending.fault = kind
            await asyncio.sleep(faults.hang_s)
            if faults.after_hang == "close":
                self._record(pending, "timeout", 0, "closed")
                wire.drop_connection(request, rst=False)
                return web.Response(status=500)  # never sent
        return None

    async def _hold_slot(self, pending: Pending, delay: float) -> None:
        """Wait for a slot (noting the time queued), then hold it for ``delay`` seconds."""
        slots = self._slots
        assert slots is not None
        if not slots.try_take():
            queued_at = time.monotonic()
            await slots.take()
            pending.queued = time.monotonic() - queued_at
        log = self.log
        log.enter_slot()
        try:
            if delay > 0.0:
                await asyncio.sleep(delay)
        finally:
            log.leave_slot()
            slots.give()

    async def _answer_unusually(
        self,
        request: web.BaseRequest,
        pending: Pending,
        body: dict[str, Any],
        payload: dict[str, Any],
        kind: FaultKind | None,
        outcome: Outcome,
        chat: bool,
    ) -> web.StreamResponse:
        """A 200 off the hot path: streamed, broken by a fault (no choices, truncated), or late."""
        detail = ""
        if kind == "no_choices":
            del payload["choices"]
            outcome, detail = "malformed", "no_choices"
        elif kind == "malformed":
            outcome, detail = "malformed", "truncated"
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            events = wire.sse_body(payload, kind, chat=chat, include_usage=include_usage)
            self._record(pending, outcome, 200, detail)
            return await wire.send_stream(request, events)
        data = json.dumps(payload).encode()
        if kind == "malformed":
            data = data[: len(data) // 2]
        self._record(pending, outcome, 200, detail)
        return wire.json_response(data)

    def _completions(
        self, keys: tuple[str, ...], seed: int | None, body: dict[str, Any], chat: bool
    ) -> tuple[list[tuple[str, str]], int, list[str]]:
        """(text, finish_reason) per key, cut to ``max_tokens`` words, the token total, and
        per key the thinking (reasoning mode; thinking counts against ``max_tokens`` first)."""
        policy = self._policy
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        budget = limit if isinstance(limit, int) and limit > 0 else None
        thinking = self._thinking_words(body)
        inline = not chat or self._config.reasoning_field == "think"
        choices: list[tuple[str, str]] = []
        thoughts: list[str] = []
        completion_tokens = 0
        for key in keys:
            text = policy.answer(key, seed)
            words = text.split()
            finish = "stop"
            room = budget
            if thinking:
                thought = _THINKING * (thinking // len(_THINKING) + 1)
                thought = thought[: thinking if budget is None else min(thinking, budget)]
                thoughts.append(" ".join(thought))
                completion_tokens += len(thought)
                room = None if budget is None else budget - len(thought)
                if room is not None and room <= 0 and len(thought) < thinking + len(words):
                    words, finish = [], "length"  # out of tokens while thinking
            if room is not None and 0 < room < len(words):
                words = words[:room]
                text = " ".join(words)
                finish = "length"
            elif not words:
                text = ""
            completion_tokens += len(words)
            if thinking and inline:  # a <think> block in the text, as without a parser
                closed = "</think>\n" if len(thoughts[-1].split()) == thinking else ""
                text = f"<think>{thoughts[-1]}{closed}" + (text if closed else "")
            choices.append((text, finish))
        return choices, completion_tokens, thoughts

    def _thinking_words(self, body: dict[str, Any]) -> int:
        """Words of thinking per reply: the configured length scaled by ``reasoning_effort``."""
        words = self._config.reasoning_words
        effort = body.get("reasoning_effort")
        return (
            round(words * _EFFORT.get(effort, 1.0)) if words and isinstance(effort, str) else words
        )

    def _uniforms(self, pending: Pending) -> tuple[float, float]:
        """Two uniforms in [0, 1) for this request: its fault draw and its latency draw."""
        text = "\x1f".join(
            (
                str(self._config.seed),
                pending.path,
                pending.model,
                pending.key,
                str(pending.seed),
                str(pending.attempt),
            )
        )
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        return (
            int.from_bytes(digest[:8], "big") / _SCALE,
            int.from_bytes(digest[8:16], "big") / _SCALE,
        )


async def serve(config: SimConfig) -> SimServer:
    """Serve until SIGINT/SIGTERM; print the base URL first, the counts last."""
    server = SimServer(config)
    await server.astart()
    print(server.base_url, flush=True)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows loops
            loop.add_signal_handler(signum, done.set)
    try:
        await done.wait()
    finally:
        await server.astop()
    counts = " ".join(f"{outcome}={n}" for outcome, n in sorted(server.counts.items()))
    print(f"simserver stopped: {counts or 'no requests'}", file=sys.stderr, flush=True)
    return server


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for a bad flag value)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except (ValueError, TypeError, OSError) as exc:
        parser.error(str(exc))
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
