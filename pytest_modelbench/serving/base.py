"""What an inference engine and a running server look like to the rest of modelbench.

An :class:`Engine` (vLLM today) turns a :class:`LaunchSpec` into a :class:`ServerHandle`;
the worker-side code only ever talks to those two Protocols, so adding an engine is adding
a class. Errors raised here carry complete, user-facing messages.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

__all__ = [
    "Engine",
    "EngineNotInstalledError",
    "LaunchSpec",
    "ServerHandle",
    "ServerStartError",
    "ServingError",
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


class Engine(Protocol):
    """A way to serve models: creates (unstarted) server handles."""

    name: str

    def server(self, spec: LaunchSpec) -> ServerHandle: ...


def cpu_or_gpus(gpus: Sequence[str] | None) -> str:
    """Human-readable placement, for messages: ``CPU`` or ``GPU 0,1``."""
    return f"GPU {','.join(gpus)}" if gpus else "CPU"
