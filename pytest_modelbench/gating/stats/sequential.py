"""Anytime-valid tests of a mean in [0, 1]: betting e-processes and the confidence sequence
they make, so a gate may look after every example and stop once its verdict is certain.

For H0: mu >= t (the alternative "below t"), the wealth of a bettor who stakes a share
``lambda_i`` of it on each observation being below t,

    K_n(t) = prod_{i <= n} (1 + lambda_i (t - X_i)),   0 <= lambda_i < 1 / (1 - t),

is a non-negative supermartingale under H0 whenever ``lambda_i`` is chosen from X_1..X_{i-1}
only (E[1 + lambda (t - X)] = 1 + lambda (t - mu) <= 1), so by Ville's inequality
P(K_n(t) >= 1/alpha for some n) <= alpha: the test may be checked after every observation.
The mirror image bets on "above t". The bets follow Waudby-Smith & Ramdas (JRSS-B 2024,
"Estimating means of bounded random variables by betting"), tuned to the planned sample
size N: lambda_i = sqrt(2 log(1/alpha) / (sigma_{i-1}^2 N)), with a running variance that
starts at 1/4, truncated to 3/4 of the bound. They do not depend on t, so K_n(t) is monotone
in t and the confidence sequence (the t neither side rejects) is found by bisection: a side
rejects exactly when the sequence lies beyond its t, so the printed interval and the
stopping decision never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

TRUNCATION = 0.75  # each bet stakes at most this share of what the bound allows


def bet_size(alpha: float, sum_sq: float, seen: int, horizon: int) -> float:
    """The bet before the (``seen`` + 1)-th observation: sqrt(2 log(1/alpha) / (var N)), with
    the running variance ``sum_sq / (seen + 1)`` (a prior of 1/4 counts as one observation)
    and N the planned sample size (at least 20)."""
    variance = max(sum_sq / (seen + 1), 1e-4)
    return math.sqrt(2.0 * math.log(1.0 / alpha) / (variance * max(horizon, 20)))


def plug_in_bets(values: Sequence[float], alpha: float, horizon: int) -> list[float]:
    """The predictable bet sizes (before truncation) for ``values`` in order."""
    bets: list[float] = []
    mean, sum_sq = 0.5, 0.25  # priors: the running mean and variance before any data
    for i, x in enumerate(values):
        bets.append(bet_size(alpha, sum_sq, i, horizon))
        sum_sq += (x - mean) ** 2
        mean = (mean * (i + 1) + x) / (i + 2)
    return bets


def wealth_below(values: Sequence[float], bets: Sequence[float], t: float) -> float:
    """K_n(t) for H0: mean >= t (large: the mean is below t); ``log`` space for long runs."""
    if t >= 1.0:
        return math.inf if any(x < 1.0 for x in values) else 1.0
    cap = TRUNCATION / (1.0 - t)
    log_wealth = 0.0
    for x, bet in zip(values, bets, strict=True):
        factor = 1.0 + min(bet, cap) * (t - x)
        log_wealth += math.log(factor)
    return math.exp(min(log_wealth, 700.0))


def wealth_above(values: Sequence[float], bets: Sequence[float], t: float) -> float:
    """K'_n(t) for H0: mean <= t (large: the mean is above t)."""
    mirrored = [1.0 - x for x in values]
    return wealth_below(mirrored, bets, 1.0 - t)


def confidence_sequence(
    values: Sequence[float], alpha: float, horizon: int, alpha_above: float | None = None
) -> tuple[float, float]:
    """The interval for the mean at this point of the sequence: the t that neither one-sided
    test rejects (the "below" side at ``alpha``, the "above" side at ``alpha_above``, alpha
    by default). Valid at any data-dependent stopping time."""
    if not values:
        return 0.0, 1.0
    bets = plug_in_bets(values, alpha, horizon)
    bets_above = bets if alpha_above is None else plug_in_bets(values, alpha_above, horizon)
    above_level = 1.0 / (alpha if alpha_above is None else alpha_above)
    mean = math.fsum(values) / len(values)
    threshold = 1.0 / alpha

    def bisect(rejects: Callable[[float], bool], inside: float, outside: float) -> float:
        for _ in range(60):
            mid = 0.5 * (inside + outside)
            if rejects(mid):
                outside = mid
            else:
                inside = mid
        return inside

    low = (
        0.0
        if wealth_above(values, bets_above, 0.0) < above_level
        else bisect(lambda t: wealth_above(values, bets_above, t) >= above_level, mean, 0.0)
    )
    high = (
        1.0
        if wealth_below(values, bets, 1.0) < threshold
        else bisect(lambda t: wealth_below(values, bets, t) >= threshold, mean, 1.0)
    )
    return low, high


@dataclass
class SequentialTest:
    """One anytime-valid one-sided test of a [0, 1] mean, fed one observation at a time in the
    sample's order: ``side="below"`` tests H0: mean >= ``threshold`` (certain once the mean is
    certainly below it), ``"above"`` tests H0: mean <= ``threshold``. :meth:`add` returns True
    the first time the wealth reaches 1 / ``alpha``; ``horizon`` is the planned sample size the
    bets are tuned to (any value keeps the test valid).
    """

    threshold: float
    side: Literal["below", "above"]
    alpha: float
    horizon: int
    values: list[float] = field(default_factory=list)
    certain: bool = False
    log_wealth: float = 0.0
    _mean: float = 0.5
    _sum_sq: float = 0.25

    def add(self, x: float) -> bool:
        """Take the next observation (in [0, 1]); True once certain."""
        if self.certain:
            return True
        seen = len(self.values)
        bet = bet_size(self.alpha, self._sum_sq, seen, self.horizon)
        self._sum_sq += (x - self._mean) ** 2
        self._mean = (self._mean * (seen + 1) + x) / (seen + 2)
        self.values.append(x)
        # mirror "above" onto "below": H0 mean <= t for x is H0 mean >= 1 - t for 1 - x
        t, y = (self.threshold, x) if self.side == "below" else (1.0 - self.threshold, 1.0 - x)
        if t >= 1.0:  # no mean in [0, 1] is above 1: any observation below 1 decides
            self.log_wealth = math.inf if y < 1.0 else self.log_wealth
        else:
            self.log_wealth += math.log(1.0 + min(bet, TRUNCATION / (1.0 - t)) * (t - y))
        self.certain = self.log_wealth >= math.log(1.0 / self.alpha)
        return self.certain

    @property
    def e_value(self) -> float:
        """The wealth: 1 / e_value is an anytime-valid p-value for H0."""
        return math.exp(min(self.log_wealth, 700.0))

    def interval(self, alpha_other_side: float | None = None) -> tuple[float, float]:
        """The confidence sequence for the mean at this point, this side at its ``alpha``
        (the other at ``alpha_other_side``, the same by default)."""
        if self.side == "below":
            return confidence_sequence(self.values, self.alpha, self.horizon, alpha_other_side)
        low, high = confidence_sequence(
            self.values, alpha_other_side or self.alpha, self.horizon, self.alpha
        )
        return low, high
