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

import string
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pytest_modelbench.running import blocking
from pytest_modelbench.serving.base import LaunchSpec
from pytest_modelbench.serving.server import EngineServer, engine_env

if TYPE_CHECKING:
    from pytest_modelbench.config.schema import ServeSpec

__all__ = ["PLACEHOLDERS", "CommandEngine", "render_command"]

PLACEHOLDERS = ("model", "served_name", "port", "host", "gpus", "n_gpus")
DEFAULT_HEALTH = "/v1/models"
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


def render_command(command: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """The argv with its placeholders filled in."""
    return [part.format_map(values) for part in command]


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

        def ready(root: str) -> bool:
            answer = blocking.get(f"{root}{health}")
            return answer is not None and answer[0] == 200

        return EngineServer(
            argv,
            engine=spec.command[0].rsplit("/", 1)[-1],
            served_name=spec.served_name,
            gpus=gpus,
            log_path=spec.log_path,
            env=engine_env(gpus, spec.model, extra=spec.env),
            ready=ready,
        )
