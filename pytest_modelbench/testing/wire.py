"""What the simulated server sends: OpenAI-shaped bodies, SSE streams, dropped connections.

Pure builders (bytes and dicts in, bytes out) plus the two helpers that touch
aiohttp, so the server module reads as policy and this one as format.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from pytest_modelbench.testing.faults import FaultKind

_quote = json.encoder.encode_basestring_ascii  # str -> its JSON literal (C fast path)
_LINGER_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST
FINGERPRINT = "modelbench-sim"


def error_body(message: str, kind: str, code: object) -> bytes:
    """An OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
    error = {"message": message, "type": kind, "param": None, "code": code}
    return json.dumps({"error": error}).encode()


def json_response(
    data: bytes, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A JSON response from already-encoded bytes."""
    return web.Response(body=data, status=status, content_type="application/json", headers=headers)


def retry_after_headers(seconds: float) -> dict[str, str]:
    """``Retry-After`` in seconds (decimals allowed, for fast tests) and ``retry-after-ms``."""
    value = str(int(seconds)) if seconds == int(seconds) else f"{seconds:g}"
    return {"Retry-After": value, "retry-after-ms": str(int(seconds * 1000))}


def message_text(content: object) -> str:
    """The text of a chat message's content (a string or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def model_card(name: str, max_model_len: int) -> dict[str, Any]:
    """One entry of ``/v1/models`` (vLLM's fields)."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": FINGERPRINT,
        "root": name,
        "max_model_len": max_model_len,
    }


def completion_payload(
    number: int,
    model: str,
    choices: Sequence[tuple[str, str]],
    usage: Mapping[str, Any],
    *,
    chat: bool,
    thoughts: Sequence[str] = (),
    reasoning_field: str = "reasoning_content",
    fingerprint: str = FINGERPRINT,
) -> dict[str, Any]:
    """A chat.completion or text_completion body; ``choices`` are (text, finish_reason).

    ``thoughts`` (one per choice) go in ``message.<reasoning_field>`` as a vLLM reasoning
    parser sends them, with a null ``content`` when there is no answer yet; the caller puts
    them in the text instead for ``<think>`` blocks and completions."""
    if chat:
        rows: list[dict[str, Any]] = []
        for index, (text, finish) in enumerate(choices):
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thoughts:
                message[reasoning_field] = thoughts[index]
                message["content"] = text or None
            rows.append(
                {"index": index, "message": message, "finish_reason": finish, "logprobs": None}
            )
    else:
        rows = [
            {"index": index, "text": text, "finish_reason": finish, "logprobs": None}
            for index, (text, finish) in enumerate(choices)
        ]
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-sim{number}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": rows,
        "usage": dict(usage),
    }


def completion_bytes(
    number: int,
    model: str,
    choices: Sequence[tuple[str, str]],
    usage: Mapping[str, int],
    *,
    chat: bool,
    fingerprint: str = FINGERPRINT,
) -> bytes:
    """``json.dumps(completion_payload(...))``, built from a template (the hot path's body).

    Only the strings go through the JSON encoder; the fixed structure is
    formatted directly, which is several times faster than encoding the dict.
    """
    quote = _quote
    if chat:
        rows = ", ".join(
            f'{{"index": {index}, "message": {{"role": "assistant", "content": {quote(text)}}}, '
            f'"finish_reason": {quote(finish)}, "logprobs": null}}'
            for index, (text, finish) in enumerate(choices)
        )
        kind, obj = "chatcmpl", "chat.completion"
    else:
        rows = ", ".join(
            f'{{"index": {index}, "text": {quote(text)}, "finish_reason": {quote(finish)}, '
            '"logprobs": null}'
            for index, (text, finish) in enumerate(choices)
        )
        kind, obj = "cmpl", "text_completion"
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    return (
        f'{{"id": "{kind}-sim{number}", "object": "{obj}", "created": {int(time.time())}, '
        f'"model": {quote(model)}, "system_fingerprint": {quote(fingerprint)}, "choices": [{rows}], '
        f'"usage": {{"prompt_tokens": {prompt}, "completion_tokens": {completion}, '
        f'"total_tokens": {usage["total_tokens"]}}}}}'
    ).encode()


def sse_body(
    payload: Mapping[str, Any], fault: FaultKind | None, *, chat: bool, include_usage: bool
) -> bytes:
    """``payload`` as server-sent events: per choice a content chunk and a finish chunk,
    then a usage chunk if asked, then ``[DONE]``. Under a ``malformed`` fault the
    only event is truncated JSON; under ``no_choices`` a chunk without choices."""
    base = {key: payload[key] for key in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk" if chat else "text_completion"
    events: list[bytes] = []
    if fault == "malformed":
        data = json.dumps(payload).encode()
        events.append(data[: len(data) // 2])
    elif fault == "no_choices":
        events.append(json.dumps(base).encode())
    else:
        for choice in payload["choices"]:
            index, finish = choice["index"], choice["finish_reason"]
            if chat:
                delta = {"role": "assistant", **choice["message"]}
                first = {"index": index, "delta": delta, "finish_reason": None}
                last = {"index": index, "delta": {}, "finish_reason": finish}
            else:
                first = {"index": index, "text": choice["text"], "finish_reason": None}
                last = {"index": index, "text": "", "finish_reason": finish}
            events.append(json.dumps({**base, "choices": [first]}).encode())
            events.append(json.dumps({**base, "choices": [last]}).encode())
        if include_usage:
            events.append(json.dumps({**base, "choices": [], "usage": payload["usage"]}).encode())
    events.append(b"[DONE]")
    return b"".join(b"data: " + event + b"\n\n" for event in events)


async def send_stream(request: web.BaseRequest, data: bytes) -> web.StreamResponse:
    """Answer with an ``text/event-stream`` body."""
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    response = web.StreamResponse(status=200, headers=headers)
    await response.prepare(request)
    await response.write(data)
    await response.write_eof()
    return response


def drop_connection(request: web.BaseRequest, *, rst: bool) -> None:
    """Close the request's connection: with an RST (a reset) or a plain close (FIN)."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return
    if rst:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        transport.abort()
    else:
        transport.close()


INVALID = "invalid_request_error"


class BadRequest(Exception):
    """The request is a client error; carries the status and OpenAI error fields."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def chat_keys(body: dict[str, Any]) -> tuple[tuple[str, ...], int]:
    """The key (last user message) of a chat request and its prompt tokens (whitespace words)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(400, "'messages' must be a non-empty list", "invalid_messages")
    key = ""
    prompt_tokens = 0
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest(400, "each message must be an object", "invalid_messages")
        text = message_text(message.get("content"))
        prompt_tokens += len(text.split())
        if message.get("role") == "user":
            key = text
    return (key,), prompt_tokens


def completion_keys(body: dict[str, Any]) -> tuple[tuple[str, ...], int]:
    """The keys (prompts) of a completion request and their prompt tokens."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        keys: tuple[str, ...] = (prompt,)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        keys = tuple(prompt)
    else:
        raise BadRequest(400, "'prompt' must be a string or a list of strings", "invalid_prompt")
    return keys, sum(len(key.split()) for key in keys)


def not_found(model: str) -> BadRequest:
    return BadRequest(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        "model_not_found",
    )
