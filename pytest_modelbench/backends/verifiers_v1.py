"""``module: verifiers:<taskset>`` for a verifiers v1 taskset (verifiers 0.4, the current line).

A v1 taskset is a package whose ``__all__`` exports one ``verifiers.v1.Taskset``; each
rollout runs a harness program in a runtime, which talks to the model through verifiers'
interception server. modelbench loads the taskset with verifiers' own
``resolve_env_config``/``load_environment`` and runs each rollout with ``env.run_slot``,
as ``vf-eval`` does, so rewards equal ``vf-eval``'s on the same server. Defaults: the
``null`` harness (a plain chat loop) in the ``subprocess`` runtime, nothing sent to any
platform. ``env_args``: ``harness`` (an id or a mapping), ``runtime`` (a type or a
mapping), ``agent`` (merged into the agent's config: timeouts, max_turns...), every other
key is a field of the taskset's config.

What modelbench adds: one journal row per rollout (total reward → ``score``, each named
reward and metric → a metric), resume by task, gates and reports as for every backend.
The harness is built with ``uv`` (installed by the extra); a missing ``uv`` is one error
before any rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_modelbench.backends.logs import quiet_logger
from pytest_modelbench.backends.protocol import ItemContext, Outcome
from pytest_modelbench.backends.solutions import refuse_solutions
from pytest_modelbench.backends.verifiers_common import (
    INSTALL,
    package_digest,
    pass_at_k,
    primary_metric,
    version,
)
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.store.item_rows import RowSink
from pytest_modelbench.store.records import JOURNAL_ROW_VERSION

DEFAULT_HARNESS = "null"
DEFAULT_RUNTIME = "subprocess"
# verifiers reads the key from this variable in this process; its subprocess runtime removes
# every variable whose name contains API_KEY from a harness's environment
KEY_VAR = "MODELBENCH_V1_API_KEY"
RETRYABLE_STOPS = frozenset({"provider_error", "interception_error"})
# Each rollout is a program (a fresh Python importing openai and mcp, ~1.5 CPU-s): more of
# them at once than the CPUs can run only slows every one of them down.
ROLLOUTS_PER_CPU = 2


def _vf() -> Any:
    import verifiers.v1 as vf

    return vf


def env_config(env_id: str, env_args: Mapping[str, Any]) -> dict[str, Any]:
    """The env config ``resolve_env_config`` takes, from a variant's id and ``env_args``."""
    args = dict(env_args)
    harness = args.pop("harness", DEFAULT_HARNESS)
    runtime = args.pop("runtime", DEFAULT_RUNTIME)
    agent = dict(args.pop("agent", None) or {})
    agent["harness"] = {"id": harness} if isinstance(harness, str) else dict(harness)
    agent["runtime"] = {"type": runtime} if isinstance(runtime, str) else dict(runtime)
    return {"taskset": {"id": env_id, **args}, "agent": agent}


def find_uv() -> str | None:
    """The directory holding ``uv``: on PATH, or beside this Python (a venv's bin, not
    activated), which the extra installs."""
    found = shutil.which("uv")
    if found:
        return str(Path(found).parent)
    beside = Path(sys.executable).parent / "uv"
    return str(beside.parent) if beside.is_file() and os.access(beside, os.X_OK) else None


@contextlib.contextmanager
def uv_on_path(directory: str) -> Iterator[None]:
    """The harness calls a bare ``uv`` through ``sh``: its directory first on PATH meanwhile."""
    old = os.environ.get("PATH", "")
    if directory in old.split(os.pathsep):
        yield
        return
    os.environ["PATH"] = directory + os.pathsep + old
    try:
        yield
    finally:
        os.environ["PATH"] = old


def rollout_slots() -> int:
    """Harness programs this process may run at once: ``ROLLOUTS_PER_CPU`` per usable core,
    shared by the xdist workers of this host."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return max(1, ROLLOUTS_PER_CPU * cores // max(1, workers))


@contextlib.contextmanager
def key_for_harness(key: str | None, source_var: str | None) -> Iterator[None]:
    """The item's API key under :data:`KEY_VAR` while its rollouts run (``EMPTY`` without one),
    and the model's own ``api_key_var`` out of the environment meanwhile, so no harness
    process sees the key whatever that variable is called (``HF_TOKEN`` has no ``API_KEY``)."""
    saved = {name: os.environ.get(name) for name in (KEY_VAR, source_var) if name}
    os.environ[KEY_VAR] = key or "EMPTY"
    if source_var and source_var != KEY_VAR:
        os.environ.pop(source_var, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _text(prompt: Any) -> str:
    """The last user message of a task's prompt (a string or chat messages)."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt or () if isinstance(m, Mapping) and m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content or "")


