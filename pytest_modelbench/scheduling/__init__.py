"""Scheduling benchmark items over xdist workers: stay on the loaded model, longest items first.

``--mb-dist modelbench`` (the default when ``--model`` or ``--mb-config`` selects items and
xdist's ``--dist`` is its default ``load``) replaces xdist's scheduler with
:class:`~pytest_modelbench.scheduling.dist.ModelAffinityScheduling`; ``--mb-dist off`` keeps
xdist's. Runs without benchmark items (a plain test suite) always keep xdist's scheduler.
The decisions live in :mod:`~pytest_modelbench.scheduling.policy` (pure, simulated in
``perf/scheduler_sim.py``); costs in :mod:`~pytest_modelbench.scheduling.costs`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from pytest_modelbench.scheduling.costs import JobSource
from pytest_modelbench.workers import is_worker

if TYPE_CHECKING:  # xdist loads only in sessions that use it
    from xdist.remote import Producer
    from xdist.scheduler.protocol import Scheduling


class ModelbenchDist:
    """Offers xdist the model-affinity scheduler when this run evaluates benchmark items.

    ``active`` says whether the session selected benchmark items; ``costs`` gives their
    cost model (the session builds it from its plan, the run store and the duration memory).
    """

    def __init__(
        self, mode: str | None, active: Callable[[], bool], costs: Callable[[], JobSource]
    ) -> None:
        self.mode = mode
        self._active = active
        self._costs = costs

    def wanted(self, config: pytest.Config) -> bool:
        if self.mode is not None:
            return self.mode == "modelbench"
        return self._active() and config.getvalue("dist") == "load"

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(
        self, config: pytest.Config, log: Producer
    ) -> Scheduling | None:
        if not self.wanted(config):
            return None
        # xdist is imported only when a distributed session asks for a scheduler
        from pytest_modelbench.scheduling.dist import ModelAffinityScheduling

        return ModelAffinityScheduling(config, log, jobs=self._costs())


def register(
    config: pytest.Config,
    mode: str | None,
    active: Callable[[], bool],
    costs: Callable[[], JobSource],
) -> None:
    """Register the scheduler hook (controller only); ``mode`` is the parsed ``--mb-dist``."""
    if not is_worker(config):
        config.pluginmanager.register(ModelbenchDist(mode, active, costs), "modelbench-dist")
        if config.pluginmanager.hasplugin("xdist"):
            # lazily: only sessions that can distribute need it (pytest start-up)
            from pytest_modelbench.scheduling.lost import LostWorkers

            config.pluginmanager.register(LostWorkers(), "modelbench-lost-workers")
