"""The SGLang engine: ``python -m sglang.launch_server`` as a managed server.

Flags as SGLang's own ``ServerArgs`` (``python/sglang/srt/server_args.py``) names them:
``--model-path``, ``--served-model-name``, ``--host``, ``--port``, ``--tp-size`` (the claimed
GPUs, unless ``serve.args`` sets ``tp_size`` or ``dp_size``), ``--random-seed`` (0 unless
``serve.args`` sets it: SGLang's default is a random one), ``--device cpu`` without a GPU;
``serve.args`` adds any other (``mem_fraction_static: 0.8`` → ``--mem-fraction-static 0.8``,
``True`` → the bare flag, ``False`` → left out: SGLang's switches have no ``--no-`` form).
Ready when ``/health`` answers and ``/v1/models`` lists the served name.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pytest_modelbench.serving.base import EngineNotInstalledError, LaunchSpec, refuse_command
from pytest_modelbench.serving.server import EngineServer, engine_env, serves_model
from pytest_modelbench.serving.vllm import render_args

if TYPE_CHECKING:
    from pytest_modelbench.config.schema import ServeSpec

__all__ = ["SGLANG_ENTRYPOINT", "SglangEngine", "sglang_flags"]

SGLANG_ENTRYPOINT = "sglang.launch_server"
# Set by modelbench from the model entry, the claim and a free port; in serve.args a mistake.
RESERVED_ARGS = frozenset(
    {"model_path", "model", "served_model_name", "host", "port", "api_key", "device"}
)
_PARALLEL_ARGS = frozenset(
    {"tp_size", "tensor_parallel_size", "tp", "dp_size", "data_parallel_size", "dp"}
)
_SEED_ARGS = frozenset({"random_seed"})
# Errors that only report that another one killed a scheduler (the cause is above them).
DEATH_WRAPPERS = ("SystemExit", "Received sigquit", "Child process unexpectedly failed")
_INSTALL_HINT = (
    "install it (pip install 'sglang[all]', see docs.sglang.ai) in the interpreter that runs "
    "the servers, or use serve.engine: vllm"
)


def _name(key: object) -> str:
    return str(key).lstrip("-").replace("-", "_")


def sglang_flags(args: Mapping[str, object], gpus: int) -> list[str]:
    """``serve.args`` as SGLang flags, with modelbench's defaults for what they leave out."""
    given = {_name(k) for k in args}
    reserved = sorted(given & RESERVED_ARGS)
    if reserved:
        raise ValueError(
            f"serve.args: {reserved[0]!r} is set by modelbench (the model path, served name, "
            "host, port, key and device come from the model entry, its GPUs and a free port); "
            "remove it from args"
        )
    flags = render_args({k: v for k, v in args.items() if v is not False})
    if gpus > 1 and not given & _PARALLEL_ARGS:
        flags += ["--tp-size", str(gpus)]
    if not given & _SEED_ARGS:
        flags += ["--random-seed", "0"]
    if gpus == 0:
        flags += ["--device", "cpu"]
    return flags


def check_sglang_installed(python: str) -> None:
    """Raise :class:`EngineNotInstalledError` unless ``python`` finds the ``sglang`` package."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        found = importlib.util.find_spec("sglang") is not None
    else:
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"
        try:
            found = subprocess.run([python, "-c", probe], timeout=60, check=False).returncode == 0
        except (OSError, subprocess.SubprocessError) as exc:
            raise EngineNotInstalledError(
                f"cannot run {python} to look for SGLang ({exc}); check the python used for serving"
            ) from None
    if not found:
        raise EngineNotInstalledError(f"SGLang is not installed for {python}: {_INSTALL_HINT}")


class SglangEngine:
    """``serve.engine: sglang``."""

    name = "sglang"

    def check(self, serve: ServeSpec) -> None:
        refuse_command(serve, self.name)
        sglang_flags(serve.args, serve.gpus)

    def check_here(self, _serve: ServeSpec) -> None:
        """SGLang installed for this interpreter, which serves when the workers run here
        (``LaunchSpec.python``); the plan asks only when they do."""
        try:
            check_sglang_installed(sys.executable)
        except EngineNotInstalledError as exc:
            raise ValueError(f"serve.engine: {exc}") from None

    def server(self, spec: LaunchSpec) -> EngineServer:
        gpus = tuple(spec.gpus or ())
        flags = sglang_flags(spec.args, len(gpus))
        key = ["--api-key", spec.api_key] if spec.api_key else []  # shown masked in the log

        def argv(port: int) -> list[str]:
            return [
                spec.python,
                "-m",
                SGLANG_ENTRYPOINT,
                "--model-path",
                spec.model,
                "--served-model-name",
                spec.served_name,
                "--host",
                spec.host,
                "--port",
                str(port),
                *key,
                *flags,
            ]

        auth = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        return EngineServer(
            argv,
            engine="SGLang",
            served_name=spec.served_name,
            gpus=gpus,
            log_path=spec.log_path,
            env=engine_env(gpus, spec.model, extra=spec.env),
            ready=lambda root: serves_model(root, spec.served_name, auth),
            host=spec.host,
            check_installed=lambda: check_sglang_installed(spec.python),
            wrappers=DEATH_WRAPPERS,
        )
