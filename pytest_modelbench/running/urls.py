"""The base URLs that serve one model: a set that grows and shrinks while items run."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

from pytest_modelbench.secrets import masked_url

__all__ = ["UrlSet"]


class UrlSet:
    """The base URLs that serve one model, shared by every pool and router mount sending to
    it (thread-safe): a replica joins with :meth:`add` and leaves with :meth:`remove` while
    items run; routing reads the set at every request. ``tls``: the context of its
    ``https://`` URLs when they are servers of this session (the session's CA trusted, the
    worker's certificate shown); None: the user's trust store. ``own``: servers this session
    started, reached directly even when ``HTTP(S)_PROXY`` is set (a proxy cannot reach them,
    and their key would travel to it)."""

    def __init__(
        self,
        urls: Iterable[str] = (),
        *,
        tls: ssl.SSLContext | None = None,
        own: bool = False,
    ) -> None:
        self.tls = tls
        self.own = own
        self._lock = threading.Lock()
        self._urls: tuple[str, ...] = ()
        self._replicas: frozenset[str] = frozenset()  # URLs that joined with replica=True
        for url in urls:
            self.add(url)

    @property
    def urls(self) -> tuple[str, ...]:
        return self._urls

    @property
    def replicas(self) -> int:
        """How many replicas serve here beyond the configured URLs (the built-in suites keep
        ``max_concurrent`` in flight per server: the configured ones count as one)."""
        return len(self._replicas)

    def add(self, url: str, *, replica: bool = False) -> str:
        """Add a base URL (a no-op when present); returns it as routing spells it.
        ``replica``: a server modelbench added for the running item (counted in
        :attr:`replicas`)."""
        url = url.rstrip("/")
        masked = masked_url(url)
        if masked is not None:  # configuration refuses these first; never route (or show) one
            raise ValueError(
                f"api_base_url {masked} carries credentials, which are not sent; use api_key_var"
            )
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"api_base_url must be an http:// or https:// URL, got {url!r}")
        with self._lock:
            if url not in self._urls:
                self._urls = (*self._urls, url)
                if replica:
                    self._replicas = self._replicas | {url}
        return url

    def remove(self, url: str) -> bool:
        """Stop routing to ``url`` (requests in flight there finish); False when absent."""
        url = url.rstrip("/")
        with self._lock:
            if url not in self._urls:
                return False
            self._urls = tuple(u for u in self._urls if u != url)
            self._replicas = self._replicas - {url}
        return True

    def __repr__(self) -> str:
        return f"UrlSet({list(self._urls)!r})"
