"""Fixed costs of one item as users run it: an installed package, no byte-code written.

``perf/throughput.py`` and ``perf/ab_item.py`` run modelbench from this checkout (an
editable install or ``PYTHONPATH``) with byte-code cached. A user has a wheel installed by
``pip`` and often ``PYTHONDONTWRITEBYTECODE=1`` (CI images set it). That differs in two
ways that cost start-up time: pip compiles the package's byte-code at install time, but
pytest rewrites the assertions of every module of a distribution that registers a
``pytest11`` plugin, and with ``PYTHONDONTWRITEBYTECODE`` it cannot cache the rewritten
code, so each session parses and compiles again every such module it imports.

Each ``--side LABEL=SPEC`` is one installation: SPEC is a virtual environment that has
pytest-modelbench installed, or a git revision of this repository (``WORKTREE`` for the
working tree, uncommitted changes included) that the script installs, non-editable, into a
fresh one (``pip install 'SRC[xdist,html,parquet]'``, dependencies pinned to this
interpreter's versions so that the sides differ only in modelbench). For ``--repeat``
rounds, with the sides in turn (which goes first alternates), it runs in each one:

* an empty pytest session (one empty test) with every installed plugin, modelbench too,
  and once more with ``-p no:modelbench``;
* ``pytest benchmarks/ --model sim-model --api-base-url URL --env mmlu --num-examples N``
  (a built-in suite item, no ``configs/``) against one simulated server
  (``--slots 64 --latency 0.1``, fixed latency, started once for all runs).

* a bare aiohttp client (``python -m pytest_modelbench.testing.loadgen``, the same number
  of requests, ``slots`` at a time) against the same server.

modelbench's own time is wall − the server's rounds (ceil(N / slots) × latency) − the
same round's empty pytest session. The simulated server and the loopback transport add time
to every request, which any client pays: "own, net of the client's span" subtracts the bare
client's span (its first request to its last answer, from the server's log) instead of the
server's rounds, so that what is left is modelbench's own. For each side it prints the median
and best of every figure, and each side's medians over the first side's.

    python perf/fixed_costs.py [--side old=HEAD --side new=WORKTREE] [--repeat 7]
                               [--env mmlu] [--requests 2000] [--slots 64] [--latency 0.1]
                               [--extras xdist,html,parquet] [--write-bytecode] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _harness import Sim  # perf/ scripts import each other from their own directory

REPO = Path(__file__).resolve().parent.parent
MODEL = "sim-model"
WORKTREE = "WORKTREE"
FIELDS = (
    "own_s",
    "own_net_s",
    "wall_s",
    "empty_s",
    "startup_s",
    "span_s",
    "client_span_s",
    "tail_s",
    "plugin_s",
    "own_cpu_s",
)


@dataclass(frozen=True)
class Side:
    """One installation: its label, its interpreter and how its package is installed."""

    label: str
    python: Path
    spec: str
    editable: bool
    pyc: str  # "N of M modules" with pip's byte-code next to them


@dataclass(frozen=True)
class Round:
    """One round of a side: the item and the empty sessions next to it (seconds)."""

    wall_s: float
    startup_s: float  # process start to the first completion request the server saw
    span_s: float  # first to last completion request
    tail_s: float  # last answer to process exit
    empty_s: float  # an empty pytest session, every plugin loaded
    bare_s: float  # the same with -p no:modelbench
    rounds_s: float  # the server's own time: ceil(N / slots) × latency
    cpu_s: float  # CPU of the item's process (user + system)
    empty_cpu_s: float  # CPU of the empty session
    client_span_s: float  # a bare aiohttp client's first request to last answer

    @property
    def own_s(self) -> float:
        return self.wall_s - self.rounds_s - self.empty_s

    @property
    def own_net_s(self) -> float:
        """Own time with the bare client's span in place of the server's rounds: the simulator's
        and the transport's time per request, which any client pays, taken out."""
        return self.wall_s - self.client_span_s - self.empty_s

    @property
    def own_cpu_s(self) -> float:
        """CPU beyond an empty session's: less sensitive than wall time to a busy machine."""
        return self.cpu_s - self.empty_cpu_s

    @property
    def plugin_s(self) -> float:
        """What loading modelbench's plugin adds to an empty session."""
        return self.empty_s - self.bare_s


# -- installations -------------------------------------------------------------------------


