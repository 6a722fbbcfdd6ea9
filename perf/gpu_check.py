"""The GPU path on a real GPU: discovery, binding, busy GPUs, ``-n auto``, workers > GPUs,
Ctrl-C and ``kill -9``, with GPU memory read back from NVML.

A stand-in engine answers as vLLM's OpenAI server does (``python -m
vllm.entrypoints.openai.api_server``, put first on ``PYTHONPATH``; the simulated server of
``pytest_modelbench.testing`` is its front) and holds ``--gib`` GiB of real CUDA memory
(torch) on the GPU modelbench gives it, so NVML shows which GPU each server took and when its
memory came back. No vLLM and no package index are needed (``scripts/gpu-check.sh`` installs
the wheels it carries). Prints one line per check and a summary; exits 1 when one failed.

    python perf/gpu_check.py [--gib 8] [--work DIR]
    python perf/gpu_check.py --dry-run     # fake GPUs, no CUDA: everything up to the GPU

``--dry-run`` runs the same checks on two fake GPUs (``MODELBENCH_FAKE_GPUS``) with an engine
that takes no GPU memory; memory is then read back as "the engine processes are gone".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINE = r'''
"""Stand-in for vLLM's OpenAI server: real CUDA memory on the GPU it is given, simulated answers."""
import argparse, json, os, sys, time
from pytest_modelbench.testing import SimConfig, SimServer

parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--served-model-name")
parser.add_argument("--port", type=int)
parser.add_argument("--host", default="127.0.0.1")
args, _ = parser.parse_known_args()
gib = float(os.environ.get("GPU_CHECK_GIB") or 0)
device = None
held = None
if gib:
    import torch
    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    device = torch.cuda.get_device_name(0)
with open(os.environ["GPU_CHECK_LOG"], "a") as log:
    log.write(json.dumps({
        "pid": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": device, "gib": gib, "worker": os.environ.get("PYTEST_XDIST_WORKER"),
    }) + "\n")
config = SimConfig(
    models=(args.served_model_name,),
    latency=float(os.environ.get("GPU_CHECK_LATENCY") or 0.05),
    slots=64,
    port=args.port,
    host=args.host,
    log_path=os.environ.get("GPU_CHECK_REQUESTS"),
    api_key=os.environ.get("VLLM_API_KEY") or None,
)
with SimServer(config):
    while True:
        time.sleep(3600)
