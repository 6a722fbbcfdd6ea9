"""Secrets never leave the process: every string modelbench writes or prints can pass through
:func:`redact`, which removes the API key values in use and anything that looks like a bearer
token or an API key (``sk-...``), even when a server echoes them back in an error body.

Keys are registered where they are read from the environment (:func:`remember`); the registry
is per process, so each xdist worker redacts the keys it uses. A URL that carries credentials
(``http://user:KEY@host/v1``) is refused where it is configured, and shown only through
:func:`masked_url`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "[REDACTED]"
_MIN_SECRET = 8  # shorter values are not treated as secrets (they would redact ordinary words)
_secrets: set[str] = set()
# OpenAI-style keys and bearer tokens, whatever key is in use (a gateway may echo another one)
_TOKEN = re.compile(
    r"(?:\bsk-[A-Za-z0-9_\-]{8,}|(?i:\bbearer\s+)[A-Za-z0-9._~+/\-]{8,}=*|\bsess-[A-Za-z0-9]{16,})"
)


def remember(value: str | None) -> None:
    """Treat ``value`` (an API key read from the environment) as a secret from now on."""
    if value and len(value) >= _MIN_SECRET:
        _secrets.add(value)


_CREDENTIAL_WORDS = ("auth", "key", "token", "secret", "password", "cookie", "session")
_SCHEMES = ("bearer", "basic", "token", "apikey", "api-key", "digest")


def is_credential_header(name: str) -> bool:
    """Whether a header's name says its value is a credential (``Authorization``,
    ``X-Api-Key``, ``Cookie`` ...)."""
    return any(word in name.lower() for word in _CREDENTIAL_WORDS)


def remember_header(name: str, value: str) -> None:
    """Treat a credential header's value as secret, and each part a server could echo alone:
    the token after ``Bearer``/``Basic``/``Token``, a Basic token's ``user:password`` and its
    password, and each ``name=value`` of a cookie."""
    if not is_credential_header(name):
        return
    remember(value)
    scheme, _, credential = value.strip().partition(" ")
    if scheme.lower() in _SCHEMES and credential.strip():
        credential = credential.strip()
        remember(credential)
        if scheme.lower() == "basic":
            _remember_basic(credential)
    for part in value.split(";"):
        _, eq, cookie = part.partition("=")
        if eq:
            remember(cookie.strip())


def _remember_basic(token: str) -> None:
    import base64
    import binascii

    try:
        decoded = base64.b64decode(token, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return
    remember(decoded)
    remember(decoded.partition(":")[2])


def redact(text: str) -> str:
    """``text`` without any registered secret or token-looking string."""
    if not text:
        return text
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    if "sk-" in text or "earer" in text or "sess-" in text:
        text = _TOKEN.sub(_mask, text)
    return text


def _mask(match: re.Match[str]) -> str:
    token = match.group(0)
    if token[:6].lower() == "bearer":
        return "Bearer " + REDACTED
    return REDACTED


def masked_url(url: str) -> str | None:
    """``url`` with its user and password replaced by ``***`` (``http://***@host/v1``), or None
    when it carries no credentials."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    _, at, host = rest[:end].rpartition("@")
    return f"{scheme}://***@{host}{rest[end:]}" if at else None


_SECRET_FLAG_WORDS = ("key", "token", "secret", "password")


def masked_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of credential flags (``--api-key K``) masked."""
    shown: list[str] = []
    hide = False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        secret = arg.startswith("--") and any(w in flag.lower() for w in _SECRET_FLAG_WORDS)
        shown.append("***" if hide else f"{flag}=***" if secret and eq else arg)
        hide = secret and not eq
    return shown
