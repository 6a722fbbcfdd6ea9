"""Backend for :class:`~pytest_modelbench.suites.contract.Suite` objects (built-in suites, ``jsonl``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_modelbench.backends.protocol import Outcome
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.store.item_rows import RowSink
from pytest_modelbench.store.journal import Row
from pytest_modelbench.store.records import RULE_USED, STOPPED
from pytest_modelbench.suites.contract import (
    Example,
    Suite,
    SuiteArgumentError,
    aggregate_extra,
    preflight,
    summary_fields,
)
from pytest_modelbench.suites.selection import sample_order, select_examples

if TYPE_CHECKING:
    from pytest_modelbench.backends.protocol import ItemContext
    from pytest_modelbench.gating.early import EarlyStopper
    from pytest_modelbench.planning.item import PlannedItem
    from pytest_modelbench.running.runner import LoopStats

SCORER_VERSION = 1
PARSE_CHUNK = 64  # journal lines parsed between two turns of the event loop (about 1 ms)
Units = Iterator[tuple[Example, int]]


def _then(units: Units, done: Callable[[], None]) -> Units:
    """``units``, then ``done()`` once the last was taken."""
    yield from units
    done()


async def _parse_ahead(rows: RowSink) -> None:
    """Parse the journal's held lines for the summary, a chunk per turn of the event loop."""
    import asyncio  # lazily, as in evaluate: loaded only when an item runs

    while rows.parse_ahead(PARSE_CHUNK):
        await asyncio.sleep(0)


