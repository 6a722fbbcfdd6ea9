"""What can go wrong on the simulated server: fault rates and the latency model.

Both are frozen values drawn from per-request uniforms that the server derives
from a hash of the request (see ``simserver``), so a configuration replays the
same faults and latencies for the same requests run after run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from statistics import NormalDist
from typing import Literal

FaultKind = Literal["5xx", "429", "timeout", "reset", "malformed", "no_choices"]
Distribution = Literal["fixed", "uniform", "lognormal", "exponential"]
AfterHang = Literal["close", "respond"]

_RATE_FIELDS = ("error_5xx", "rate_limit", "timeout", "reset", "malformed", "missing_choices")
_KINDS: tuple[FaultKind, ...] = ("5xx", "429", "timeout", "reset", "malformed", "no_choices")
_NORMAL = NormalDist()


@dataclass(frozen=True)
class Faults:
    """Per-request fault rates (each in [0, 1], summing to at most 1) and their shape.

    Faults apply to ``/v1/chat/completions`` and ``/v1/completions`` only, so a
    client's pre-flight (``/v1/models``) sees a healthy server, except under
    ``hang_forever``, where every request is accepted and never answered.

    * ``error_5xx``: answer with a status from ``status_codes`` and an OpenAI error body.
    * ``rate_limit``: answer 429 at once (no slot taken) with ``Retry-After: retry_after``.
    * ``timeout``: hold the request ``hang_s`` seconds (no slot taken), then close
      the connection (``after_hang="close"``) or answer normally (``"respond"``).
    * ``reset``: abort the TCP connection with an RST before answering.
    * ``malformed``: 200 whose body is truncated, invalid JSON.
    * ``missing_choices``: 200 with valid JSON that lacks ``choices``.
    """

    error_5xx: float = 0.0
    rate_limit: float = 0.0
    timeout: float = 0.0
    reset: float = 0.0
    malformed: float = 0.0
    missing_choices: float = 0.0
    retry_after: float = 1.0
    hang_s: float = 30.0
    after_hang: AfterHang = "close"
    hang_forever: bool = False
    status_codes: tuple[int, ...] = (500, 502, 503)

    def __post_init__(self) -> None:
        for name in _RATE_FIELDS:
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"Faults.{name}={rate!r}: a rate must lie in [0, 1]")
        if self.total > 1.0 + 1e-9:
            raise ValueError(f"Faults: rates sum to {self.total:.3f}; they must sum to at most 1")
        if self.retry_after < 0 or self.hang_s < 0:
            raise ValueError("Faults: retry_after and hang_s must be >= 0 seconds")
        if self.after_hang not in ("close", "respond"):
            raise ValueError(f"Faults.after_hang={self.after_hang!r}: use 'close' or 'respond'")
        if not self.status_codes or any(not 500 <= code <= 599 for code in self.status_codes):
            raise ValueError(f"Faults.status_codes={self.status_codes!r}: give 5xx codes")

    @property
    def total(self) -> float:
        """The probability that a completion request meets any fault."""
        return float(sum(getattr(self, name) for name in _RATE_FIELDS))

    def pick(self, u: float) -> tuple[FaultKind | None, int]:
        """The fault for a request whose uniform draw is ``u`` and, for 5xx, its status."""
        edge = 0.0
        for name, kind in zip(_RATE_FIELDS, _KINDS, strict=True):
            rate: float = getattr(self, name)
            if u < edge + rate:
                if kind == "5xx":
                    index = int((u - edge) / rate * len(self.status_codes))
                    return kind, self.status_codes[min(index, len(self.status_codes) - 1)]
                return kind, 0
            edge += rate
        return None, 0

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names accepted by the constructor (for kwargs and CLI validation)."""
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class Latency:
    """How long a request holds its slot: ``mean`` seconds shaped by ``distribution``.

    ``uniform`` draws from ``mean × (1 ± spread)``; ``lognormal`` uses ``spread`` as
    the sigma of the log and keeps the mean; ``exponential`` has mean ``mean``.
    ``per_token`` adds that many seconds per completion token (decode time).
    """

    mean: float = 0.0
    distribution: Distribution = "fixed"
    spread: float = 0.5
    per_token: float = 0.0

    def __post_init__(self) -> None:
        if self.mean < 0 or self.spread < 0 or self.per_token < 0:
            raise ValueError("Latency: mean, spread and per_token must be >= 0")
        if self.distribution not in ("fixed", "uniform", "lognormal", "exponential"):
            raise ValueError(
                f"Latency.distribution={self.distribution!r}: "
                "use fixed, uniform, lognormal or exponential"
            )
        if self.distribution == "uniform" and self.spread > 1:
            raise ValueError("Latency: a uniform spread above 1 would give negative latencies")

    @classmethod
    def fixed(cls, seconds: float) -> Latency:
        """Every request takes exactly ``seconds``."""
        return cls(mean=seconds)

    @classmethod
    def uniform(cls, mean: float, spread: float = 0.5) -> Latency:
        """Uniform on ``mean × [1 - spread, 1 + spread]``."""
        return cls(mean=mean, distribution="uniform", spread=spread)

    @classmethod
    def lognormal(cls, mean: float, sigma: float = 0.5) -> Latency:
        """Lognormal with the given mean and log-sigma (a long right tail)."""
        return cls(mean=mean, distribution="lognormal", spread=sigma)

    @classmethod
    def exponential(cls, mean: float) -> Latency:
        """Exponential with the given mean."""
        return cls(mean=mean, distribution="exponential")

    def sample(self, u: float, completion_tokens: int = 0) -> float:
        """The latency for a request whose uniform draw is ``u`` (in [0, 1))."""
        base = self.mean
        if self.distribution == "uniform":
            base = self.mean * (1.0 + self.spread * (2.0 * u - 1.0))
        elif self.distribution == "lognormal":
            z = _NORMAL.inv_cdf(min(max(u, 1e-12), 1.0 - 1e-12))
            base = self.mean * math.exp(self.spread * z - self.spread * self.spread / 2.0)
        elif self.distribution == "exponential":
            base = -self.mean * math.log1p(-u)
        return base + self.per_token * completion_tokens
