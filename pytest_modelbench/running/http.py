"""HTTP for the endpoint pool, on aiohttp: one request, every failure named.

aiohttp does the protocol: keep-alive connections, chunked bodies, content decoding
(``gzip``, ``deflate``; ``br``/``zstd`` where their packages are installed), TLS and
forward proxies (a ``CONNECT`` tunnel for ``https://``, on every Python we support).
This module only configures it and turns its exceptions into one line that says what
happened (TLS verification failed, a redirect to where, a body in a bad encoding), for
the pool's retry policy and for the user.

Proxies are read from the environment as aiohttp's ``trust_env`` reads them
(``helpers.get_env_proxy_for_url``: ``HTTP_PROXY``/``HTTPS_PROXY``, lower-case names
winning as in curl and requests, ``NO_PROXY``, ``~/.netrc`` for proxy credentials), once
per base URL rather than per request: ``trust_env=True`` looks them and ``~/.netrc`` up
in a thread for every request, which doubled the client's CPU per request (PERFORMANCE.md).
Two readings are added, as curl and requests have them: a ``NO_PROXY`` entry may write an
IPv6 address in brackets (``[::1]``), and a proxy may be given as ``host:port`` without
``http://``. TLS verifies against ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when set, else the
system's trust store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from ssl import SSLContext  # the name Target.ssl hides the module in its class

import aiohttp
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.helpers import get_env_proxy_for_url, strip_auth_from_url
from yarl import URL

CONNECT_TIMEOUT_S = 30.0
KEEPALIVE_S = 4.0  # below common servers' idle timeouts (uvicorn, so vLLM: 5 s), so a kept
# connection is closed by us first, never by the server as a request goes out on it
USER_AGENT = "pytest-modelbench"
CLOSED_SILENTLY = "closed without a response"

# what aiohttp decodes (auto_decompress): anything else arrives as it was sent
_DECODED = frozenset(
    ["", "identity", "gzip", "x-gzip", "deflate"] + ["br"] * HAS_BROTLI + ["zstd"] * HAS_ZSTD
)
_contexts: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


@dataclass(frozen=True)
class Response:
    """One HTTP response, its body read and decoded."""

    status: int
    headers: Mapping[str, str]  # case-insensitive names
    body: bytes


class TransportError(Exception):
    """A request that got no usable response: ``reason`` is short and stable (retry reasons
    are counted by it), ``detail`` says what happened for the user."""

    def __init__(
        self,
        reason: str,
        *,
        detail: str = "",
        connect: bool = False,
        final: bool = False,
        unreachable: bool = False,
        answered: bool = False,
    ) -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail or reason
        self.connect = connect  # no connection could be opened: nothing reached the server
        self.final = final  # no retry changes it (a certificate the trust store refuses)
        self.unreachable = unreachable  # nothing answered there (refused, DNS, timed out)
        self.answered = answered  # a response came, but it cannot be read (not the connection)


def ssl_context() -> ssl.SSLContext:
    """The verifying context: ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when set (as OpenSSL, curl
    and requests read them), else the system's trust store; built once per value."""
    cafile = os.environ.get("SSL_CERT_FILE") or None
    capath = os.environ.get("SSL_CERT_DIR") or None
    key = (cafile, capath)
    context = _contexts.get(key)
    if context is None:
        try:
            context = ssl.create_default_context(cafile=cafile, capath=capath)
        except (OSError, ssl.SSLError) as exc:
            where = f"SSL_CERT_FILE={cafile}" if cafile else f"SSL_CERT_DIR={capath}"
            raise TransportError(
                "bad trust store",
                detail=f"{where} cannot be read as PEM certificates ({exc}); point it at a CA "
                "bundle or unset it",
                connect=True,
                final=True,
            ) from None
        _contexts[key] = context
    return context


