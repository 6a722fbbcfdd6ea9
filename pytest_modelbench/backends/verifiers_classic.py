"""``module: verifiers:<env_id>`` for a classic verifiers environment (0.1.14 to 0.3.x).

The environment is loaded with ``verifiers.load_environment(env_id, **env_args)``
(the env package, or a module named like the id, must be importable) and run
with its own ``generate`` — its prompts, multi-turn logic, parser and rubric —
so scores equal ``env.evaluate(...)``/``vf-eval`` on the same server. What
modelbench adds: every finished example group is a journal row per rollout
(reward → ``score``, each rubric function → a metric), so resume, gates and
reports work as for built-in suites; concurrency is the model's
``max_concurrent``; requests use the model's ``timeout`` and ``max_retries``
(the OpenAI SDK's backoff), and a rollout that still fails is retried once.

Supported: the classic API, verifiers 0.1.14 up to 0.3.x (``verifiers.legacy``
in 0.3.x). verifiers 0.4 removed it; :mod:`.verifiers_common` says so before
an item runs (v1 tasksets are :mod:`.verifiers_v1`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_modelbench.backends.logs import quiet_logger
from pytest_modelbench.backends.protocol import ItemContext, Outcome
from pytest_modelbench.backends.solutions import refuse_solutions
from pytest_modelbench.backends.verifiers_common import (
    CLASSIC_INSTALL,
    CLASSIC_SUPPORTED,
    module_name,
    package_digest,
    pass_at_k,
    primary_metric,
    version,
)
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.running.endpoint import relay_timeout_s
from pytest_modelbench.store.item_rows import RowSink
from pytest_modelbench.store.records import JOURNAL_ROW_VERSION

# Chat-completions parameters the OpenAI SDK accepts as keywords; others go in extra_body.
_OPENAI_PARAMS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "reasoning_effort",
        "response_format",
        "user",
        "extra_body",
        "extra_headers",
        "parallel_tool_calls",
        "tool_choice",
        "modalities",
        "service_tier",
        "verbosity",
    }
)


def _vf() -> Any:
    import verifiers

    if not hasattr(verifiers, "load_environment"):
        raise ModelbenchUsageError(
            f"verifiers {version()} has no classic API (verifiers.load_environment); "
            f"install verifiers{CLASSIC_SUPPORTED}: {CLASSIC_INSTALL}"
        )
    return verifiers


def _message(message: Any) -> dict[str, Any]:
    if hasattr(message, "model_dump"):
        data = message.model_dump(exclude_none=True)
    elif isinstance(message, Mapping):
        data = dict(message)
    else:
        data = {"role": "assistant", "content": str(message)}
    return json.loads(json.dumps(data, default=str))  # type: ignore[no-any-return]


def messages_of(value: Any) -> list[dict[str, Any]] | str | None:
    """A prompt/completion as JSON: a list of message dicts, or the plain text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence):
        return [_message(m) for m in value]
    return str(value)


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def last_user_text(prompt: list[dict[str, Any]] | str | None) -> str:
    if isinstance(prompt, str) or prompt is None:
        return prompt or ""
    users = [_content(m) for m in prompt if m.get("role") == "user"]
    return users[-1] if users else ""


def completion_text(completion: list[dict[str, Any]] | str | None) -> str | None:
    """The completion as text: the assistant's reply, or a role-labelled transcript (multi-turn)."""
    if completion is None or isinstance(completion, str):
        return completion
    if len(completion) == 1:
        return _content(completion[0])
    return "\n\n".join(f"[{m.get('role', '?')}] {_content(m)}" for m in completion)


def error_text(error: Any) -> str | None:
    if not error:
        return None
    if isinstance(error, Mapping):
        return f"{error.get('error', 'Error')}: {error.get('message', '')}".strip()
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return str(error)


def split_sampling_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """Sampling args for the OpenAI SDK: unknown keys (``top_k``...) move to ``extra_body``."""
    out = {k: v for k, v in args.items() if k in _OPENAI_PARAMS}
    extra = {k: v for k, v in args.items() if k not in _OPENAI_PARAMS}
    if extra:
        out["extra_body"] = {**extra, **dict(out.get("extra_body") or {})}
    return out


