"""A managed server for engines started from a plain command line (SGLang, ``command``).

:class:`EngineServer` is the :class:`~pytest_modelbench.serving.base.ServerHandle` around a
:class:`~pytest_modelbench.serving.process.ServerProcess`: the claimed GPUs in
``CUDA_VISIBLE_DEVICES`` (exactly them; empty for the CPU), a log in the run directory, a
readiness probe, restart on the same port, and a one-line death report. vLLM keeps its own
class (``serving/vllm.py``) for its CPU defaults and install hints.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_modelbench.running import blocking
from pytest_modelbench.serving.base import cpu_or_gpus
from pytest_modelbench.serving.process import (
    ServerProcess,
    death_cause,
    log_tail,
    port_is_free,
)

__all__ = ["EngineServer", "engine_env", "serves_model"]


def engine_env(
    gpus: Sequence[str] | None,
    model: str,
    base: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A server's environment: exactly the claimed GPUs (none: an empty list), unbuffered
    output for its log, and no hub lookups for a local model."""
    env = dict(os.environ if base is None else base)
    env.update(extra or {})
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus) if gpus else ""
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # indexes mean what nvidia-smi shows
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if Path(model).is_dir():  # a local model needs no hub: do not wait on it offline
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def serves_model(root_url: str, served_name: str, headers: Mapping[str, str]) -> bool:
    """``/health`` answers 200 and ``/v1/models`` lists ``served_name`` (*our* server there)."""
    health = blocking.get(f"{root_url}/health")
    if health is None or health[0] != 200:
        return False
    models = blocking.get(f"{root_url}/v1/models", headers=headers)
    if models is None or models[0] != 200:
        return False
    try:
        ids = {m.get("id") for m in json.loads(models[1]).get("data", [])}
    except (ValueError, AttributeError):
        return False
    return served_name in ids


class EngineServer:
    """One engine server process for one model, on claimed GPUs or the CPU."""

    def __init__(
        self,
        argv: Callable[[int], Sequence[str]],
        *,
        engine: str,
        served_name: str,
        gpus: Sequence[str] | None,
        log_path: Path,
        env: Mapping[str, str],
        ready: Callable[[str], bool],
        host: str = "127.0.0.1",
        check_installed: Callable[[], None] | None = None,
        wrappers: Sequence[str] = (),
        stop_grace_s: float = 15.0,
    ) -> None:
        """``argv``: the command for a port; ``ready``: the probe of the root URL;
        ``check_installed`` raises ``EngineNotInstalledError`` before a start when the engine
        is missing; ``wrappers``: log errors that only report another's death."""
        self._served_name = served_name
        self.gpus = tuple(gpus or ())
        self._check_installed = check_installed
        self._wrappers = tuple(wrappers)
        self._deadline_s = 600.0
        self.process = ServerProcess(
            argv,
            env=env,
            log_path=Path(log_path),
            ready=ready,
            label=f"{engine} server for {served_name!r} on {cpu_or_gpus(self.gpus)}",
            host=host,
            stop_grace_s=stop_grace_s,
            wrappers=wrappers,
        )

    @property
    def base_url(self) -> str:
        return f"{self.process.root_url}/v1"

    @property
    def served_name(self) -> str:
        return self._served_name

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def start(self, deadline_s: float = 600.0) -> None:
        """Start and wait up to ``deadline_s`` s until the readiness probe passes."""
        if self._check_installed is not None:
            self._check_installed()
        self._deadline_s = deadline_s
        self.process.start(deadline_s)

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def restart(self, deadline_s: float | None = None) -> None:
        """Stop and start again, on the same port when it is still free."""
        port = self.process.port
        self.stop()
        keep = port if port is not None and port_is_free(port) else None
        self.process.port = None
        self.process.start(self._deadline_s if deadline_s is None else deadline_s, port=keep)

    def stop(self) -> None:
        self.process.stop()

    def cancel(self) -> None:
        """Stop it, and any start under way in another thread (see ``ServerProcess.cancel``)."""
        self.process.cancel()

    def death_report(self) -> str | None:
        """None while the server runs; once it has exited, one line: how, the root cause from
        its log, and the log's path."""
        code = self.process.returncode()
        if code is None:
            return None
        tail = log_tail(self.log_path, 400, 256 * 1024, self.process.log_start)
        cause = death_cause(tail, self._wrappers) or "no error in its log"
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"the {self.process.label} died ({how}): {cause}; log: {self.log_path}"

    def __repr__(self) -> str:
        state = f"pid {self.process.pid}" if self.is_alive() else "stopped"
        return f"<EngineServer {self.process.label} {state}>"
