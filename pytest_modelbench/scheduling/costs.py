"""What each collected test costs the scheduler: remembered durations, else a plan estimate.

Costs are estimated seconds on one worker. In order of preference: the item's duration from
an earlier run (pytest cache key ``modelbench/durations``: ``{item_id: seconds}``); the
variant's ``cost`` hint (seconds); examples × rollouts × tokens per example converted to
seconds with the tokens/second seen in those remembered durations (per model when that model
has any), else ``TOKENS_PER_S``. Tokens per example are the ones observed in an earlier run
(``scheduling/tokens.py``: the item's own, else its model × variant's or model × environment's)
when there is one, else the suite's ``tokens_per_example``; the calibration divides by the same
figures, so a reasoning model's long replies are not counted as a slow server. Items already
finished in the run store and tests that are not benchmark items are cheap and need no server.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pytest_modelbench.names import param_id
from pytest_modelbench.scheduling.policy import Job
from pytest_modelbench.scheduling.tokens import ESTIMATED, ObservedTokens, TokenMemory

if TYPE_CHECKING:
    from pytest_modelbench.planning.item import PlannedItem

SERVER_START_S = 60.0  # starting a vLLM server: what a model switch costs a worker
ENDPOINT_SWITCH_S = 5.0  # an external endpoint: no server, but a pre-flight and cold connections
TOKENS_PER_S = 2000.0  # one server's throughput when no earlier run says otherwise
PLAIN_TEST_S = 0.05  # a test that is not a benchmark item (or its second test function)
FINISHED_S = 0.05  # an item the run store already holds: read back, no server
UNKNOWN_EXAMPLES = 100
UNKNOWN_TOKENS_PER_EXAMPLE = 500


class JobSource(Protocol):
    """Turns xdist's collection (node ids) into jobs with models and costs."""

    def jobs(self, collection: Sequence[str]) -> list[Job]: ...

    def job(self, index: int, nodeid: str) -> Job: ...

    def start_costs(self) -> dict[str, float]: ...


def param_part(nodeid: str) -> str | None:
    """The ``[...]`` of a node id (``path::Class::test[<param ids>]``), or None. Paths have no
    ``::`` and test names no ``[``, so it starts at the first ``[`` after the first ``::``."""
    start = nodeid.find("[", nodeid.find("::") + 2) if "::" in nodeid else -1
    return nodeid[start + 1 : -1] if start >= 0 and nodeid.endswith("]") else None


class NodeItems:
    """Node ids → planned items, through the plan's ``{item id: item}`` map.

    ``mb_item``'s parametrize id is the item id as pytest writes it into node ids
    (:func:`~pytest_modelbench.names.param_id`), so ``test_benchmark[<id>]`` is one
    dict lookup. A test that adds parameters of its own has pytest's ``-``-joined ids there
    (``test_x[<id>-strict]``, ``test_x[3-<id>]``): its item is the longest ``-``-separated run
    of them that the map holds.
    """

    def __init__(self, items: Mapping[str, PlannedItem]) -> None:
        self._by_param = {param_id(item.item_id): item for item in items.values()}
        for item in items.values():  # ids written unescaped (pytest's escaping switched off)
            self._by_param.setdefault(item.item_id, item)
        self._found: dict[str, PlannedItem | None] = {}

    def __call__(self, nodeid: str) -> PlannedItem | None:
        if nodeid not in self._found:
            self._found[nodeid] = self._lookup(param_part(nodeid))
        return self._found[nodeid]

    def _lookup(self, params: str | None) -> PlannedItem | None:
        if params is None or not self._by_param:
            return None
        item = self._by_param.get(params)
        if item is not None:
            return item
        parts = params.split("-")
        for length in range(len(parts) - 1, 0, -1):
            for first in range(len(parts) - length + 1):
                item = self._by_param.get("-".join(parts[first : first + length]))
                if item is not None:
                    return item
        return None


@dataclass(frozen=True)
class ItemCost:
    model: str | None
    seconds: float
    source: str  # "duration" | "hint" | "tokens" | "finished"
    tokens_from: str | None = None  # "tokens": where tokens per example come from (tokens.py)


