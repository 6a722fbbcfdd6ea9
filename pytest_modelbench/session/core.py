"""The per-session modelbench object: plan, parametrization, evaluation, result gathering.

The plugin imports this module only for sessions that ask for benchmark items
(``plugin.start_session``), so what it imports costs other pytest sessions nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_modelbench.config import ConfigSet, load_config_set
from pytest_modelbench.config.options import RunOptions, flag_name
from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean, one_of, shown_value
from pytest_modelbench.planning.item import Plan, PlannedItem
from pytest_modelbench.planning.plan import PlanWarning, build_plan
from pytest_modelbench.scheduling.costs import PlanCosts
from pytest_modelbench.scheduling.durations import read_durations
from pytest_modelbench.session.baseline_update import BaselineUpdate
from pytest_modelbench.session.gates import ItemGates
from pytest_modelbench.session.plan_checks import (
    check_baseline_metrics,
    check_engines,
    check_env_args,
)
from pytest_modelbench.session.results import ItemResults
from pytest_modelbench.session.rundir import RunDirectory
from pytest_modelbench.session.servers import SessionServers
from pytest_modelbench.session.settle import HolmStep, pending_status
from pytest_modelbench.store.records import PROPERTY_PREFIX, ItemStatus
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runstore import ItemStore, RunStore
from pytest_modelbench.store.summary import EMPTY
from pytest_modelbench.workers import WORKER_RUN_DIR, is_worker

if TYPE_CHECKING:  # imported where used, lazily, for pytest's start-up time
    from types import FrameType

    from xdist.workermanage import WorkerController

    from pytest_modelbench.backends.protocol import Backend
    from pytest_modelbench.evaluation.evaluate import ItemEvaluator

SESSION_KEY = pytest.StashKey["ModelbenchSession"]()
ITEM_PROPERTY = PROPERTY_PREFIX + "item"
MARKER_KEYWORDS = ("model", "env", "variant")  # @pytest.mark.modelbench(...)


class ModelbenchSession:
    """Holds the plan and the run store; implements modelbench's collection and reporting hooks."""

    def __init__(self, config: pytest.Config, options: RunOptions) -> None:
        self.config = config
        self.options = options
        self._config_set: ConfigSet | None = None
        self._plan: Plan | None = None
        self._plan_error: str | None = None
        self._evaluator: ItemEvaluator | None = None
        self._marker_error: str | None = None
        self._in_flight: set[str] = set()  # items this process is evaluating right now
        self._interrupted: dict[str, PlannedItem] = {}  # stopped by Ctrl-C or SIGTERM
        self._selected: list[PlannedItem] | None = None  # after deselection (-k, --lf)
        self.notes: list[str] = []  # one line each, shown in the header (controller)
        # the concerns of the session, one owner each, given what they need
        self.runs = RunDirectory(config, options, lambda: self.plan, self.notes)
        self.gates = ItemGates(
            options, lambda: self.plan, lambda: self._selected, self.runs, self.backend_for
        )
        self.servers = SessionServers(
            config, options, self.runs, lambda: self.plan, self.plan_costs
        )
        self.results = ItemResults(config, self.runs)  # controller: each item's record
        self.holm = HolmStep(config, self.results.announce)  # controller: Holm's final step
        self.baseline_update = BaselineUpdate(options)  # controller: --update-baselines

    # -- configuration and plan ------------------------------------------------------------
    @property
    def config_set(self) -> ConfigSet:
        if self._config_set is None:
            self._config_set = load_config_set(self.options.config_dir)
        return self._config_set

    @property
    def active(self) -> bool:
        """True when the user asked for benchmark items (so the plan is built eagerly)."""
        return self.options.selects_items

    def check_module(self, module: str, where: str) -> None:
        if (
            self.config.hook.pytest_modelbench_make_backend(config=self.config, module=module)
            is not None
        ):
            return
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.backends.registry import known_module_names

        names = known_module_names()
        prefix = module.split(":", 1)[0]
        hint = ""
        if prefix in ("verifiers", "lm_eval"):
            hint = f"; the {prefix} backend needs its extra: pip install 'pytest-modelbench[{prefix.replace('_', '-')}]'"
        raise ModelbenchUsageError(
            f"{where}: unknown module {shown_value(module)}{did_you_mean(module, names)}; "
            f"accepted: {one_of(names)}{hint}"
        )

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            plan = build_plan(self.config_set, self.options, self.check_module)
            tx = self.config.getoption("tx", default=None) or []
            check_engines(plan, self.config_set, [str(spec) for spec in tx])
            check_env_args(plan, self.options.env_args, self.backend_for)
            check_baseline_metrics(plan, self.config_set, self.backend_for)
            self._plan = plan
        return self._plan

    def plan_costs(self) -> PlanCosts:
        """The scheduler's cost model: the plan, the items this run already finished, and the
        remembered durations and tokens per example."""
        try:
            items = self.plan.by_id() if self.active else {}
        except ModelbenchUsageError:  # reported by pytest_collection_modifyitems; schedule plainly
            items = {}
        finished: set[str] = set()
        if items and not self.options.force:
            with contextlib.suppress(OSError):  # no run directory yet: nothing is finished
                finished = RunStore(self.run_dir).finished_item_ids()
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.scheduling.tokens import read_tokens

        return PlanCosts(
            items, self.backend_for, read_durations(self.config), finished, read_tokens(self.config)
        )

    @property
    def run_dir(self) -> Path:
        """This session's run directory (chosen when first needed)."""
        return self.runs.path

    # -- hooks -----------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self) -> None:
        if not self.active:
            return
        try:
            self.plan  # noqa: B018 - validate config and selection before anything runs
            for note in () if is_worker(self.config) else self.plan.notes:
                self.config.issue_config_time_warning(PlanWarning(note), stacklevel=2)
            if not self.config.option.collectonly and not is_worker(self.config):
                self.runs.check_references()
                self.runs.check_writable()
                self.notes.extend(self.servers.sharing_note())
        except ModelbenchUsageError as exc:
            raise pytest.UsageError(str(exc)) from None

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """Ctrl-C: pytest formats the whole traceback (each frame's source and arguments, and
        the exceptions it interrupted; over a second in a worker deep in an item) only to
        print where it stopped, unless ``--full-trace``. Keep that frame alone, so that Ctrl-C
        ends the run at once; the output is the same."""
        if self.config.option.fulltrace:
            return
        entries = excinfo.traceback
        for index in range(len(entries) - 1, -1, -1):
            if not entries[index].ishidden(excinfo):
                excinfo.traceback = entries[index:]
                break
        excinfo.value.__suppress_context__ = True  # chained exceptions are not printed either

    def pytest_report_header(self) -> list[str]:
        cpu_note: list[str] = []
        if self.active and not is_worker(self.config) and self._plan is not None:
            cpu_note = self.servers.cpu_note(self._plan)
        return [f"modelbench: {note}" for note in [*self.notes, *cpu_note]]

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: WorkerController) -> None:
        """xdist controller → worker: every worker writes the same run directory; with
        several nodes, every worker gets the session's exchange (replicas across nodes)."""
        if self.active:
            node.workerinput[WORKER_RUN_DIR] = str(self.run_dir)
            self.servers.configure_node(node)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: WorkerController) -> None:
        """A worker exited: helpers stop waiting for it (replicas across nodes)."""
        self.servers.node_down(node)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "mb_item" not in metafunc.fixturenames:
            return
        for mark in metafunc.definition.iter_markers("modelbench"):
            self._marker_error = self._marker_error or _marker_mistake(metafunc.definition, mark)
        marker = metafunc.definition.get_closest_marker("modelbench")
        try:
            items = list(self.plan.items)
        except ModelbenchUsageError as exc:
            self._plan_error = str(exc)
            items = []
        if marker is not None:
            items = [item for item in items if _marker_selects(marker.kwargs, item)]
        metafunc.parametrize("mb_item", items, ids=[item.item_id for item in items])

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self) -> None:
        for error in (self._marker_error, self._plan_error):
            if error is not None:
                raise pytest.UsageError(error)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self._plan is None:
            return
        selected = {
            item.callspec.params["mb_item"].item_id
            for item in session.items
            if hasattr(item, "callspec") and "mb_item" in item.callspec.params
        }
        self._selected = [i for i in self._plan.items if i.item_id in selected]
        if is_worker(self.config) and not session.config.option.collectonly:
            self.servers.reserve_gpus(self._selected)
        if session.config.option.collectonly and not is_worker(self.config):
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.session.terminal import (
                write_expected_examples,
                write_plan,
                write_planned_setups,
            )

            planned = write_plan(session.config, self._selected, self.backend_for)
            book = self.gates.planning_book()
            write_planned_setups(session.config, self._selected, book)
            if self.options.stop_early:
                write_expected_examples(
                    session.config,
                    self._selected,
                    planned,
                    lambda item: self.gates.planned_rule(book, item),
                    lambda item: self.gates.tested(item, book),
                )

    # -- evaluation (worker side) ------------------------------------------------------------
    def evaluator(self) -> ItemEvaluator:
        if self._evaluator is None:
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.evaluation.endpoints import EndpointManager
            from pytest_modelbench.evaluation.evaluate import ItemEvaluator, versions

            store = RunStore(self.run_dir)
            store.init(run_name=self.plan.run_name, versions=versions())
            from pytest_modelbench.running.progress import PROGRESS_SINK

            # a plan with no served model needs no server pool (nor its imports)
            serves = any(
                not (item.model.api_base_url or item.model.solutions) for item in self.plan.items
            )
            endpoints = EndpointManager(serving=self.servers.pool() if serves else None)
            self._evaluator = ItemEvaluator(
                self.options,
                store,
                endpoints,
                self.backend_for,
                self.config.stash.get(PROGRESS_SINK, None),
            )
            if self.options.stop_early:
                self._evaluator.stop_rule_for = self.gates.stop_rule
        return self._evaluator

    def backend_for(self, module: str) -> Backend | None:
        backend: Backend | None = self.config.hook.pytest_modelbench_make_backend(
            config=self.config, module=module
        )
        if backend is None:
            self.check_module(module, "module")
        return backend

    def evaluate(self, item: PlannedItem, node: pytest.Item) -> EvalResult:
        """Evaluate (or load) the item, then gate it on its baseline."""
        self._in_flight.add(item.item_id)
        try:
            with _sigterm_interrupts():
                result: EvalResult = self.evaluator().evaluate(item)
        except KeyboardInterrupt:
            self._interrupted[item.item_id] = item
            self._settle_interrupted()
            raise
        finally:
            self._in_flight.discard(item.item_id)
        result = self.gates.gate(result, item)
        self._save(node, result)
        return result

    @staticmethod
    def _save(node: pytest.Item, result: EvalResult) -> None:
        """Save the item's record in the store (what the controller reads) and give its test
        the ``mb_*`` properties (what JUnit and pytest-html show)."""
        with contextlib.suppress(OSError):  # a store that cannot be written: the item's
            result.save()  # error already says so; the controller falls back to properties
        if not any(k == ITEM_PROPERTY for k, _ in node.user_properties):
            node.user_properties.extend(result.properties())

    def tracker_config(self) -> dict[str, Any]:
        """What an experiment tracker's run records about this session: names and counts only
        (no endpoint, no paths, nothing that could hold a secret)."""
        items = self.plan.items
        return {
            "run_id": self.run_dir.name,
            "models": ",".join(sorted({i.model_name for i in items})),
            "envs": ",".join(sorted({i.env for i in items})),
            "seeds": ",".join(str(s) for s in sorted({i.seed for i in items})),
            "items": len(items),
            "num_examples": self.options.num_examples if self.options.num_examples else "all",
        }

    def _settle_interrupted(self) -> None:
        """Ctrl-C or SIGTERM stopped this process's items: their manifest entries say
        ``interrupted`` instead of ``running`` (their journals keep what finished)."""
        if not self._in_flight or self.runs.chosen is None:
            return
        store = RunStore(self.runs.chosen)
        with contextlib.suppress(OSError):  # stopping must not fail on a damaged store
            items = store.read_manifest().get("items") or {}
            for item_id in sorted(self._in_flight):
                entry = items.get(item_id)
                status = ItemStatus.of(entry.get("status")) if isinstance(entry, dict) else None
                if status is ItemStatus.RUNNING:
                    store.update_item(item_id, status=ItemStatus.INTERRUPTED)

    def record_error(self, node: pytest.Item, item: PlannedItem, message: str) -> None:
        result = EvalResult(
            item_id=item.item_id,
            model=item.model_name,
            env=item.env,
            variant=item.variant.id,
            seed=item.seed,
            metric="",
            summary=EMPTY,
            directory=RunStore(self.run_dir).item(item.item_id).directory,
            error=message,
            model_path=item.model.model,
        )
        if result.summary or ItemStore(result.directory).read_summary() is None:
            self._save(node, result)
        else:  # finished results still stand (nothing was recomputed): their record stays
            node.user_properties.extend(result.properties())

    # -- reporting (controller side) ---------------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if is_worker(self.config) or not self.active:
            return
        added = self.results.add(report)
        if added is None:
            return
        result, first = added
        if pending_status(report, result) is not None:  # announced when Holm decides it
            self.holm.hold(report, result)
        elif first:
            self.results.announce(result)

    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        """An item waiting for Holm's final step shows as ``HOLM-PENDING``, not ``PASSED``."""
        if self.options.correction != "holm" or report.when != "call" or not report.passed:
            return None
        return pending_status(report, self.results.result_of(report))

    @property
    def records(self) -> list[EvalResult]:
        """Controller: one record per finished item (final verdicts after Holm's step)."""
        return self.results.records

    @property
    def outcomes(self) -> dict[str, str]:
        """Controller: item id -> pytest outcome."""
        return self.results.outcomes

    def pytest_terminal_summary(
        self, terminalreporter: pytest.TerminalReporter, exitstatus: int
    ) -> None:
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED and self.runs.chosen is not None
        if not self.records and not interrupted:
            return
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.session.terminal import (
            write_markdown_summary,
            write_recomputed,
            write_resume_hint,
            write_setup_differences,
            write_summary_table,
            write_truncation_warnings,
        )

        write_summary_table(
            terminalreporter,
            self.records,
            self.runs.chosen,
            interrupted=[i for k, i in self._interrupted.items() if k not in self.outcomes],
        )
        if interrupted:
            write_resume_hint(terminalreporter, self._resume_advice())
        write_truncation_warnings(terminalreporter, self.records)
        write_setup_differences(terminalreporter, self.records)
        write_recomputed(terminalreporter, self.records)
        for message in self.results.hook_failures:
            terminalreporter.write_line(f"modelbench: {message}", red=True)
        self.holm.write_summary(terminalreporter)
        self.baseline_update.write_summary(terminalreporter, self.records)
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            write_markdown_summary(Path(step_summary), self.records, self.runs.chosen)

    def _resume_advice(self) -> str:
        """How to continue this run: the same command when it would find this run again."""
        if self.options.run_id or self.options.auto_resume:
            return "re-running the same command resumes it"
        run_id = self.runs.chosen.name if self.runs.chosen is not None else "ID"
        return f"re-run with {flag_name(self.config, 'run_id')} {run_id} to resume it"

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Holm's final step first, so JUnit, ``--lf``, pytest-html and the terminal (all
        written at session end) see every item's final outcome."""
        if self.options.correction == "holm" and self.records and not is_worker(self.config):
            self.results.records = self.holm.settle_all(session, self.records, self.outcomes)

    @pytest.hookimpl(trylast=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_last(self, session: pytest.Session, exitstatus: int) -> None:
        """Last: this process's servers stop; ``--update-baselines`` writes settled scores."""
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        if interrupted and is_worker(self.config):  # the controller waits for its workers
            atexit.register(_exit_without_collecting)
        if self._evaluator is not None:  # stop this process's servers, release its GPUs
            self._evaluator.endpoints.close(interrupted=interrupted)
        else:  # GPUs reserved, no item run: give them back (or serve another node's item)
            self.servers.close_pool(interrupted)
        self.servers.close_exchange()
        if is_worker(self.config) or not self.records:
            return
        if self.options.update_baselines:
            run_id = self.runs.chosen.name if self.runs.chosen else "unknown"
            self.baseline_update.write(session, self.records, run_id)


def _marker_mistake(test: pytest.Function, marker: pytest.Mark) -> str | None:
    """What is wrong with a test's ``@pytest.mark.modelbench(...)``, or None."""
    where = f"{test.nodeid}: @pytest.mark.modelbench"
    accepted = ", ".join(MARKER_KEYWORDS)
    for key in marker.kwargs:
        if key not in MARKER_KEYWORDS:
            return (
                f"{where}: unknown keyword {key!r}{did_you_mean(key, MARKER_KEYWORDS)}; "
                f"accepted: {accepted}"
            )
    if marker.args:
        return (
            f"{where}: takes keywords, not {shown_value(marker.args[0])}; write e.g. "
            f"@pytest.mark.modelbench(env={shown_value(marker.args[0])}) (accepted: {accepted})"
        )
    return None


def _exit_without_collecting() -> None:
    """At an xdist worker's exit after Ctrl-C: the interpreter's last garbage collections walk
    every object the run made (hundreds of milliseconds, which the controller waits for).
    Frozen, they are not walked: objects kept alive only by reference cycles are then never
    finalised, which is safe here because the journal is flushed per line and the store's
    files are written atomically before this runs (atexit, after the session ended)."""
    gc.freeze()
    gc.disable()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001  # signal handler signature
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While an item runs, SIGTERM stops it as Ctrl-C does (pytest leaves SIGTERM fatal), so
    the item's manifest entry is settled; the previous handler is restored afterwards. A
    handler someone else installed is left alone."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _marker_selects(kwargs: Mapping[str, Any], item: PlannedItem) -> bool:
    for key, value in (("model", item.model_name), ("env", item.env), ("variant", item.variant.id)):
        wanted = kwargs.get(key)
        if wanted is None:
            continue
        allowed = [wanted] if isinstance(wanted, str) else list(wanted)
        if value not in allowed:
            return False
    return True
