"""Async OpenAI-compatible client: bounded concurrency, retries with backoff, pre-flight.

Retries connection errors, timeouts, 408/429 (honouring ``Retry-After``), 5xx
and malformed 200 responses, with exponential backoff and full jitter; never
retries other 4xx (a user error: bad model name, context too long...).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 300.0


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


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(value)))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return min(MAX_RETRY_AFTER_S, max(0.0, parsed.timestamp() - time.time()))


def _error_text(body: bytes) -> str:
    try:
        data = json.loads(body)
        error = data.get("error", data) if isinstance(data, dict) else data
        message = error.get("message") if isinstance(error, dict) else None
        return str(message or error)[:300]
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return body[:300].decode("utf-8", "replace")


class OpenAIClient:
    """Sends chat/completions requests to one or more base URLs of one model.

    Use as ``async with OpenAIClient(...) as client``; requests go to the base
    URL with the fewest outstanding requests.
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
    ) -> None:
        if not base_urls:
            raise ValueError("at least one base URL is required")
        self.base_urls = [url.rstrip("/") for url in base_urls]
        self._outstanding = dict.fromkeys(self.base_urls, 0)
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._max_connections = max_connections
        self._rng = random.Random(seed)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> OpenAIClient:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections * len(self.base_urls) + 8,
            limit_per_host=self._max_connections + 4,
            ttl_dns_cache=300,
            enable_cleanup_closed=True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            json_serialize=json.dumps,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use 'async with OpenAIClient(...)'"
        return self._session

    async def preflight(self, model: str, timeout_s: float = 15.0) -> list[str]:
        """Check every base URL answers ``/models`` and serves ``model``; returns the served names."""
        served: list[str] = []
        for base in self.base_urls:
            url = f"{base}/models"
            try:
                async with self.session.get(
                    url, timeout=aiohttp.ClientTimeout(total=timeout_s)
                ) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise EndpointUnavailable(
                            f"{url} answered HTTP {resp.status}: {_error_text(body)}"
                            + (" (check api_key_var)" if resp.status in (401, 403) else "")
                        )
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                reason = (
                    "timed out"
                    if isinstance(exc, asyncio.TimeoutError)
                    else str(exc) or type(exc).__name__
                )
                raise EndpointUnavailable(
                    f"endpoint {base} is unreachable ({reason}); start the server, fix api_base_url, "
                    "or omit api_base_url to let modelbench serve the model"
                ) from None
            try:
                names = [str(m.get("id")) for m in json.loads(body).get("data", [])]
            except (json.JSONDecodeError, AttributeError, TypeError):
                raise EndpointUnavailable(f"{url} did not return an OpenAI model list") from None
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

    async def _once(self, path: str, payload: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        base = self._pick()
        self._outstanding[base] += 1
        try:
            async with self.session.post(
                f"{base}{path}", json=payload, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as resp:
                body = await resp.read()
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
        except asyncio.TimeoutError:
            raise _Retryable(f"timeout after {self.timeout_s:g}s") from None
        except aiohttp.ClientPayloadError:
            raise _Retryable("connection broken mid-response") from None
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise _Retryable(f"connection error: {type(exc).__name__}") from None
        finally:
            self._outstanding[base] -= 1
        if status != 200:
            if status in RETRY_STATUSES or status >= 500:
                raise _Retryable(f"HTTP {status}", _retry_after(retry_after))
            raise RequestFailed(f"HTTP {status} from {base}{path}: {_error_text(body)}", attempts=1)
        try:
            data = json.loads(body)
            choice = data["choices"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, UnicodeDecodeError):
            raise _Retryable("malformed response") from None
        return data, str(choice.get("finish_reason") or "")

    async def request(self, path: str, payload: Mapping[str, Any]) -> Completion:
        """POST with retries; returns the first choice's text."""
        reasons: list[str] = []
        started = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            try:
                data, finish = await self._once(path, payload)
            except _Retryable as exc:
                reasons.append(exc.reason)
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
            choice = data["choices"][0]
            if path.endswith("chat/completions"):
                message = choice.get("message") or {}
                text = message.get("content") or ""
            else:
                text = choice.get("text") or ""
            usage = data.get("usage") or {}
            return Completion(
                text=str(text),
                finish_reason=finish or None,
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
                latency_s=time.perf_counter() - started,
                attempts=attempt,
                retry_reasons=reasons,
            )
