"""Worker-side server pool: one inference server per worker, reused across items of a model.

The pool claims this worker's GPU(s) once (host-local locks, see
``serving/gpus.py``), starts the model's engine on them, keeps it while
items of the same model follow, stops it (whole process group) when the
worker switches model or the session ends, and restarts it once if it died.
A local checkpoint is served under its model label; one whose weight file is
misnamed is served from a shadow directory (``serving/checkpoints.py``).

While an item runs, GPUs of this node that other workers of the session gave back serve the
model as replicas when the remaining work pays for their start (``serving/replicas.py``).

A worker of a session that finds no free GPU (more workers than GPUs) shares a running server
of the same launch on its node for the item (``serving/handover.py``: its requests join that
server's queue), or waits for a GPU to come free, up to the model's start-up timeout.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.names import safe_component
from pytest_modelbench.planning.plan import BUILT_IN_MODELS

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_modelbench.planning.item import PlannedItem
    from pytest_modelbench.running.urls import UrlSet
    from pytest_modelbench.serving.base import ServerHandle
    from pytest_modelbench.serving.exchange import ExchangeClient
    from pytest_modelbench.serving.handover import Wanted
    from pytest_modelbench.serving.replicas import Claim, Progress, ReplicaSet, Server

MAX_RESTARTS = 1
REMOTE_POLL_S = 1.0  # a worker serving another node's item reports this often
SHARE_POLL_S = 0.5  # a worker without a GPU looks for one (or a server to share) this often


def default_cache_dir() -> Path:
    """Where the smoke model and vLLM's compile cache live (``$MODELBENCH_CACHE`` or ~/.cache)."""
    root = os.environ.get("MODELBENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "modelbench"
    )
    return Path(root)


class ServerDiedWarning(UserWarning):
    """A served model's server died and is being restarted."""


class ReplicaWarning(UserWarning):
    """A replica of a served model died or did not start (the item goes on without it)."""


class SharedServerWarning(UserWarning):
    """A worker found no free GPU: its item shares another worker's server, or waits."""


@dataclass(frozen=True)
class _Launch:
    """How this worker's current server was started: replicas start the same way."""

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
    def of(cls, fields: dict[str, Any]) -> _Launch:
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
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.handover import launch_key

        fields: dict[str, Any] = {
            "path": self.model_path,
            "served": self.served,
            "args": self.args,
            "gpus": self.gpus,
        }
        if self.engine != "vllm":
            fields.update(engine=self.engine, command=list(self.command), health=self.health)
        return launch_key(fields)


