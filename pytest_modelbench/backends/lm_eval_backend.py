"""``module: lm_eval:<task>``: an lm-eval task (by name or local YAML) against the item's endpoint.

The task runs through ``lm_eval.simple_evaluate`` with lm-eval's
``local-chat-completions`` (model ``api: chat``) or ``local-completions``
(``api: completions``) model, ``num_concurrent`` = the model's
``max_concurrent``, ``tokenized_requests=False`` and no tokenizer unless
``env_args.tokenizer_backend`` asks for one (loglikelihood tasks need it: see
docs/backends.md). lm-eval's metrics and stderr are kept as they are, every
``<metric>,<filter>`` pair; its per-sample log becomes our journal. lm-eval's
request cache lives in the item directory, so an interrupted item resends
only the requests that had not finished.

The item seed is lm-eval's ``--seed`` (python, numpy, few-shot; torch is not
imported for API models) and the request ``seed``; ``limit`` is ``num_examples``; sampling args become
``gen_kwargs``. The lm-eval import happens only when an item runs.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_modelbench.backends.lm_eval_progress import LmEvalProgress
from pytest_modelbench.backends.lm_eval_tasks import TaskSpec, task_manager, task_spec
from pytest_modelbench.backends.logs import quiet_logger
from pytest_modelbench.backends.protocol import ItemContext, Outcome
from pytest_modelbench.backends.solutions import refuse_solutions
from pytest_modelbench.config.schema import split_request_args
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError, did_you_mean
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.running.endpoint import relay_timeout_s
from pytest_modelbench.store.records import JOURNAL_ROW_VERSION

SUPPORTED = ">=0.4.12,<0.5"  # task index and YAML loader of 0.4.12; no torch needed
INSTALL = "pip install 'pytest-modelbench[lm-eval]'"
Z95 = 1.959963984540054

# env_args accepted for lm_eval modules → (type, help)
ARGS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "num_fewshot": (int, "few-shot examples (lm-eval --num_fewshot)"),
    "fewshot_as_multiturn": (bool, "few-shot examples as chat turns (chat only)"),
    "apply_chat_template": (bool, "render prompts as chat messages (always on for api: chat)"),
    "system_instruction": (str, "a system message"),
    "gen_kwargs": (dict, "generation kwargs merged over the sampling args"),
    "include_path": (str, "a directory of your own task YAMLs"),
    "api": (str, "'chat' or 'completions' (default: the model's api)"),
    "tokenizer_backend": (str, "none | remote | huggingface | tiktoken (loglikelihood tasks)"),
    "tokenizer": (str, "tokenizer name/path for tokenizer_backend: huggingface"),
    "max_length": (int, "context length lm-eval assumes (default 2048)"),
    "max_gen_toks": (int, "default max generated tokens (default 256)"),
    "bootstrap_iters": (int, "bootstrap resamples for non-mean metrics' stderr (default 100000)"),
    "confirm_run_unsafe_code": (bool, "allow tasks that execute generated code"),
    "metadata": (dict, "task metadata (lm-eval --metadata)"),
    "model_args": (dict, "extra lm-eval model arguments"),
}


def require_extra(module: str) -> None:
    """Raise a usage error naming the install command when lm-eval is missing or too new/old."""
    if importlib.util.find_spec("lm_eval") is None:
        raise ModelbenchUsageError(
            f"module {module!r} needs lm-eval, which is not installed: {INSTALL}"
        )
    try:
        version = importlib.metadata.version("lm-eval")
    except importlib.metadata.PackageNotFoundError:
        return
    release = tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:3])
    if not (0, 4, 12) <= release < (0, 5):
        raise ModelbenchUsageError(
            f"module {module!r}: lm-eval {version} is installed; modelbench supports lm-eval "
            f"{SUPPORTED}: pip install 'lm-eval[api]{SUPPORTED}' (or {INSTALL})"
        )


def _check_args(item: PlannedItem) -> dict[str, Any]:
    args = dict(item.variant.env_args)
    where = f"{Path(item.variant.source).name}: variant {item.variant.id!r}"
    for key, value in args.items():
        if key not in ARGS:
            raise ModelbenchUsageError(
                f"{where}: unknown env_args key {key!r} for {item.variant.module!r}"
                f"{did_you_mean(key, ARGS)}; lm_eval modules accept: {', '.join(ARGS)}"
            )
        kind = ARGS[key][0]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ModelbenchUsageError(
                f"{where}: env_args.{key} = {value!r}: expected {ARGS[key][1]}"
            )
    if args.get("api", "chat") not in ("chat", "completions"):
        raise ModelbenchUsageError(f"{where}: env_args.api: expected 'chat' or 'completions'")
    gen_kwargs = args.get("gen_kwargs")
    if gen_kwargs:  # extra_body merged in, as in sampling_args; headers do not belong here
        if "extra_headers" in gen_kwargs:
            raise ModelbenchUsageError(
                f"{where}: env_args.gen_kwargs.extra_headers: env args are written to the run "
                "store; set the headers in sampling_args.extra_headers instead"
            )
        try:
            args["gen_kwargs"] = split_request_args(gen_kwargs)[0]
        except ValueError as exc:
            raise ModelbenchUsageError(f"{where}: env_args.gen_kwargs: {exc}") from None
    return args


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


class LmEvalBackend:
    """Evaluates one lm-eval task (or group) per item."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.name = f"lm_eval:{task}"

    # -- plan ----------------------------------------------------------------------------
    def spec(self, item: PlannedItem) -> TaskSpec:
        args = _check_args(item)
        return task_spec(self.task, item, args.get("include_path"))

    def primary_metric(self, item: PlannedItem) -> str:
        names = self.spec(item).metric_names
        metric = item.variant.metric
        if metric is None:
            if not names:
                raise ModelbenchUsageError(
                    f"{Path(item.variant.source).name}: variant {item.variant.id!r}: cannot tell "
                    f"the primary metric of {self.name}; set metric: '<metric>,<filter>'"
                )
            return names[0]
        if names and metric not in names:
            raise ModelbenchUsageError(
                f"{Path(item.variant.source).name}: variant {item.variant.id!r}: unknown metric "
                f"{metric!r}{did_you_mean(metric, names)}; {self.name} reports: {', '.join(names)}"
            )
        return metric

    def fingerprint_parts(self, item: PlannedItem) -> dict[str, Any]:
        spec = self.spec(item)
        return {
            "task": spec.name,
            "task_files": spec.checksum,
            "lm_eval": importlib.metadata.version("lm-eval"),
        }

    def count_examples(self, item: PlannedItem) -> int:
        self.spec(item)  # a missing task file or unknown task shows in the plan
        raise NotImplementedError("lm-eval tasks are counted when they run")

    def tokens_per_example(self) -> int:
        return 500

    # -- run -----------------------------------------------------------------------------
    def _model(self, ctx: ItemContext, args: Mapping[str, Any], base_url: str) -> tuple[Any, str]:
        """lm-eval's API model at ``base_url``, the worker's router: it spreads the requests over
        the model's URL set and retries them, and adds the API key (lm-eval never has it)."""
        import lm_eval.api.registry

        item, endpoint = ctx.item, ctx.endpoint
        api = args.get("api", endpoint.api)
        path = "/chat/completions" if api == "chat" else "/completions"
        model_args: dict[str, Any] = {
            "model": endpoint.served_model,
            "base_url": base_url + path,
            "num_concurrent": item.model.max_concurrent,
            "max_retries": 1,  # one attempt: the router retries (max_retries, Retry-After)
            "timeout": math.ceil(relay_timeout_s(item.model.timeout, item.model.max_retries)),
            "seed": item.seed,
            "tokenized_requests": False,
            "tokenizer_backend": args.get("tokenizer_backend", "none"),
        }
        for key in ("tokenizer", "max_length", "max_gen_toks"):
            if key in args:
                model_args[key] = args[key]
        model_args.update(args.get("model_args", {}))
        kind = "local-chat-completions" if api == "chat" else "local-completions"
        lm = lm_eval.api.registry.get_model(kind).create_from_arg_obj(model_args, {"batch_size": 1})
        return lm, api

    def evaluate(self, ctx: ItemContext) -> Outcome:
        refuse_solutions(ctx.item)
        model = ctx.item.model
        with ctx.endpoint.single_url(
            timeout_s=model.timeout,
            max_retries=model.max_retries,
        ) as url:
            return self._evaluate(ctx, url)

    def _evaluate(self, ctx: ItemContext, base_url: str) -> Outcome:
        item = ctx.item
        args = _check_args(item)
        spec = self.spec(item)
        import lm_eval

        lm, api = self._model(ctx, args, base_url)
        if api == "chat" and args.get("apply_chat_template") is False:
            raise ModelbenchUsageError(
                f"{Path(item.variant.source).name}: variant {item.variant.id!r}: "
                "apply_chat_template: false needs api: completions (chat endpoints take messages)"
            )
        gen_kwargs = {**item.sampling_args(), **args.get("gen_kwargs", {})}
        cache = _cache_prefix(ctx)
        cached_before = _cache_size(cache)
        manager = task_manager(
            spec.include_path, not isinstance(spec.spec, dict) or "group" in spec.spec
        )
        extra: dict[str, Any] = {}
        if "fewshot_as_multiturn" in args:
            extra["fewshot_as_multiturn"] = args["fewshot_as_multiturn"]
        ctx.progress.start(item.item_id, 0, 0)
        LmEvalProgress(ctx.progress, item.item_id).attach(lm)
        started = time.perf_counter()
        try:
            with quiet_logger("lm_eval"):
                results = lm_eval.simple_evaluate(
                    model=lm,
                    tasks=[spec.spec],
                    num_fewshot=args.get("num_fewshot"),
                    limit=item.num_examples if item.num_examples >= 0 else None,
                    use_cache=str(cache),
                    log_samples=True,
                    apply_chat_template=api == "chat" or bool(args.get("apply_chat_template")),
                    system_instruction=args.get("system_instruction"),
                    gen_kwargs=gen_kwargs or None,
                    task_manager=manager,
                    random_seed=item.seed,
                    numpy_random_seed=item.seed,
                    torch_random_seed=None,  # API models: nothing to seed, no torch import
                    fewshot_random_seed=item.seed,
                    bootstrap_iters=args.get("bootstrap_iters", 100000),
                    confirm_run_unsafe_code=bool(args.get("confirm_run_unsafe_code")),
                    metadata=args.get("metadata"),
                    **extra,
                )
        except (ModelbenchUsageError, EvaluationError):
            raise
        except Exception as exc:
            raise EvaluationError(
                f"{item.item_id}: lm-eval failed: {type(exc).__name__}: {str(exc)[:400]}. Requests "
                f"that finished are cached in {cache.parent} and are not sent again when you re-run"
            ) from exc
        finally:
            ctx.progress.finish()
        if results is None:
            raise EvaluationError(f"{item.item_id}: lm-eval returned no results (non-zero rank?)")
        return self._record(ctx, spec, results, cached_before, time.perf_counter() - started)

    def _record(
        self, ctx: ItemContext, spec: TaskSpec, results: Mapping[str, Any], cached: int, wall: float
    ) -> Outcome:
        item = ctx.item
        primary = self.primary_metric(item)
        keys: set[tuple[str, int]] = set()
        for row in _rows(results, spec.name, primary):
            ctx.rows.append(row)
            keys.add((str(row["example_id"]), int(row["rollout"])))
        names = [key for key in results.get("results", {}).get(spec.name, {}) if "," in key]
        metrics = _metrics(results, spec.name, len(keys))
        if primary not in metrics:
            raise ModelbenchUsageError(
                f"{Path(item.variant.source).name}: variant {item.variant.id!r}: "
                f"metric {primary!r} is not in lm-eval's results for {spec.name}; "
                f"it reports: {', '.join(names)}"
            )
        lm_eval_fields = {
            "task": spec.name,
            "lm_eval_version": results.get("lm_eval_version")
            or importlib.metadata.version("lm-eval"),
            "versions": results.get("versions"),
            "n-shot": results.get("n-shot"),
            "n-samples": results.get("n-samples"),
            "higher_is_better": results.get("higher_is_better"),
            "group_subtasks": results.get("group_subtasks"),
            "cached_requests_at_start": cached,
            "cache": str(_cache_prefix(ctx).parent),
            "wall_s": round(wall, 3),
        }
        return Outcome(
            expected=len(keys),
            selected=keys.__contains__,  # this run's rows: lm-eval decides what it evaluates
            metrics=metrics,  # lm-eval's own, with its stderr
            fields={"lm_eval": lm_eval_fields},
        )


