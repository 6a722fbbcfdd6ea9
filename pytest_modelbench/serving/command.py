"""The ``command`` engine: any OpenAI-compatible server from an argv template.

``serve: {engine: command, command: [llama-server, -m, "{model}", --port, "{port}"],
health: /health}`` serves llama.cpp's server, TGI, LMDeploy or anything else that speaks
``/v1`` without code. Placeholders: ``{model}`` (the model's path or id), ``{served_name}``
(the name requests carry), ``{port}`` (a free port), ``{host}`` (where to listen), ``{gpus}``
(the claimed GPU ids, ``0,1``; empty on the CPU) and ``{n_gpus}``; ``{{`` is a literal brace.
The process gets exactly the claimed GPUs in ``CUDA_VISIBLE_DEVICES``. Ready when the health
path (``/v1/models`` unless ``serve.health`` says) answers 200.
"""

from __future__ import annotations

import shutil
import string
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pytest_modelbench.running import blocking
from pytest_modelbench.serving.base import LaunchSpec, ServerStartError
from pytest_modelbench.serving.server import EngineServer, engine_env

if TYPE_CHECKING:
    from pytest_modelbench.config.schema import ServeSpec

__all__ = ["PLACEHOLDERS", "CommandEngine", "render_command"]

PLACEHOLDERS = ("model", "served_name", "port", "host", "gpus", "n_gpus")
DEFAULT_HEALTH = "/v1/models"
# A live server that refuses the health path (4xx) this long while /v1/models answers 200
# has the wrong path, not a slow start: said at once rather than after serve.startup_timeout.
WRONG_HEALTH_S = 3.0
_EXAMPLE = 'e.g. [llama-server, -m, "{model}", --port, "{port}"]'


def _fields(part: str) -> list[str]:
    """The placeholders of one argv element; ValueError for a malformed one."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(part) if name is not None]
    except ValueError as exc:
        raise ValueError(
            f"serve.command: {part!r}: {exc} (write {{{{ and }}}} for literal braces)"
        ) from None


def check_command(command: Sequence[str] | None, health: str | None) -> None:
    """ValueError naming the key, the value and the fix for a template that cannot run."""
    if not command:
        raise ValueError(
            f"serve.command: serve.engine: command needs the server's argv as a list, {_EXAMPLE}"
        )
    unknown = sorted({name for part in command for name in _fields(part)} - set(PLACEHOLDERS))
    if unknown:
        shown = ", ".join("{" + name + "}" for name in unknown)
        known = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
        raise ValueError(
            f"serve.command: unknown placeholder{'s' if len(unknown) > 1 else ''} {shown}; "
            f"known: {known}"
        )
    if not any("port" in _fields(part) for part in command):
        raise ValueError(
            "serve.command: the server must listen on the port modelbench picks: put "
            f'"{{port}}" in the command, {_EXAMPLE}'
        )
    if health is not None and not health.startswith("/"):
        raise ValueError(f"serve.health: {health!r} is not a path; write it as /health")


def check_program(command: Sequence[str]) -> None:
    """ValueError when the server's program (``serve.command[0]``) cannot be found or run
    here; a program named by a placeholder is found when the server starts."""
    if _fields(command[0]):
        return
    program = command[0].format_map({})  # {{ and }}: literal braces
    if shutil.which(program) is not None:
        return
    where = "not found" if "/" in program else "not found on PATH"
    raise ValueError(
        f"serve.command[0]: {program!r} {where} (or not executable): install it or give "
        "its full path"
    )


def render_command(command: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """The argv with its placeholders filled in."""
    return [part.format_map(values) for part in command]


class HealthProbe:
    """Ready when the health path answers 200. A server that answers a 4xx there while
    ``/v1/models`` answers 200 serves, at another path: :class:`ServerStartError` naming
    ``serve.health``, its answer and the fix, after :data:`WRONG_HEALTH_S` seconds of it."""

    def __init__(self, health: str) -> None:
        self.health = health
        self._refused_since: float | None = None

    def __call__(self, root: str) -> bool:
        answer = blocking.get(f"{root}{self.health}")
        if answer is not None and answer[0] == 200:
            return True
        if (
            answer is None
            or not 400 <= answer[0] < 500
            or self.health == DEFAULT_HEALTH
            or (blocking.get(f"{root}{DEFAULT_HEALTH}") or (0, b""))[0] != 200
        ):
            self._refused_since = None
            return False
        now = time.monotonic()
        self._refused_since = self._refused_since or now
        if now - self._refused_since < WRONG_HEALTH_S:
            return False
        self._refused_since = None
        raise ServerStartError(
            f"serve.health {self.health!r} answers {answer[0]} ({DEFAULT_HEALTH} answers 200): "
            f"fix serve.health in models.yaml, or remove it to probe {DEFAULT_HEALTH}"
        )


class CommandEngine:
    """``serve.engine: command``."""

    name = "command"

    def check(self, serve: ServeSpec) -> None:
        check_command(serve.command, serve.health)
        if serve.args:
            raise ValueError(
                "serve.args: serve.engine: command takes its flags in serve.command; move "
                f"{next(iter(serve.args))!r} there"
            )

    def server(self, spec: LaunchSpec) -> EngineServer:
        check_command(spec.command, spec.health)
        gpus = tuple(spec.gpus or ())
        health = spec.health or DEFAULT_HEALTH
        values = {
            "model": spec.model,
            "served_name": spec.served_name,
            "host": "127.0.0.1",  # no key reaches it: never listens beyond this host
            "gpus": ",".join(gpus),
            "n_gpus": str(len(gpus)),
        }

        def argv(port: int) -> list[str]:
            return render_command(spec.command, {**values, "port": str(port)})

        return EngineServer(
            argv,
            engine=argv(0)[0].rsplit("/", 1)[-1],  # the program, placeholders filled in
            served_name=spec.served_name,
            gpus=gpus,
            log_path=spec.log_path,
            env=engine_env(gpus, spec.model, extra=spec.env),
            ready=HealthProbe(health),
        )