def output_rows(outputs: Sequence[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    """Journal rows for one example group's rollout outputs (rollout = position in the group)."""
    for rollout, output in enumerate(outputs):
        prompt = messages_of(output.get("prompt"))
        completion = messages_of(output.get("completion"))
        error = error_text(output.get("error"))
        reward = output.get("reward")
        metrics = {
            k: float(v)
            for k, v in (output.get("metrics") or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if reward is not None:
            metrics["reward"] = float(reward)
        usage = output.get("token_usage") or {}
        timing = output.get("timing") or {}
        generation = timing.get("generation") if isinstance(timing, Mapping) else None
        latency = generation.get("duration") if isinstance(generation, Mapping) else None
        yield {
            "v": JOURNAL_ROW_VERSION,
            "example_id": str(output["example_id"]),
            "rollout": rollout,
            "prompt": last_user_text(prompt),
            "gold": output.get("answer"),
            "completion": completion_text(completion),
            "extracted": None,
            "metrics": {} if error else metrics,
            "score": None if error else metrics.get("reward"),
            "tokens": {
                "prompt": int(usage.get("input_tokens") or 0),
                "completion": int(usage.get("output_tokens") or 0),
            },
            "latency_s": round(float(latency), 4) if isinstance(latency, (int, float)) else None,
            "attempts": 1,
            "error": error,
            "detail": {
                "prompt_messages": prompt,
                "completion_messages": completion,
                "is_truncated": output.get("is_truncated"),
                "stop_condition": output.get("stop_condition"),
            },
        }


class ClassicEnvironment:
    """Evaluates one classic environment id (``env_args`` go to its ``load_environment``)."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self.name = f"verifiers:{env_id}"
        self._envs: dict[str, Any] = {}

    # -- loading -------------------------------------------------------------------------
    def environment(self, item: PlannedItem) -> Any:
        """The loaded environment for this item's env_args (cached per process)."""
        key = json.dumps(dict(item.variant.env_args), sort_keys=True, default=str)
        if key not in self._envs:
            vf = _vf()
            where = f"{Path(item.variant.source).name}: variant {item.variant.id!r}"
            try:
                with quiet_logger("verifiers"):
                    self._envs[key] = vf.load_environment(self.env_id, **item.variant.env_args)
            except (ValueError, RuntimeError, TypeError, ImportError) as exc:
                cause = exc.__cause__ or exc
                raise ModelbenchUsageError(
                    f"{where}: cannot load verifiers environment {self.env_id!r}: "
                    f"{type(cause).__name__}: {str(cause)[:300]} (install the environment's "
                    "package, e.g. 'vf-install <env>' or pip install, and check env_args)"
                ) from None
        return self._envs[key]

    def metric_names(self, item: PlannedItem) -> list[str]:
        env = self.environment(item)
        rubric = env.rubric
        names: list[str] = []
        getter: Callable[[], list[str]] | None = getattr(rubric, "_get_reward_func_names", None)
        if getter is None:
            getter = getattr(rubric, "get_reward_func_names", None)
        if getter is not None:
            try:
                names = list(getter())
            except Exception:  # names are a convenience for messages; metrics come from rows
                names = []
        return ["reward", *[n for n in names if n != "reward"]]

    def inputs(self, item: PlannedItem) -> list[dict[str, Any]]:
        """Rollout inputs as ``env.evaluate`` builds them: first N examples, each repeated."""
        env = self.environment(item)
        rollouts = item.variant.rollouts_per_example
        build = getattr(env, "_get_eval_inputs", None)
        if build is not None:
            return list(build(item.num_examples, rollouts))
        dataset = env.get_eval_dataset()
        if item.num_examples > 0:
            dataset = dataset.select(range(min(item.num_examples, len(dataset))))
        rows = dataset.to_list()
        return [row for row in rows for _ in range(rollouts)]

    # -- Backend protocol ----------------------------------------------------------------
    def primary_metric(self, item: PlannedItem) -> str:
        return primary_metric(item, lambda: self.metric_names(item), self.name)

    def fingerprint_parts(self, item: PlannedItem) -> dict[str, Any]:
        """Version, the env module's source and class, example count (code changes → recompute)."""
        env = self.environment(item)
        return {
            "verifiers": version(),
            "env_module": package_digest(module_name(self.env_id)),
            "env_class": f"{type(env).__module__}.{type(env).__qualname__}",
            "examples": self.count_examples(item),
        }

    def count_examples(self, item: PlannedItem) -> int:
        return len(self.inputs(item)) // item.variant.rollouts_per_example

    def tokens_per_example(self) -> int:
        return 800

    # -- run -----------------------------------------------------------------------------
    def evaluate(self, ctx: ItemContext) -> Outcome:
        item = ctx.item
        refuse_solutions(item)
        env = self.environment(item)
        rollouts = item.variant.rollouts_per_example
        inputs = self.inputs(item)
        done = ctx.rows.done_keys()
        wanted = {(str(i["example_id"]), r) for i in inputs for r in range(rollouts)}
        complete = {ex for ex, _ in wanted if all((ex, r) in done for r in range(rollouts))}
        todo = [i for i in inputs if str(i["example_id"]) not in complete]
        ctx.progress.start(item.item_id, len(wanted), len(wanted) - len(todo))
        started = time.perf_counter()
        try:
            if todo:
                asyncio.run(self._generate(ctx, env, todo, ctx.rows))
        finally:
            ctx.progress.finish()
        rows = list(ctx.rows.rows(wanted.__contains__))
        return Outcome(
            expected=len(wanted),
            selected=wanted.__contains__,
            metric_names=self.metric_names(item),
            resumed=len(done & wanted),
            fields={
                "verifiers": {
                    "env_id": self.env_id,
                    "version": version(),
                    "wall_s": round(time.perf_counter() - started, 3),
                    **pass_at_k(rows, rollouts),
                }
            },
        )

    async def _generate(
        self, ctx: ItemContext, env: Any, todo: list[dict[str, Any]], sink: RowSink
    ) -> None:
        """Generate through the worker's router: the model's whole URL set, our retries and
        breaker, the API key added there (the environment's client never holds it)."""
        model = ctx.item.model
        async with ctx.endpoint.asingle_url(
            timeout_s=model.timeout,
            max_retries=model.max_retries,
        ) as base_url:
            await self._generate_at(base_url, ctx, env, todo, sink)

    async def _generate_at(
        self, base_url: str, ctx: ItemContext, env: Any, todo: list[dict[str, Any]], sink: RowSink
    ) -> None:
        vf = _vf()
        from openai import AsyncOpenAI

        item, endpoint = ctx.item, ctx.endpoint
        openai_client = AsyncOpenAI(
            base_url=base_url,
            api_key="modelbench-router",  # the router sends the endpoint's own key
            timeout=relay_timeout_s(item.model.timeout, item.model.max_retries),
            max_retries=0,  # the router retries
        )
        client_class = (
            vf.OpenAIChatCompletionsClient if endpoint.api == "chat" else vf.OpenAICompletionsClient
        )
        client = client_class(openai_client)  # newer classic versions refuse a bare AsyncOpenAI
        rollouts = item.variant.rollouts_per_example

        def on_progress(
            all_outputs: Any,  # noqa: ARG001 - verifiers passes all three
            new_outputs: Sequence[Mapping[str, Any]],
            metadata: Any,  # noqa: ARG001
        ) -> None:
            for row in output_rows(new_outputs):
                sink.append(row)
                tokens = row["tokens"]
                ctx.progress.advance(
                    error=row["error"] is not None,
                    prompt_tokens=tokens["prompt"],
                    completion_tokens=tokens["completion"],
                )

        try:
            with quiet_logger("verifiers"):
                await env.generate(
                    todo,
                    client=client,
                    model=endpoint.served_model,
                    sampling_args=split_sampling_args(item.sampling_args()),
                    max_concurrent=max(1, item.model.max_concurrent // rollouts),
                    max_retries=1 if item.model.max_retries > 0 else 0,
                    on_start=lambda *_args, **_kwargs: None,
                    on_progress=on_progress,
                    on_log=lambda message: None,  # noqa: ARG005 - verifiers' callback signature
                )
        except (ModelbenchUsageError, EvaluationError):
            raise
        except Exception as exc:
            raise EvaluationError(
                f"{item.item_id}: verifiers environment {self.env_id!r} raised "
                f"{type(exc).__name__}: {str(exc)[:400]}; finished examples are kept and "
                "re-running continues from them"
            ) from exc
        finally:
            await openai_client.close()


__all__ = ["ClassicEnvironment", "output_rows", "split_sampling_args"]