def example_id(task: Any) -> str:
    """A task's identity in the journal: its own ``key`` when the taskset defines one, else
    its content hash (shortened; data edits make a new example)."""
    key, digest = str(task.key), str(task.hash)
    return key if key != digest else digest[:16]


def episode_row(episode: Any, example: str, rollout: int, attempts: int) -> dict[str, Any]:
    """One journal row for one finished rollout (an ``Episode`` with its one ``Trace``)."""
    trace = episode.traces[-1] if episode.traces else None
    errors = [*episode.errors, *(trace.errors if trace is not None else ())]
    error = "; ".join(f"{e.type}: {e.message}"[:500] for e in errors) or None
    if trace is not None and not trace.ok and error is None:
        error = f"rollout failed: {trace.stop_condition}"
    rewards = dict(trace.rewards) if trace is not None else {}
    metrics: dict[str, float] = {}
    if error is None and trace is not None:
        metrics = {n: float(r.score) for n, r in rewards.items() if r is not None}
        metrics.update(
            {n: float(v) for n, v in (trace.metrics or {}).items() if isinstance(v, (int, float))}
        )
        metrics["reward"] = float(trace.reward)
    calls = list(trace.calls) if trace is not None else []
    latency = sum(c.time.end - c.time.start for c in calls if c.time is not None) if calls else None
    data = episode.task.data
    return {
        "v": JOURNAL_ROW_VERSION,
        "example_id": example,
        "rollout": rollout,
        "prompt": _text(getattr(data, "prompt", "")),
        "gold": _gold(data),
        "completion": trace.last_reply if trace is not None else None,
        "extracted": None,
        "metrics": metrics,
        "score": metrics.get("reward") if error is None else None,
        "tokens": {
            "prompt": int(trace.num_input_tokens or 0) if trace is not None else 0,
            "completion": int(trace.num_output_tokens or 0) if trace is not None else 0,
        },
        "latency_s": round(latency, 4) if latency is not None else None,
        "attempts": attempts,
        "error": error,
        "detail": {
            "task_hash": str(episode.task.hash),
            "task_key": str(episode.task.key),
            "rewards": {
                n: (None if r is None else {"score": r.score, "weight": r.weight})
                for n, r in rewards.items()
            },
            "stop_condition": trace.stop_condition if trace is not None else None,
            "is_timeout": getattr(trace, "is_timeout", None),
            "finish_reasons": [c.finish_reason for c in calls],
            "turns": trace.num_turns if trace is not None else 0,
        },
    }


def _gold(data: Any) -> Any:
    answer = getattr(data, "answer", None)
    return json.loads(json.dumps(answer, default=str)) if answer is not None else None