def _source_tree(spec: str, where: Path) -> Path:
    """A copy of this repository at ``spec`` (a revision, or ``WORKTREE``) under ``where``."""
    where.mkdir(parents=True)
    if spec == WORKTREE:
        listed = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
            check=True,
            capture_output=True,
        ).stdout.split(b"\0")
        for name in filter(None, (entry.decode() for entry in listed)):
            source = REPO / name
            if source.is_file():
                (where / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, where / name)
        return where
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", spec], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def _constraints(where: Path) -> Path:
    """This interpreter's package versions, so that every side installs the same ones."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = where / "constraints.txt"
    path.write_text("\n".join(line for line in frozen.splitlines() if "==" in line) + "\n")
    return path


def install(label: str, spec: str, work: Path, extras: str) -> Path:
    """A fresh virtual environment with ``spec``'s modelbench installed from a wheel."""
    venv = work / f"venv-{label}"
    source = _source_tree(spec, work / f"src-{label}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    target = f"{source}[{extras}]" if extras else str(source)
    print(f"  installing {spec} into {venv}", file=sys.stderr, flush=True)
    subprocess.run([*pip, "--constraint", str(_constraints(work)), target], check=True)
    return python


PROBE = """\
import importlib.metadata as m, json, pathlib, sys, pytest_modelbench
dist = m.distribution("pytest-modelbench")
url = json.loads(dist.read_text("direct_url.json") or "{}")
package = pathlib.Path(pytest_modelbench.__file__).parent
tag = sys.implementation.cache_tag
sources = [p for p in package.rglob("*.py")]
compiled = [p for p in sources if (p.parent / "__pycache__" / f"{p.stem}.{tag}.pyc").exists()]
print(json.dumps({"editable": bool(url.get("dir_info", {}).get("editable")),
                  "modules": len(sources), "compiled": len(compiled)}))
"""


def probe(label: str, python: Path, spec: str, work: Path) -> Side:
    """How ``python``'s modelbench is installed (editable? byte-code there?); run in ``work``,
    since ``python -c`` imports from its working directory first."""
    found = subprocess.run(
        [str(python), "-c", PROBE],
        check=True,
        capture_output=True,
        text=True,
        env=client_env(),
        cwd=work,
    )
    facts = json.loads(found.stdout)
    pyc = f"{facts['compiled']} of {facts['modules']} modules"
    return Side(label, python, spec, bool(facts["editable"]), pyc)


def resolve(entry: str, work: Path, extras: str) -> Side:
    label, sep, spec = entry.partition("=")
    if not sep or not label or not spec:
        raise SystemExit(f"--side {entry!r}: expected LABEL=VENV or LABEL=REVISION")
    venv = Path(spec).expanduser()
    python = venv / "bin" / "python" if (venv / "bin" / "python").exists() else None
    if python is None:
        python = install(label, spec, work, extras)
    return probe(label, python, spec, work)


# -- runs -----------------------------------------------------------------------------------


def client_env(write_bytecode: bool = False) -> dict[str, str]:
    """A user's environment: no inherited pytest, path or cache settings; offline hubs."""
    dropped = ("PYTEST_", "COV_", "PYTHONPATH", "PYTHONPYCACHEPREFIX", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not write_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(OPENAI_API_KEY="sim-key", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """(start, end, CPU seconds) of a process, times from ``time.monotonic()``; a failure
    stops the script. The CPU is that of waited-for children, so runs must not overlap."""
    cpu = _children_cpu()
    started = time.monotonic()
    done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True)
    ended = time.monotonic()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stdout[-3000:]}")
    return started, ended, _children_cpu() - cpu


@dataclass(frozen=True)
class Bench:
    """The item's project, the empty project, the server and the settings of every run."""

    project: Path
    empty: Path
    server: Sim
    args: argparse.Namespace

    def run_round(self, side: Side, index: int) -> Round:
        env = client_env(self.args.write_bytecode)
        python = str(side.python)
        empty = [python, "-m", "pytest", "-q", "test_empty.py"]
        start, end, empty_cpu_s = timed(empty, self.empty, env)
        empty_s = end - start
        start, end, _ = timed([*empty, "-p", "no:modelbench"], self.empty, env)
        bare_s = end - start
        argv = [python, "-m", "pytest", "benchmarks/", "--model", MODEL, "-q"]
        argv += ["--api-base-url", self.server.base_url, "--env", self.args.env]
        argv += ["--num-examples", str(self.args.requests)]
        argv += ["--max-concurrent", str(self.args.slots)]
        argv += ["--run-dir", f"runs-{side.label}-{index}"]
        offset = self.server.offset()
        started, ended, cpu_s = timed(argv, self.project, env)
        records = self.server.since(offset)
        if len(records) < self.args.requests:
            raise SystemExit(f"{side.label}: {len(records)} requests, not {self.args.requests}")
        first = min(float(r["start"]) for r in records)
        last = max(float(r["end"]) for r in records)
        rounds_s = math.ceil(self.args.requests / self.args.slots) * self.args.latency
        load = [python, "-m", "pytest_modelbench.testing.loadgen", self.server.base_url]
        load += ["--requests", str(self.args.requests), "--concurrency", str(self.args.slots)]
        load += ["--model", MODEL]
        offset = self.server.offset()
        timed(load, self.project, env)
        bare = self.server.since(offset)
        client_span_s = max(float(r["end"]) for r in bare) - min(float(r["start"]) for r in bare)
        return Round(
            wall_s=ended - started,
            startup_s=first - started,
            span_s=last - first,
            tail_s=ended - last,
            empty_s=empty_s,
            bare_s=bare_s,
            rounds_s=rounds_s,
            cpu_s=cpu_s,
            empty_cpu_s=empty_cpu_s,
            client_span_s=client_span_s,
        )


def prepare(work: Path) -> tuple[Path, Path]:
    """The item's project (the repository's ``benchmarks/`` only) and the empty one."""
    project, empty = work / "project", work / "empty"
    (project / "benchmarks").mkdir(parents=True)
    shutil.copy(REPO / "benchmarks" / "test_models.py", project / "benchmarks" / "test_models.py")
    empty.mkdir()
    (empty / "test_empty.py").write_text("def test_empty():\n    pass\n")
    return project, empty


# -- reporting ------------------------------------------------------------------------------


def median(rounds: Sequence[Round], name: str) -> float:
    return statistics.median(getattr(r, name) for r in rounds)


def best(rounds: Sequence[Round], name: str) -> float:
    return min(getattr(r, name) for r in rounds)


def report(sides: Sequence[Side], results: dict[str, list[Round]], header: str) -> str:
    lines = [header, ""]
    lines += [
        f"* {s.label}: {s.spec} ({'editable' if s.editable else 'from a wheel'}; pip's "
        f"byte-code for {s.pyc}), {s.python}"
        for s in sides
    ]
    lines += [
        "",
        "| side | own s | own, net of the client's span s | wall s | empty pytest s "
        "| start-up s | span s | bare client's span s | tail s | plugin load s | own CPU s "
        "| own s, each round |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for side in sides:
        rounds = results[side.label]
        cells = " | ".join(f"{median(rounds, f):.2f} ({best(rounds, f):.2f})" for f in FIELDS)
        each = ", ".join(f"{r.own_s:.2f}" for r in rounds)
        lines.append(f"| {side.label} | {cells} | {each} |")
    lines.append("")
    lines.append(
        "Median (best) of the rounds; own = wall − the server's rounds − empty pytest; own, net "
        "of the client's span = wall − a bare aiohttp client's span against the same server − "
        "empty pytest; own CPU = the item's CPU − the empty session's; plugin load = empty "
        "pytest − the same with `-p no:modelbench`."
    )
    first = sides[0]
    for side in sides[1:]:
        ratios = ", ".join(
            f"{name.removesuffix('_s')} "
            f"{median(results[side.label], name) / median(results[first.label], name):.2f}×"
            for name in (
                "own_s",
                "own_net_s",
                "wall_s",
                "startup_s",
                "span_s",
                "tail_s",
                "own_cpu_s",
            )
        )
        lines.append(f"{side.label} / {first.label} (medians): {ratios}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python perf/fixed_costs.py", description=__doc__)
    parser.add_argument(
        "--side",
        action="append",
        default=[],
        help="LABEL=VENV or LABEL=REVISION (WORKTREE: the working tree); default tree=WORKTREE",
    )
    parser.add_argument("--repeat", type=int, default=7, help="rounds per side")
    parser.add_argument("--env", default="mmlu", help="the built-in suite of the item")
    parser.add_argument("--requests", type=int, default=2000, help="--num-examples")
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--extras", default="xdist,html,parquet", help="installed with the wheel")
    parser.add_argument(
        "--write-bytecode", action="store_true", help="leave PYTHONDONTWRITEBYTECODE unset"
    )
    parser.add_argument("--keep", type=Path, help="work here (kept) instead of a temporary dir")
    args = parser.parse_args(argv)
    entries = args.side or [f"tree={WORKTREE}"]
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with (
        contextlib.nullcontext(str(args.keep))
        if args.keep
        else tempfile.TemporaryDirectory(prefix="mb-fixed-")
    ) as tmp:
        work = Path(tmp)
        sides = [resolve(entry, work, args.extras) for entry in entries]
        project, empty = prepare(work)
        load_before = os.getloadavg()[0]
        server = Sim(
            slots=args.slots,
            latency=args.latency,
            model=MODEL,
            log=work / "server.jsonl",
            python=sides[0].python,
        )
        bench = Bench(project, empty, server, args)
        results: dict[str, list[Round]] = {side.label: [] for side in sides}
        try:
            for side in sides:  # one warm-up each (page cache, the data's first read)
                bench.run_round(side, -1)
            for index in range(args.repeat):
                order = sides if index % 2 == 0 else sides[::-1]
                for side in order:
                    done = bench.run_round(side, index)
                    results[side.label].append(done)
                    print(
                        f"  round {index + 1} {side.label}: own {done.own_s:.2f} s, wall "
                        f"{done.wall_s:.2f}, empty {done.empty_s:.2f}, start-up "
                        f"{done.startup_s:.2f}, span {done.span_s:.2f} (bare client "
                        f"{done.client_span_s:.2f}), tail {done.tail_s:.2f}, own CPU "
                        f"{done.own_cpu_s:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            server.stop()
    bytecode = "written" if args.write_bytecode else "not written (PYTHONDONTWRITEBYTECODE=1)"
    header = (
        f"{args.env}, {args.requests} examples, {args.slots} slots × {args.latency * 1000:g} ms "
        f"(the server's rounds: {math.ceil(args.requests / args.slots) * args.latency:.2f} s); "
        f"byte-code {bytecode}; {args.repeat} rounds per side, sides in turn; "
        f"{os.cpu_count()} CPUs, load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    print(report(sides, results, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
