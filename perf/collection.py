"""Collecting 1k / 10k / 100k benchmark items: wall time and peak RSS of ``pytest --collect-only``.

Each size is a throw-away project whose config expands to exactly that many items:
10 models × (a jsonl env whose ``matrix`` sweeps ``sampling_args.temperature`` and
``system_prompt``) × 10 seeds. The models point at an unused local port (nothing is
served, and collection must not touch the network). For each size the script runs
``python -m pytest benchmarks/ --model all --collect-only -q`` in a subprocess and
records its wall time (process start included), its CPU time (user + system) and its
peak RSS (``ru_maxrss`` of that child from ``wait4``); it also checks the number of items
collected. CPU time is the figure to compare on a loaded machine, where wall time also
counts waiting for a core. The floor is the same command on a project with one empty
test file and no ``--model``: pytest's own start-up with the plugin loaded. Timings are
the best of ``--repeat`` runs, RSS the highest.

    python perf/collection.py [--sizes 1000,10000,100000] [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"
LEAN = ["-p", "no:html", "-p", "no:metadata", "-p", "no:hypothesispytest", "-p", "no:randomly"]
UNUSED_URL = "http://127.0.0.1:9/v1"  # the discard port: never contacted at collection
MODELS = 10
SEEDS = 10
EXAMPLES = 10  # rows of the dataset every variant reads (the plan counts them)
TARGET_ITEMS, TARGET_S, TARGET_RSS_MB = 10_000, 3.0, 400
_COLLECTED = re.compile(r"(\d+) (?:tests?|items?) collected")


@dataclass(frozen=True)
class Measurement:
    label: str
    items: int  # items the project expands to (0 for the floor)
    collected: int  # items pytest reported collecting (the same in every run)
    shape: str  # models × variants × seeds
    wall_s: list[float]
    cpu_s: list[float]
    peak_rss_mb: list[float]

    @property
    def best_s(self) -> float:
        return min(self.wall_s)

    @property
    def best_cpu_s(self) -> float:
        return min(self.cpu_s)

    @property
    def rss_mb(self) -> float:
        return max(self.peak_rss_mb)

    def as_json(self) -> dict[str, object]:
        return {
            **asdict(self),
            "best_s": self.best_s,
            "best_cpu_s": self.best_cpu_s,
            "rss_mb": self.rss_mb,
        }


def _matrix(variants: int) -> dict[str, list[object]]:
    """A sweep with exactly ``variants`` combinations (temperature × system prompt)."""
    temperatures = [round(0.1 * i, 1) for i in range(min(10, variants))]
    if variants % len(temperatures):
        raise SystemExit(f"--sizes: {variants} variants is not a multiple of 10")
    prompts = [f"assistant-{i}" for i in range(variants // len(temperatures))]
    return {"sampling_args.temperature": list(temperatures), "system_prompt": list(prompts)}


def make_project(root: Path, items: int) -> str:
    """A project of exactly ``items`` items; returns its shape (models × variants × seeds)."""
    if items % (MODELS * SEEDS):
        raise SystemExit(f"--sizes: {items} is not a multiple of {MODELS * SEEDS}")
    variants = items // (MODELS * SEEDS)
    (root / "configs" / "envs").mkdir(parents=True)
    (root / "configs" / "baselines").mkdir()
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    with (root / "qa.jsonl").open("w") as handle:
        for i in range(EXAMPLES):
            row = {"id": f"q{i}", "question": f"what is {i} + 1?", "answer": str(i + 1)}
            handle.write(json.dumps(row) + "\n")
    models = {
        f"model{m}": {"model": f"org/model-{m}", "api_base_url": UNUSED_URL} for m in range(MODELS)
    }
    (root / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": models}))
    env = [
        {
            "id": "qa",
            "module": "jsonl",
            "env_args": {"path": "qa.jsonl"},
            "seeds": list(range(SEEDS)),
            "matrix": _matrix(variants),
        }
    ]
    (root / "configs" / "envs" / "qa.yaml").write_text(yaml.safe_dump(env))
    return f"{MODELS} × {variants} × {SEEDS}"


def make_floor_project(root: Path) -> None:
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks" / "test_empty.py").write_text("")


def run_once(root: Path, args: list[str], expect: int | None) -> tuple[int, float, float, float]:
    """(items collected, wall seconds, CPU seconds, peak RSS in MB) of one ``pytest`` subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    command = [sys.executable, "-m", "pytest", "benchmarks/", "--collect-only", "-q", *LEAN, *args]
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    ok_codes = (0, 5) if expect is None else (0,)  # 5: no tests collected (the floor)
    if proc.returncode not in ok_codes:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{text[-3000:]}")
    found = _COLLECTED.search(text)
    count = int(found.group(1)) if found else 0
    if expect is not None and count != expect:
        sys.exit(f"expected {expect} items collected, pytest said {count}:\n{text[-2000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return count, elapsed, cpu, usage.ru_maxrss / 1024  # Linux: ru_maxrss is in kB


def measure(
    label: str, root: Path, args: list[str], expect: int | None, shape: str, repeat: int
) -> Measurement:
    counts: set[int] = set()
    walls: list[float] = []
    cpus: list[float] = []
    rss: list[float] = []
    for _ in range(repeat):
        count, wall, cpu, peak = run_once(root, args, expect)
        counts.add(count)
        walls.append(wall)
        cpus.append(cpu)
        rss.append(peak)
    return Measurement(label, expect or 0, max(counts), shape, walls, cpus, rss)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma list of item counts")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size (best is reported)")
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON here")
    opts = parser.parse_args()
    try:
        sizes = [int(s) for s in opts.sizes.split(",") if s.strip()]
    except ValueError:
        sys.exit(f"--sizes: {opts.sizes!r} is not a comma list of integers (e.g. 1000,10000)")
    if opts.repeat < 1:
        sys.exit(f"--repeat: {opts.repeat} must be at least 1")
    load_before = _load()
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory() as tmp:
        floor_root = Path(tmp) / "floor"
        make_floor_project(floor_root)
        floor = measure("floor (empty test file)", floor_root, [], None, "-", opts.repeat)
        for size in sizes:
            root = Path(tmp) / f"p{size}"
            shape = make_project(root, size)
            results.append(
                measure(f"{size:,} items", root, ["--model", "all"], size, shape, opts.repeat)
            )
    load_after = _load()
    print(
        f"load average (1/5/15 min) before: {' '.join(map(str, load_before))}, "
        f"after: {' '.join(map(str, load_after))}; cpus: {os.cpu_count()}"
    )
    print(
        "| collection | models × variants × seeds | best wall (s) | all runs (s) | "
        "minus floor (s) | best CPU (s) | peak RSS (MB) |"
    )
    print("|---|---|---:|---|---:|---:|---:|")
    for m in (floor, *results):
        runs = ", ".join(f"{w:.2f}" for w in m.wall_s)
        extra = "-" if m is floor else f"{m.best_s - floor.best_s:.2f}"
        print(
            f"| {m.label} | {m.shape} | {m.best_s:.2f} | {runs} | {extra} | "
            f"{m.best_cpu_s:.2f} | {m.rss_mb:.0f} |"
        )
    for m in results:
        if m.items == TARGET_ITEMS:
            met = m.best_s <= TARGET_S and m.rss_mb <= TARGET_RSS_MB
            print(
                f"\ntarget {TARGET_ITEMS:,} items in <= {TARGET_S:g} s with <= {TARGET_RSS_MB} MB: "
                f"{m.best_s:.2f} s, {m.rss_mb:.0f} MB ({'met' if met else 'NOT met'})"
            )
    if opts.json:
        report = {
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": load_after,
            "repeat": opts.repeat,
            "floor": floor.as_json(),
            "sizes": [m.as_json() for m in results],
        }
        Path(opts.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
