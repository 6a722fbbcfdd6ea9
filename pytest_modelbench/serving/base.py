"""What an inference engine and a running server look like to the rest of modelbench.

An :class:`Engine` (``serve.engine``: vLLM, SGLang, any command) turns a :class:`LaunchSpec`
into a :class:`ServerHandle`; the worker-side code only ever talks to those two Protocols, so
adding an engine is adding a class (``serving/engines.py`` registers it). Errors raised here
carry complete, user-facing messages.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pytest_modelbench.config.schema import ServeSpec
    from pytest_modelbench.serving.tls import SessionTls

__all__ = [
    "Engine",
    "EngineNotInstalledError",
    "LaunchSpec",
    "ServerHandle",
    "ServerStartError",
    "ServingError",
    "refuse_command",
]


class ServingError(Exception):
    """A server could not be started, or is not usable; the message says why and what to do."""


class EngineNotInstalledError(ServingError):
    """The engine's Python package is missing from the interpreter that would run the server."""


class ServerStartError(ServingError):
    """The server process died or did not become healthy before its deadline."""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one inference server for one model."""

    model: str  # HF id or local path, as the engine understands it
    served_name: str  # the model name clients send in requests
    log_path: Path
    cache_dir: Path  # engine caches (compiled graphs...) go under here
    args: Mapping[str, object] = field(default_factory=dict)  # engine flags, e.g. serve.args
    gpus: tuple[str, ...] | None = None  # claimed GPU ids (physical); None/() = CPU
    python: str = sys.executable  # interpreter with the engine installed
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for the server
    host: str = "127.0.0.1"  # where it listens (another node's item: see serving/exchange.py)
    api_key: str | None = field(default=None, repr=False)  # requests must carry it
    tls: SessionTls | None = None  # serve TLS, clients showing the session's certificate
    command: tuple[str, ...] = ()  # serve.command: the argv template (engine: command)
    health: str | None = None  # serve.health: the path that answers 200 once it serves


class ServerHandle(Protocol):
    """A server process that modelbench owns: started, probed, restarted and stopped here."""

    @property
    def base_url(self) -> str:
        """OpenAI-compatible base URL ending in ``/v1``; may change after :meth:`restart`."""
        ...

    @property
    def served_name(self) -> str: ...

    def start(self, deadline_s: float) -> None:
        """Start and wait at most ``deadline_s`` seconds for health; raise :class:`ServingError`."""
        ...

    def is_alive(self) -> bool: ...

    def restart(self, deadline_s: float | None = None) -> None: ...

    def stop(self) -> None:
        """Stop the whole process group; idempotent."""
        ...

    def death_report(self) -> str | None:
        """None while it runs; once it has exited, one line: how, the cause from its log."""
        ...


class Engine(Protocol):
    """A way to serve models: creates (unstarted) server handles. :meth:`server` raises
    ``ValueError`` with the ``serve.args`` key and the fix when the spec cannot be served."""

    name: str

    def check(self, serve: ServeSpec) -> None:
        """Raise ``ValueError`` (``serve.<key>: ...`` and the fix) for a ``serve`` section
        this engine cannot serve, or whose program or package is missing here; called when
        the session starts, before any server."""
        ...

    def server(self, spec: LaunchSpec) -> ServerHandle: ...


def cpu_or_gpus(gpus: Sequence[str] | None) -> str:
    """Human-readable placement, for messages: ``CPU`` or ``GPU 0,1``."""
    return f"GPU {','.join(gpus)}" if gpus else "CPU"


def refuse_command(serve: ServeSpec, engine: str) -> None:
    """``serve.command`` and ``serve.health`` belong to ``engine: command`` only."""
    for key in ("command", "health"):
        if getattr(serve, key) is not None:
            raise ValueError(
                f"serve.{key}: only serve.engine: command takes a {key} (this engine is "
                f"{engine}); remove it, or set serve.engine: command"
            )