class ServerPool:
    """Starts, reuses and stops this worker's server; gives items their base URL."""

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
        ``estimate``: an item's work in seconds on one server (the session's cost plan), so
        that replicas start alongside this worker's own server when the item pays for them.
        ``exchange``: the session's exchange when it spans several nodes: servers of other
        nodes join this worker's items, and this worker serves theirs at its end."""
        self.run_dir = run_dir
        self.gpus_option = gpus_option
        self.cache_dir = cache_dir or default_cache_dir()
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.session = session
        self._progress = progress
        self._estimate = estimate
        self.exchange = exchange
        self._remote_ready: list[Server] = []  # servers other nodes started for this worker
        self._remote_dead: dict[str, str] = {}  # their lease -> why it ended
        self._exchange_reported = False
        self._claim: Any = None
        self._server: Any = None
        self._model: str | None = None
        self._launch: _Launch | None = None
        self._start_s = 0.0  # how long the current server took to start
        self._replicas: ReplicaSet | None = None
        self._wanted: Wanted | None = None  # "more servers of my model welcome" (replicas)
        self._served_items: set[str] = set()  # items the current server serves
        self._planned: dict[str, PlannedItem] = {}  # items this worker served
        self._estimates: dict[str, float | None] = {}  # their work, seconds on one server
        self._estimate_lock = threading.Lock()
        self._replica_s: dict[str, float] = {}  # item -> replicas' serving time, past sets
        self._remote_lock = threading.Lock()
        self._remote_closed = False  # replicas stopped: no more wants until the next set
        self._starting: str | None = None  # the item whose server is starting
        self._want_lock = threading.Lock()
        self._restarts: dict[str, int] = {}
        self._published: Any = None  # handover.Published: this worker's server, shared
        self._tp_warned: set[str] = set()
        self._waited_out: dict[str, str] = {}  # model -> the wait that timed out (no second one)
        self.starts = 0

    def _gpus(self, n: int, model: str) -> tuple[str, ...]:
        """This worker's GPUs for a server of ``n`` GPUs (claimed once, re-claimed when
        ``n`` changes); warns once per model when the server would span several."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.gpus import warn_if_tensor_parallel

        gpus = self._claimed(n)
        if len(gpus) > 1 and model not in self._tp_warned:
            self._tp_warned.add(model)
            warn_if_tensor_parallel(len(gpus), model)
        return gpus

    def _claimed(self, n: int) -> tuple[str, ...]:
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import ServingError
        from pytest_modelbench.serving.gpus import (
            GpuSpecError,
            NoFreeGpuError,
            claim,
            held_by_session,
        )

        if self._claim is None or len(self._claim.gpus) not in (0, n):
            if self._claim is not None:
                self._claim.release()
                self._claim = None
            try:
                self._claim = claim(
                    n, option=self.gpus_option, warn_tensor_parallel=False, session=self.session
                )
            except GpuSpecError as exc:
                raise ModelbenchUsageError(str(exc)) from None  # names --gpus and the value
            except NoFreeGpuError as exc:
                if self.session is not None and held_by_session(exc.taken, self.session):
                    raise  # workers of this session hold them: share a server, or wait (_start)
                raise EvaluationError(str(exc)) from None  # another session's: fail at once
            except ServingError as exc:
                raise EvaluationError(str(exc)) from None
        # an empty claim: the host has no GPU (busy GPUs raise NoFreeGpuError), which the
        # session's header says once (session.core), not a warning per worker
        return tuple(self._claim.gpus)

    def reserve(self, n: int) -> None:
        """Claim this worker's GPUs for servers of ``n`` GPUs now, before any item runs, so
        that a worker that ends up with nothing to run gives them back to its session (for
        replicas). A claim that fails here is tried again, and reported, by the first item."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import ServingError
        from pytest_modelbench.serving.gpus import GpuSpecError, claim

        if self._claim is not None:
            return
        with contextlib.suppress(GpuSpecError, ServingError):
            self._claim = claim(
                n, option=self.gpus_option, warn_tensor_parallel=False, session=self.session
            )

    def ensure(self, item: PlannedItem) -> tuple[str, str]:
        """The (base URL, served model name) for ``item``, starting a server when needed."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import ServingError

        if self._estimate is not None and self.session is not None:
            self._planned.setdefault(item.item_id, item)  # estimated when replicas ask
        spec = item.model
        local = (
            spec.model is not None
            and spec.model not in BUILT_IN_MODELS
            and Path(spec.model).is_dir()
        )
        served = item.model_name if local else (spec.model or item.model_name)
        if isinstance(self._server, _SharedServer) and not self._server.is_alive():
            self.stop()  # its owner's server died: find another, or a GPU
        if self._server is not None and self._model == item.model_name:
            self._served_items.add(item.item_id)
            if self._server.is_alive():
                return self._server.base_url, self._server.served_name
            self._restart(item.model_name)
            return self._server.base_url, self._server.served_name
        self.stop()
        self._served_items = {item.item_id}
        try:
            self._server = self._start(item, served)
        except ServingError as exc:
            raise EvaluationError(f"{item.model_name}: {exc}") from None
        self._model = item.model_name
        self._publish()
        return self._server.base_url, self._server.served_name

    def _start(self, item: PlannedItem, served: str) -> Any:
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.checkpoints import CheckpointWarning, servable_checkpoint
        from pytest_modelbench.serving.engines import MODEL_BUILDERS, engine_for
        from pytest_modelbench.serving.gpus import NoFreeGpuError

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
                warnings.warn(CheckpointWarning(note), stacklevel=2)
        timeout_s = serve.startup_timeout if serve is not None else 900.0
        launch = _Launch(
            item.model_name,
            str(model_path),
            served,
            args,
            max(1, n_gpus),
            timeout_s,
            engine.name,
            tuple(serve.command or ()) if serve is not None else (),
            serve.health if serve is not None else None,
        )
        try:
            gpus = self._gpus(launch.gpus, item.model_name)
        except NoFreeGpuError as exc:  # other workers of the session hold the GPUs
            found = self._share_or_wait(launch, exc)
            if isinstance(found, _SharedServer):
                return found
            gpus = found
        log_path = self.run_dir / "servers" / f"{self.worker}-{safe_component(item.model_name)}.log"
        try:
            server = self._server_for(launch, gpus or None, log_path, listen=True)
        except ValueError as exc:  # reserved flag in serve.args
            raise ModelbenchUsageError(f"models.{item.model_name}.{exc}") from None
        self._launch = launch
        self._starting = item.item_id
        self._watch(None)  # replicas may start alongside this server
        began = time.monotonic()
        try:
            server.start(timeout_s)
        except BaseException:
            self._stop_replicas()
            self._launch = None
            raise
        finally:
            self._starting = None
        self._start_s = time.monotonic() - began
        if self._replicas is not None:
            self._replicas.primary_started(self._start_s)
        self.starts += 1
        return server

    def _server_for(
        self, launch: _Launch, gpus: tuple[str, ...] | None, log_path: Path, *, listen: bool
    ) -> ServerHandle:
        """An unstarted server of ``launch`` on ``gpus``, from the engine it names (every
        server this pool starts comes from here); ``listen``: reachable by other nodes."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import LaunchSpec
        from pytest_modelbench.serving.engines import ENGINES

        spec = LaunchSpec(
            model=launch.model_path,
            served_name=launch.served,
            log_path=log_path,
            cache_dir=self.cache_dir,
            args=launch.args,
            gpus=gpus,
            command=launch.command,
            health=launch.health,
            # only vLLM takes the session's key without showing it (VLLM_API_KEY, not argv):
            # other engines' servers stay on loopback and are never lent to another node
            **(self._listen() if listen and launch.engine == "vllm" else {}),
        )
        return ENGINES[launch.engine].server(spec)

    # -- workers without a GPU ----------------------------------------------------------------
    def _share_or_wait(self, launch: _Launch, no_gpu: Exception) -> _SharedServer | tuple[str, ...]:
        """No free GPU, but workers of this session hold some: share a running server of
        ``launch`` on this node, or claim GPUs once one comes free, whichever comes first,
        within the launch's start-up timeout. Says which in one line."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import ServingError
        from pytest_modelbench.serving.gpus import GpuSpecError, claim, default_lock_dir
        from pytest_modelbench.serving.handover import share

        assert self.session is not None
        if launch.model_name in self._waited_out:  # one wait per model: later items fail at once
            raise EvaluationError(f"{no_gpu}; {self._waited_out[launch.model_name]}")
        lock_dir = default_lock_dir()
        deadline = time.monotonic() + launch.timeout_s
        waited = False
        while True:
            found = share(self.session, launch.key, lock_dir)
            if found is not None:
                warnings.warn(
                    SharedServerWarning(
                        f"{launch.model_name}: no free GPU for worker {self.worker}; its item "
                        f"shares worker {found.worker}'s server (requests join its queue)"
                    ),
                    stacklevel=4,
                )
                return _SharedServer(found, launch.served)
            try:
                self._claim = claim(
                    launch.gpus,
                    option=self.gpus_option,
                    warn_tensor_parallel=False,
                    warn_busy=False,
                    session=self.session,
                )
                return tuple(self._claim.gpus)
            except GpuSpecError as exc:
                raise ModelbenchUsageError(str(exc)) from None
            except ServingError as exc:
                no_gpu = exc
            if time.monotonic() >= deadline:
                self._waited_out[launch.model_name] = (
                    f"waited {launch.timeout_s:.0f} s (serve.startup_timeout) for a GPU to come "
                    f"free or a server of {launch.model_name} to share"
                )
                raise EvaluationError(f"{no_gpu}; {self._waited_out[launch.model_name]}")
            if not waited:
                waited = True
                warnings.warn(
                    SharedServerWarning(
                        f"{launch.model_name}: no free GPU for worker {self.worker}; waiting up "
                        f"to {launch.timeout_s:.0f} s (serve.startup_timeout) for a GPU to come "
                        "free or a server of the same model on this node to share"
                    ),
                    stacklevel=4,
                )
            time.sleep(min(SHARE_POLL_S, max(0.0, deadline - time.monotonic())))

    def _publish(self) -> None:
        """Open this worker's new server to the session's workers on this node that have no
        GPU (they share it while their items run)."""
        server, launch = self._server, self._launch
        if self.session is None or launch is None or isinstance(server, _SharedServer):
            return
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.gpus import default_lock_dir
        from pytest_modelbench.serving.handover import Published

        pid = getattr(getattr(server, "process", None), "pid", None)
        with contextlib.suppress(OSError):  # sharing is a fallback only
            self._published = Published(
                self.session, self.worker, launch.key, server.base_url, pid, default_lock_dir()
            )

    def _unpublish(self, *, wait: bool) -> None:
        """Withdraw this worker's server; with ``wait``, after the items sharing it end."""
        published, self._published = self._published, None
        if published is None:
            return
        if wait and published.in_use() and self._launch is not None:
            warnings.warn(
                SharedServerWarning(
                    f"{self._launch.model_name}: items of other workers share this worker's "
                    "server; it stops once they end"
                ),
                stacklevel=4,
            )
        published.close(wait=wait)

    def item_done(self) -> None:
        """After an item: say what happened to replicas; let go of a shared server (its owner
        may switch model once no item of another worker sends to it)."""
        self.report_replicas()
        if isinstance(self._server, _SharedServer):
            self.stop()

    # -- replicas ----------------------------------------------------------------------------
    def share(self, urls: UrlSet) -> None:
        """The URL set the current server's requests go through: replicas join it. Starts
        watching for GPUs the session gave back (once per server)."""
        if self._server is None or self._launch is None:
            return
        if self._replicas is not None:
            if self._replicas.urls is not urls:
                self._replicas.attach(urls)
            return
        self._watch(urls)

    def _watch(self, urls: UrlSet | None) -> None:
        """Watch for GPUs the session gave back, for replicas of the current launch. Without
        ``urls``, while this worker's own server starts (``_starting``): its replicas wait in
        a URL set of their own until :meth:`share` hands them the item's."""
        if self.session is None or self._progress is None or self._claim is None or self._claim.cpu:
            return  # no session to share GPUs with, or serving on the CPU
        assert self._launch is not None
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.running.urls import UrlSet
        from pytest_modelbench.serving.gpus import default_lock_dir
        from pytest_modelbench.serving.handover import take
        from pytest_modelbench.serving.replicas import START_GUESS_S, ReplicaSet

        session, key, lock_dir = self.session, self._launch.key, default_lock_dir()
        with self._remote_lock:
            self._remote_closed = False
        self._replicas = ReplicaSet(
            model=self._launch.model_name,
            urls=urls if urls is not None else UrlSet(),
            launch=self._launch_replica,
            claim=self._claim_replica,
            progress=self._served_progress,
            start_s=self._start_s if urls is not None else START_GUESS_S,
            borrow=lambda: take(session, key, lock_dir) or self._take_remote(),
            give_back=lambda found: found.give_back(session),  # type: ignore[attr-defined]
            estimate=self._estimate_of,
            primary_ready=urls is not None,
            want_more=self._want_remote,
        )
        self._replicas.start()

    def _listen(self) -> dict[str, Any]:
        """Where this worker's servers listen: with an exchange, on this node's network with
        the session's key, so that it can lend them to another node's item at its end."""
        if self.exchange is None:
            return {}
        host = "127.0.0.1" if self.exchange.local else "0.0.0.0"  # keyed
        return {"host": host, "api_key": self.exchange.server_key}

    @property
    def server_key(self) -> str | None:
        """The key servers of other nodes require (None without an exchange)."""
        return self.exchange.server_key if self.exchange is not None else None

    @property
    def node(self) -> str:
        """This node, as the exchange tells nodes apart (host name and GPU claim directory)."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        import socket

        from pytest_modelbench.serving.gpus import default_lock_dir

        return f"{socket.gethostname()}:{default_lock_dir()}"

    def _want_remote(self, need: int, lend: bool) -> int:
        """Tell the exchange how many servers of the current launch from other nodes would
        pay, counting those they are starting (0: none), and whether live ones are welcome
        (``lend``: the item has work left); collect the servers other nodes made ready and
        the deaths. Returns how many other nodes are starting one for this worker."""
        client, launch = self.exchange, self._launch
        if client is None or launch is None or launch.engine != "vllm":  # see _server_for
            return 0
        with self._remote_lock:  # never after _stop_replicas released everything
            if self._remote_closed:
                return 0
            answer = client.call(
                "want",
                keeper=self.worker,
                node=self.node,
                key=launch.key,
                launch=launch.fields(),
                need=need,
                lend=lend,
            )
        if answer is None:
            return 0
        for dead in answer.get("dead", ()):
            self._remote_dead[str(dead["id"])] = str(dead["note"])
        for ready in answer.get("ready", ()):
            self._remote_ready.append(_RemoteServer(str(ready["id"]), str(ready["url"]), self))
        return int(answer.get("starting", 0))

    def _take_remote(self) -> Server | None:
        return self._remote_ready.pop(0) if self._remote_ready else None

    def _estimate_of(self, item_id: str | None) -> float | None:
        """The cost plan's work of an item this server serves (None: the one it starts for),
        computed when the replica thread first asks (never before a server start)."""
        key = item_id if item_id is not None else self._starting
        if key is None or self._estimate is None or key not in self._planned:
            return None
        item = self._planned[key]
        with self._estimate_lock:
            if key not in self._estimates:
                try:
                    self._estimates[key] = self._estimate(item)
                except Exception:  # an estimate only helps replicas start early
                    self._estimates[key] = None
            return self._estimates[key]

    def replica_seconds(self, item_id: str) -> float:
        """How long replicas served ``item_id`` (summed over their number): its work on one
        server is its wall time plus this."""
        current = self._replicas.replica_seconds if self._replicas is not None else {}
        return self._replica_s.get(item_id, 0.0) + current.get(item_id, 0.0)

    def _served_progress(self) -> Progress | None:
        """The running item's progress while it is one this server serves (not an API item
        run in between); other workers may lend servers of this model just as long."""
        found = self._progress() if self._progress is not None else None
        serving = found is not None and found[0] in self._served_items
        self._want(serving)
        return found if serving else None

    def _want(self, wanted: bool) -> None:
        """Say (or stop saying) that servers of this model are welcome here (``Wanted``)."""
        with self._want_lock:
            if not wanted:
                if self._wanted is not None:
                    self._wanted.close()
                    self._wanted = None
                return
            if self._wanted is not None or self.session is None or self._launch is None:
                return
            # lazily: serving loads only when a worker starts a server (pytest start-up)
            from pytest_modelbench.serving.gpus import default_lock_dir
            from pytest_modelbench.serving.handover import Wanted

            with contextlib.suppress(OSError, RuntimeError):  # lending is a bonus only
                self._wanted = Wanted(
                    self.session, self.worker, self._launch.key, default_lock_dir()
                )

    def _claim_replica(self) -> Claim | None:
        """Free GPUs of this session for one more server, or None."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import ServingError
        from pytest_modelbench.serving.gpus import GpuSpecError, claim, session_gpus

        assert self.session is not None and self._launch is not None
        given_back = session_gpus(self.session)
        if len(given_back) < self._launch.gpus:
            return None
        try:
            found = claim(
                self._launch.gpus,
                option=",".join(given_back),
                warn_tensor_parallel=False,
                warn_busy=False,
                session=self.session,
            )
        except (GpuSpecError, ServingError):  # taken meanwhile, or busy: look again later
            return None
        if found.cpu:
            return None
        return found

    def _launch_replica(
        self, gpus: tuple[str, ...], index: int, launched: Callable[[Server], None]
    ) -> Server:
        spec = self._launch
        assert spec is not None
        name = f"{self.worker}-{safe_component(spec.model_name)}-replica{index}.log"
        server = self._server_for(spec, gpus, self.run_dir / "servers" / name, listen=False)
        launched(server)
        server.start(spec.timeout_s)
        return server

    def report_replicas(self) -> None:
        """Warn (in the calling thread: the running test) what happened to replicas."""
        if self._replicas is not None:
            for note in self._replicas.drain_notes():
                warnings.warn(ReplicaWarning(note), stacklevel=2)
        failure = self.exchange.failure if self.exchange is not None else None
        if failure is not None and not self._exchange_reported:
            self._exchange_reported = True
            warnings.warn(
                ReplicaWarning(
                    f"replicas across nodes are off: {failure}; set MODELBENCH_EXCHANGE_HOST "
                    "(//env: in the --tx spec) to an address of the controller this node reaches"
                ),
                stacklevel=2,
            )

    def death_report(self) -> str | None:
        """None while this worker's server runs (or none was started); once it has died, one
        line with the cause from its log and the log's path."""
        report = getattr(self._server, "death_report", None)
        return report() if report is not None else None

    def _restart(self, model: str) -> None:
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import ServingError

        count = self._restarts.get(model, 0)
        died = self.death_report()
        self._unpublish(wait=False)  # its sharers see it died; published again once restarted
        if count >= MAX_RESTARTS:
            self._stop_replicas()  # its items fail from here on: replicas would only wait
            raise EvaluationError(
                f"{model}: {died}. It died again after one restart; finished examples are "
                "kept, re-running the same command continues with the rest"
                if died
                else f"the {model} server died again after a restart (finished examples are "
                f"kept; re-run to continue). {self._log_excerpt()}"
            )
        self._restarts[model] = count + 1
        warnings.warn(
            ServerDiedWarning(f"{model}: {died or 'the server died'}; restarting it once"),
            stacklevel=3,
        )
        try:
            self._server.restart()
        except ServingError as exc:
            raise EvaluationError(f"{model}: restart after a crash failed: {exc}") from None
        self._publish()

    def _log_excerpt(self) -> str:
        """The dead server's log path and last lines, which say why it died."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.process import log_tail

        path = getattr(self._server, "log_path", None)
        if path is None:
            return f"See its log in {self.run_dir / 'servers'}"
        tail = "\n".join("    " + line for line in log_tail(path).splitlines()) or "    (empty)"
        return f"Its log: {path}, last lines:\n{tail}"

    def recover(self, item: PlannedItem) -> bool:
        """After a failed item: True when its server had died and was restarted (retry the item)."""
        if self._server is None or self._model != item.model_name or self._server.is_alive():
            return False
        if isinstance(self._server, _SharedServer):
            self.stop()  # another worker's server died: the retry finds another, or a GPU
            return True
        self._restart(item.model_name)
        return True

    def _lend(self) -> None:
        """Nothing left to run here: while a worker of the session on this node runs an item
        of the same model, it uses this server as a replica; stop only after that."""
        if self.session is None or self._launch is None or self._server is None:
            return
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.gpus import default_lock_dir
        from pytest_modelbench.serving.handover import Offer

        server = self._server
        pid = getattr(getattr(server, "process", None), "pid", None)
        offer = Offer(
            self.session, self.worker, self._launch.key, server.base_url, pid, default_lock_dir()
        )
        with contextlib.suppress(OSError):
            offer.lend(alive=server.is_alive)

    def _serve_other_nodes(self) -> None:
        """Nothing left to run here: while an item on another node wants servers of a launch
        that fits this worker's GPUs (and none on this node does), serve it on them."""
        client, claim = self.exchange, self._claim
        if client is None or claim is None or claim.cpu or not claim.gpus:
            return
        gpus = tuple(claim.gpus)
        while True:
            live = self._live()
            job = client.call(
                "serve", helper=self.worker, node=self.node, gpus=len(gpus), live=live
            )
            if job is None or job.get("local"):
                return  # nobody will want it, or a keeper of this node does (GPUs go back)
            if "id" not in job:
                if not job.get("wait"):
                    return
                time.sleep(REMOTE_POLL_S)
                continue
            if job.get("lent"):  # this worker's own server, as it is
                served = self._lend_lease(client, str(job["id"]))
                self.stop()
                if not served:
                    return
                continue
            self.stop()  # its own server holds another launch
            if not self._serve_lease(client, str(job["id"]), dict(job["launch"]), gpus):
                return

    def _live(self) -> tuple[str, int] | None:
        """(launch key, port) of this worker's own server while it runs (a vLLM one: the
        only engine whose servers listen for other nodes)."""
        server, launch = self._server, self._launch
        if server is None or launch is None or launch.engine != "vllm" or not server.is_alive():
            return None
        port = getattr(getattr(server, "process", None), "port", None)
        return (launch.key, int(port)) if port is not None else None

    def _lend_lease(self, client: ExchangeClient, lease: str) -> bool:
        """Serve another node's item with this worker's own server until it is released;
        False when the server died meanwhile."""
        return self._hold_lease(client, lease, self._server)

    def _serve_lease(
        self, client: ExchangeClient, lease: str, launch: dict[str, Any], gpus: tuple[str, ...]
    ) -> bool:
        """Start ``launch`` on ``gpus`` for another node's item and serve until released;
        False when it did not start or died (this worker then stops serving others)."""
        name = safe_component(str(launch["model_name"]))
        try:
            server: Any = self._server_for(
                _Launch.of(launch),
                gpus,
                self.run_dir / "servers" / f"{self.worker}-{name}-for-another-node.log",
                listen=True,
            )
        except (ValueError, KeyError) as exc:
            client.call("offer", id=lease, note=f"{self.worker} on {self.node}: {exc}")
            return False
        try:
            try:
                server.start(float(launch["timeout_s"]))
            except Exception as exc:
                client.call("offer", id=lease, note=f"did not start on {self.node}: {exc}")
                return False
            client.call("offer", id=lease, port=server.process.port)
            return self._hold_lease(client, lease, server)
        finally:
            server.stop()

    def _hold_lease(self, client: ExchangeClient, lease: str, server: Any) -> bool:
        """Report every ``REMOTE_POLL_S`` while the lease holds; True once released, False
        (reported) when ``server`` died."""
        while True:
            time.sleep(REMOTE_POLL_S)
            if not server.is_alive():
                why = server.death_report() or "its process exited"
                client.call("offer", id=lease, note=f"on {self.node}: {why}")
                return False
            answer = client.call("lease", id=lease)
            if answer is None or not answer.get("serve"):
                return True

    def _stop_replicas(self) -> None:
        if self._replicas is not None:
            with self._remote_lock:
                self._remote_closed = True
            self._replicas.stop()  # its thread no longer says "wanted" after this
            self.report_replicas()
            for item_id, seconds in self._replicas.replica_seconds.items():
                self._replica_s[item_id] = self._replica_s.get(item_id, 0.0) + seconds
            self._replicas = None
            if self.exchange is not None:  # servers of other nodes: no longer wanted
                with self._remote_lock:  # after any want in flight
                    self.exchange.call("release", keeper=self.worker, id=None)
                for server in self._remote_ready:
                    server.stop()
                self._remote_ready.clear()
        self._want(False)

    def stop(self, *, wait_sharers: bool = True) -> None:
        """Stop this worker's server (after the items of other workers sharing it, unless
        ``wait_sharers`` is False), or let go of the one it shares."""
        self._stop_replicas()
        self._unpublish(wait=wait_sharers)
        if self._server is not None:
            self._server.stop()
            self._server = None
            self._model = None
            self._launch = None

    def close(self, *, lend: bool = True) -> None:
        """End of this worker: lend the server while another worker of the session uses it
        (``lend=False`` after Ctrl-C), stop everything, give the GPUs back to the session."""
        try:
            self._stop_replicas()
            if lend:
                self._lend()
                self._serve_other_nodes()
        finally:
            self.stop(wait_sharers=lend)
            if self._claim is not None:
                if self.session is not None:
                    self._claim.give_back(self.session)
                else:
                    self._claim.release()
                self._claim = None