class SuiteBackend:
    """Evaluates a suite's examples through the async runner against the item's endpoint."""

    selects_by_example = True  # results are kept per example: --num-examples picks a subset
    stops_early = True  # --mb-stop-early: reads results in the sample's order and stops

    def __init__(self, suite: Suite) -> None:
        self.suite = suite
        self.name = suite.name

    def examples(self, item: PlannedItem) -> Sequence[Example]:
        try:
            examples = self.suite.examples(item.variant.env_args, item.seed)
        except SuiteArgumentError as exc:
            raise ModelbenchUsageError(
                f"{item.variant.source.name}: variant {item.variant.id!r}: {exc}"
            ) from None
        return select_examples(examples, item.num_examples)

    def primary_metric(self, item: PlannedItem) -> str:
        metric = item.variant.metric or self.suite.primary_metric
        known = set(self.suite.metrics) | {"pass@1"}
        if metric not in known and not metric.startswith("pass@"):
            # lazily: the HTTP client loads only when an item runs (pytest start-up)
            from pytest_modelbench.errors import did_you_mean

            raise ModelbenchUsageError(
                f"{item.variant.source.name}: variant {item.variant.id!r}: unknown metric {metric!r}"
                f"{did_you_mean(metric, known)}; {self.suite.name} reports: {', '.join(sorted(known))}"
            )
        return metric

    def fingerprint_parts(self, item: PlannedItem) -> dict[str, Any]:
        self.examples(item)  # loads data, so the checksum is known
        # not the number of examples: results are kept per example (--num-examples reuses them)
        return {
            "data": self.suite.data_checksum(),
            "scorer": f"{self.suite.name}/{getattr(self.suite, 'version', SCORER_VERSION)}",
        }

    def count_examples(self, item: PlannedItem) -> int:
        return len(self.examples(item))

    def tokens_per_example(self) -> int:
        return int(self.suite.tokens_per_example)

    def evaluate(self, ctx: ItemContext) -> Outcome:
        import asyncio

        # lazily: the HTTP client loads only when an item runs (pytest start-up)
        from pytest_modelbench.running.prefetch import prefetch_when_idle
        from pytest_modelbench.running.runner import (
            EndpointGone,
            LoopSettings,
            run_loop,
            work_units,
        )
        from pytest_modelbench.running.scoring import in_process_pool, warm_up

        item = ctx.item
        examples = self.examples(item)
        rollouts = item.variant.rollouts_per_example
        ids = {example.id for example in examples}

        def wanted(key: tuple[str, int]) -> bool:
            return key[0] in ids and 0 <= key[1] < rollouts

        done = ctx.rows.done_keys()
        total = len(examples) * rollouts
        stopper = None
        sink: RowSink = ctx.rows
        if ctx.stop_rule is not None:  # a random sample's order, read as results complete
            examples = sample_order(examples)
            stopper = self._stopper(ctx, examples, wanted)
            if stopper is not None:
                sink = _StoppingSink(ctx.rows, stopper)
        ctx.progress.start(item.item_id, total, len(done))

        async def main() -> LoopStats:
            # extra_body is merged into the sampling args and extra_headers kept apart when the
            # configuration is read (config.schema.split_request_args): the headers travel with
            # the endpoint (evaluation.endpoints), so every request carries them and no file
            # records them
            settings = LoopSettings(
                api=ctx.endpoint.api,
                model=ctx.endpoint.served_model,
                sampling_args=item.sampling_args(),
                seed=item.seed,
                max_concurrent=item.model.max_concurrent,
            )
            async with ctx.endpoint.client(
                timeout_s=item.model.timeout,
                max_retries=item.model.max_retries,
            ) as client:
                await ctx.endpoint.ensure_ready(client)
                # pyarrow for session end, imported once this item waits on its server
                tasks = [asyncio.create_task(prefetch_when_idle())]

                def all_taken() -> None:
                    # only the last replies are awaited now: the summary's rows are parsed meanwhile
                    tasks.append(asyncio.create_task(_parse_ahead(ctx.rows)))

                try:
                    return await run_loop(
                        self.suite,
                        _then(work_units(examples, rollouts, done), all_taken),
                        client,
                        sink,
                        settings,
                        ctx.progress,
                        order=stopper,  # --mb-stop-early: the item may stop
                    )
                finally:
                    for task in tasks:
                        task.cancel()

        if total > len(done):
            preflight(self.suite, item.item_id)  # e.g. code suites without OS isolation
        if total > len(done) and examples and in_process_pool(self.suite):
            warm_up(self.suite, examples[0])  # the scorer's workers, while the server answers
        todo = total > len(done) and (stopper is None or stopper.decision is None)
        try:
            loop_stats = asyncio.run(main()) if todo else None
        except EndpointGone as exc:
            kept = sum(1 for row in ctx.rows.rows(wanted) if not row.get("error"))
            raise EvaluationError(
                f"{item.item_id}: {exc}; stopped the item. {kept} of {total} examples are kept; "
                "re-running the same command continues with the rest"
            ) from None
        finally:
            ctx.progress.finish()
        if stopper is not None and stopper.decision is not None:
            return self._stopped_outcome(ctx.rows, stopper, wanted, done, loop_stats, rollouts)
        fields: dict[str, Any] = {}
        if stopper is not None and not stopper.disabled:  # read while it ran: alpha was spent
            fields[RULE_USED] = stopper.rule.key
        return self._outcome(ctx.rows, wanted, total, done, loop_stats, fields)

    def _stopped_outcome(
        self,
        rows: RowSink,
        stopper: EarlyStopper,
        selected: Callable[[tuple[str, int]], bool],
        done: frozenset[tuple[str, int]],
        loop_stats: LoopStats | None,
        rollouts: int,
    ) -> Outcome:
        """The outcome of an item stopped once certain: the prefix the decision read, and the
        decision's record (:data:`STOPPED`)."""
        used = stopper.used_ids()

        def wanted(key: tuple[str, int]) -> bool:
            return key[0] in used and selected(key)

        fields = {STOPPED: stopper.record(len(stopper.order)), RULE_USED: stopper.rule.key}
        return self._outcome(rows, wanted, len(used) * rollouts, done, loop_stats, fields)

    def _stopper(
        self,
        ctx: ItemContext,
        examples: Sequence[Example],
        wanted: Callable[[tuple[str, int]], bool],
    ) -> EarlyStopper | None:
        """``--mb-stop-early``: reads the item's results in the sample's order ``examples``
        (see :mod:`pytest_modelbench.gating.early`), the journal's first; None without a rule."""
        rule = ctx.stop_rule
        if rule is None:
            return None
        # lazily: only --mb-stop-early sessions load the sequential tests
        from pytest_modelbench.gating.early import EarlyStopper

        order = [example.id for example in examples]
        metric = rule.metric or self.primary_metric(ctx.item)
        stopper = EarlyStopper(rule, order, ctx.item.variant.rollouts_per_example, metric)
        for row in ctx.rows.rows(wanted):  # a resume reaches the same decision
            if row.get("error") is None and stopper.add(row) is not None:
                break
        return stopper

    def _outcome(
        self,
        rows: RowSink,
        wanted: Callable[[tuple[str, int]], bool],
        total: int,
        done: frozenset[tuple[str, int]],
        loop_stats: LoopStats | None,
        fields: dict[str, Any],
    ) -> Outcome:
        """The selected rows, the suite's own fields and metrics (and this session's loop
        counters) for the evaluator's summary."""
        fields = {**summary_fields(self.suite), **fields}
        extra_metrics: dict[str, Any] = {}
        if getattr(self.suite, "aggregate", None) is not None:
            # the journal is streamed: a 100k-example item never holds its rows in memory
            by_example: dict[str, list[dict[str, float]]] = defaultdict(list)
            for row in rows.rows(wanted):
                if not row.get("error"):
                    by_example[str(row["example_id"])].append(row.get("metrics") or {})
            for name, value in aggregate_extra(self.suite, by_example).items():
                extra_metrics[name] = {"value": value, "n": len(by_example)}
        if loop_stats is not None:
            fields["session"] = {
                "requested": loop_stats.requested,
                "retries": loop_stats.retries,
                "retry_reasons": loop_stats.retry_reasons,
                "wall_s": round(loop_stats.wall_s, 3),
            }
        return Outcome(
            expected=total,
            selected=wanted,
            metric_names=self.suite.metrics,
            resumed=sum(1 for key in done if wanted(key)),
            fields=fields,
            extra_metrics=extra_metrics,
        )


class _StoppingSink:
    """The item's rows, each also read by ``--mb-stop-early``'s stopper: ``stopped()`` once
    the item's verdict is certain."""

    def __init__(self, rows: RowSink, stopper: EarlyStopper) -> None:
        self._rows = rows
        self._stopper = stopper
        self._stopped = False

    def done_keys(self) -> frozenset[tuple[str, int]]:
        return self._rows.done_keys()

    def rows(self, keep: Callable[[tuple[str, int]], bool] | None = None) -> Iterator[Row]:
        return self._rows.rows(keep)

    def append(self, row: Mapping[str, Any]) -> None:
        self._rows.append(row)
        self._stopped = self._stopper.add_and_check(row) or self._stopped

    def stopped(self) -> bool:
        return self._stopped or self._rows.stopped()

    def parse_ahead(self, count: int) -> bool:
        return self._rows.parse_ahead(count)


__all__ = ["SuiteBackend"]
