"""Odd but valid JSON from a server is read, never a traceback: strings where objects or numbers
are usual, and OpenAI content-part lists (scored on their text, not their ``repr``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.core.test_client_transport import http, run


def body(choice: dict[str, Any], **extra: Any) -> bytes:
    return http(json.dumps({"id": "c", "choices": [{"index": 0, **choice}], **extra}).encode())


@pytest.mark.parametrize(
    ("choice", "extra", "text", "tokens"),
    [
        ({"message": {"content": "4"}}, {"usage": "lots"}, "4", (None, None)),
        ({"message": "4"}, {}, "4", (None, None)),
        (
            {"message": {"content": "4"}},
            {"usage": {"prompt_tokens": "12", "completion_tokens": "3"}},
            "4",
            (12, 3),
        ),
        (
            {
                "message": {
                    "content": [
                        {"type": "text", "text": "The answer"},
                        {"type": "text", "text": " is 4"},
                    ]
                }
            },
            {"usage": {"prompt_tokens": 5, "completion_tokens": True}},
            "The answer is 4",
            (5, None),
        ),
        ({"message": {"content": None}}, {"usage": {"prompt_tokens": "many"}}, "", (None, None)),
    ],
    ids=["usage-string", "message-string", "string-counts", "content-parts", "null-content"],
)
def test_odd_but_valid_json_is_read(
    choice: dict[str, Any], extra: dict[str, Any], text: str, tokens: tuple[Any, Any]
) -> None:
    (completion,), _ = run(lambda _seen: body(choice, **extra), "q")
    assert completion.text == text
    assert (completion.prompt_tokens, completion.completion_tokens) == tokens
