"""What a verifiers v1 rollout costs: modelbench vs ``vf-eval`` on the same taskset and server.

Each v1 rollout runs the harness program (the ``null`` harness: a fresh Python that imports
openai and mcp) in the ``subprocess`` runtime, so its cost is CPU, not the model: this script
measures it for both tools, in one run, on the same taskset and the same simulated server.

* the taskset: N trivial arithmetic tasks (one exact-match reward), written into a temporary
  package on ``PYTHONPATH``;
* the server: ``python -m pytest_modelbench.testing.simserver`` in its own process (streamed
  chat completions with usage; right or wrong answers by question text, no latency);
* **modelbench**: ``pytest benchmarks/ --model sim`` in a fresh process with a fresh run
  directory (start-up, plan, rollouts, reports);
* **vf-eval**: ``vf-eval <taskset> --env.agent.harness.id null --env.agent.runtime.type
  subprocess -n N -r R -c C --no-push --no-rich`` in a fresh process;
* **wall** is the whole process; **CPU-s** the process and all its children (the harness
  programs), from ``getrusage(RUSAGE_CHILDREN)`` before and after. Both tools use the same
  concurrency (``--concurrency``; modelbench caps v1 rollouts at 2 per CPU core anyway).

Each tool runs ``--repeat`` times, interleaved; the table shows the median wall run. uv's
harness environment is built before the first measured run (a warm-up rollout), as after
the first use on any machine.

    python perf/verifiers_v1_cost.py [--tasks 16] [--rollouts 2] [--concurrency 4]
                                     [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from _harness import Sim  # perf/ scripts import each other from their own directory

MODEL = "sim-model"
TASKSET = """
import verifiers.v1 as vf

N = int(__import__("os").environ.get("COST_TASKS", "16"))


class CostData(vf.TaskData):
    answer: str


class CostTask(vf.Task[CostData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().endswith(self.data.answer))


class CostTasks(vf.Taskset[CostTask, vf.TasksetConfig]):
    def load(self):
        for i in range(N):
            yield CostTask(CostData(prompt=f"cost: what is {i} + 1?", answer=str(i + 1)),
                           self.config.task)


__all__ = ["CostTasks", "CostTask", "CostData"]
"""
BENCHMARK = """
from pytest_modelbench import EvalResult


def test_benchmark(mb_eval: EvalResult) -> None:
    mb_eval.check_baseline()
"""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and its children, output tail) of one command."""
    cpu, start = children_cpu(), time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall, used = time.perf_counter() - start, children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(
            f"{command[0]} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return wall, used, done.stdout[-2000:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python perf/verifiers_v1_cost.py", description=__doc__)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    bin_dir = Path(sys.executable).parent
    vf_eval = bin_dir / "vf-eval"
    if not vf_eval.exists():
        raise SystemExit("vf-eval not found beside this Python: pip install -e '.[verifiers]'")
    rollouts = args.tasks * args.rollouts
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mb-vf-cost-") as tmp:
        root = Path(tmp)
        (root / "pkgs" / "cost_tasks").mkdir(parents=True)
        (root / "pkgs" / "cost_tasks" / "__init__.py").write_text(TASKSET)
        lookup = {
            f"cost: what is {i} + 1?": [f"The answer is {i + 1}", "no idea"]
            for i in range(args.tasks)
        }
        (root / "lookup.json").write_text(json.dumps(lookup))
        server = Sim(
            slots=256,
            latency=0,
            accuracy=1.0,
            lookup=root / "lookup.json",
            model=MODEL,
            quiet=True,
        )
        project = root / "project"
        (project / "configs" / "envs").mkdir(parents=True)
        (project / "benchmarks").mkdir()
        (project / "benchmarks" / "test_bench.py").write_text(BENCHMARK)
        models = {"sim": {"model": MODEL, "api_base_url": server.base_url,
                          "max_concurrent": args.concurrency}}  # fmt: skip
        (project / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": models}))
        variant = {"id": "cost", "module": "verifiers:cost-tasks",
                   "rollouts_per_example": args.rollouts}  # fmt: skip
        (project / "configs" / "envs" / "cost.yaml").write_text(yaml.safe_dump([variant]))
        env = {
            **os.environ,
            "PYTHONPATH": str(root / "pkgs"),
            "COST_TASKS": str(args.tasks),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",  # vf-eval needs uv
        }
        commands = {
            "modelbench": lambda i: [
                str(bin_dir / "pytest"), "benchmarks/", "--model", "sim", "-q", "-p",
                "no:cacheprovider", "--run-dir", str(root / f"runs-{i}"), "--mb-progress", "off",
            ],
            "vf-eval": lambda i: [
                str(vf_eval), "cost-tasks", "--env.agent.harness.id", "null",
                "--env.agent.runtime.type", "subprocess", "-m", MODEL,
                "--client.base-url", server.base_url, "--client.api-key-var", "NO_KEY_VAR",
                "-n", str(args.tasks), "-r", str(args.rollouts), "-c", str(args.concurrency),
                "--no-push", "--no-rich", "-o", str(root / "vf-out"), "--run.name", f"r{i}",
            ],
        }  # fmt: skip
        try:
            warm = [*commands["vf-eval"](99)]
            warm[warm.index("-n") + 1], warm[warm.index("-r") + 1] = "1", "1"
            timed(warm, project, env)  # builds uv's harness environment once
            runs: dict[str, list[tuple[float, float]]] = {"modelbench": [], "vf-eval": []}
            for i in range(args.repeat):
                for tool, command in commands.items():
                    wall, cpu, _ = timed(command(i), project, env)
                    runs[tool].append((wall, cpu))
        finally:
            server.stop()
    load_after = os.getloadavg()
    rows = []
    result: dict[str, Any] = {"rollouts": rollouts, "concurrency": args.concurrency, "tools": {}}
    for tool, measured in runs.items():
        wall, cpu = sorted(measured)[len(measured) // 2]
        result["tools"][tool] = {"wall_s": wall, "cpu_s": cpu, "runs": measured}
        rows.append(
            f"| {tool} | {wall:.1f} | {wall / rollouts:.2f} | {cpu:.1f} | {cpu / rollouts:.2f} | "
            + ", ".join(f"{w:.1f}" for w, _ in measured)
            + " |"
        )
    mb, vf = result["tools"]["modelbench"], result["tools"]["vf-eval"]
    print(f"{args.tasks} tasks × {args.rollouts} rollouts = {rollouts} rollouts, "
          f"{args.concurrency} at once, null harness, subprocess runtime; median of "
          f"{args.repeat} runs; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after\n")  # fmt: skip
    print("| tool | wall s | wall s / rollout | CPU s | CPU s / rollout | every run's wall |")
    print("|---|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    print(
        f"\nmodelbench / vf-eval: wall {mb['wall_s'] / vf['wall_s']:.2f}×, "
        f"CPU {mb['cpu_s'] / vf['cpu_s']:.2f}× (statistics.median of per-run ratios: "
        f"{statistics.median(a[0] / b[0] for a, b in zip(mb['runs'], vf['runs'], strict=True)):.2f}×)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
