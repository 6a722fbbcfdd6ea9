"""Where an item's requests go: an external endpoint, or a server modelbench starts.

:class:`EndpointManager` lives on each worker process. External endpoints
(``api_base_url``) are checked once with a pre-flight ``/models`` request;
models without one are served by an engine (``serving/``) on the worker's
GPU(s), reused across items of the same model and stopped on model switch.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_modelbench.errors import EvaluationError
from pytest_modelbench.planning.plan import request_headers
from pytest_modelbench.running.endpoint import Endpoint, close_router
from pytest_modelbench.running.urls import UrlSet
from pytest_modelbench.secrets import remember

if TYPE_CHECKING:  # imported where used, lazily, for pytest's start-up time
    from pytest_modelbench.planning.item import PlannedItem
    from pytest_modelbench.serving.pool import ServerPool


@dataclass(frozen=True)
class IdentityUnknown:
    """An external endpoint's identity could not be fetched: no model list came back from it
    (refused, timed out, DNS, TLS, an HTTP error), so nothing says what it serves now."""

    urls: tuple[str, ...]  #: the base URLs asked, as the fingerprint records them
    reason: str  #: the pre-flight's message, naming the URL and the cause


@dataclass(frozen=True)
class _NotServed:
    """The endpoint answered with a model list without the model (the pre-flight's message)."""

    reason: str


def _api_key(var: str | None, model_name: str) -> str | None:
    if var is None:
        key = os.environ.get("OPENAI_API_KEY") or None
        remember(key)  # never written or printed, even when a server echoes it
        return key
    value = os.environ.get(var)
    remember(value)
    if not value:
        raise EvaluationError(
            f"models.{model_name}.api_key_var: environment variable {var} is not set; "
            f"export {var}=... before running (the key itself is never stored in config files)"
        )
    return value


class EndpointManager:
    """Gives each item its endpoint; owns the servers this worker started."""

    def __init__(
        self, *, preflight_timeout_s: float = 15.0, serving: ServerPool | None = None
    ) -> None:
        self._checked: dict[tuple[tuple[str, ...], str], str | None] = {}  # pre-flight outcomes
        self._identities: dict[
            tuple[tuple[str, ...], str], dict[str, Any] | IdentityUnknown | _NotServed
        ] = {}
        self._urls: dict[tuple[tuple[str, ...], str], UrlSet] = {}  # live URL sets
        self.preflight_timeout_s = preflight_timeout_s
        self.serving = serving  # a serving.ServerPool when the worker may start servers
        self._served: dict[str, tuple[str, ...]] = {}  # model -> its server's URL (base_urls_of)
        self._gpus: dict[str, int] = {}  # model -> its server's GPU count here (0: the CPU)

    def urls(
        self,
        base_urls: tuple[str, ...],
        served_model: str,
        tls: ssl.SSLContext | None = None,
        *,
        own: bool = False,
    ) -> UrlSet:
        """The live URL set of a model at ``base_urls``, shared by every item of this worker
        that sends to it: a replica that starts serving the model joins it with
        ``UrlSet.add(url)`` (and leaves with ``remove``), and the requests of the item running
        at that moment spread to it, whichever backend sends them. ``tls``: how its https
        URLs are reached, for servers of this session; ``own``: servers of this session,
        never reached through a proxy (``UrlSet``)."""
        key = (base_urls, served_model)
        found = self._urls.get(key)
        if found is None:
            found = self._urls[key] = UrlSet(base_urls, tls=tls, own=own)
        return found

    def endpoint_for(self, item: PlannedItem) -> Endpoint:
        spec = item.model
        if spec.solutions:  # completions come from files: no server, no pre-flight
            return Endpoint(base_urls=(), served_model=spec.model or item.model_name, api=spec.api)
        if spec.api_base_url:
            urls = (
                (spec.api_base_url,)
                if isinstance(spec.api_base_url, str)
                else tuple(spec.api_base_url)
            )
            base_urls = tuple(u.rstrip("/") for u in urls)
            served = spec.model or item.model_name
            return Endpoint(
                base_urls=base_urls,
                served_model=served,
                api=spec.api,
                api_key=_api_key(spec.api_key_var, item.model_name),
                backoff_s=spec.retry_backoff,
                preflight_timeout_s=self.preflight_timeout_s,
                checked=self._checked,
                urls=self.urls(base_urls, served),
                headers=request_headers(item),
            )
        if self.serving is None:
            raise EvaluationError(
                f"model {item.model_name!r} has no api_base_url and this process cannot start servers; "
                "set api_base_url in models.yaml or pass --api-base-url URL"
            )
        base_url, served = self.serving.ensure(item)
        self._served[item.model_name] = (base_url,)
        # the GPUs the server was given (none: the CPU), not serve.gpus; unknown for a server
        # shared from another worker
        server = getattr(getattr(self.serving, "slot", None), "server", None)
        gpus = getattr(server, "gpus", None)
        if isinstance(gpus, tuple):
            self._gpus[item.model_name] = len(gpus)
        live = self.urls((base_url,), served, getattr(self.serving, "tls_context", None), own=True)
        self.serving.share(live)  # replicas of this server join the set
        return Endpoint(
            base_urls=(base_url,),
            served_model=served,
            api=spec.api,
            api_key=getattr(self.serving, "server_key", None),  # servers of other nodes want it
            backoff_s=spec.retry_backoff,
            preflight_timeout_s=max(self.preflight_timeout_s, 60.0),
            checked=self._checked,
            died=self.serving.death_report,
            urls=live,
            headers=request_headers(item),
        )

    def gpus_of(self, item: PlannedItem) -> int | None:
        """How many GPUs the server this worker started for the item's model runs on (0: the
        CPU); None when no server of it was started here."""
        return self._gpus.get(item.model_name)

    def base_urls_of(self, item: PlannedItem) -> tuple[str, ...]:
        """Where the item's requests went, without starting anything: the external endpoint's
        URLs, or the URL of the server this worker started for its model; () for solution
        files or a server not started here."""
        spec = item.model
        if spec.solutions:
            return ()
        if spec.api_base_url:
            urls = (spec.api_base_url,) if isinstance(spec.api_base_url, str) else spec.api_base_url
            return tuple(u.rstrip("/") for u in urls)
        return self._served.get(item.model_name, ())

    def identity(self, item: PlannedItem) -> dict[str, Any] | IdentityUnknown | None:
        """For an external endpoint, what answers there: its URLs and what ``/v1/models`` says of
        the model (id, root, max_model_len), asked once per worker. Results are reused only while
        the same model answers at the same place; None for served models (their weights are in
        the fingerprint already) and solution files.

        :class:`IdentityUnknown` when no model list came back (the caller decides whether stored
        results may answer unchecked); an endpoint that lists its models without this one raises
        :class:`EvaluationError`, as the pre-flight of a run would."""
        spec = item.model
        if spec.solutions or not spec.api_base_url:
            return None
        endpoint = self.endpoint_for(item)
        key = (endpoint.base_urls, endpoint.served_model)
        if key not in self._identities:
            self._identities[key] = asyncio.run(_describe(endpoint))
        found = self._identities[key]
        if isinstance(found, _NotServed):
            raise EvaluationError(found.reason)
        return found

    def item_done(self) -> None:
        """After an item: say what happened to replicas while it ran (in its test), and let go
        of another worker's server it shared."""
        if self.serving is not None:
            self.serving.item_done()

    def recover(self, item: PlannedItem) -> bool:
        """After a failed item: True when its server had died and was restarted (retry it)."""
        return self.serving is not None and bool(self.serving.recover(item))

    def close(self, *, interrupted: bool = False) -> None:
        """Stop this worker's servers (after lending one, unless the session was
        interrupted) and its router."""
        close_router()
        if self.serving is not None:
            self.serving.close(lend=not interrupted)


_CARD_FIELDS = ("id", "root", "parent", "max_model_len")  # not "created": vLLM stamps each answer


async def _describe(endpoint: Endpoint) -> dict[str, Any] | IdentityUnknown | _NotServed:
    async with endpoint.client(timeout_s=endpoint.preflight_timeout_s, max_retries=0) as client:
        try:  # the pre-flight, once per worker: items that send requests fail at once after it
            await endpoint.ensure_ready(client)
        except EvaluationError as exc:
            # a base URL that listed its models without this one (an empty card) answered
            if any(not card for card in client.model_cards.values()):
                return _NotServed(str(exc))
            return IdentityUnknown(endpoint.base_urls, str(exc))
        cards = client.model_cards
    seen = {  # a URL down at the pre-flight has no card: the others answer for the model
        str(i): {k: cards[base].get(k) for k in _CARD_FIELDS if k in cards[base]}
        for i, base in enumerate(endpoint.base_urls)
        if base in cards
    }
    identity: dict[str, Any] = {"urls": list(endpoint.base_urls)}
    first = next(iter(seen.values()), {})
    if all(card == first for card in seen.values()):
        identity["model"] = first  # field by field, so a change names the field
    else:
        identity["models"] = seen
    return identity
