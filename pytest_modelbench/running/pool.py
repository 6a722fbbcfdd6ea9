"""The endpoint pool: the one owner of where a model's requests go and whether they go again.

An :class:`EndpointPool` owns one model's base URLs (a :class:`UrlSet`, which may grow and
shrink while an item runs: a replica joins with ``add``), least-busy routing over them, a
breaker per URL (a URL that refuses connections rests while the others serve, and a request
it refused goes to another at once), dead-endpoint detection (connections refused in a row
and no answer for a while: every request stops at once), timeouts, retries with backoff and
``Retry-After``, and the pre-flight. Every backend sends through one: the suite backend in
its own event loop, lm-eval and the verifiers harnesses through the worker's loopback
router (:mod:`.router`). The HTTP under it is aiohttp (:mod:`.http`).

Retries connection errors, timeouts, 408/409/425/429, 5xx and bodies a caller cannot read
(``Malformed``), with full-jitter exponential backoff; never other 4xx (a user error: bad
model name, context too long...), a redirect (the error names where it points) or a TLS
certificate the trust store refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from pytest_modelbench.running.http import (
    CONNECT_TIMEOUT_S,
    Response,
    Target,
    TransportError,
    bad_encoding,
    failure,
    open_session,
    redirect_target,
    request,
)
from pytest_modelbench.running.urls import UrlSet
from pytest_modelbench.secrets import redact, remember_header

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 300.0
DEAD_AFTER_FAILURES = 8  # connections that could not be opened, in a row ...
DEAD_AFTER_S = 2.0  # ... with no answer from any URL for this long
REST_S = 0.25  # a URL that refused a connection rests this long, doubling per refusal ...
MAX_REST_S = 10.0  # ... up to this

T = TypeVar("T")
P = TypeVar("P", bound="EndpointPool")


@dataclass(frozen=True)
class RetryPolicy:
    """How many times and how patiently to retry one request."""

    max_retries: int = 6
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full-jitter exponential backoff for the ``attempt``-th retry (1-based)."""
        cap = min(self.max_backoff_s, self.backoff_s * (2 ** (attempt - 1)))
        return rng.uniform(cap / 2, cap)


