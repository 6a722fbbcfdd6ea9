"""One worker's server slot: start a server, reuse it while items of its model follow, restart
it once after it died, stop it (whole process group).

The slot holds either this worker's own server, built from a :class:`Launch` by the engine it
names (every server a worker starts comes from :func:`build_server`), or another worker's
running server of the same launch that its item shares (:class:`SharedServer`, when the
worker found no free GPU). Its own server is published to the session's workers on this node
that have no GPU (``serving/sharing.py``, through the session's exchange) from its start to
its stop.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_modelbench.errors import EvaluationError
from pytest_modelbench.serving.base import LaunchSpec, ServerHandle, ServingError

if TYPE_CHECKING:
    from pytest_modelbench.serving.channel import ExchangeClient
    from pytest_modelbench.serving.sharing import Published, Shared

__all__ = [
    "MAX_RESTARTS",
    "Launch",
    "ServerDiedWarning",
    "ServerSlot",
    "SharedServer",
    "SharedServerWarning",
    "build_server",
]

MAX_RESTARTS = 1


class ServerDiedWarning(UserWarning):
    """A served model's server died and is being restarted."""


class SharedServerWarning(UserWarning):
    """A worker found no free GPU: its item shares another worker's server, or waits."""


@dataclass(frozen=True)
class Launch:
    """How a worker's server is started: replicas, and servers on other nodes, start alike."""

    model_name: str
    model_path: str
    served: str
    args: dict[str, Any]
    gpus: int
    timeout_s: float
    engine: str = "vllm"  # serve.engine
    command: tuple[str, ...] = ()  # serve.command (engine: command)
    health: str | None = None  # serve.health (engine: command)

    def fields(self) -> dict[str, Any]:
        """What another node needs to start the same server."""
        return {
            "model_name": self.model_name,
            "model_path": self.model_path,
            "served": self.served,
            "args": self.args,
            "gpus": self.gpus,
            "timeout_s": self.timeout_s,
            "engine": self.engine,
            "command": list(self.command),
            "health": self.health,
        }

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Launch:
        """The launch another node described with :meth:`fields`."""
        return cls(
            str(fields["model_name"]),
            str(fields["model_path"]),
            str(fields["served"]),
            dict(fields["args"]),
            int(fields["gpus"]),
            float(fields["timeout_s"]),
            str(fields.get("engine") or "vllm"),
            tuple(str(part) for part in fields.get("command") or ()),
            fields.get("health"),
        )

    @property
    def key(self) -> str:
        """Equal for servers that answer alike (engine, weights, name, engine args, GPUs)."""
        fields: dict[str, Any] = {
            "path": self.model_path,
            "served": self.served,
            "args": self.args,
            "gpus": self.gpus,
        }
        if self.engine != "vllm":
            fields.update(engine=self.engine, command=list(self.command), health=self.health)
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[
            :16
        ]


def build_server(
    launch: Launch,
    gpus: tuple[str, ...] | None,
    log_path: Path,
    cache_dir: Path,
    listen: Mapping[str, Any] | None = None,
) -> ServerHandle:
    """An unstarted server of ``launch`` on ``gpus``, from the engine it names; ``listen``
    (host, key and TLS): reachable by other nodes, which vLLM serves itself (``VLLM_API_KEY``,
    not argv); other engines' servers stay on loopback with no key, behind a mutual-TLS front
    (``serving/tls_front.py``). ValueError: a reserved flag in ``serve.args``."""
    # lazily: serving loads only when a worker starts a server (pytest start-up)
    from pytest_modelbench.serving.engines import ENGINES

    spec = LaunchSpec(
        model=launch.model_path,
        served_name=launch.served,
        log_path=log_path,
        cache_dir=cache_dir,
        args=launch.args,
        gpus=gpus,
        command=launch.command,
        health=launch.health,
        **(dict(listen) if listen and launch.engine == "vllm" else {}),
    )
    server = ENGINES[launch.engine].server(spec)
    if listen and listen.get("tls") is not None and launch.engine != "vllm":
        from pytest_modelbench.serving.tls_front import FrontedServer  # lazily, as ENGINES

        return FrontedServer(server, listen["tls"], listen["api_key"], listen["host"])
    return server


class SharedServer:
    """Another worker's running server of the same launch (``sharing.Shared``), used by this
    worker's item: stopping it lets go, and its owner stops it."""

    def __init__(self, shared: Shared, served_name: str) -> None:
        self._shared = shared
        self.base_url: str = shared.base_url
        self.served_name = served_name

    def is_alive(self) -> bool:
        return bool(self._shared.is_alive())

    def stop(self) -> None:
        self._shared.stop()

    def restart(self) -> None:
        raise ServingError(f"worker {self._shared.worker}'s server is not this worker's to restart")

    def death_report(self) -> str | None:
        report: str | None = self._shared.death_report()
        return report


