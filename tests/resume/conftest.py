"""Fixtures for resume tests: the core ``project``/``sim`` fixtures and helpers to read a run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.core import conftest as core
from tests.core.conftest import Project

project = core.project  # the core fixtures, shared
sim = core.sim

# a pytest started by a test must not think it is an xdist worker of the outer run
_OUTER_PYTEST_VARS = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
    "PYTEST_CURRENT_TEST",
    "PYTEST_ADDOPTS",
    "PYTEST_VERSION",
)


def configure(
    project: Project,
    url: str,
    *,
    n: int = 20,
    envs: tuple[str, ...] = ("qa",),
    models: tuple[str, ...] = ("alpha",),
    seeds: tuple[int, ...] = (0,),
    served: str = "sim-model",
    **model: Any,
) -> None:
    """Models at ``url`` and one jsonl env per name (``<name>.jsonl`` with ``n`` questions).

    ``served`` is the model name sent to the server; ``{name}`` in it becomes the model's name.
    """
    for env in envs:
        if not (project.root / f"{env}.jsonl").exists():
            project.qa(env, n)
        project.env(
            env,
            [
                {
                    "id": env,
                    "module": "jsonl",
                    "env_args": {"path": f"{env}.jsonl"},
                    "seeds": list(seeds),
                }
            ],
        )
    project.models(
        {
            name: {
                "model": served.format(name=name),
                "api_base_url": url,
                "max_concurrent": 8,
                "retry_backoff": 0.01,
                **model,
            }
            for name in models
        }
    )


def completions(server: Any) -> list[Any]:
    return [r for r in server.requests if r.path.endswith("completions")]


def rows(item_dir: Path) -> list[dict[str, Any]]:
    """Whole journal lines of an item (what a resume would keep), last row per example."""
    text = (item_dir / "results.jsonl").read_bytes().decode()
    complete = text[: text.rfind("\n") + 1] if "\n" in text else ""
    out: dict[str, dict[str, Any]] = {}
    for line in complete.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[f"{row['example_id']}/{row.get('rollout', 0)}"] = row
    return list(out.values())


def comparable(item_dir: Path) -> list[tuple[str, str, float]]:
    """(example_id, completion, score) per example, sorted: what must not depend on crashes."""
    return sorted((r["example_id"], r["completion"], r["score"]) for r in rows(item_dir))


def manifest(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "run_manifest.json").read_text())
    return data


@dataclass
class Finished:
    returncode: int
    output: str


def argv_for(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:randomly", *args]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _OUTER_PYTEST_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_pytest(root: Path, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """pytest in its own process group (so the whole group, xdist workers too, can be killed)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            argv_for(*args),
            cwd=root,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run_pytest(root: Path, *args: str, timeout: float = 120) -> Finished:
    log = root / f"pytest-{os.getpid()}-{len(list(root.glob('pytest-*.log')))}.log"
    proc = start_pytest(root, *args, log=log)
    try:
        proc.wait(timeout=timeout)
    finally:
        kill_group(proc)
    return Finished(proc.returncode, log.read_text(errors="replace"))


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of ``proc`` while it still runs, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