def _cache_prefix(ctx: ItemContext) -> Path:
    """lm-eval's request cache for this item's fingerprint; caches of older fingerprints
    (another model checkpoint, other settings) are removed, never reused."""
    import shutil

    fingerprint = ctx.fingerprint or "current"
    root = ctx.directory / "lm_eval_cache"
    if root.is_dir():
        for old in root.iterdir():
            if old.name != fingerprint:
                shutil.rmtree(old, ignore_errors=True)
    (root / fingerprint).mkdir(parents=True, exist_ok=True)
    return root / fingerprint / "requests"


def _cache_size(prefix: Path) -> int:
    """Requests already in lm-eval's cache (``<prefix>_rank0.db``), for the summary."""
    db = prefix.with_name(prefix.name + "_rank0.db")
    if not db.exists():
        return 0
    try:
        from sqlitedict import SqliteDict  # type: ignore[import-untyped]

        with SqliteDict(str(db), flag="r") as cache:
            return len(cache)
    except Exception:  # a damaged cache is lm-eval's to handle; the count is informational
        return 0


def _metrics(results: Mapping[str, Any], name: str, n_rows: int) -> dict[str, Any]:
    """Every ``<metric>,<filter>`` of every task in lm-eval's results, with lm-eval's stderr.

    The requested task (or group) keeps plain names; its subtasks are
    ``<subtask>/<metric>,<filter>``.
    """
    metrics: dict[str, Any] = {}
    n_samples = results.get("n-samples") or {}
    for task, values in (results.get("results") or {}).items():
        prefix = "" if task == name else f"{task}/"
        effective = (n_samples.get(task) or {}).get("effective")
        n = int(effective) if effective is not None else (n_rows if task == name else 0)
        for key, value in values.items():
            if "," not in key or "_stderr," in key:
                continue
            metric, flt = key.split(",", 1)
            number = _number(value)
            stderr = _number(values.get(f"{metric}_stderr,{flt}"))
            metrics[f"{prefix}{key}"] = {
                "value": number,
                "stderr": stderr,
                "ci_low": None if number is None or stderr is None else number - Z95 * stderr,
                "ci_high": None if number is None or stderr is None else number + Z95 * stderr,
                "n": n,
                "examples": n,
                "ci_method": "lm-eval stderr (normal)",
            }
    return metrics


