"""Scheduling benchmark items over xdist workers: stay on the loaded model, longest items first.

``--mb-dist modelbench`` (the default when ``--model`` or ``--mb-config`` selects items and
xdist's ``--dist`` is its default ``load``) replaces xdist's scheduler with
:class:`~pytest_modelbench.scheduling.dist.ModelAffinityScheduling`; ``--mb-dist off`` keeps
xdist's. Runs without benchmark items (a plain test suite) always keep xdist's scheduler.
The decisions live in :mod:`~pytest_modelbench.scheduling.policy` (pure, simulated in
``perf/scheduler_sim.py``); costs in :mod:`~pytest_modelbench.scheduling.costs`.
"""

from __future__ import annotations

from typing import Any

import pytest

DIST_MODES = ("modelbench", "off")


def dist_mode(config: pytest.Config) -> str | None:
    """``--mb-dist`` / ``modelbench_dist`` ini: 'modelbench', 'off', or None (decide by the run)."""
    value = config.getoption("mb_dist", default=None)
    if value is None:
        value = config.getini("modelbench_dist") or None
    if value is None:
        return None
    mode = str(value).strip().lower()
    if mode not in DIST_MODES:
        raise pytest.UsageError(
            f"--mb-dist: expected 'modelbench' (keep each xdist worker on its model) or 'off' "
            f"(use xdist's --dist), got {value!r}"
        )
    return mode


class ModelbenchDist:
    """Offers xdist the model-affinity scheduler when this run evaluates benchmark items."""

    def __init__(self, mode: str | None) -> None:
        self.mode = mode

    def wanted(self, config: pytest.Config) -> bool:
        if self.mode is not None:
            return self.mode == "modelbench"
        from pytest_modelbench.session import SESSION_KEY

        session = config.stash.get(SESSION_KEY, None)
        return bool(session is not None and session.active and config.getvalue("dist") == "load")

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if not self.wanted(config):
            return None
        from pytest_modelbench.scheduling.costs import PlanCosts
        from pytest_modelbench.scheduling.dist import ModelAffinityScheduling
        from pytest_modelbench.session import SESSION_KEY

        return ModelAffinityScheduling(
            config, log, jobs=PlanCosts.from_session(config.stash[SESSION_KEY])
        )


def register(config: pytest.Config) -> None:
    """Validate ``--mb-dist`` and register the scheduler hook (controller only)."""
    mode = dist_mode(config)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(ModelbenchDist(mode), "modelbench-dist")
