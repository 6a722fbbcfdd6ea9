"""An OpenAI-compatible place to send one model's requests, checked once by a pre-flight.

Backends reach it one way: :meth:`Endpoint.client` (an endpoint pool in the backend's event
loop) or, for tools that take a single base URL, :meth:`Endpoint.single_url` (a mount of
the worker's loopback router that spreads over the whole URL set).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_modelbench.errors import EvaluationError
from pytest_modelbench.running.urls import UrlSet

if TYPE_CHECKING:
    from pytest_modelbench.running.client import OpenAIClient
    from pytest_modelbench.running.pool import EndpointPool

# The pool, the client and the router import aiohttp (about 0.15 s): they load when an item
# sends its first request, not when pytest starts (``pytest --help`` stays light).
_ROUTER_MODULE = "pytest_modelbench.running.router"


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible place to send one model's requests. The key is never written anywhere."""

    base_urls: tuple[str, ...]  # as configured: the identity, and the pre-flight's cache key
    served_model: str
    api: str
    api_key: str | None = field(default=None, repr=False)
    backoff_s: float = 0.5
    preflight_timeout_s: float = 15.0
    checked: dict[tuple[tuple[str, ...], str], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )  # shared per worker: key -> None (passed) or the failure message (fail the next items at once)
    # for a server modelbench started: None while it runs, else why it died (stop the item)
    died: Callable[[], str | None] | None = field(default=None, compare=False, repr=False)
    # the live URL set (base_urls, and replicas that join later): shared per worker and model
    urls: UrlSet = field(default_factory=UrlSet, compare=False, repr=False)
    # the item's extra_headers: sent with every request, whichever way a backend sends
    headers: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.urls.urls:
            for url in self.base_urls:
                self.urls.add(url)

    def client(self, *, timeout_s: float, max_retries: int) -> OpenAIClient:
        """An endpoint pool over the live URL set, for the caller's event loop; :attr:`headers`
        go with every request."""
        from pytest_modelbench.running.client import OpenAIClient  # start-up time: see above
        from pytest_modelbench.running.pool import RetryPolicy

        return OpenAIClient(
            self.urls,
            api_key=self.api_key,
            timeout_s=timeout_s,
            retry=RetryPolicy(max_retries=max_retries, backoff_s=self.backoff_s),
            died=self.died,
            headers=self.headers,
        )

    async def ensure_ready(self, client: EndpointPool) -> None:
        """Pre-flight once per worker: fail fast with the URL when unreachable or missing the model."""
        from pytest_modelbench.running.pool import EndpointUnavailable  # start-up time

        key = (self.base_urls, self.served_model)
        if key in self.checked:
            failure = self.checked[key]
            if failure is not None:
                raise EvaluationError(failure)
            return
        try:
            await client.preflight(self.served_model, timeout_s=self.preflight_timeout_s)
        except EndpointUnavailable as exc:
            self.checked[key] = str(exc)
            raise EvaluationError(str(exc)) from None
        self.checked[key] = None

    @contextmanager
    def single_url(self, *, timeout_s: float, max_retries: int) -> Iterator[str]:
        """One loopback base URL (``.../v1``) spreading over the whole URL set with the pool's
        policy (and :attr:`headers` on every request), for tools that take a single base URL;
        pre-flighted first (EvaluationError)."""
        from pytest_modelbench.running.router import worker_router  # start-up time

        with worker_router().mount(
            lambda: self.client(timeout_s=timeout_s, max_retries=max_retries),
            self.ensure_ready,
        ) as url:
            yield url

    @asynccontextmanager
    async def asingle_url(self, *, timeout_s: float, max_retries: int) -> AsyncIterator[str]:
        """:meth:`single_url` for a caller inside an event loop."""
        from pytest_modelbench.running.router import worker_router  # start-up time

        async with worker_router().amount(
            lambda: self.client(timeout_s=timeout_s, max_retries=max_retries),
            self.ensure_ready,
        ) as url:
            yield url


def relay_timeout_s(timeout_s: float, max_retries: int) -> float:
    """How long a tool behind :meth:`Endpoint.single_url` should wait for one request: every
    attempt the router may make, each with its backoff (at most 30 s), and a margin."""
    return (max_retries + 1) * (timeout_s + 30.0) + 60.0


def close_router() -> None:
    """Stop this process's loopback router, if a backend started one (a later mount starts
    it again)."""
    router = sys.modules.get(_ROUTER_MODULE)
    if router is not None:
        router.worker_router().close()