class _RemoteServer:
    """A server another node started for this worker (``serving/exchange.py``)."""

    def __init__(self, lease: str, base_url: str, pool: ServerPool) -> None:
        self.lease = lease
        self.base_url = base_url
        self._pool = pool

    def is_alive(self) -> bool:
        exchange = self._pool.exchange
        lost = exchange is not None and exchange.failure is not None  # nobody says any more
        return not lost and self.lease not in self._pool._remote_dead

    def stop(self) -> None:
        if self._pool.exchange is not None:
            self._pool.exchange.call("release", keeper=self._pool.worker, id=self.lease)

    def death_report(self) -> str | None:
        exchange = self._pool.exchange
        if exchange is not None and exchange.failure is not None:
            return exchange.failure
        return self._pool._remote_dead.get(self.lease)


class _SharedServer:
    """Another worker's running server of the same launch (``handover.Shared``), used by this
    worker's item: stopping it lets go, and its owner stops it."""

    def __init__(self, shared: Any, served_name: str) -> None:
        self._shared = shared
        self.base_url: str = shared.base_url
        self.served_name = served_name

    def is_alive(self) -> bool:
        return bool(self._shared.is_alive())

    def stop(self) -> None:
        self._shared.stop()

    def restart(self) -> None:
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.base import ServingError

        raise ServingError(f"worker {self._shared.worker}'s server is not this worker's to restart")

    def death_report(self) -> str | None:
        report: str | None = self._shared.death_report()
        return report