def _text(value: Any) -> Any:
    """A prompt or response as JSON-friendly text (chat prompts arrive as JSON strings)."""
    if isinstance(value, str):
        return value
    prompt = getattr(value, "prompt", None)
    if isinstance(prompt, str):
        return prompt
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _rows(results: Mapping[str, Any], name: str, primary: str) -> Iterator[dict[str, Any]]:
    """One journal row per document: every filter's metrics joined on ``doc_id``."""
    samples: Mapping[str, list[Mapping[str, Any]]] = results.get("samples") or {}
    several = len(samples) > 1
    for task, task_samples in samples.items():
        by_doc: dict[int, dict[str, Any]] = {}
        for sample in task_samples:
            doc_id = int(sample["doc_id"])
            flt = str(sample.get("filter", "none"))
            row = by_doc.get(doc_id)
            if row is None:
                arguments = sample.get("arguments") or [[None]]
                resps = sample.get("resps") or [[None]]
                first = resps[0] if resps else [None]
                row = {
                    "v": JOURNAL_ROW_VERSION,
                    "example_id": f"{task}/{doc_id}" if several else str(doc_id),
                    "rollout": 0,
                    "prompt": _text(arguments[0][0] if arguments and arguments[0] else None),
                    "gold": _text(sample.get("target")),
                    "completion": _text(first[0]) if isinstance(first, list) and first else None,
                    "extracted": {},
                    "metrics": {},
                    "tokens": None,
                    "latency_s": None,
                    "attempts": 1,
                    "error": None,
                    "task": task,
                }
                by_doc[doc_id] = row
            row["extracted"][flt] = _text(sample.get("filtered_resps"))
            for metric in sample.get("metrics") or []:
                number = _number(sample.get(metric))
                if number is not None:
                    key = (
                        f"{metric},{flt}"
                        if task == name or not several
                        else f"{task}/{metric},{flt}"
                    )
                    row["metrics"][key] = number
        for row in by_doc.values():
            row["score"] = row["metrics"].get(primary)
            yield row


__all__ = ["ARGS", "LmEvalBackend", "require_extra"]
