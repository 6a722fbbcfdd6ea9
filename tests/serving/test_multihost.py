"""Two "hosts" as xdist ``--tx`` worker groups writing one run directory.

Each host is a group of workers started the documented way (docs/multihost.md):
``popen//python=PYTHON -m pytest_modelbench.serving.remote HOST``, with a fake ``ssh``
that runs the remote command here as ssh would there: from ``/``, in a fresh environment
(only ``PATH``, ``HOME`` and ``FAKE_HOST=HOST``; the rest comes from ``//env:`` in the
spec). Each host has its own fake GPU inventory (``//env:MODELBENCH_FAKE_GPUS=...``) and its
own claim directory (``//env:MODELBENCH_GPU_LOCK_DIR=...``), as two nodes with node-local
``/tmp`` would have; ``--run-dir`` is one directory, as on a shared filesystem.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections import Counter
from pathlib import Path

import pytest

from pytest_modelbench.serving import remote
from pytest_modelbench.serving.remote import SSH_ENV, remote_argv
from tests.serving.fakevllm import EXAMPLES, models, qa_env, requests, starts

HOSTS = {"a": ("0", "1"), "b": ("4", "5")}  # two workers per host: one per GPU
SEEDS = (0, 1)
MODELS = ("m1", "m2", "m3", "m4")  # one per worker: the scheduler puts every worker to work


FAKE_SSH = """#!/bin/sh
# fake-ssh HOST COMMAND: run COMMAND as on HOST: from /, with a fresh login environment
host="$1"
cd / && exec env -i PATH="$PATH" HOME="$HOME" FAKE_HOST="$host" sh -c "$2"
"""

# what the fake vLLM needs on the remote side; the caller's environment does not travel
FORWARDED = ("PYTHONPATH", "FAKE_VLLM_LOG", "FAKE_VLLM_REQUESTS", "MODELBENCH_CACHE")


def tx(root: Path, host: str, workers: int = 2) -> list[str]:
    """``--tx`` for one simulated host: ssh to it, its GPUs, its node-local claim directory."""
    gpus = ",".join(f"{g}:0" for g in HOSTS[host])
    env = {
        "MODELBENCH_FAKE_GPUS": gpus,
        "MODELBENCH_GPU_LOCK_DIR": str(root / f"host-{host}" / "gpu-locks"),
        **{name: os.environ[name] for name in FORWARDED},
    }
    spec = f"{workers}*popen//python={sys.executable} -m pytest_modelbench.serving.remote {host}"
    return ["--tx", spec + "".join(f"//env:{name}={value}" for name, value in env.items())]


def check_placement(root: Path, fake_vllm: Path) -> None:
    """Each worker's server ran on a GPU of the worker's own host (``FAKE_HOST``), claimed in
    that host's directory; on each host the two workers took both GPUs, none twice; one start
    per model, in the project directory although ssh landed elsewhere."""
    servers = starts(fake_vllm)
    placed: dict[str, tuple[str, str]] = {}  # worker -> (host, CUDA_VISIBLE_DEVICES)
    for server in servers:
        where = (server["host"], server["gpus"])
        assert server["gpus"] in HOSTS[server["host"]], server
        assert placed.setdefault(server["worker"], where) == where, server
    for host, gpus in HOSTS.items():
        assert sorted(gpu for h, gpu in placed.values() if h == host) == sorted(gpus)
        claims = sorted(p.name for p in (root / f"host-{host}" / "gpu-locks").glob("gpu-*"))
        assert claims == sorted(f"gpu-{g}.lock" for g in gpus)
    assert sorted(s["model"] for s in servers) == sorted(MODELS)
    assert {s["cwd"] for s in servers} == {str(root)}


def test_two_hosts_share_one_run_directory(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pytester.path
    ssh = root / "fake-ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("MODELBENCH_SSH", str(ssh))
    models(root, gpus=1, names=MODELS)
    qa_env(root, SEEDS)
    result = pytester.runpytest_subprocess(
        "benchmarks/",
        "--model",
        ",".join(MODELS),
        "--dist",
        "load",
        *tx(root, "a"),
        *tx(root, "b"),
        "--run-dir",
        "shared/runs",  # relative: resolved once, on the controller
        "--run-id",
        "sweep",
        "-p",
        "no:cacheprovider",
        "--mb-no-reports",
    )
    items = [f"{m}-qa-seed{s}" for m in MODELS for s in SEEDS]
    result.assert_outcomes(passed=len(items))

    # every item ran exactly once: one request per example, none repeated
    asked = Counter(
        (r.model, r.key, r.seed) for r in requests(root) if r.path.endswith("chat/completions")
    )
    assert len(asked) == len(items) * EXAMPLES
    assert set(asked.values()) == {1}

    check_placement(root, fake_vllm)

    # one run directory, one consistent manifest naming every item once
    run_dir = root / "shared" / "runs" / "sweep"
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    assert sorted(manifest["items"]) == sorted(items)
    assert {e["status"] for e in manifest["items"].values()} == {"finished"}
    for item in items:
        rows = (run_dir / item / "results.jsonl").read_text().splitlines()
        assert len(rows) == EXAMPLES
    logs = {p.name for p in (run_dir / "servers").iterdir()}
    assert logs == {f"{s['worker']}-{s['model']}.log" for s in starts(fake_vllm)}


def test_remote_command_runs_this_python_in_this_directory() -> None:
    worker = ["-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"]
    argv = remote_argv(
        "node1", worker, python="/shared/p/.venv/bin/python", cwd="/shared/my proj", environ={}
    )
    assert argv[:-2] == ["ssh", "-T", "-o", "BatchMode=yes"]
    assert argv[-2] == "node1"
    assert shlex.split(argv[-1]) == [
        "cd", "/shared/my proj", "&&", "exec", "/shared/p/.venv/bin/python", *worker
    ]  # fmt: skip
    custom = remote_argv("n2", worker, environ={SSH_ENV: "ssh -J bastion"})
    assert custom[:3] == ["ssh", "-J", "bastion"]


def test_remote_without_worker_arguments_says_how_to_use_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert remote.main(["node1"]) == 2
    assert "--tx 'popen//python=" in capsys.readouterr().err
