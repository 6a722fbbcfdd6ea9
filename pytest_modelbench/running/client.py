"""Async OpenAI-compatible client: keep-alive HTTP/1.1, retries with backoff, pre-flight.

Retries connection errors, timeouts, 408/429 (honouring ``Retry-After``), 5xx
and malformed 200 responses, with exponential backoff and full jitter; never
retries other 4xx (a user error: bad model name, context too long...).

Requests go over a small HTTP/1.1 keep-alive connection pool on asyncio
streams (TLS for ``https://``), standard library only. An item keeps
``max_concurrent`` requests in flight from start to end, so against a fast
server the client's CPU per request bounds throughput; this transport needs
less than half the CPU per request of aiohttp's client (PERFORMANCE.md).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import ssl
import sys
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pytest_modelbench.running.proxies import Proxy, proxy_for
from pytest_modelbench.secrets import redact

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 300.0
CONNECT_TIMEOUT_S = 30.0
MAX_HEADER_BYTES = 1 << 16
USER_AGENT = "pytest-modelbench"
CLOSED_SILENTLY = "closed without a response"

T = TypeVar("T")


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


@dataclass
class Completion:
    """A model answer with its cost: tokens, latency, attempts."""

    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    attempts: int
    retry_reasons: list[str] = field(default_factory=list)


class RequestFailed(Exception):
    """A request that failed for good (after retries, or a non-retryable error)."""

    def __init__(self, reason: str, attempts: int, retry_reasons: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.attempts = attempts
        self.retry_reasons = list(retry_reasons)


class EndpointUnavailable(Exception):
    """Pre-flight failed: the endpoint is unreachable or does not serve the model."""


DEAD_AFTER_FAILURES = 8  # connections that could not be opened, in a row ...
DEAD_AFTER_S = 2.0  # ... with no answer from the endpoint for this long


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _Broken(Exception):
    """The connection failed (``reason``: what broke; ``detail``: the exception, if any)."""

    def __init__(self, reason: str, *, detail: str = "", connect: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason  # short and stable: retry reasons are counted by it
        self.detail = detail or reason
        self.connect = connect  # no connection could be opened (nothing reached the server)


def _retry_after(value: str | None) -> float | None:
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


def _error_text(body: bytes) -> str:
    try:
        data = json.loads(body)
        error = data.get("error", data) if isinstance(data, dict) else data
        message = error.get("message") if isinstance(error, dict) else None
        return redact(str(message or error)[:300])  # a gateway may echo the key it was sent
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return redact(body[:300].decode("utf-8", "replace"))


def _choice_text(choice: Mapping[str, Any], *, chat: bool) -> str:
    """The text of a choice, from any shape a server may send: ``message.content`` as a string
    or as a list of content parts (``{"type": "text", "text": ...}``), a bare string
    ``message``, or ``text`` for completions."""
    if not chat:
        return _part_text(choice.get("text"))
    message = choice.get("message")
    if isinstance(message, dict):
        return _part_text(message.get("content"))
    return _part_text(message)


def _part_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(p.get("text") if isinstance(p, dict) else p) for p in content)
    return str(content)


def _count(value: Any) -> int | None:
    """A token count as the server sent it (a number, or a numeric string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, (float, str)):
        try:
            return int(float(value))
        except (ValueError, OverflowError):
            return None
    return None


