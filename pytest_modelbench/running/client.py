"""The OpenAI-compatible client: a completion request through the endpoint pool, read into a
:class:`Completion` from any shape a server may send.

Routing, retries, timeouts, the pre-flight and dead-endpoint detection are the pool's
(:mod:`.pool`); this adds what a completion is: a 200 whose body has no first choice is
retried (``malformed response``), any other status the pool does not retry fails with the
server's message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_modelbench.running.http import Response
from pytest_modelbench.running.pool import (
    EndpointPool,
    EndpointUnavailable,
    Malformed,
    RequestFailed,
    RetryPolicy,
    unusable,
)
from pytest_modelbench.running.urls import UrlSet

__all__ = [
    "Completion",
    "EndpointUnavailable",
    "OpenAIClient",
    "RequestFailed",
    "RetryPolicy",
    "UrlSet",
]


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


def _completion(response: Response, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the body, its first choice) of a completion response."""
    if response.status != 200:
        raise unusable(response, where)
    try:
        data: dict[str, Any] = json.loads(response.body)
        choice: dict[str, Any] = data["choices"][0]
        if not isinstance(choice, dict):
            raise TypeError
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, UnicodeDecodeError):
        raise Malformed("malformed response") from None
    return data, choice


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
        return Completion(
            text=_choice_text(choice, chat=path.endswith("chat/completions")),
            finish_reason=str(choice.get("finish_reason") or "") or None,
            prompt_tokens=_count(usage.get("prompt_tokens")),
            completion_tokens=_count(usage.get("completion_tokens")),
            latency_s=time.perf_counter() - started,
            attempts=attempts,
            retry_reasons=reasons,
        )
