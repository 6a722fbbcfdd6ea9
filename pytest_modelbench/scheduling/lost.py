"""Workers that go away: a lost node fails the items it held, named, and the run goes on.

When an xdist worker dies (its node lost, its ssh connection cut, its process killed), xdist
fails the item it was running with a bare "worker crashed" and starts the worker's ``--tx``
spec again. For a worker on another node (``serving.remote``) that restart opens a new ssh
connection to the lost node, which fails, and execnet's error stops the whole session
(``INTERNALERROR``, no summary, other nodes' items unreported). :class:`LostWorkers` keeps the
session going: a failed restart is one line, the crashed item's failure names the worker and
its node, and items that nobody is left to run fail as "not run" instead of stopping xdist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # xdist loads only in sessions that use it
    from xdist.dsession import DSession
    from xdist.scheduler.protocol import Scheduling
    from xdist.workermanage import WorkerController


def where(node: WorkerController) -> str:
    """``node HOST`` for a worker started through ``serving.remote``, else ``this node``."""
    # lazily: only a lost worker needs the serving package (pytest start-up)
    from pytest_modelbench.serving.remote import host_of

    spec = node.gateway.spec
    ssh = getattr(spec, "ssh", None)  # xdist's own ssh= gateway
    host = ssh or host_of(getattr(spec, "python", None))
    return f"node {host}" if host else "this node"


class LostWorkers:
    """Registered on the controller next to the scheduler (``scheduling.register``)."""

    def __init__(self) -> None:
        self._reasons: dict[str, str] = {}  # worker id -> why xdist saw it go down
        self._held: dict[
            int, WorkerController
        ] = {}  # collection index -> the lost worker that held it
        self._dsession: DSession | None = None  # xdist's controller, once the session starts

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        dsession: DSession | None = session.config.pluginmanager.get_plugin("dsession")
        restart = getattr(dsession, "_clone_node", None)  # xdist's worker restart (private)
        if dsession is None or restart is None:
            return
        config = session.config
        self._dsession = dsession

        def restart_or_go_on(node: WorkerController) -> WorkerController | None:
            try:
                return restart(node)
            except Exception as exc:  # execnet: OSError, EOFError, HostNotFound (ssh exited)
                dsession.report_line(
                    f"[{node.gateway.id}] not replaced: cannot start a worker on {where(node)} "
                    f"({type(exc).__name__}: {exc})"
                )
            self._fail_orphans(config, dsession, node)
            return None

        dsession._clone_node = restart_or_go_on

    def _fail_orphans(
        self, config: pytest.Config, dsession: DSession, lost: WorkerController
    ) -> None:
        orphans = getattr(dsession.sched, "orphans", None)
        for index, nodeid in orphans() if orphans is not None else ():
            holder = self._held.get(index)
            path = nodeid.split("::")[0]
            why = (
                f"worker {holder.gateway.id!r} on {where(holder)} went away before it started "
                f"{nodeid!r}"
                if holder is not None
                else f"worker {lost.gateway.id!r} on {where(lost)} went away"
            )
            report = pytest.TestReport(
                nodeid=nodeid,
                location=(path, None, path),
                keywords={},
                outcome="failed",
                longrepr=f"not run: {why}, and no other worker is left to run it",
                when="call",
            )
            report.node = holder or lost  # type: ignore[attr-defined]  # as xdist's reports do
            config.hook.pytest_runtest_logreport(report=report)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: WorkerController, error: object) -> None:
        if not error:
            return
        self._reasons[node.gateway.id] = str(error)
        sched = getattr(self._dsession, "sched", None)
        pending = getattr(sched, "node2pending", {}).get(node, ()) if sched is not None else ()
        self._held.update(dict.fromkeys(pending, node))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(
        self,
        crashitem: str,
        report: pytest.TestReport,
        sched: Scheduling,  # noqa: ARG002  # xdist's hook passes it
    ) -> None:
        node = getattr(report, "node", None)
        if node is None:
            return
        reason = self._reasons.get(node.gateway.id, "exited")
        report.longrepr = (
            f"worker {node.gateway.id!r} on {where(node)} went away while running {crashitem!r} "
            f"({reason}): the node or its connection was lost, or the worker process died; the "
            "item was not retried"
        )