def open_session(headers: Mapping[str, str]) -> aiohttp.ClientSession:
    """A session for one pool, in the running event loop (no cookies: an API is stateless)."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(
        connector=connector,
        headers={"User-Agent": USER_AGENT, **headers},
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,  # read once per base URL by Target, see the module docstring
        auto_decompress=True,
    )


def _bypassed(host: str) -> bool:
    """``NO_PROXY`` as urllib (so aiohttp) reads it, plus IPv6 entries written in brackets."""
    if urllib.request.proxy_bypass(host):
        return True
    if ":" not in host:
        return False
    no_proxy = urllib.request.getproxies_environment().get("no", "")
    return any(e.strip().lower().strip("[]") == host.lower() for e in no_proxy.split(","))


@dataclass(frozen=True)
class Target:
    """How to reach one base URL: its URL prefix, proxy and TLS context, read once."""

    base: str
    proxy: URL | None
    proxy_auth: aiohttp.BasicAuth | None
    ssl: ssl.SSLContext | bool

    @classmethod
    def of(cls, base: str, tls: SSLContext | None = None, *, direct: bool = False) -> Target:
        """``tls``: the context of an ``https://`` base (the verifying default otherwise).
        ``direct``: never through a proxy (this session's own servers: a proxy cannot reach
        them, and their key would travel to it)."""
        url = URL(base)
        proxy: URL | None = None
        auth = None
        if url.host is not None and not direct and not _bypassed(url.host):
            with contextlib.suppress(LookupError):  # no proxy for it
                proxy, auth = get_env_proxy_for_url(url)
        if proxy is not None and proxy.host is None:  # host:port, as curl and requests take it
            proxy, auth = strip_auth_from_url(URL(f"http://{proxy}"))
        if url.scheme != "https":
            return cls(base, proxy, auth, True)
        return cls(base, proxy, auth, tls if tls is not None else ssl_context())


async def request(
    session: aiohttp.ClientSession,
    target: Target,
    url: URL,
    method: str,
    body: bytes | None,
    timeout: aiohttp.ClientTimeout,
    headers: Mapping[str, str] | None = None,
) -> aiohttp.ClientResponse:
    """Send one request and return once the response head is in (the caller reads the body
    and releases the response); raise :class:`TransportError`."""
    try:
        return await session.request(
            method,
            url,
            data=body,
            headers=headers,
            timeout=timeout,
            proxy=target.proxy,
            proxy_auth=target.proxy_auth,
            ssl=target.ssl,
            allow_redirects=False,  # a moved endpoint is an error naming where it went
        )
    except Exception as exc:
        raise failure(exc, target) from None


def failure(exc: BaseException, target: Target) -> TransportError | BaseException:
    """What went wrong, in words; exceptions that are no transport failure pass through."""
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _connect_failure(exc, target)
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return TransportError(
            "proxy refused CONNECT",
            detail=f"{_proxy(target)} refused CONNECT: HTTP {exc.status} {exc.message}",
            connect=True,
            final=exc.status in (401, 403, 407),
        )
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # (sock_connect)
        return TransportError(
            f"connect timed out after {CONNECT_TIMEOUT_S:g}s", connect=True, unreachable=True
        )
    if isinstance(exc, asyncio.TimeoutError):
        return exc  # the request's own timeout: the pool names it with its seconds
    if isinstance(
        exc,
        (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError),
    ):
        return _response_failure(exc)
    if isinstance(exc, OSError) and exc.errno is not None:  # ClientOSError: name the errno
        name = type(OSError(exc.errno, exc.strerror)).__name__  # ConnectionResetError, ...
        return TransportError(name, detail=f"{name}: {exc.strerror or exc}")
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return TransportError(type(exc).__name__, detail=f"{type(exc).__name__}: {exc}")
    return exc


def _response_failure(
    exc: aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError,
) -> TransportError:
    """The connection closed before the response was whole, or the response cannot be read."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):  # its message: the head, if one came
        if isinstance(exc.message, str):
            return TransportError(CLOSED_SILENTLY, unreachable=True)
        return TransportError("closed mid-response")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return _payload_failure(_one_line(str(exc)))
    text = _one_line(exc.message)  # the parser refused the response head
    if "content-encoding" in text.lower():
        return _payload_failure(text)
    return TransportError(
        "unparseable response", detail=f"unparseable response: {text}", answered=True
    )


def _proxy(target: Target) -> str:
    return f"proxy {target.proxy.host}:{target.proxy.port}" if target.proxy else "the proxy"


def _connect_failure(exc: aiohttp.ClientConnectorError, target: Target) -> TransportError:
    """No connection: refused, DNS, TLS verification or handshake, the proxy unreachable."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cert = exc.certificate_error
        why = getattr(cert, "verify_message", None) or getattr(cert, "reason", None) or cert
        return TransportError(
            "TLS verification failed",
            detail=f"TLS verification failed: {why} (SSLCertVerificationError); trust the "
            "server's CA with SSL_CERT_FILE=/path/to/ca.pem",
            connect=True,
            final=True,
        )
    if isinstance(exc, aiohttp.ClientConnectorSSLError):
        return TransportError(
            "TLS handshake failed", detail=f"TLS handshake failed: {exc}", connect=True, final=True
        )
    os_error = exc.os_error
    name = type(os_error).__name__
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return TransportError(
            name,
            detail=f"{_proxy(target)} is unreachable ({name}: {os_error}); check "
            "HTTPS_PROXY/HTTP_PROXY or list the host in NO_PROXY",
            connect=True,
        )
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return TransportError(
            "DNS lookup failed",
            detail=f"DNS lookup of {exc.host} failed ({os_error})",
            connect=True,
            unreachable=True,
        )
    return TransportError(
        name, detail=f"{name}: {os_error.strerror or os_error}", connect=True, unreachable=True
    )


def _payload_failure(text: str) -> TransportError:
    if "content-encoding" in text.lower() or "decompress" in text.lower():
        return TransportError(
            "bad Content-Encoding", detail=f"bad Content-Encoding: {text}", answered=True
        )
    return TransportError("closed mid-response", detail=f"closed mid-response: {text}")


def _one_line(text: str) -> str:
    """aiohttp's multi-line parser messages (``400, message:\n  Bad status line: ...``) as one
    line, without the status aiohttp puts in front."""
    words = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return words.removeprefix("400, message: ").removeprefix("400, message:").strip()[:300]


def redirect_target(response: Response) -> str | None:
    """Where a 3xx response points, or None for any other response."""
    if 300 <= response.status < 400:
        return response.headers.get("Location") or "(no Location header)"
    return None


def bad_encoding(response: Response) -> str | None:
    """A ``Content-Encoding`` aiohttp left as it was (not one it decodes), or None."""
    encoding = response.headers.get("Content-Encoding", "").strip().lower()
    if encoding in _DECODED:
        return None
    return encoding
