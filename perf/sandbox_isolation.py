"""CPU and wall time per sandboxed program at each isolation level, and at another commit.

For each level (``bwrap``, ``namespaces``, ``audit-hook``) it scores ``--n`` HumanEval
reference replies through ``Sandbox.run_tests`` one at a time (as the suite does, without
the concurrency) and reports, per program, the CPU time of the scoring process and of
every process the runs started (``getrusage(RUSAGE_CHILDREN)``: all of them are reaped)
and the median wall time. Each level runs in its own process, after two unmeasured runs
(level probe, root layout, byte-code); ``--repeat`` rounds go through the levels in turn
and the medians of their figures are shown (a shared machine's load moves single rounds
by 10 ms and more). ``--old REV`` adds the sandbox of another commit
(``git archive`` into a temporary directory and compiled, first on ``sys.path``), e.g. the
commit before issue 27, at its two modes: ``isolated`` (namespaces as they were) and
``fallback``.

bubblewrap runs as the sandbox user when this runs as root, so the interpreter must be one
that user can read: pass ``--python /usr/bin/python3`` where the default one lives under
``/root`` (pyenv), and the same ``--python`` compares every level on one interpreter.

    python perf/sandbox_isolation.py [--n 30] [--repeat 3] [--python PATH] [--old REV]
                                     [--levels bwrap,namespaces,audit-hook]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD_MODES = ("isolated", "fallback")


def measure(level: str, n: int, python: str | None) -> dict[str, float]:
    """In this process: score ``n`` references at ``level``; CPU and wall per program."""
    from pytest_modelbench.sandbox import Sandbox
    from pytest_modelbench.suites.coding import HumanEval

    if "isolation" in inspect.signature(Sandbox).parameters:
        sandbox = Sandbox(workers=1, isolation=level, python=python)
    else:  # a commit before issue 27: isolate=True/False
        sandbox = Sandbox(workers=1, isolate=level == "isolated", python=python)  # type: ignore[call-arg]
    suite = HumanEval()
    examples = list(suite.examples({}, 0))[: n + 2]
    parts = [suite.program_and_tests(e, suite.reference_completion(e))[:2] for e in examples]
    for program, tests in parts[:2]:  # warm-up: probe, layout, byte-code
        sandbox.run_tests(program, tests)
    before, cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
    walls = []
    for program, tests in parts[2:]:
        start = time.perf_counter()
        result = sandbox.run_tests(program, tests)
        walls.append(time.perf_counter() - start)
        if not result.passed:
            raise SystemExit(f"{level}: a reference failed: {result.reason} {result.stderr_tail}")
    after, cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
    children = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    count = len(walls)
    return {
        "cpu_ms": 1000 * (children + cpu_after - cpu_before) / count,
        "children_cpu_ms": 1000 * children / count,
        "wall_ms": 1000 * statistics.median(walls),
        "programs": count,
    }


def run_level(level: str, n: int, python: str | None, tree: Path | None) -> dict[str, float]:
    """``measure`` in a fresh process (its own rusage), importing the package from ``tree``."""
    command = [sys.executable, __file__, "--child", level, "--n", str(n)]
    command += ["--python", python] if python else []
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree or ROOT)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "?"}  # type: ignore[dict-item]
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def archive(revision: str, into: Path) -> Path:
    """The package of ``revision`` (``git archive``), unpacked into ``into``."""
    tar = into / "tree.tar"
    with tar.open("wb") as out:
        subprocess.run(
            ["git", "-C", str(ROOT), "archive", revision, "pytest_modelbench"],
            stdout=out,
            check=True,
        )
    with tarfile.open(tar) as bundle:
        bundle.extractall(into, filter="data")
    # its launcher gets bytecode too (as in an installed package), so only isolation differs
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(into)], check=True)
    return into


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds (or the first error)."""
    failed = [figures for figures in rounds if "error" in figures]
    if failed:
        return failed[0]
    return {key: statistics.median(figures[key] for figures in rounds) for key in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=30, help="programs per level and round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--python", help="the sandbox's interpreter (default: this one)")
    parser.add_argument("--levels", default="bwrap,namespaces,audit-hook")
    parser.add_argument("--old", help="also measure this commit's sandbox (e.g. HEAD~1)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.n, args.python)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        sides: list[tuple[str, str, Path | None]] = [
            (lv, lv, None) for lv in args.levels.split(",")
        ]
        if args.old:
            old = archive(args.old, Path(tmp))
            sides += [(f"{args.old} {mode}", mode, old) for mode in OLD_MODES]
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in sides}
        for _ in range(args.repeat):
            for name, level, tree in sides:
                rounds[name].append(run_level(level, args.n, args.python, tree))
    print(f"python: {args.python or sys.executable}; {args.n} HumanEval references per level")
    print(f"and round, median of {args.repeat} rounds")
    print(f"{'level':<24} {'CPU ms/program':>15} {'(children)':>11} {'wall ms (median)':>17}")
    for name, figures in ((name, medians(found)) for name, found in rounds.items()):
        if "error" in figures:
            print(f"{name:<24} failed: {figures['error']}")
            continue
        print(
            f"{name:<24} {figures['cpu_ms']:>15.1f} {figures['children_cpu_ms']:>11.1f} "
            f"{figures['wall_ms']:>17.1f}"
        )


if __name__ == "__main__":
    main()
