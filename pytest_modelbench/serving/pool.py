"""Worker-side server pool: one inference server per worker, reused across items of a model.

A thin composition of three owners: the worker's GPU claimer (``serving/gpus.py``:
claimed once, given back to the session at the end), its server slot (``serving/slot.py``:
the model's engine started on them, kept while items of the same model follow, stopped
when the worker switches model or the session ends, restarted once if it died) and its
replica policy (``serving/replica_policy.py``: replicas on GPUs other workers gave back,
servers lent by idle workers and by other nodes). A local checkpoint is served under its
model label; one whose weight file is misnamed is served from a shadow directory
(``serving/checkpoints.py``).

A worker of a session that finds no free GPU (more workers than GPUs) shares a running server
of the same launch on its node for the item (``serving/sharing.py``, through the session's
exchange: its requests join that server's queue), or waits for a GPU to come free: with no
deadline while workers of its session hold the GPUs (they give them back when they end; the
exchange wakes it), up to the model's start-up timeout when others hold them.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.names import safe_component
from pytest_modelbench.planning.plan import BUILT_IN_MODELS
from pytest_modelbench.serving.gpus import GpuClaimer
from pytest_modelbench.serving.messages import GpusGiven, Message, WaitGpus, Wake
from pytest_modelbench.serving.replica_policy import ReplicaPolicy, ReplicaWarning
from pytest_modelbench.serving.slot import (
    Launch,
    ServerDiedWarning,
    ServerSlot,
    SharedServer,
    SharedServerWarning,
    build_server,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_modelbench.planning.item import PlannedItem
    from pytest_modelbench.running.urls import UrlSet
    from pytest_modelbench.serving.channel import ExchangeClient
    from pytest_modelbench.serving.replicas import Progress

__all__ = [
    "ReplicaWarning",
    "ServerDiedWarning",
    "ServerPool",
    "SharedServerWarning",
    "default_cache_dir",
]

SHARE_POLL_S = 0.5  # a worker without a GPU looks for one (or a server to share) this often
# ... while workers of its session hold the GPUs, woken by the exchange's events; this look
# only catches one it missed (a worker killed: its GPU lock may lapse after its socket closed)
SESSION_LOOK_S = 5.0


def default_cache_dir() -> Path:
    """Where the smoke model and vLLM's compile cache live (``$MODELBENCH_CACHE`` or ~/.cache)."""
    root = os.environ.get("MODELBENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "modelbench"
    )
    return Path(root)