class RequestFailed(Exception):
    """A request that failed for good (after retries, or a non-retryable error)."""

    def __init__(self, reason: str, attempts: int, retry_reasons: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.attempts = attempts
        self.retry_reasons = list(retry_reasons)


class EndpointUnavailable(Exception):
    """Pre-flight failed: the endpoint is unreachable or does not serve the model."""


class Malformed(Exception):
    """A 200 whose body is not what the caller asked for: retried like a 5xx. ``detail``, when
    given, is what the final failure says (the server's message)."""

    def __init__(self, reason: str = "malformed response", detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail or reason


@dataclass(eq=False)
class _Replica:
    """One base URL's routing state in one pool."""

    url: str
    target: Target
    outstanding: int = 0  # requests in flight (streams until released)
    sent: int = 0  # requests sent: ties of outstanding go to the least used
    refusals: int = 0  # connections refused in a row
    resting_until: float = 0.0  # monotonic time before which routing avoids it
    paths: dict[str, URL] = field(default_factory=dict)

    def url_for(self, path: str) -> URL:
        url = self.paths.get(path)
        if url is None:
            url = self.paths[path] = URL(self.url + path)
        return url


class _Down(Exception):
    """Nothing answers at a base URL (the pre-flight's message)."""


class _Retry(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.detail = detail or reason


def retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (delta or HTTP date), capped; None when absent or unreadable."""
    if not value:
        return None
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(value)))
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return min(MAX_RETRY_AFTER_S, max(0.0, parsed.timestamp() - time.time()))


def error_text(body: bytes) -> str:
    """A server's error message from its body, redacted (a gateway may echo the key it got)."""
    try:
        data = json.loads(body)
        error = data.get("error", data) if isinstance(data, dict) else data
        message = error.get("message") if isinstance(error, dict) else None
        return redact(str(message or error)[:300])
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return redact(body[:300].decode("utf-8", "replace"))


def error_code(error: Any) -> int | None:
    """The HTTP-like code of an error object (``code`` or ``status``, a number or its text)."""
    if not isinstance(error, dict):
        return None
    for name in ("code", "status"):
        value = error.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def error_status(body: bytes) -> int | None:
    """For a 200 whose body is an error rather than an answer (``{"error": ...}`` without
    ``choices``, a gateway's way to fail): the status it stands for (its own ``code`` when that
    is an HTTP error status, else 502); None for any other body."""
    if b'"error"' not in body or not body.lstrip().startswith(b"{"):
        return None
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or "choices" in data or not data.get("error"):
        return None
    code = error_code(data["error"])
    return code if code is not None and 400 <= code < 600 else 502


def unusable(response: Response, where: str) -> RequestFailed:
    """The final failure for a response no retry changes (a 4xx, a redirect)."""
    status = response.status
    moved = redirect_target(response)
    if moved is not None:
        return RequestFailed(
            f"HTTP {status} from {where}: redirected to {moved}; set api_base_url to the "
            "address it points to",
            attempts=1,
        )
    return RequestFailed(f"HTTP {status} from {where}: {error_text(response.body)}", attempts=1)


@dataclass
class Stream:
    """A response whose body is still coming (server-sent events): read :attr:`chunks`, then
    :meth:`release` (the request counts as in flight until then)."""

    status: int
    headers: Mapping[str, str]
    chunks: AsyncIterator[bytes]
    release: Callable[[], None]


class EndpointPool:
    """Sends one model's requests over its :class:`UrlSet`, with the policy above.

    Use as ``async with EndpointPool(...) as pool`` in the event loop that sends (it holds
    one aiohttp session). ``died``: for a server modelbench started, why its process died
    (or None while it runs): no retry can help then. ``headers`` go with every request (the
    ``extra_headers`` of the sampling args), over a caller's own; a value under a name that
    says it is a credential is redacted like the key.
    """

    def __init__(
        self,
        urls: UrlSet | Sequence[str],
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        seed: int = 0,
        died: Callable[[], str | None] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.urls = urls if isinstance(urls, UrlSet) else UrlSet(urls)
        if not self.urls.urls:
            raise ValueError("at least one base URL is required")
        self.model_cards: dict[str, dict[str, Any]] = {}  # base URL -> /models entry (preflight)
        self.dead: str | None = None  # why the endpoint is considered gone (see _refused)
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._timeout = aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=min(timeout_s, CONNECT_TIMEOUT_S)
        )
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._extra_headers = dict(headers or {})
        for name, value in self._extra_headers.items():
            remember_header(name, value)  # the token alone too: a gateway may echo just that
        self._headers.update(self._extra_headers)
        self._replicas: dict[str, _Replica] = {}
        self._refusals = 0
        self._last_answer = time.monotonic()
        self._died = died
        self._rng = random.Random(seed)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self: P) -> P:
        self._session = open_session(self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use 'async with EndpointPool(...)'"
        return self._session

    # -- routing ---------------------------------------------------------------------------

    def _replica(self, url: str) -> _Replica:
        replica = self._replicas.get(url)
        if replica is None:
            replica = self._replicas[url] = _Replica(
                url, Target.of(url, self.urls.tls, direct=self.urls.own)
            )
        return replica

    def resolve(self) -> None:
        """Read how to reach each URL now (proxy, TLS context), not at its first request; a
        failure here comes again, named, at the pre-flight or the request."""
        for url in self.urls.urls:
            with contextlib.suppress(TransportError):
                self._replica(url)

    def _pick(self, refused: Iterable[str] = ()) -> _Replica:
        """The least busy URL, avoiding those that refused this request and those resting."""
        urls = self.urls.urls
        if len(urls) == 1 and not refused:
            return self._replica(urls[0])
        if not urls:  # every URL was removed (UrlSet.remove): nowhere to send
            raise TransportError("no base URL left", detail="every base URL was removed")
        now = time.monotonic()
        avoid = set(refused)
        return min(
            (self._replica(u) for u in urls),
            key=lambda r: (r.url in avoid, r.resting_until > now, r.outstanding, r.sent),
        )

    def _elsewhere(self, refused: set[str]) -> bool:
        """Whether a URL that has not refused this request is up (not resting)."""
        now = time.monotonic()
        return any(
            u not in refused and self._replica(u).resting_until <= now for u in self.urls.urls
        )

    def _answered(self, replica: _Replica) -> None:
        self._refusals = 0
        self._last_answer = time.monotonic()
        if replica.refusals:
            replica.refusals = 0
            replica.resting_until = 0.0

    def _refused(self, replica: _Replica, exc: TransportError) -> None:
        """Count connections that could not be opened: the URL rests (others take its
        requests); many in a row across the set, with no answer for a while, mean the endpoint
        is gone (a dead server), so every request in flight stops at once instead of spending
        its retries on it."""
        now = time.monotonic()
        replica.refusals += 1
        replica.resting_until = now + min(MAX_REST_S, REST_S * 2 ** (replica.refusals - 1))
        self._refusals += 1
        quiet = now - self._last_answer
        if self._refusals >= DEAD_AFTER_FAILURES and quiet >= DEAD_AFTER_S:
            down = [u for u in self.urls.urls if self._replica(u).refusals] or [replica.url]
            where = (
                f"endpoint {down[0]} is" if len(down) == 1 else f"endpoints {', '.join(down)} are"
            )
            self.dead = (
                f"{where} not accepting connections ({exc.detail}; {self._refusals} failed "
                f"connection attempts in a row, no answer for {quiet:.0f} s)"
            )

    # -- sending ---------------------------------------------------------------------------

    async def _once(
        self,
        replica: _Replica,
        method: str,
        path: str,
        body: bytes | None,
        headers: Mapping[str, str] | None,
        *,
        stream: bool = False,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> Response | Stream:
        """One attempt at one URL: the whole response, or with ``stream`` a :class:`Stream`
        for server-sent events (in flight until released)."""
        if headers and self._extra_headers:  # a relayed request: the configured headers win
            headers = CIMultiDict(headers)
            headers.update(self._extra_headers)
        replica.outstanding += 1
        replica.sent += 1
        try:
            upstream = await request(
                self.session,
                replica.target,
                replica.url_for(path),
                method,
                body,
                timeout or self._timeout,
                headers,
            )
        except BaseException:
            replica.outstanding -= 1
            raise
        self._answered(replica)
        if stream and upstream.status == 200 and upstream.content_type == "text/event-stream":
            released = False

            def release() -> None:
                nonlocal released
                if not released:
                    released = True
                    replica.outstanding -= 1
                    upstream.release()

            return Stream(upstream.status, upstream.headers, upstream.content.iter_any(), release)
        try:
            data = await upstream.read()
        except Exception as exc:
            raise failure(exc, replica.target) from None
        finally:
            replica.outstanding -= 1
            upstream.release()
        return Response(upstream.status, upstream.headers, data)

    async def send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        parse: Callable[[Response, str], T],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[T, int, list[str]]:
        """One request with the pool's policy: ``(parse(response, url), attempts, retry
        reasons)``. ``parse`` sees every response not retried here (2xx, 3xx, other 4xx) and
        returns its value, raises :class:`Malformed` (retried) or :class:`RequestFailed`."""

        async def attempt(replica: _Replica) -> T:
            response = await self._once(replica, method, path, body, headers)
            assert isinstance(response, Response)  # (no stream asked for)
            self._judge(replica, response)
            try:
                return parse(response, replica.url + path)
            except Malformed as exc:
                raise _Retry(exc.reason, detail=exc.detail) from None

        return await self._with_retries(attempt)

    @asynccontextmanager
    async def exchange(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Response | Stream]:
        """One request for a relay (the router): the whole :class:`Response` (any status that
        is not retried, read inside the retries; a redirect raises :class:`RequestFailed`
        naming its target), or for server-sent events a :class:`Stream` once its head is in;
        its chunks are no longer retried."""

        async def attempt(replica: _Replica) -> Response | Stream:
            reply = await self._once(replica, method, path, body, headers, stream=True)
            if isinstance(reply, Response):
                self._judge(replica, reply)
                if redirect_target(reply) is not None:  # never let the caller follow it
                    raise unusable(reply, replica.url + path)
            return reply

        reply, _, _ = await self._with_retries(attempt)
        try:
            yield reply
        finally:
            if isinstance(reply, Stream):
                reply.release()

    def _judge(self, replica: _Replica, response: Response) -> None:
        """Raise :class:`_Retry` for a status worth another attempt (a ``Retry-After`` also
        rests the URL, so the other URLs take the requests meanwhile), and
        :class:`TransportError` for a body in an encoding nobody decoded."""
        status = response.status
        if status in RETRY_STATUSES or status >= 500:
            wait = retry_after(response.headers.get("Retry-After"))
            if wait and len(self.urls.urls) > 1:
                replica.resting_until = time.monotonic() + wait
            raise _Retry(f"HTTP {status}", wait)
        encoding = bad_encoding(response)
        if encoding is not None:
            raise TransportError(
                "bad Content-Encoding",
                detail=f"bad Content-Encoding {encoding!r}: the body cannot be decoded",
                answered=True,
            )

    async def _with_retries(
        self, attempt: Callable[[_Replica], Awaitable[T]]
    ) -> tuple[T, int, list[str]]:
        reasons: list[str] = []
        refused: set[str] = set()  # URLs that refused this request's connection
        attempts = 0
        while True:
            if self.dead is not None:  # the endpoint stopped taking connections: stop asking
                raise RequestFailed(self.dead, max(1, attempts), reasons)
            attempts += 1
            try:
                replica = self._pick(refused)
            except TransportError as exc:  # an unreadable SSL_CERT_FILE, no URL left
                raise RequestFailed(exc.detail, attempts, reasons) from None
            try:
                return await attempt(replica), attempts, reasons
            except RequestFailed as exc:
                exc.attempts, exc.retry_reasons = attempts, reasons
                raise
            except (_Retry, asyncio.TimeoutError, TransportError) as exc:
                failed = self._failed(replica, exc, refused, attempts, reasons)
            if failed is None:
                attempts -= 1  # nothing reached a server: another URL takes it at once
                continue
            reason, detail, wait = failed
            reasons.append(reason)
            if self._died is not None and self.dead is None:
                self.dead = self._died()  # the server process exited: no retry can help
            if self.dead is not None:
                continue
            if attempts > self.retry.max_retries:
                raise RequestFailed(
                    f"gave up after {attempts} attempts; last error: {detail}", attempts, reasons
                )
            if wait is not None and self._elsewhere({replica.url}):
                wait = 0.0  # another URL is up: no need to wait for this one
            await asyncio.sleep(wait if wait is not None else self.retry.delay(attempts, self._rng))

    def _failed(
        self,
        replica: _Replica,
        exc: _Retry | asyncio.TimeoutError | TransportError,
        refused: set[str],
        attempts: int,
        reasons: list[str],
    ) -> tuple[str, str, float | None] | None:
        """What a failed attempt means: ``(reason, detail, Retry-After)`` to retry on, None
        when another URL takes the request at once (its connection was refused here), or
        :class:`RequestFailed` when no retry can help."""
        if isinstance(exc, _Retry):
            return exc.reason, exc.detail, exc.retry_after
        if not isinstance(exc, TransportError):
            reason = f"timeout after {self.timeout_s:g}s"
            return reason, reason, None
        if exc.connect:
            self._refused(replica, exc)
            if exc.final:
                raise RequestFailed(exc.detail, attempts, reasons)
            refused.add(replica.url)
            if self.dead is None and self._elsewhere(refused):
                return None
        reason = exc.reason if exc.answered else f"connection error: {exc.reason}"
        return reason, exc.detail, None

    # -- pre-flight --------------------------------------------------------------------------

    async def preflight(self, model: str, timeout_s: float = 15.0) -> list[str]:
        """Check the base URLs answer ``/models`` and serve ``model``; returns the served names.

        A URL where nothing answers (refused, DNS, timed out) rests, and the others serve,
        as long as one answers; one that answers without the model, with an error status or
        over a TLS or proxy failure is a configuration error: :class:`EndpointUnavailable`.
        """
        timeout = aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=min(timeout_s, CONNECT_TIMEOUT_S)
        )
        served: list[str] = []
        down: list[str] = []
        for base in self.urls.urls:
            try:
                served.extend(await self._models(base, model, timeout))
            except _Down as exc:
                down.append(str(exc))
                replica = self._replica(base)
                replica.refusals += 1
                replica.resting_until = time.monotonic() + MAX_REST_S
        if down and not served:
            raise EndpointUnavailable(down[0])
        return served

    async def _models(self, base: str, model: str, timeout: aiohttp.ClientTimeout) -> list[str]:
        """What ``base`` lists at ``/models`` (its card for ``model`` kept); :class:`_Down`
        when nothing answers there."""
        url = f"{base}/models"
        try:
            response = await self._once(
                self._replica(base), "GET", "/models", None, None, timeout=timeout
            )
        except asyncio.TimeoutError:
            raise _Down(_unreachable(base, f"timed out after {timeout.total:g}s")) from None
        except TransportError as exc:
            if exc.unreachable:
                raise _Down(_unreachable(base, exc.detail)) from None
            raise EndpointUnavailable(f"endpoint {base}: {exc.detail}") from None
        assert isinstance(response, Response)  # (no stream asked for)
        if response.status != 200:
            failed = unusable(response, url)
            raise EndpointUnavailable(
                failed.reason + (" (check api_key_var)" if response.status in (401, 403) else "")
            )
        try:
            listed = [m for m in json.loads(response.body).get("data", []) if isinstance(m, dict)]
            names = [str(m.get("id")) for m in listed]
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError):
            raise EndpointUnavailable(f"{url} did not return an OpenAI model list") from None
        self.model_cards[base] = next((m for m in listed if m.get("id") == model), {})
        if model not in names:
            raise EndpointUnavailable(
                f"endpoint {base} does not serve model {model!r}; it serves: "
                f"{', '.join(names) or '(nothing)'} (set 'model:' in models.yaml to one of these)"
            )
        return names


def _unreachable(base: str, why: str) -> str:
    return (
        f"endpoint {base} is unreachable ({why}); start the server, fix api_base_url, "
        "or omit api_base_url to let modelbench serve the model"
    )