class V1Taskset:
    """Evaluates one v1 taskset id (``env_args`` → harness, runtime, agent and taskset config)."""

    selects_by_example = True  # rows are per task: any --num-examples reuses them

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self.name = f"verifiers:{env_id}"
        self._envs: dict[str, Any] = {}
        self._tasks: dict[tuple[str, int], list[Any]] = {}

    # -- loading -------------------------------------------------------------------------
    def environment(self, item: PlannedItem) -> Any:
        key = json.dumps(dict(item.variant.env_args), sort_keys=True, default=str)
        if key not in self._envs:
            vf = _vf()
            where = f"{Path(item.variant.source).name}: variant {item.variant.id!r}"
            try:
                with quiet_logger("verifiers"):
                    config = vf.resolve_env_config(env_config(self.env_id, item.variant.env_args))
                    self._envs[key] = vf.load_environment(config)
            except Exception as exc:  # pydantic validation, import errors, the loader's own
                # pydantic names the bad key on its second line ("taskset.sytem  Extra inputs
                # are not permitted"): keep a few lines, joined
                lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
                detail = " | ".join(lines[:4])[:900]
                raise ModelbenchUsageError(
                    f"{where}: cannot load verifiers taskset {self.env_id!r}: "
                    f"{type(exc).__name__}: {detail} (env_args: harness, runtime, agent, and "
                    "the taskset's config fields; docs/backends.md)"
                ) from None
        return self._envs[key]

    def tasks(self, item: PlannedItem) -> list[Any]:
        """The first ``--num-examples`` tasks (all with -1), in the taskset's order."""
        key = (
            json.dumps(dict(item.variant.env_args), sort_keys=True, default=str),
            item.num_examples,
        )
        if key not in self._tasks:
            vf, taskset = _vf(), self.environment(item).taskset
            limit = item.num_examples if item.num_examples > 0 else None
            if limit is None and not getattr(taskset, "bounded", True):
                raise ModelbenchUsageError(
                    f"{Path(item.variant.source).name}: variant {item.variant.id!r}: taskset "
                    f"{self.env_id!r} has no end (its load() yields tasks forever): set "
                    "num_examples in the variant or pass --num-examples N"
                )
            if hasattr(vf, "SelectConfig"):  # 0.4
                chosen = taskset.select(vf.SelectConfig(limit=limit))
            else:  # verifiers.v1 of 0.3.x
                chosen = taskset.head(limit) if limit is not None else taskset
            self._tasks[key] = list(chosen)
        return self._tasks[key]

    def metric_names(self, item: PlannedItem) -> list[str]:
        tasks = self.tasks(item)
        names: list[str] = []
        if tasks:
            task = tasks[0]
            for kind in ("reward", "metric"):
                names += [fn.__name__ for fn in task.hooks(kind)]
            names += [judge.reward_name for judge in task.plugged_judges()]
        return ["reward", *dict.fromkeys(n for n in names if n != "reward")]

    # -- Backend protocol ----------------------------------------------------------------
    def primary_metric(self, item: PlannedItem) -> str:
        return primary_metric(item, lambda: self.metric_names(item), self.name)

    def fingerprint_parts(self, item: PlannedItem) -> dict[str, Any]:
        """Version, the taskset package's source, harness and runtime. Not the selection: a
        task's rows count only while its content hash is the one they were made from."""
        env = self.environment(item)
        config = env_config(self.env_id, item.variant.env_args)["agent"]
        return {
            "verifiers": version(),
            "line": "v1",
            "taskset_package": package_digest(type(env.taskset).__module__),
            "harness": config["harness"],
            "runtime": config["runtime"],
        }

    def count_examples(self, item: PlannedItem) -> int:
        return len(self.tasks(item))

    def tokens_per_example(self) -> int:
        return 800

    # -- run -----------------------------------------------------------------------------
    def evaluate(self, ctx: ItemContext) -> Outcome:
        item = ctx.item
        refuse_solutions(item)
        uv = find_uv()
        if uv is None:
            raise ModelbenchUsageError(
                f"{item.item_id}: verifiers v1 tasksets build each rollout's harness with uv, "
                f"which is neither on PATH nor beside {sys.executable}: {INSTALL} (or pip "
                "install uv); no rollout was started"
            )
        rollouts = item.variant.rollouts_per_example
        tasks = self.tasks(item)
        ids = [example_id(t) for t in tasks]
        wanted = {(ex, r) for ex in ids for r in range(rollouts)}
        hashes = {ex: str(t.hash) for t, ex in zip(tasks, ids, strict=True)}
        done = {
            (str(row["example_id"]), int(row["rollout"]))
            for row in ctx.rows.rows(wanted.__contains__)
            if not row.get("error")
            and (row.get("detail") or {}).get("task_hash") == hashes[str(row["example_id"])]
        }  # a task whose data changed under the same key is run again
        repeated = sorted(ex for ex, count in Counter(ids).items() if count > 1)
        if repeated:
            raise ModelbenchUsageError(
                f"{item.item_id}: taskset {self.env_id!r} has several tasks with the key "
                f"{', '.join(map(repr, repeated[:5]))}; results are kept per task key, so each "
                "task needs its own (Task.key, default the task's content hash)"
            )
        todo = [
            (t, ex, r)
            for t, ex in zip(tasks, ids, strict=True)
            for r in range(rollouts)
            if (ex, r) not in done
        ]
        ctx.progress.start(item.item_id, len(wanted), len(wanted) - len(todo))
        started = time.perf_counter()
        try:
            if todo:
                if ctx.endpoint.api != "chat":
                    raise ModelbenchUsageError(
                        f"{item.item_id}: model {item.model_name!r} has api: "
                        f"{ctx.endpoint.api}; verifiers v1 harnesses speak chat completions "
                        "only: set api: chat (the default) for this model"
                    )
                with uv_on_path(uv):
                    asyncio.run(self._run(ctx, todo, ctx.rows))
        finally:
            ctx.progress.finish()
        rows = [
            row
            for row in ctx.rows.rows(wanted.__contains__)
            if (row.get("detail") or {}).get("task_hash") == hashes[str(row["example_id"])]
        ]
        current = {(str(row["example_id"]), int(row["rollout"])) for row in rows}
        stops: dict[str, int] = {}
        for row in rows:
            stop = str((row.get("detail") or {}).get("stop_condition"))
            stops[stop] = stops.get(stop, 0) + 1
        return Outcome(
            expected=len(wanted),
            selected=current.__contains__,  # rows of the tasks as they are now
            metric_names=self.metric_names(item),
            resumed=len(done & wanted),
            fields={
                "verifiers": {
                    "env_id": self.env_id,
                    "line": "v1",
                    "version": version(),
                    "stop_conditions": stops,
                    "wall_s": round(time.perf_counter() - started, 3),
                    **pass_at_k(rows, rollouts),
                }
            },
        )

    async def _run(
        self, ctx: ItemContext, todo: Sequence[tuple[Any, str, int]], sink: RowSink
    ) -> None:
        """Roll out through the worker's router: the model's whole URL set, our retries and
        breaker, streamed answers passed through, the API key added there."""
        model = ctx.item.model
        async with ctx.endpoint.asingle_url(
            timeout_s=model.timeout,
            max_retries=model.max_retries,
        ) as base_url:
            await self._run_at(base_url, ctx, todo, sink)

    async def _run_at(
        self, base_url: str, ctx: ItemContext, todo: Sequence[tuple[Any, str, int]], sink: RowSink
    ) -> None:
        vf, item, endpoint = _vf(), ctx.item, ctx.endpoint
        model = vf.ModelContext(
            model=endpoint.served_model,
            client=vf.EvalClientConfig(base_url=base_url, api_key_var=KEY_VAR),
            sampling=vf.SamplingConfig(**dict(item.sampling_args())),
        )
        env = self.environment(item)
        limit = max(1, min(item.model.max_concurrent, rollout_slots()))
        semaphore = asyncio.Semaphore(limit)

        async def one(task: Any, example: str, rollout: int) -> None:
            attempts = 0
            while True:
                attempts += 1
                (slot,) = env.slots(task, 1)
                episode = await env.run_slot(slot, model, semaphore)
                trace = episode.traces[-1] if episode.traces else None
                stop = trace.stop_condition if trace is not None else None
                if episode.ok or stop not in RETRYABLE_STOPS or attempts > item.model.max_retries:
                    break
                await asyncio.sleep(endpoint.backoff_s * attempts)
            row = episode_row(episode, example, rollout, attempts)
            sink.append(row)
            ctx.progress.advance(
                error=row["error"] is not None,
                prompt_tokens=row["tokens"]["prompt"],
                completion_tokens=row["tokens"]["completion"],
            )

        try:
            with (
                quiet_logger("verifiers"),
                key_for_harness(None, item.model.api_key_var),  # the router adds the key
            ):
                async with env.serving():
                    await asyncio.gather(*(one(t, ex, r) for t, ex, r in todo))
        except (ModelbenchUsageError, EvaluationError):
            raise
        except Exception as exc:
            raise EvaluationError(
                f"{item.item_id}: verifiers taskset {self.env_id!r} raised "
                f"{type(exc).__name__}: {str(exc)[:400]}; finished rollouts are kept and "
                "re-running continues from them"
            ) from exc


__all__ = ["V1Taskset", "env_config", "episode_row", "example_id", "find_uv"]
