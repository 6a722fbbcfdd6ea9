"""The xdist side: :class:`ModelAffinityScheduling` drives :class:`AffinityPolicy` with real nodes.

Implements xdist's ``Scheduling`` protocol (see ``xdist/scheduler/protocol.py``); collection
handling follows ``LoadScheduling``. Every decision is the policy's; this class only turns
events into policy calls and actions into ``send_runtest_some`` / ``send_steal`` / ``shutdown``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pytest
from xdist.remote import Producer
from xdist.report import report_collection_diff
from xdist.workermanage import WorkerController, parse_tx_spec_config

from pytest_modelbench.scheduling.costs import JobSource
from pytest_modelbench.scheduling.policy import (
    Action,
    AffinityPolicy,
    PolicySettings,
    Send,
    Shutdown,
    Steal,
)


class ModelAffinityScheduling:
    """Keeps each worker on its model's server, longest items first, steals at the end."""

    def __init__(
        self,
        config: pytest.Config,
        log: Producer | None = None,
        *,
        jobs: JobSource,
        settings: PolicySettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.numnodes = len(parse_tx_spec_config(config))
        self.node2collection: dict[WorkerController, list[str]] = {}
        self.collection: list[str] | None = None
        self.config = config
        if log is None:
            log = Producer("modelbench", enabled=False)
        self.log = log.modelbenchsched
        if settings is None:
            settings = PolicySettings(start_costs=jobs.start_costs())
        self.policy = AffinityPolicy(settings)
        self._jobs = jobs
        self._clock = clock
        self._aborted = False  # collections differ: nothing will run

    # -- Scheduling protocol: state --------------------------------------------------------------
    @property
    def nodes(self) -> list[WorkerController]:
        return self.policy.workers

    @property
    def node2pending(self) -> dict[WorkerController, list[int]]:
        return {node: self.policy.pending_indices(node) for node in self.policy.workers}

    @property
    def collection_is_completed(self) -> bool:
        return len(self.node2collection) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        if not self.collection_is_completed:
            return False
        if self._aborted:
            return True
        return self.collection is not None and self.policy.finished

    @property
    def has_pending(self) -> bool:
        return self.policy.has_pending

    # -- Scheduling protocol: events ---------------------------------------------------------------
    def add_node(self, node: WorkerController) -> None:
        assert node not in self.policy.workers
        self.policy.add_worker(node, self._clock(), _node_key(node))

    def add_node_collection(self, node: WorkerController, collection: Sequence[str]) -> None:
        assert node in self.policy.workers
        if self.collection_is_completed:
            # a node added later (one died): it must have collected the same items
            assert self.collection is not None
            if list(collection) != self.collection:
                other = next(iter(self.node2collection))
                self.log(
                    report_collection_diff(
                        self.collection, collection, other.gateway.id, node.gateway.id
                    )
                )
                return
        self.node2collection[node] = list(collection)

    def mark_test_complete(
        self,
        node: WorkerController,
        item_index: int,
        duration: float = 0,  # noqa: ARG002  # xdist protocol; the policy times items by its clock
    ) -> None:
        now = self._clock()
        self.policy.complete(node, item_index, now)
        self._step(now)

    def mark_test_pending(self, item: str) -> None:
        assert self.collection is not None
        self.policy.add_jobs([self._jobs.job(self.collection.index(item), item)])
        self._step(self._clock())

    def remove_pending_tests_from_node(
        self, node: WorkerController, indices: Sequence[int]
    ) -> None:
        now = self._clock()
        self._sync_shutdowns()
        self._apply(self.policy.stolen(node, list(indices), now))

    def remove_node(self, node: WorkerController) -> str | None:
        crashed = self.policy.remove_worker(node)
        self._step(self._clock())
        if crashed is None:
            return None
        assert self.collection is not None
        return self.collection[crashed]

    def orphans(self) -> list[tuple[int, str]]:
        """``(index, node id)`` of items no live worker can run any more (workers lost with
        nobody left to take their held items); they leave the pools."""
        if self.collection is None:
            return []
        return [(i, self.collection[i]) for i in self.policy.drain_if_unrunnable()]

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # a node joined later: feed it
            self._step(self._clock())
            return
        if not self._same_collections():
            self.log("**Different tests collected, aborting run**")
            self._aborted = True
            return
        self.collection = next(iter(self.node2collection.values()))
        self.policy.add_jobs(self._jobs.jobs(self.collection))
        self._step(self._clock())

    # -- helpers -------------------------------------------------------------------------------
    def _step(self, now: float) -> None:
        self._sync_shutdowns()
        self._apply(self.policy.step(now))

    def _sync_shutdowns(self) -> None:
        for node in self.policy.workers:
            if getattr(node, "shutting_down", False):
                self.policy.mark_shutdown(node)

    def _apply(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                node: WorkerController = action.worker
                self.log("send", node.gateway.id, list(action.indices))
                node.send_runtest_some(list(action.indices))
            elif isinstance(action, Steal):
                victim: WorkerController = action.victim
                self.log("steal", victim.gateway.id, list(action.indices))
                victim.send_steal(list(action.indices))
            elif isinstance(action, Shutdown):
                worker: WorkerController = action.worker
                worker.shutdown()

    def _same_collections(self) -> bool:
        """True if all nodes collected the same items; else report the difference, as xdist does."""
        (first, collection), *others = self.node2collection.items()
        same = True
        for node, other in others:
            message = report_collection_diff(collection, other, first.gateway.id, node.gateway.id)
            if message:
                same = False
                self.log(message)
                self.config.hook.pytest_collectreport(
                    report=pytest.CollectReport(
                        nodeid=node.gateway.id,
                        outcome="failed",
                        longrepr=message,
                        result=[],
                    )
                )
        return same


def _node_key(node: WorkerController) -> str | None:
    """Workers of one ``--tx`` group run on one node: the group's spec without the worker id
    (``popen`` workers of ``-n`` all share the local node)."""
    spec = getattr(getattr(node, "gateway", None), "spec", None)
    if spec is None:
        return None
    return "//".join(part for part in str(spec).split("//") if not part.startswith("id="))
