"""Chat prompts for the built-in suites: instruction + question, optional few-shot turns.

Few-shot exemplars become alternating user/assistant turns before the real
question (lm-eval's ``fewshot_as_multiturn``), each user turn carrying the
same instruction so the format request is never ambiguous. :func:`plain`
renders the same conversation as one string for completion endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_modelbench.suites.contract import Message

Shot = tuple[str, str]  # (user turn, assistant turn)

LETTERS = "ABCDEFGHIJ"


def chat(user: str, shots: Sequence[Shot] = (), system: str | None = None) -> tuple[Message, ...]:
    """``[system] (user, assistant)* user`` as chat messages."""
    messages: list[Message] = []
    if system:
        messages.append({"role": "system", "content": system})
    for question, answer in shots:
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": user})
    return tuple(messages)


def plain(messages: Sequence[Mapping[str, str]]) -> str:
    """The conversation as text for a completions endpoint (turns separated by blank lines)."""
    parts = [message.get("content", "") for message in messages]
    return "\n\n".join(part.strip("\n") for part in parts) + "\n\n"


def letters_for(options: Sequence[Any]) -> str:
    return LETTERS[: len(options)]


def format_options(options: Sequence[str], letters: str | None = None) -> str:
    """``A) first\\nB) second ...``"""
    letters = letters or letters_for(options)
    return "\n".join(
        f"{letter}) {str(option).strip()}" for letter, option in zip(letters, options, strict=False)
    )


def letter_list(letters: str) -> str:
    """``A, B, C or D``"""
    return ", ".join(letters[:-1]) + f" or {letters[-1]}" if len(letters) > 1 else letters