class PlanCosts:
    """Costs of the session's planned items; each estimate computed once (10k items stay cheap)."""

    def __init__(
        self,
        items: Mapping[str, PlannedItem],
        backend_for: Callable[[str], Any],
        durations: Mapping[str, float] | None = None,
        finished: Collection[str] = (),
        observed: Mapping[str, ObservedTokens] | None = None,
    ) -> None:
        self._items = items
        self._item_of = NodeItems(items)
        self._backend_for = backend_for
        self._durations = dict(durations or {})
        self._finished = set(finished)
        self._observed = TokenMemory(observed)
        self._examples: dict[tuple[str, int], int] = {}
        self._tokens_per_example: dict[str, int] = {}
        self._item_tokens: dict[str, tuple[float, str]] = {}
        self._costs: dict[str, ItemCost] = {}
        self._seconds_per_token = self._calibrate()

    # -- JobSource -------------------------------------------------------------------------
    def jobs(self, collection: Sequence[str]) -> list[Job]:
        groups: dict[str, list[int]] = {}
        jobs: list[Job] = []
        for index, nodeid in enumerate(collection):
            item = self._item_of(nodeid)
            if item is None:
                jobs.append(Job((index,), None, PLAIN_TEST_S))
            else:
                groups.setdefault(item.item_id, []).append(index)
        for item_id, indices in groups.items():
            cost = self.cost(item_id)
            extra = PLAIN_TEST_S * (len(indices) - 1)  # other tests of one item read its result
            jobs.append(Job(tuple(indices), cost.model, cost.seconds + extra))
        return jobs

    def job(self, index: int, nodeid: str) -> Job:
        item = self._item_of(nodeid)
        if item is None:
            return Job((index,), None, PLAIN_TEST_S)
        cost = self.cost(item.item_id)
        return Job((index,), cost.model, cost.seconds)

    def start_costs(self) -> dict[str, float]:
        return {
            item.model_name: ENDPOINT_SWITCH_S if item.model.api_base_url else SERVER_START_S
            for item in self._items.values()
        }

    # -- estimates -------------------------------------------------------------------------
    def cost(self, item_id: str) -> ItemCost:
        cached = self._costs.get(item_id)
        if cached is None:
            cached = self._costs[item_id] = self._estimate(self._items[item_id])
        return cached

    def _estimate(self, item: PlannedItem) -> ItemCost:
        if item.item_id in self._finished:
            return ItemCost(None, FINISHED_S, "finished")
        if item.item_id in self._durations:
            return ItemCost(item.model_name, self._durations[item.item_id], "duration")
        if item.variant.cost is not None:
            return ItemCost(item.model_name, float(item.variant.cost), "hint")
        per_token = self._seconds_per_token.get(item.model_name, self._seconds_per_token[None])
        tokens, source = self.token_estimate(item)
        return ItemCost(item.model_name, tokens * per_token, "tokens", source)

    def tokens(self, item: PlannedItem) -> float:
        """examples × rollouts × tokens per example (observed, else the suite's)."""
        return self.token_estimate(item)[0]

    def token_estimate(self, item: PlannedItem) -> tuple[float, str]:
        """:meth:`tokens` and where its tokens per example come from (``tokens.OBSERVED`` …)."""
        known = self._item_tokens.get(item.item_id)
        if known is None:
            known = self._item_tokens[item.item_id] = self._token_estimate(item)
        return known

    def _token_estimate(self, item: PlannedItem) -> tuple[float, str]:
        module = item.variant.module
        count = item.num_examples
        if count < 0:
            key = (item.variant.id, count)
            if key not in self._examples:
                try:
                    self._examples[key] = int(self._backend_for(module).count_examples(item))
                except Exception:  # a broken variant fails its own item, not the scheduler
                    self._examples[key] = UNKNOWN_EXAMPLES
            count = self._examples[key]
        units = max(count, 1) * item.variant.rollouts_per_example
        observed = self._observed.per_example(item)
        if observed is not None:
            return units * observed[0], observed[1]
        if module not in self._tokens_per_example:
            try:
                per_example = self._backend_for(module).tokens_per_example()
                self._tokens_per_example[module] = int(per_example)
            except Exception:
                self._tokens_per_example[module] = UNKNOWN_TOKENS_PER_EXAMPLE
        return float(units * self._tokens_per_example[module]), ESTIMATED

    def _calibrate(self) -> dict[str | None, float]:
        """Seconds per token seen in remembered durations: per model, and over all (key None).
        Durations are divided by :meth:`tokens`, the figure estimates multiply (observed where
        known), so an observed figure is never paired with a rate calibrated on a static one."""
        seconds: dict[str | None, float] = {}
        tokens: dict[str | None, float] = {}
        for item_id, duration in self._durations.items():
            item = self._items.get(item_id)
            if item is None or duration <= 0 or item.variant.cost is not None:
                continue
            estimate = self.tokens(item)
            for key in (item.model_name, None):
                seconds[key] = seconds.get(key, 0.0) + duration
                tokens[key] = tokens.get(key, 0.0) + estimate
        rates = {k: seconds[k] / tokens[k] for k in seconds if tokens[k] > 0}
        rates.setdefault(None, 1.0 / TOKENS_PER_S)
        return rates


class TableCosts:
    """Fixed costs by node id (simulations and tests): ``{nodeid: (model, seconds)}``."""

    def __init__(
        self,
        table: Mapping[str, tuple[str | None, float]],
        start_costs: Mapping[str, float] | None = None,
    ) -> None:
        self.table = table
        self._start_costs = dict(start_costs or {})

    def jobs(self, collection: Sequence[str]) -> list[Job]:
        return [self.job(index, nodeid) for index, nodeid in enumerate(collection)]

    def job(self, index: int, nodeid: str) -> Job:
        model, seconds = self.table.get(nodeid, (None, PLAIN_TEST_S))
        return Job((index,), model, seconds)

    def start_costs(self) -> dict[str, float]:
        return dict(self._start_costs)
