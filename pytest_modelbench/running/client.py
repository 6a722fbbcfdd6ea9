"""The OpenAI-compatible client: a completion request through the endpoint pool, read into a
:class:`Completion` from any shape a server may send.

A reasoning model's thinking is kept apart from its answer: from ``message.reasoning_content``
(vLLM's reasoning parsers), ``message.reasoning`` (newer vLLM) or ``<think>`` blocks in the
text (no parser on); scorers see only the answer.

Routing, retries, timeouts, the pre-flight and dead-endpoint detection are the pool's
(:mod:`.pool`); this adds what a completion is: a 200 whose body has no first choice is
retried (``malformed response``), any other status the pool does not retry fails with the
server's message. A 200 whose body is an error (``{"error": ...}``, as some gateways answer)
fails at once with its message, unless its code says to retry (429, 5xx).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_modelbench.running.http import Response
from pytest_modelbench.running.pool import (
    RETRY_STATUSES,
    EndpointPool,
    EndpointUnavailable,
    Malformed,
    RequestFailed,
    RetryPolicy,
    error_code,
    error_text,
    unusable,
)
from pytest_modelbench.running.urls import UrlSet
from pytest_modelbench.suites.extract import split_thinking

__all__ = [
    "Completion",
    "EndpointUnavailable",
    "OpenAIClient",
    "RequestFailed",
    "RetryPolicy",
    "UrlSet",
    "split_thinking",
]


@dataclass
class Completion:
    """A model answer with its cost: tokens, latency, attempts."""

    text: str  # the answer: what scorers read (thinking removed)
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    attempts: int
    retry_reasons: list[str] = field(default_factory=list)
    reasoning: str | None = None  # the thinking, when the model sent any
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens
    system_fingerprint: str | None = None  # the build that answered, as the server says

    @property
    def truncated(self) -> bool:
        """The token budget ran out (``finish_reason: length``)."""
        return self.finish_reason == "length"

    @property
    def truncated_in_reasoning(self) -> bool:
        """The budget ran out before any answer: the model was still thinking."""
        return self.truncated and not self.text.strip()


REASONING_FIELDS = ("reasoning_content", "reasoning")  # vLLM's names, older first


def _reasoning_field(choice: Mapping[str, Any]) -> str | None:
    """The thinking a reasoning parser sent beside the answer (either field name), or None."""
    message = choice.get("message")
    if not isinstance(message, dict):
        return None
    for name in REASONING_FIELDS:
        text = _part_text(message.get(name))
        if text:
            return text
    return None


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _reasoning_tokens(usage: Mapping[str, Any]) -> int | None:
    details = usage.get("completion_tokens_details")
    return _count(details.get("reasoning_tokens")) if isinstance(details, dict) else None


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


def _error_body(data: Any, response: Response, where: str) -> Exception | None:
    """For a 200 whose body is an error rather than a completion (a gateway's way to fail):
    :class:`Malformed` to retry when its code is one the pool retries, else the final
    :class:`RequestFailed`, both with the server's message; None for any other body."""
    if not isinstance(data, dict) or "choices" in data or not data.get("error"):
        return None
    text = error_text(response.body)
    code = error_code(data["error"])
    if code is not None and (code in RETRY_STATUSES or code >= 500):
        return Malformed(
            f"error {code} in a 200 response", f"HTTP 200 from {where} with error {code}: {text}"
        )
    return RequestFailed(f"HTTP 200 from {where} is an error, not a completion: {text}", attempts=1)


def _completion(response: Response, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the body, its first choice) of a completion response."""
    if response.status != 200:
        raise unusable(response, where)
    try:
        data: dict[str, Any] = _json_body(response.body)
        failed = _error_body(data, response, where)
        if failed is not None:
            raise failed
        choice: dict[str, Any] = data["choices"][0]
        if not isinstance(choice, dict):
            raise TypeError
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, RecursionError):
        raise Malformed("malformed response") from None
    return data, choice


def _json_body(body: bytes) -> Any:
    """A response body's JSON; bytes that are not UTF-8 (a server's broken text) read as U+FFFD,
    so the reply is kept and scored rather than retried as malformed."""
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        return json.loads(body.decode("utf-8", errors="replace"))


class OpenAIClient(EndpointPool):
    """An :class:`EndpointPool` that sends chat/completions requests and reads their answers.

    Use as ``async with OpenAIClient(urls, ...) as client``.
    """

    async def request(self, path: str, payload: Mapping[str, Any]) -> Completion:
        """POST with the pool's retries; returns the first choice's text."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        started = time.perf_counter()
        (data, choice), attempts, reasons = await self.send("POST", path, body, _completion)
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        chat = path.endswith("chat/completions")
        text, thought = split_thinking(_choice_text(choice, chat=chat))
        parsed = _reasoning_field(choice) if chat else None
        if parsed is not None:
            thought = parsed if thought is None else f"{parsed}\n\n{thought}"
        return Completion(
            text=text,
            finish_reason=str(choice.get("finish_reason") or "") or None,
            prompt_tokens=_count(usage.get("prompt_tokens")),
            completion_tokens=_count(usage.get("completion_tokens")),
            latency_s=time.perf_counter() - started,
            attempts=attempts,
            retry_reasons=reasons,
            reasoning=thought,
            reasoning_tokens=_reasoning_tokens(usage),
            system_fingerprint=_text_or_none(data.get("system_fingerprint")),
        )
