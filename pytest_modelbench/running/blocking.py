"""Blocking HTTP, for the few calls made outside an event loop: a server's health and
``/v1/models`` probes, the replica exchange's calls, ``modelbench models``.

Everything that sends an item's requests runs on aiohttp (:mod:`.http`); these calls are
one request each, from threads or the command line, where an event loop would cost more
than the call. Probes of our own servers and calls to the session's exchange go straight
to their address (``direct=True``, the default) even when the user has ``HTTP(S)_PROXY``
set; a call to a user's server honours the proxy variables.
Standard library only: :mod:`pytest_modelbench.serving` imports this at start-up.
"""

from __future__ import annotations

import http.client
import ipaddress
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Reply", "Unreachable", "get", "request"]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is the answer: following it would carry the call's credentials (a bearer key)
    to whatever host, or plain-HTTP URL, the server names."""

    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


_DIRECT = urllib.request.build_opener(_NoRedirect(), urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Reply:
    """What a server answered, whatever its status."""

    status: int
    reason: str  # the status line's text (``Not Found``)
    body: bytes


class Unreachable(OSError):
    """Nothing answered: refused, timed out, a name that does not resolve, a bad URL."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def request(
    url: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    data: bytes | None = None,
    timeout_s: float = 2.0,
    direct: bool = True,
    context: ssl.SSLContext | None = None,
) -> Reply:
    """One request; any HTTP answer (an error status too) is a :class:`Reply`, no answer
    raises :class:`Unreachable`, and so does a body cut short or a TLS handshake refused.
    ``context``: the TLS context of an ``https://`` call (the default trust otherwise).
    A loopback address is always called directly: a proxy cannot reach this machine's
    loopback, and the call's key would go to the proxy."""
    direct = direct or _loopback(url)
    if context is not None:
        handlers: list[urllib.request.BaseHandler] = [
            _NoRedirect(),
            urllib.request.HTTPSHandler(context=context),
        ]
        if direct:
            handlers.append(urllib.request.ProxyHandler({}))
        opener = urllib.request.build_opener(*handlers)
    else:  # the proxy variables as they are now (urllib reads them when an opener is built)
        opener = _DIRECT if direct else urllib.request.build_opener(_NoRedirect())
    try:
        prepared = urllib.request.Request(
            url, data=data, headers=dict(headers or {}), method=method
        )
        with opener.open(prepared, timeout=timeout_s) as response:
            return Reply(int(response.status), str(response.reason), response.read())
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read()
        except OSError:
            body = b""
        return Reply(int(exc.code), str(exc.reason), body)
    except urllib.error.URLError as exc:
        raise Unreachable(str(exc.reason)) from None
    # reset, timed out mid-body, unknown URL type; a body cut short, a status line that is not
    # HTTP (another protocol on the port)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise Unreachable(str(exc) or type(exc).__name__) from None


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def get(
    url: str,
    timeout_s: float = 2.0,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, bytes] | None:
    """``(status, body)`` of a direct GET, or None when nothing answers: the probe form."""
    try:
        reply = request(url, headers=headers, timeout_s=timeout_s, context=context)
    except Unreachable:
        return None
    return reply.status, reply.body