class ServerPool:
    """Gives items their base URL: the worker's GPU claimer, server slot and replica policy."""

    def __init__(
        self,
        run_dir: Path,
        *,
        gpus_option: str | None = None,
        cache_dir: Path | None = None,
        session: str | None = None,
        progress: Callable[[], Progress | None] | None = None,
        estimate: Callable[[PlannedItem], float | None] | None = None,
        exchange: ExchangeClient | None = None,
    ) -> None:
        """``session``: the pytest session's id (xdist's ``testrunuid``); with ``progress``
        (the running item's id, done and total) this worker may start replicas on GPUs other
        workers of the session gave back, and lend its server. Without them it never does.
        ``estimate`` and ``exchange``: see :class:`ReplicaPolicy`."""
        self.run_dir = run_dir
        self.cache_dir = cache_dir or default_cache_dir()
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.session = session
        self.gpus = GpuClaimer(gpus_option, session)
        self.slot = ServerSlot(run_dir, self.worker, session)
        self.slot.exchange = exchange
        self.replicas = ReplicaPolicy(
            self.slot,
            self.gpus,
            cache_dir=self.cache_dir,
            progress=progress,
            estimate=estimate,
            exchange=exchange,
        )
        self._waited_out: dict[str, str] = {}  # model -> the wait that timed out (no second one)
        self._woken = threading.Event()  # the exchange pushed: GPUs given back, a worker ended
        if exchange is not None:
            exchange.listen(self._on_event)

    @property
    def starts(self) -> int:
        """How many servers this worker started (restarts not counted)."""
        return self.slot.starts

    @property
    def exchange(self) -> ExchangeClient | None:
        return self.replicas.exchange

    @property
    def server_key(self) -> str | None:
        """The key servers of other nodes require (None without an exchange)."""
        return self.replicas.server_key

    @property
    def tls_context(self) -> ssl.SSLContext | None:
        """How requests reach this session's servers that serve TLS (None without an
        exchange)."""
        return self.replicas.tls_context

    def reserve(self, n: int) -> None:
        """Claim this worker's GPUs for servers of ``n`` GPUs now (see :meth:`GpuClaimer.reserve`)."""
        self.gpus.reserve(n)

    def ensure(self, item: PlannedItem) -> tuple[str, str]:
        """The (base URL, served model name) for ``item``, starting a server when needed."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import ServingError

        self.replicas.plan(item)
        spec = item.model
        local = (
            spec.model is not None
            and spec.model not in BUILT_IN_MODELS
            and Path(spec.model).is_dir()
        )
        served = item.model_name if local else (spec.model or item.model_name)
        if self.slot.shared and not self.slot.server.is_alive():
            self.stop()  # its owner's server died: find another, or a GPU
        if self.slot.holds(item.model_name):
            self.replicas.served_items.add(item.item_id)
            if not self.slot.server.is_alive():
                self._restart()
            return self.slot.address()
        self.stop()
        self.replicas.served_items = {item.item_id}
        try:
            self._start(item, served)
        except ServingError as exc:
            raise EvaluationError(f"{item.model_name}: {exc}") from None
        return self.slot.address()

    def _launch(self, item: PlannedItem, served: str) -> Launch:
        """How ``item``'s model is served: its engine, weights (built, or a checkpoint's
        servable folder), engine args, GPUs and start-up timeout."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.checkpoints import CheckpointWarning, servable_checkpoint
        from pytest_modelbench.serving.engines import MODEL_BUILDERS, engine_for

        spec = item.model
        serve = spec.serve
        try:
            engine = engine_for(serve)
        except ValueError as exc:  # the session checked it already; a bare pool did not
            raise ModelbenchUsageError(f"models.{item.model_name}.{exc}") from None
        n_gpus = serve.gpus if serve is not None else 1
        args: dict[str, Any] = dict(serve.args) if serve is not None else {}
        model_path: str | Path = spec.model or item.model_name
        builder = MODEL_BUILDERS.get(spec.model or "")
        if builder is not None:
            model_path = builder.build(self.cache_dir)
            args = {**builder.serve_args.get(engine.name, {}), **args}
        elif Path(model_path).is_dir():
            shadow_root = self.run_dir / "servers" / "checkpoints"
            model_path, note = servable_checkpoint(model_path, shadow_root)
            if note:
                warnings.warn(CheckpointWarning(note), stacklevel=3)
        return Launch(
            item.model_name,
            str(model_path),
            served,
            args,
            max(1, n_gpus),
            serve.startup_timeout if serve is not None else 900.0,
            engine.name,
            tuple(serve.command or ()) if serve is not None else (),
            serve.health if serve is not None else None,
        )

    def _start(self, item: PlannedItem, served: str) -> None:
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.gpu_claims import NoFreeGpuError

        launch = self._launch(item, served)
        try:
            gpus = self.gpus.gpus(launch.gpus, item.model_name)
        except NoFreeGpuError as exc:  # other workers of the session hold the GPUs
            found = self._share_or_wait(launch, exc)
            if isinstance(found, SharedServer):
                self.slot.adopt(item.model_name, found)
                return
            gpus = found
        log_path = self.run_dir / "servers" / f"{self.worker}-{safe_component(item.model_name)}.log"
        try:
            server = build_server(
                launch, gpus or None, log_path, self.cache_dir, self.replicas.listen()
            )
        except ValueError as exc:  # reserved flag in serve.args
            raise ModelbenchUsageError(f"models.{item.model_name}.{exc}") from None
        self.replicas.starting = item.item_id
        try:  # replicas may start alongside this server
            self.slot.start(
                item.model_name, launch, server, starting=lambda: self.replicas.watch(None)
            )
        except BaseException:
            try:
                self.replicas.stop()  # they read the launch: stopped before it is forgotten
            finally:
                self.slot.forget_launch()
            raise
        finally:
            self.replicas.starting = None
        self.replicas.primary_started()

    # -- workers without a GPU ----------------------------------------------------------------
    def _on_event(self, event: Message) -> None:
        if isinstance(event, (GpusGiven, Wake)):
            self._woken.set()

    def _share_or_wait(self, launch: Launch, no_gpu: Exception) -> SharedServer | tuple[str, ...]:
        """No free GPU, but workers of this session hold some: share a running server of
        ``launch`` on this node, or claim GPUs once one comes free, whichever comes first.

        With the session's exchange, the wait has no deadline while workers of this session
        hold GPUs of this node (they give them back at their end, and the exchange sees a
        dead one): it is woken by the exchange's events. Only GPUs held by others (another
        session, another program) bound it to the launch's start-up timeout, counted from
        when the session's workers held none. Without an exchange the whole wait is bounded.
        Says what it waits for in one line."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.channel import this_node
        from pytest_modelbench.serving.process import ctrl_c_raises

        if launch.model_name in self._waited_out:  # one wait per model: later items fail at once
            raise EvaluationError(f"{no_gpu}; {self._waited_out[launch.model_name]}")
        node = this_node()
        exchange = self.exchange
        interrupted = False
        try:  # Ctrl-C stops it at once, even in the item's event loop (whose handler would not)
            with ctrl_c_raises():
                return self._wait_for_gpu(launch, no_gpu, node)
        except KeyboardInterrupt:
            interrupted = True  # the worker ends at once: its connection's close says so
            raise
        finally:
            if exchange is not None and not interrupted:
                exchange.call(WaitGpus(node, waiting=False))

    def _wait_for_gpu(
        self, launch: Launch, no_gpu: Exception, node: str
    ) -> SharedServer | tuple[str, ...]:
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import ServingError
        from pytest_modelbench.serving.gpu_claims import NoFreeGpuError, held_by_session
        from pytest_modelbench.serving.sharing import share

        assert self.session is not None
        exchange = self.exchange
        model = launch.model_name
        deadline = time.monotonic() + launch.timeout_s
        said = False
        while True:
            self._woken.clear()  # before looking: an event from here on is not lost
            found = share(exchange, launch.key, node) if exchange is not None else None
            if found is not None:
                self._say(
                    f"{model}: no free GPU for worker {self.worker}; its item shares worker "
                    f"{found.worker}'s server (requests join its queue)"
                )
                return SharedServer(found, launch.served)
            try:
                return self.gpus.try_claim(launch.gpus)
            except ServingError as exc:
                no_gpu = exc
            taken = no_gpu.taken if isinstance(no_gpu, NoFreeGpuError) else ()
            ours = [gpu for gpu in taken if held_by_session((gpu,), self.session)]
            now = time.monotonic()
            # they give them back: no deadline, while the exchange has this wait on its book
            # (said again at every look: a reconnect or a lost reply must not drop it, or no
            # worker of this node would know to give its GPUs back)
            if ours and exchange is not None and exchange.call(WaitGpus(node)) is not None:
                deadline = now + launch.timeout_s
                if not said:
                    said = True
                    self._say(
                        f"{model}: no free GPU for worker {self.worker}; waiting for GPU "
                        f"{','.join(ours)}, held by workers of this session that give it back "
                        f"when they end, or for a server of {model} on this node to share "
                        "(not failing while the session holds the GPUs)"
                    )
                self._woken.wait(SESSION_LOOK_S)
                continue
            if now >= deadline:
                others = "; the GPUs are held by other sessions or programs" if exchange else ""
                self._waited_out[model] = (
                    f"waited {launch.timeout_s:.0f} s (serve.startup_timeout) for a GPU to come "
                    f"free or a server of {model} to share{others}; raise serve.startup_timeout "
                    "to wait longer"
                )
                raise EvaluationError(f"{no_gpu}; {self._waited_out[model]}")
            if not said:
                said = True
                self._say(
                    f"{model}: no free GPU for worker {self.worker}; waiting up to "
                    f"{launch.timeout_s:.0f} s (serve.startup_timeout) for a GPU to come free "
                    "or a server of the same model on this node to share"
                )
            self._woken.wait(min(SHARE_POLL_S, max(0.0, deadline - now)))

    @staticmethod
    def _say(line: str) -> None:
        """One line on the item (a warning, shown where the item is)."""
        warnings.warn(SharedServerWarning(line), stacklevel=6)

    # -- while items run ----------------------------------------------------------------------
    def share(self, urls: UrlSet) -> None:
        """The URL set the current server's requests go through: replicas join it."""
        self.replicas.share(urls)

    def replica_seconds(self, item_id: str) -> float:
        """How long replicas served ``item_id`` (summed over their number)."""
        return self.replicas.replica_seconds(item_id)

    def report_replicas(self) -> None:
        """Warn (in the calling thread: the running test) what happened to replicas."""
        self.replicas.report()

    def item_done(self) -> None:
        """After an item: say what happened to replicas; let go of a shared server (its owner
        may switch model once no item of another worker sends to it)."""
        self.replicas.report()
        if self.slot.shared:
            self.stop()

    def death_report(self) -> str | None:
        """None while this worker's server runs (or none was started); once it has died, one
        line with the cause from its log and the log's path."""
        return self.slot.death_report()

    def recover(self, item: PlannedItem) -> bool:
        """After a failed item: True when its server had died and was restarted (retry the item)."""
        if not self.slot.holds(item.model_name) or self.slot.server.is_alive():
            return False
        if self.slot.shared:
            self.stop()  # another worker's server died: the retry finds another, or a GPU
            return True
        self._restart()
        return True

    def _restart(self) -> None:
        if not self.slot.may_restart():
            self.replicas.stop()  # its items fail from here on: replicas would only wait
        self.slot.restart()

    # -- stopping -----------------------------------------------------------------------------
    def stop(self, *, wait_sharers: bool = True) -> None:
        """Stop this worker's server (after the items of other workers sharing it, unless
        ``wait_sharers`` is False) with its replicas, or let go of the one it shares."""
        self.replicas.stop()
        self.slot.stop(wait_sharers=wait_sharers)

    def close(self, *, lend: bool = True) -> None:
        """End of this worker: lend the server while another worker of the session uses it,
        or serve another node's item (``lend=False`` after Ctrl-C), stop everything, give
        the GPUs back to the session."""
        try:
            self.replicas.stop()
            if lend:
                self.replicas.help_others(self.stop)
        finally:
            try:
                self.stop(wait_sharers=lend)
            finally:  # a second Ctrl-C during the stop still gives the GPUs back
                try:
                    self.gpus.close()
                finally:  # the exchange takes the closed connection as this worker's end
                    if self.exchange is not None:
                        self.exchange.close()
