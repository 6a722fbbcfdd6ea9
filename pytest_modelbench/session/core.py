"""The per-session modelbench object: plan, parametrization, evaluation, result gathering."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.config import ConfigSet, load_config_set
from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean, one_of
from pytest_modelbench.planning.item import Plan, PlannedItem
from pytest_modelbench.planning.plan import build_plan
from pytest_modelbench.scheduling.costs import PlanCosts
from pytest_modelbench.scheduling.durations import read_durations
from pytest_modelbench.store.records import PROPERTY_PREFIX, ItemProperties
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runstore import RunStore, find_latest_run, new_run_id
from pytest_modelbench.workers import WORKER_RUN_DIR, is_worker, worker_input

SESSION_KEY = pytest.StashKey["ModelbenchSession"]()


class ModelbenchSession:
    """Holds the plan and the run store; implements modelbench's collection and reporting hooks."""

    def __init__(self, config: pytest.Config, options: RunOptions) -> None:
        self.config = config
        self.options = options
        self._config_set: ConfigSet | None = None
        self._plan: Plan | None = None
        self._plan_error: str | None = None
        self._run_dir: Path | None = None
        self._evaluator: Any = None
        self._book: Any = None
        self.records: list[dict[str, Any]] = []  # controller: one per finished item (from reports)
        self.holm_failures: list[str] = []
        self.baselines_written: list[Path] = []

    # -- configuration and plan ------------------------------------------------------------
    @property
    def config_set(self) -> ConfigSet:
        if self._config_set is None:
            self._config_set = load_config_set(self.options.config_dir)
        return self._config_set

    @property
    def active(self) -> bool:
        """True when the user asked for benchmark items (so the plan is built eagerly)."""
        return bool(self.options.models or self.options.job_file)

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
            f"{where}: unknown module {module!r}{did_you_mean(module, names)}; accepted: {one_of(names)}{hint}"
        )

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = build_plan(self.config_set, self.options, self.check_module)
        return self._plan

    def plan_costs(self) -> PlanCosts:
        """The scheduler's cost model: the plan, the items this run already finished, and the
        remembered durations."""
        try:
            items = self.plan.by_id() if self.active else {}
        except ModelbenchUsageError:  # reported by pytest_collection_modifyitems; schedule plainly
            items = {}
        finished: set[str] = set()
        if items and not self.options.force:
            with contextlib.suppress(OSError):  # no run directory yet: nothing is finished
                finished = RunStore(self.run_dir).finished_item_ids()
        return PlanCosts(items, self.backend_for, read_durations(self.config), finished)

    # -- run directory ---------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        if self._run_dir is None:
            given = worker_input(self.config).get(WORKER_RUN_DIR)
            if given:
                self._run_dir = Path(given)
            else:
                self._run_dir = self._resolve_run_dir()
        return self._run_dir

    def _resolve_run_dir(self) -> Path:
        base = self.config.invocation_params.dir
        parent = self.options.run_dir
        if self.plan.run_parent is not None and self.options.run_dir == Path("runs"):
            parent = self.plan.run_parent
        parent = parent if parent.is_absolute() else base / parent
        if self.options.run_id:
            return parent / self.options.run_id
        if self.options.auto_resume:  # with --restart OLD: the latest run seeded from OLD
            latest = find_latest_run(parent, self.plan.run_name, restart_from=self.options.restart)
            if latest is not None:
                return latest
        return parent / new_run_id(parent, self.plan.run_name)

    # -- hooks -----------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self) -> None:
        if not self.active:
            return
        try:
            self.plan  # noqa: B018 - validate config and selection before anything runs
        except ModelbenchUsageError as exc:
            raise pytest.UsageError(str(exc)) from None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist controller → worker: every worker writes the same run directory."""
        if self.active:
            node.workerinput[WORKER_RUN_DIR] = str(self.run_dir)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "mb_item" not in metafunc.fixturenames:
            return
        try:
            items = list(self.plan.items)
        except ModelbenchUsageError as exc:
            self._plan_error = str(exc)
            items = []
        marker = metafunc.definition.get_closest_marker("modelbench")
        if marker is not None:
            items = [item for item in items if _marker_selects(marker.kwargs, item)]
        metafunc.parametrize("mb_item", items, ids=[item.item_id for item in items])

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self) -> None:
        if self._plan_error is not None:
            raise pytest.UsageError(self._plan_error)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if (
            session.config.option.collectonly
            and self._plan is not None
            and not is_worker(self.config)
        ):
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.session.terminal import write_plan

            selected = {
                item.callspec.params["mb_item"].item_id
                for item in session.items
                if hasattr(item, "callspec") and "mb_item" in item.callspec.params
            }
            write_plan(session.config, [i for i in self._plan.items if i.item_id in selected], self)

    # -- evaluation (worker side) ------------------------------------------------------------
    def evaluator(self) -> Any:
        if self._evaluator is None:
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.evaluation.endpoints import EndpointManager
            from pytest_modelbench.evaluation.evaluate import ItemEvaluator, versions

            store = RunStore(self.run_dir)
            store.init(run_name=self.plan.run_name, versions=versions())
            from pytest_modelbench.serving.pool import ServerPool

            serving = ServerPool(self.run_dir, gpus_option=self.options.gpus)
            endpoints = EndpointManager(serving=serving)
            from pytest_modelbench.running.progress import PROGRESS_SINK

            self._evaluator = ItemEvaluator(
                self.options,
                store,
                endpoints,
                self.backend_for,
                self.config.stash.get(PROGRESS_SINK, None),
            )
        return self._evaluator

    def backend_for(self, module: str) -> Any:
        backend = self.config.hook.pytest_modelbench_make_backend(config=self.config, module=module)
        if backend is None:
            self.check_module(module, "module")
        return backend

    def baseline_book(self) -> Any:
        if self._book is None:
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.gating.baselines import BaselineBook

            self._book = BaselineBook(
                self.options.config_dir / "baselines",
                self.run_dir.parent,
                require=self.options.require_baseline,
                baseline_run=self.options.baseline_run,
            )
        return self._book

    def evaluate(self, item: PlannedItem, node: pytest.Item) -> EvalResult:
        """Evaluate (or load) the item, then gate it on its baseline."""
        result: EvalResult = self.evaluator().evaluate(item)
        verdict = self.baseline_book().verdict(result)
        deferred = self.options.correction == "holm" and verdict.p_value is not None
        result = dataclasses.replace(result, verdict=verdict, gate_deferred=deferred)
        _record_properties(node, item, result)
        self.config.hook.pytest_modelbench_item_finished(
            config=self.config, item_id=item.item_id, summary=result.summary, result=result
        )
        return result

    def record_error(self, node: pytest.Item, item: PlannedItem, message: str) -> None:
        node.user_properties.extend(
            ItemProperties(
                item.item_id,
                item.model_name,
                item.env,
                item.variant.id,
                item.seed,
                "error",
                error=message,
            ).to_properties()
        )

    # -- reporting (controller side) ---------------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if is_worker(self.config):
            return
        if not (report.when == "call" or (report.when == "setup" and report.failed)):
            return
        record = ItemProperties.from_report(report)
        if record is not None:
            self.records.append(record)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.records:
            return
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.session.terminal import (
            write_markdown_summary,
            write_recomputed,
            write_summary_table,
        )

        write_summary_table(terminalreporter, self.records, self._run_dir)
        write_recomputed(terminalreporter, self.records)
        if self.holm_failures:
            terminalreporter.write_sep("=", "regressions after Holm correction", red=True)
            for message in self.holm_failures:
                terminalreporter.write_line(message)
        if self.baselines_written:
            terminalreporter.write_line(
                "baselines written: " + ", ".join(str(p) for p in self.baselines_written)
            )
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            write_markdown_summary(Path(step_summary), self.records, self._run_dir)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._evaluator is not None:
            self._evaluator.endpoints.close()  # stop this process's servers, release its GPUs
        if is_worker(self.config) or not self.records:
            return
        if self.options.correction == "holm":
            self._apply_holm(session)
        if self.options.update_baselines:
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.gating.baselines import update_baselines

            run_id = self._run_dir.name if self._run_dir else "unknown"
            self.baselines_written = update_baselines(
                self.options.config_dir / "baselines", self.records, run_id
            )

    def _apply_holm(self, session: pytest.Session) -> None:
        """Re-decide every tested verdict with Holm-adjusted p-values; a failure fails the session."""
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.gating.gates import GateVerdict, holm_adjust_verdicts

        tested = [r for r in self.records if r.get("gate")]
        verdicts = [GateVerdict.from_dict(json.loads(record["gate"])) for record in tested]
        for record, verdict in zip(tested, holm_adjust_verdicts(verdicts), strict=True):
            record["verdict"] = verdict.status
            if not verdict.passed:
                self.holm_failures.append(verdict.message)
        if self.holm_failures and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _marker_selects(kwargs: Mapping[str, Any], item: PlannedItem) -> bool:
    for key, value in (("model", item.model_name), ("env", item.env), ("variant", item.variant.id)):
        wanted = kwargs.get(key)
        if wanted is None:
            continue
        allowed = [wanted] if isinstance(wanted, str) else list(wanted)
        if value not in allowed:
            return False
    return True


def _record_properties(node: pytest.Item, item: PlannedItem, result: EvalResult) -> None:
    if any(k == PROPERTY_PREFIX + "item" for k, _ in node.user_properties):
        return
    low, high = result.ci
    verdict = result.verdict
    status = verdict.status if verdict is not None else "no baseline"
    if result.gate_deferred:
        status = f"{status} (Holm pending)"
    properties = ItemProperties(
        item=item.item_id,
        model=item.model_name,
        env=item.env,
        variant=item.variant.id,
        seed=item.seed,
        verdict=status,
        metric=result.metric,
        score=result.score,
        ci_low=low,
        ci_high=high,
        stderr=result.stderr,
        n=result.n,
        errors=result.errors,
        from_store=result.from_store,
        duration_s=result.summary.get("duration_s"),
        model_path=item.model.model,
        baseline=verdict.baseline_value if verdict is not None else None,
        delta=verdict.delta if verdict is not None else None,
        p_value=verdict.p_value if verdict is not None else None,
        rule=verdict.rule if verdict is not None else None,
        gate=json.dumps(verdict.as_dict()) if verdict is not None else None,
        recomputed=result.recompute_reason,
    )
    node.user_properties.extend(properties.to_properties())