'''

HOLDER = r"""
import sys, time
import torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
"""

BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"
SETTLE_S = 30.0  # GPU memory must come back within this long


@dataclass
class Result:
    name: str
    ok: bool
    detail: str


@dataclass
class Context:
    work: Path
    dry_run: bool
    gib: float
    python: str
    gpus: list[str] = field(default_factory=list)  # ids as CUDA_VISIBLE_DEVICES takes them
    baseline: dict[str, int] = field(default_factory=dict)  # MiB in use before the checks
    runs: int = 0

    # -- the project ---------------------------------------------------------------------
    def project(self, examples: int, seeds: int, latency: float = 0.05) -> Path:
        """A fresh project: one served model ``m1``, a ``qa`` environment."""
        self.runs += 1
        root = self.work / f"run{self.runs:02d}"
        package = root / "engine" / "vllm" / "entrypoints" / "openai"
        package.mkdir(parents=True)
        for folder in (package.parents[1], package.parents[0], package):
            (folder / "__init__.py").write_text("")
        (package / "api_server.py").write_text(ENGINE)
        (root / "benchmarks").mkdir()
        (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
        (root / "configs" / "envs").mkdir(parents=True)
        serve = {"engine": "vllm", "gpus": 1, "startup_timeout": 300}
        models = {"m1": {"model": "m1", "serve": serve, "max_concurrent": 4}}
        (root / "configs" / "models.yaml").write_text(json.dumps({"models": models}))
        (root / "qa.jsonl").write_text(
            "".join(
                json.dumps({"id": i, "question": f"q{i}", "answer": "a"}) + "\n"
                for i in range(examples)
            )
        )
        variant: dict[str, Any] = {"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}
        variant["seeds"] = list(range(seeds))
        (root / "configs" / "envs" / "qa.yaml").write_text(json.dumps([variant]))
        (root / "latency").write_text(str(latency))
        return root

    def env(self, root: Path, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(root / "engine"),
            "GPU_CHECK_LOG": str(root / "engines.jsonl"),
            "GPU_CHECK_REQUESTS": str(root / "requests.jsonl"),
            "GPU_CHECK_GIB": "0" if self.dry_run else str(self.gib),
            "GPU_CHECK_LATENCY": (root / "latency").read_text(),
            "MODELBENCH_GPU_LOCK_DIR": str(self.work / "locks"),
            "MODELBENCH_CACHE": str(self.work / "cache"),
            **extra,
        }
        if self.dry_run:
            env.setdefault("MODELBENCH_FAKE_GPUS", "0:0,1:0")
        return env

    def pytest(self, root: Path, *args: str, env: dict[str, str] | None = None) -> Finished:
        argv = [self.python, "-m", "pytest", "benchmarks/", "-p", "no:randomly", *args]
        began = time.monotonic()
        done = subprocess.run(
            argv,
            cwd=root,
            env=env or self.env(root),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        return Finished(done.returncode, done.stdout + done.stderr, time.monotonic() - began)

    def start(self, root: Path, *args: str) -> subprocess.Popen[bytes]:
        """pytest in its own process group, as a terminal runs it (Ctrl-C reaches the group)."""
        argv = [self.python, "-m", "pytest", "benchmarks/", "-p", "no:randomly", *args]
        with (root / "pytest.log").open("wb") as out:
            return subprocess.Popen(
                argv,
                cwd=root,
                env=self.env(root),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    # -- what the GPUs say -----------------------------------------------------------------
    def used_mib(self) -> dict[str, int]:
        """MiB in use per GPU from NVML ({} in a dry run)."""
        if self.dry_run:
            return {}
        import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py: on the GPU machine

        pynvml.nvmlInit()
        try:
            return {
                str(i): pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used
                // 2**20
                for i in range(pynvml.nvmlDeviceGetCount())
            }
        finally:
            pynvml.nvmlShutdown()

    def holders(self, gpu: str) -> dict[int, int]:
        """pid -> MiB of the processes NVML lists on ``gpu`` ({} in a dry run)."""
        if self.dry_run:
            return {}
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(gpu))
            return {
                p.pid: (p.usedGpuMemory or 0) // 2**20
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            }
        finally:
            pynvml.nvmlShutdown()

    def settled(self, root: Path, began: float) -> str:
        """Wait until every engine of ``root`` is gone and (on a GPU) each GPU's memory is
        back to its baseline; say how long that took after ``began``."""
        end = time.monotonic() + SETTLE_S
        while True:
            alive = [pid for pid in engine_pids(root) if pid_alive(pid)]
            used = self.used_mib()
            high = {
                g: mib
                for g, mib in used.items()
                if g in self.baseline and mib > self.baseline[g] + 256
            }
            if not alive and not high:
                what = "engines gone" if self.dry_run else "engines gone, GPU memory back"
                return f"{what} after {time.monotonic() - began:.2f} s"
            if time.monotonic() > end:
                for pid in alive:  # ours: tidy up after reporting them
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                raise CheckFailed(
                    f"after {SETTLE_S:.0f} s: engines alive {alive}, GPU memory high {high} "
                    f"(baseline {self.baseline})"
                )
            time.sleep(0.05)


@dataclass
class Finished:
    rc: int
    output: str
    seconds: float

    def outcome(self) -> str:
        found = re.findall(r"=+ (.*? in [\d.]+s.*?) =+", self.output)
        return found[-1] if found else f"exit {self.rc}"


class CheckFailed(Exception):
    pass


def engine_pids(root: Path) -> list[int]:
    return [int(e["pid"]) for e in engines(root)]


def engines(root: Path) -> list[dict[str, Any]]:
    path = root / "engines.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


# --------------------------------------------------------------------------- the checks


def check_discovery(ctx: Context) -> str:
    env = ctx.env(ctx.project(1, 1))
    done = subprocess.run(
        [ctx.python, "-m", "pytest_modelbench.cli", "gpus"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    expect(done.returncode == 0, f"modelbench gpus: exit {done.returncode}: {done.stderr}")
    rows = [line.split()[0] for line in done.stdout.splitlines()[1:] if line[:1].isdigit()]
    expect(bool(rows), f"modelbench gpus found no GPU:\n{done.stdout}")
    source = "(from fake)" if ctx.dry_run else "(from NVML)"
    expect(source in done.stdout, f"expected {source}:\n{done.stdout}")
    ctx.gpus = rows
    ctx.baseline = ctx.used_mib()
    print(done.stdout, end="")
    return f"{len(rows)} GPU(s) {source[1:-1]}: {','.join(rows)}"


def check_binding(ctx: Context) -> str:
    root = ctx.project(20, 1, latency=0.3)
    proc = ctx.start(root, "--model", "m1", "--seeds", "0")
    seen: dict[int, int] = {}
    while proc.poll() is None:
        started = engines(root)
        if started and not ctx.dry_run:
            gpu = str(started[0]["gpus"])
            seen.update(ctx.holders(gpu))
        time.sleep(0.2)
    output = (root / "pytest.log").read_text(errors="replace")
    expect(proc.returncode == 0, f"pytest exit {proc.returncode}:\n{output[-3000:]}")
    (engine,) = engines(root)
    expect(engine["gpus"] in ctx.gpus, f"engine got CUDA_VISIBLE_DEVICES={engine['gpus']!r}")
    detail = f"engine pid {engine['pid']} on CUDA_VISIBLE_DEVICES={engine['gpus']}"
    if not ctx.dry_run:
        held = seen.get(int(engine["pid"]), 0)
        expect(held >= ctx.gib * 1024 * 0.9, f"NVML never showed the engine's memory: {seen}")
        detail += f" ({engine['device']}), NVML: {held / 1024:.1f} GiB held by it"
    return detail + "; " + ctx.settled(root, time.monotonic())


def check_busy(ctx: Context) -> str:
    gpu = ctx.gpus[0]
    root = ctx.project(5, 1)
    holder: subprocess.Popen[str] | None = None
    extra: dict[str, str] = {}
    if ctx.dry_run:
        extra["MODELBENCH_FAKE_GPUS"] = f"{gpu}:30000"
    else:
        holder = subprocess.Popen(
            [ctx.python, "-c", HOLDER, str(min(ctx.gib, 4.0)), "gpu-check-holder"],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        expect(holder.stdout.readline().strip() == "ready", "the holder did not take memory")
    try:
        env = ctx.env(root, **extra)
        done = ctx.pytest(root, "--model", "m1", "--seeds", "0", "--gpus", gpu, env=env)
        expect(done.rc != 0, "a run on the busy GPU passed")
        expect(f"GPU {gpu} is busy" in done.output, f"no busy report:\n{done.output[-3000:]}")
        line = next(x for x in done.output.splitlines() if f"GPU {gpu} is busy" in x)
        line = line[line.index(f"GPU {gpu} is busy") :].strip()
        if holder is not None:
            expect(f"pid {holder.pid}" in line, f"the report does not name the holder: {line}")
            time.sleep(12)  # idle holder: 0% utilisation over NVML's window
            table = subprocess.run(
                [ctx.python, "-m", "pytest_modelbench.cli", "gpus"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            ).stdout
            print(table, end="")
            expect(str(holder.pid) in table, f"modelbench gpus does not list the holder:\n{table}")
            leftover = "likely a leftover" in table
            line += f" | leftover flagged: {'yes' if leftover else 'no (NVML window too short?)'}"
        return line[:400]
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


def check_n_auto(ctx: Context) -> str:
    found = []
    orders = (
        ("pytest_modelbench.plugin", "xdist.plugin", "xdist.looponfail"),
        ("xdist.plugin", "xdist.looponfail", "pytest_modelbench.plugin"),
    )
    for order in orders:
        root = ctx.project(5, len(ctx.gpus))
        env = ctx.env(root, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
        plugins = [a for name in order for a in ("-p", name)]
        done = ctx.pytest(root, *plugins, "--model", "m1", "-n", "auto", env=env)
        want = f"created: {len(ctx.gpus)}/{len(ctx.gpus)} worker"
        expect(want in done.output, f"order {order[0]} first: no {want!r}:\n{done.output[-3000:]}")
        expect(done.rc == 0, f"order {order[0]} first: {done.outcome()}")
        found.append(f"{order[0]} first: {want}")
    return "; ".join(found)


def check_more_workers_than_gpus(ctx: Context) -> str:
    workers = len(ctx.gpus) + 1
    root = ctx.project(10, workers, latency=0.2)
    done = ctx.pytest(root, "--model", "m1", "-n", str(workers), "--mb-dist", "off")
    expect(done.rc == 0, f"{done.outcome()}:\n{done.output[-3000:]}")
    expect(f"{workers} passed" in done.outcome(), done.outcome())
    starts = engines(root)
    expect(len(starts) <= len(ctx.gpus), f"{len(starts)} engines on {len(ctx.gpus)} GPU(s)")
    shared = done.output.count("shares worker")
    return (
        f"-n {workers} on {len(ctx.gpus)} GPU(s): {done.outcome()}, {len(starts)} engine(s), "
        f"{shared} item(s) shared a server; " + ctx.settled(root, time.monotonic())
    )


def interrupt(ctx: Context, sig: signal.Signals) -> str:
    root = ctx.project(400, len(ctx.gpus), latency=0.2)
    args = ["--model", "m1"] + (["-n", str(len(ctx.gpus))] if len(ctx.gpus) > 1 else [])
    proc = ctx.start(root, *args)
    end = time.monotonic() + 600
    while lines(root / "requests.jsonl") < 8 * len(ctx.gpus):
        output = (root / "pytest.log").read_text(errors="replace")
        expect(proc.poll() is None, f"pytest ended early:\n{output[-3000:]}")
        expect(time.monotonic() < end, "no requests within 600 s")
        time.sleep(0.05)
    began = time.monotonic()
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    exited = time.monotonic() - began
    if sig == signal.SIGINT:
        expect(proc.returncode == 2, f"exit status {proc.returncode} after Ctrl-C")
    return f"pytest exited {exited:.2f} s after the signal; " + ctx.settled(root, began)


def check_ctrl_c(ctx: Context) -> str:
    return interrupt(ctx, signal.SIGINT)


def check_kill_9(ctx: Context) -> str:
    return interrupt(ctx, signal.SIGKILL)


CHECKS: list[tuple[str, Callable[[Context], str]]] = [
    ("discovery", check_discovery),
    ("binding", check_binding),
    ("busy GPU", check_busy),
    ("-n auto", check_n_auto),
    ("workers > GPUs", check_more_workers_than_gpus),
    ("Ctrl-C", check_ctrl_c),
    ("kill -9", check_kill_9),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="fake GPUs, no CUDA")
    parser.add_argument("--gib", type=float, default=8.0, help="CUDA memory each engine holds")
    parser.add_argument("--work", type=Path, default=None, help="where the projects go")
    parser.add_argument("--only", action="append", help="run only these checks (by name)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="mb-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(work=work, dry_run=args.dry_run, gib=args.gib, python=sys.executable)
    if not args.dry_run:
        with contextlib.suppress(Exception):
            import torch  # type: ignore[import-not-found]  # the GPU machine's

            print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"modelbench GPU check, {time.strftime('%Y-%m-%d %H:%M %Z')}, work in {work}")
    results: list[Result] = []
    for name, check in CHECKS:
        if args.only and name not in args.only and name != "discovery":
            continue
        began = time.monotonic()
        try:
            detail = check(ctx)
            results.append(Result(name, True, detail))
        except (CheckFailed, StopIteration, subprocess.SubprocessError, OSError) as exc:
            results.append(Result(name, False, str(exc) or type(exc).__name__))
        status = "PASS" if results[-1].ok else "FAIL"
        print(f"{status} {name} ({time.monotonic() - began:.1f} s): {results[-1].detail}")
        if name == "discovery" and not results[-1].ok:
            break
    print("\nsummary:")
    for result in results:
        print(f"  {'PASS' if result.ok else 'FAIL'}  {result.name:15s} {result.detail[:300]}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