async def _within(seconds: float, awaitable: Awaitable[T]) -> T:
    """``awaitable``, cancelled with :class:`asyncio.TimeoutError` after ``seconds``."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


@dataclass(frozen=True)
class Response:
    """One HTTP response, body already read (and decompressed)."""

    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


class _Pool:
    """Keep-alive connections to one base URL (``http://`` or ``https://``)."""

    def __init__(self, base_url: str, headers: Mapping[str, str], max_idle: int) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"api_base_url must be an http:// or https:// URL, got {base_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        netloc = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port:
            netloc = f"{netloc}:{parts.port}"
        self._fixed = "".join(
            f"{name}: {value}\r\n"
            for name, value in {"Host": netloc, "User-Agent": USER_AGENT, **headers}.items()
        )
        self.netloc = netloc
        self.proxy = proxy_for(base_url)
        if self.proxy is not None and self.proxy.authorization and not self.tls:
            self._fixed += f"Proxy-Authorization: {self.proxy.authorization}\r\n"
        self._heads: dict[tuple[str, str], str] = {}
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._max_idle = max(1, max_idle)
        self._ssl: ssl.SSLContext | None = None

    def head(self, method: str, path: str) -> str:
        """The request line and fixed headers (cached per path)."""
        key = (method, path)
        head = self._heads.get(key)
        if head is None:
            # through an HTTP proxy, an http:// request names its whole URL (absolute form)
            origin = f"http://{self.netloc}" if self.proxy is not None and not self.tls else ""
            target = f"{origin}{self.prefix}{path}"
            head = self._heads[key] = f"{method} {target} HTTP/1.1\r\n{self._fixed}"
        return head

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            if self.proxy is not None:
                return await _within(CONNECT_TIMEOUT_S, self._through_proxy(self.proxy))
            return await _within(
                CONNECT_TIMEOUT_S,
                asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self._ssl if self.tls else None,
                    limit=MAX_HEADER_BYTES,
                ),
            )
        except asyncio.TimeoutError:
            raise _Broken(f"connect timed out after {CONNECT_TIMEOUT_S:g}s", connect=True) from None
        except (OSError, ssl.SSLError) as exc:
            name = type(exc).__name__
            raise _Broken(name, detail=f"{name}: {exc}", connect=True) from None

    async def _through_proxy(
        self, proxy: Proxy
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the proxy; for https a ``CONNECT`` tunnel with TLS to the endpoint
        inside it (the proxy sees only where the bytes go, never the request)."""
        reader, writer = await asyncio.open_connection(
            proxy.host, proxy.port, limit=MAX_HEADER_BYTES
        )
        if not self.tls:
            return reader, writer
        auth = f"Proxy-Authorization: {proxy.authorization}\r\n" if proxy.authorization else ""
        writer.write(
            f"CONNECT {self.netloc_with_port} HTTP/1.1\r\nHost: {self.netloc_with_port}\r\n"
            f"{auth}\r\n".encode()
        )
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            raise _Broken(
                f"proxy {proxy.host}:{proxy.port} closed the CONNECT tunnel", connect=True
            ) from None
        status = head.split(b" ", 2)[1:2]
        if status != [b"200"]:
            writer.close()
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            raise _Broken(f"proxy {proxy.host}:{proxy.port} refused CONNECT: {line}", connect=True)
        assert self._ssl is not None
        if sys.version_info < (3, 11):
            writer.close()
            raise _Broken("https through a proxy needs Python 3.11 or newer", connect=True)
        await writer.start_tls(self._ssl, server_hostname=self.host)
        return reader, writer

    @property
    def netloc_with_port(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def exchange(self, head: str, body: bytes | None) -> Response:
        """Send one request and read its response, on an idle connection or a new one.

        An idle connection the server closed (FIN) as the request went out, its keep-alive
        timeout, is no error: the request goes again on a new connection.
        """
        if body is None:
            data = (head + "\r\n").encode()
        else:
            data = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        while True:
            conn = None
            while self._idle:
                reader, writer = self._idle.pop()
                if reader.at_eof() or reader.exception() is not None or writer.is_closing():
                    writer.close()
                    continue
                conn = reader, writer
                break
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            reader, writer = conn
            keep = False
            try:
                writer.write(data)
                response, keep = await _read_response(reader)
            except _Broken as exc:
                if reused and exc.reason == CLOSED_SILENTLY:
                    continue
                raise
            finally:
                if keep and len(self._idle) < self._max_idle:
                    self._idle.append(conn)
                else:
                    writer.transport.abort()
            return response

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


async def _read_response(reader: asyncio.StreamReader) -> tuple[Response, bool]:
    """(response, whether the connection can carry another request)."""
    answered = False
    try:
        while True:
            block = await reader.readuntil(b"\r\n\r\n")
            answered = True
            version, status, headers = _parse_head(block)
            if not 100 <= status < 200:
                break  # 1xx: an interim response, the real one follows
        body, keep = await _read_body(reader, version, status, headers)
    except asyncio.IncompleteReadError as exc:
        answered = answered or bool(exc.partial)
        raise _Broken("closed mid-response" if answered else CLOSED_SILENTLY) from None
    except (asyncio.LimitOverrunError, ValueError, IndexError):
        raise _Broken("unparseable response") from None
    except OSError as exc:
        raise _Broken(type(exc).__name__) from None
    encoding = headers.get("content-encoding", "").lower()
    if encoding in ("gzip", "deflate"):
        try:
            body = zlib.decompress(
                body, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
            )
        except zlib.error:
            raise _Broken("undecodable compressed body") from None
    return Response(status, headers, body), keep


def _parse_head(block: bytes) -> tuple[str, int, dict[str, str]]:
    """(HTTP version, status, headers with lower-case names) of a response head.

    Raises ValueError for a status line without a numeric status.
    """
    lines = block.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    status = int(rest[:3])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return version, status, headers


async def _read_body(
    reader: asyncio.StreamReader, version: str, status: int, headers: Mapping[str, str]
) -> tuple[bytes, bool]:
    """(the still-encoded body, whether the connection can carry another request)."""
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif status in (204, 304):
        body = b""
    else:
        body, keep = await reader.read(), False  # delimited by the server closing
    return body, keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


class OpenAIClient:
    """Sends chat/completions requests to one or more base URLs of one model.

    Use as ``async with OpenAIClient(...) as client``; requests go to the base
    URL with the fewest outstanding requests. ``max_connections``: keep-alive
    connections kept per base URL (more may be open at once; they close after use).
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_connections: int = 64,
        retry: RetryPolicy | None = None,
        seed: int = 0,
        died: Callable[[], str | None] | None = None,
    ) -> None:
        if not base_urls:
            raise ValueError("at least one base URL is required")
        self.base_urls = [url.rstrip("/") for url in base_urls]
        self.model_cards: dict[str, dict[str, Any]] = {}  # base URL -> /models entry (preflight)
        self.dead: str | None = None  # why the endpoint is considered gone (see _connect_failed)
        self._connect_failures = 0
        self._last_answer = time.monotonic()
        self._died = died  # a served endpoint's process check: why it died, or None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._pools = {url: _Pool(url, headers, max_connections + 4) for url in self.base_urls}
        self._outstanding = dict.fromkeys(self.base_urls, 0)
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._rng = random.Random(seed)
        self._open = False

    async def __aenter__(self) -> OpenAIClient:
        self._open = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._open = False
        for pool in self._pools.values():
            pool.close()
        await asyncio.sleep(0)  # let the transports finish closing inside this event loop

    async def _send(
        self, base: str, method: str, path: str, body: bytes | None, timeout_s: float
    ) -> Response:
        assert self._open, "use 'async with OpenAIClient(...)'"
        pool = self._pools[base]
        return await _within(timeout_s, pool.exchange(pool.head(method, path), body))

    async def preflight(self, model: str, timeout_s: float = 15.0) -> list[str]:
        """Check every base URL answers ``/models`` and serves ``model``; returns the served names."""
        served: list[str] = []
        for base in self.base_urls:
            url = f"{base}/models"
            try:
                response = await self._send(base, "GET", "/models", None, timeout_s)
            except (_Broken, asyncio.TimeoutError) as exc:
                reason = exc.detail if isinstance(exc, _Broken) else "timed out"
                raise EndpointUnavailable(
                    f"endpoint {base} is unreachable ({reason}); start the server, fix api_base_url, "
                    "or omit api_base_url to let modelbench serve the model"
                ) from None
            if response.status != 200:
                raise EndpointUnavailable(
                    f"{url} answered HTTP {response.status}: {_error_text(response.body)}"
                    + (" (check api_key_var)" if response.status in (401, 403) else "")
                )
            try:
                listed = [
                    m for m in json.loads(response.body).get("data", []) if isinstance(m, dict)
                ]
                names = [str(m.get("id")) for m in listed]
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError):
                raise EndpointUnavailable(f"{url} did not return an OpenAI model list") from None
            self.model_cards[base] = next((m for m in listed if m.get("id") == model), {})
            if model not in names:
                raise EndpointUnavailable(
                    f"endpoint {base} does not serve model {model!r}; it serves: "
                    f"{', '.join(names) or '(nothing)'} (set 'model:' in models.yaml to one of these)"
                )
            served.extend(names)
        return served

    def _pick(self) -> str:
        if len(self.base_urls) == 1:
            return self.base_urls[0]
        return min(self.base_urls, key=self._outstanding.__getitem__)

    def _connect_failed(self, base: str, exc: _Broken) -> None:
        """Count connections that could not be opened, across requests: many in a row, with
        no answer for a while, mean the endpoint is gone (a dead server), so every request in
        flight stops at once instead of spending its retries on it."""
        self._connect_failures += 1
        quiet = time.monotonic() - self._last_answer
        if self._connect_failures >= DEAD_AFTER_FAILURES and quiet >= DEAD_AFTER_S:
            self.dead = (
                f"endpoint {base} is not accepting connections ({exc.detail}; "
                f"{self._connect_failures} failed connection attempts in a row, no answer for "
                f"{quiet:.0f} s)"
            )

    async def _once(self, path: str, body: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        base = self._pick()
        self._outstanding[base] += 1
        try:
            response = await self._send(base, "POST", path, body, self.timeout_s)
        except asyncio.TimeoutError:
            raise _Retryable(f"timeout after {self.timeout_s:g}s") from None
        except _Broken as exc:
            if exc.connect:
                self._connect_failed(base, exc)
            raise _Retryable(f"connection error: {exc.reason}") from None
        finally:
            self._outstanding[base] -= 1
        self._connect_failures = 0
        self._last_answer = time.monotonic()
        status = response.status
        if status != 200:
            if status in RETRY_STATUSES or status >= 500:
                raise _Retryable(
                    f"HTTP {status}", _retry_after(response.headers.get("retry-after"))
                )
            raise RequestFailed(
                f"HTTP {status} from {base}{path}: {_error_text(response.body)}", attempts=1
            )
        try:
            data: dict[str, Any] = json.loads(response.body)
            choice: dict[str, Any] = data["choices"][0]
            if not isinstance(choice, dict):
                raise TypeError
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, UnicodeDecodeError):
            raise _Retryable("malformed response") from None
        return data, choice

    async def request(self, path: str, payload: Mapping[str, Any]) -> Completion:
        """POST with retries; returns the first choice's text."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        reasons: list[str] = []
        started = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            if self.dead is not None:  # the endpoint stopped taking connections: stop asking
                raise RequestFailed(self.dead, max(1, attempt - 1), reasons)
            try:
                data, choice = await self._once(path, body)
            except _Retryable as exc:
                reasons.append(exc.reason)
                if self._died is not None and self.dead is None:
                    self.dead = self._died()  # the server process exited: no retry can help
                if self.dead is not None:
                    continue
                if attempt > self.retry.max_retries:
                    raise RequestFailed(
                        f"gave up after {attempt} attempts; last error: {exc.reason}",
                        attempt,
                        reasons,
                    ) from None
                delay = (
                    exc.retry_after
                    if exc.retry_after is not None
                    else self.retry.delay(attempt, self._rng)
                )
                await asyncio.sleep(delay)
                continue
            except RequestFailed as exc:
                exc.attempts = attempt
                exc.retry_reasons = reasons
                raise
            usage = data.get("usage")
            usage = usage if isinstance(usage, dict) else {}
            return Completion(
                text=_choice_text(choice, chat=path.endswith("chat/completions")),
                finish_reason=str(choice.get("finish_reason") or "") or None,
                prompt_tokens=_count(usage.get("prompt_tokens")),
                completion_tokens=_count(usage.get("completion_tokens")),
                latency_s=time.perf_counter() - started,
                attempts=attempt,
                retry_reasons=reasons,
            )
