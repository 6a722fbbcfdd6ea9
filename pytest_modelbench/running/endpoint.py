"""An OpenAI-compatible place to send one model's requests, checked once by a pre-flight."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_modelbench.errors import EvaluationError
from pytest_modelbench.running.client import EndpointUnavailable, OpenAIClient


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible place to send one model's requests. The key is never written anywhere."""

    base_urls: tuple[str, ...]
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

    async def ensure_ready(self, client: OpenAIClient) -> None:
        """Pre-flight once per worker: fail fast with the URL when unreachable or missing the model."""
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