class ServerSlot:
    """The one owner of a worker's server: started, reused, restarted once, stopped here."""

    def __init__(self, run_dir: Path, worker: str, session: str | None = None) -> None:
        self.run_dir = run_dir
        self.worker = worker
        self.session = session
        self.server: Any = None  # the worker's own ServerHandle, or a SharedServer
        self.model: str | None = None  # the model label it serves
        self.launch: Launch | None = None  # how its own server was started (None: shared)
        self.start_s = 0.0  # how long the current server took to start
        self.starts = 0
        self._restarts: dict[str, int] = {}
        self._published: Published | None = None  # this worker's server, shared
        self.exchange: ExchangeClient | None = None  # the session's (sharing goes through it)

    @property
    def shared(self) -> bool:
        """Whether the slot holds another worker's server."""
        return isinstance(self.server, SharedServer)

    def holds(self, model: str) -> bool:
        """Whether the slot's server (alive or not) serves ``model``."""
        return self.server is not None and self.model == model

    def address(self) -> tuple[str, str]:
        """(base URL, served model name) of the slot's server."""
        return self.server.base_url, self.server.served_name

    def start(
        self,
        model: str,
        launch: Launch,
        server: ServerHandle,
        *,
        starting: Callable[[], None] | None = None,
    ) -> None:
        """Start ``server`` (built from ``launch``) and hold it; ``starting`` runs once the
        launch is known, before the start (replicas may start alongside). When it raises,
        ``launch`` is still set: the caller stops the replicas, then :meth:`forget_launch`."""
        self.launch = launch
        began = time.monotonic()
        if starting is not None:
            starting()
        server.start(launch.timeout_s)
        self.start_s = time.monotonic() - began
        self.starts += 1
        self.server, self.model = server, model
        self.publish()

    def forget_launch(self) -> None:
        """A start failed: no launch is held (after the replicas that read it have stopped)."""
        self.launch = None

    def adopt(self, model: str, shared: SharedServer) -> None:
        """Hold another worker's server for this worker's items of ``model``."""
        self.server, self.model, self.launch = shared, model, None

    def may_restart(self) -> bool:
        """Whether the dead server of the slot's model gets its one restart."""
        return self._restarts.get(self.model or "", 0) < MAX_RESTARTS

    def restart(self) -> None:
        """Restart the dead server, once per model; EvaluationError (with the cause from its
        log) when it died again or the restart failed."""
        model = self.model or ""
        died = self.death_report()
        self.unpublish(lost="it died")  # its sharers lose it; published again once restarted
        if not self.may_restart():
            raise EvaluationError(
                f"{model}: {died}. It died again after one restart; finished examples are "
                "kept, re-running the same command continues with the rest"
                if died
                else f"the {model} server died again after a restart (finished examples are "
                f"kept; re-run to continue). {self.log_excerpt()}"
            )
        self._restarts[model] = self._restarts.get(model, 0) + 1
        # located at the server's log: no line of modelbench's code is shown with it
        log = getattr(self.server, "log_path", None) or self.run_dir / "servers"
        warnings.warn_explicit(
            ServerDiedWarning(f"{model}: {died or 'the server died'}; restarting it once"),
            ServerDiedWarning,
            str(log),
            0,
        )
        try:
            self.server.restart()
        except ServingError as exc:
            raise EvaluationError(f"{model}: restart after a crash failed: {exc}") from None
        self.publish()

    def death_report(self) -> str | None:
        """None while the server runs (or none was started); once it has died, one line with
        the cause from its log and the log's path."""
        report = getattr(self.server, "death_report", None)
        return report() if report is not None else None

    def log_excerpt(self) -> str:
        """The dead server's log path and last lines, which say why it died."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.process import log_tail

        path = getattr(self.server, "log_path", None)
        if path is None:
            return f"See its log in {self.run_dir / 'servers'}"
        tail = "\n".join("    " + line for line in log_tail(path).splitlines()) or "    (empty)"
        return f"Its log: {path}, last lines:\n{tail}"

    def publish(self) -> None:
        """Open this worker's own server to the session's workers on this node that have no
        GPU (they share it while their items run)."""
        server, launch = self.server, self.launch
        client = self.exchange
        if client is None or launch is None or server is None or self.shared:
            return
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.channel import this_node
        from pytest_modelbench.serving.sharing import Published

        self._published = Published(client, launch.key, this_node(), server.base_url)

    def unpublish(self, *, lost: str | None = None) -> None:
        """Withdraw this worker's server, after the items sharing it end; with ``lost`` (why:
        it died, or stops at once) they lose it now."""
        published, self._published = self._published, None
        if published is None:
            return
        if lost is not None:
            published.close(lost=lost)
            return
        if published.withdraw() and self.launch is not None:
            warnings.warn(
                SharedServerWarning(
                    f"{self.launch.model_name}: items of other workers share this worker's "
                    "server; it stops once they end"
                ),
                stacklevel=5,
            )
        published.close()

    def stop(self, *, wait_sharers: bool = True) -> None:
        """Stop the worker's own server (after the items of other workers sharing it, unless
        ``wait_sharers`` is False), or let go of the one it shares."""
        self.unpublish(lost=None if wait_sharers else "its worker stops it at once")
        if self.server is not None:
            self.server.stop()
            self.server = None
            self.model = None
            self.launch = None
