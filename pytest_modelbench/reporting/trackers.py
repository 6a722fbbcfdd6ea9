"""Experiment trackers: each item's score goes to W&B and/or MLflow as it finishes.

``--mb-tracker wandb,mlflow`` registers :class:`TrackerReporter` on the controller, an
implementation of ``pytest_modelbench_item_finished``. One tracker run per pytest session,
named after the run directory; one entry per item (score, CI, stderr, n, errors, verdict) and,
for checkpoint sweeps (``<name>-step<N>`` models), score against the checkpoint step. What a
tracker receives is the item's numbers and names only: no endpoint, no sampling secrets, no
environment, and W&B's own metadata (command line, git, paths, host) is off. A tracker that
cannot start or log is named in one line of the terminal summary and dropped; the benchmark
run goes on (a tracker never fails a gate or changes the exit code).

W&B follows its own settings (``WANDB_MODE=offline``, ``WANDB_DIR``, ``WANDB_ENTITY``...);
MLflow uses ``MLFLOW_TRACKING_URI`` (its default is a local ``mlflow.db``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

import pytest

from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.names import checkpoint_of
from pytest_modelbench.secrets import redact
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.verdict import Verdict

TRACKER_PLUGIN = "modelbench-trackers"
DEFAULT_PROJECT = "modelbench"


@dataclass(frozen=True)
class TrackedItem:
    """One finished item as every tracker logs it (``items.json``, the W&B table)."""

    SCHEMA_VERSION: ClassVar[int] = 1

    item: str  # the item id (model-variant-seed)
    model: str  # the model label (a sweep's ``<name>-step<N>``)
    env: str
    variant: str
    seed: int
    metric: str  # the primary metric's name
    score: float | None  # its value
    ci_low: float | None  # 95% interval
    ci_high: float | None
    stderr: float | None
    n: int  # scored units
    errors: int  # units without a score
    verdict: Verdict  # pass, fail, undecidable, no baseline or error
    baseline: float | None  # the baseline's value, when gated against one
    p_value: float | None
    from_store: bool  # read back from the run store
    family: str | None  # a checkpoint sweep's model name, else None
    step: int | None  # a checkpoint sweep's step, else None
    holm_pending: bool = False  # the verdict waits for --mb-correction holm's final step

    @property
    def verdict_text(self) -> str:
        """The verdict as trackers show it: ``fail (Holm pending)`` while Holm decides."""
        return self.verdict.text(self.holm_pending)

    def as_dict(self) -> dict[str, Any]:
        """The entry of ``items.json`` and the W&B table: the verdict as its text."""
        data = asdict(self)
        del data["holm_pending"]
        data["verdict"] = self.verdict_text
        return data

    @classmethod
    def of(cls, result: EvalResult) -> TrackedItem:
        verdict = result.verdict
        sweep = checkpoint_of(result.model)
        low, high = result.ci
        return cls(
            item=result.item_id,
            model=result.model,
            env=result.env,
            variant=result.variant,
            seed=result.seed,
            metric=result.metric,
            score=result.score,
            ci_low=low,
            ci_high=high,
            stderr=result.stderr,
            n=result.n,
            errors=result.errors,
            verdict=result.status,
            holm_pending=result.gate_deferred,
            baseline=getattr(verdict, "baseline_value", None),
            p_value=getattr(verdict, "p_value", None),
            from_store=result.from_store,
            family=sweep[0] if sweep else None,
            step=sweep[1] if sweep else None,
        )

    @property
    def key(self) -> str:
        """Where this item's numbers go: ``<model>/<variant>/seed<N>`` (``<family>/...`` in a
        sweep, whose steps are the x axis)."""
        return f"{self.family or self.model}/{self.variant}/seed{self.seed}"

    def numbers(self) -> dict[str, float]:
        """The numeric fields, finite values only (trackers refuse NaN)."""
        values = {
            self.metric: self.score,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "stderr": self.stderr,
            "n": self.n,
            "errors": self.errors,
            # decided verdicts only ("no baseline" has none; "... (Holm pending)" not yet)
            "passed": self.verdict is Verdict.PASS
            if self.verdict in (Verdict.PASS, Verdict.FAIL) and not self.holm_pending
            else None,
            "baseline": self.baseline,
            "p_value": self.p_value,
        }
        return {
            name: float(value)
            for name, value in values.items()
            if value is not None and math.isfinite(float(value))
        }


TRACKED_COLUMNS = tuple(f.name for f in dataclasses.fields(TrackedItem) if f.name != "holm_pending")


class Tracker(Protocol):
    """One tracker run for the session."""

    name: str

    def log_item(self, entry: TrackedItem) -> None: ...

    def finish(self, entries: Sequence[TrackedItem], failed: bool) -> None: ...


class WandbTracker:
    """A W&B run: per item ``<key>/<metric>``..., a step axis for sweeps, a table at the end."""

    name = "wandb"

    def __init__(self, project: str, run_name: str, config: Mapping[str, Any]) -> None:
        # lazily: wandb loads only for sessions that asked for it (pytest start-up)
        import wandb

        self._wandb = wandb
        self._run = wandb.init(
            project=project,
            name=run_name,
            config=dict(config),
            job_type="eval",
            reinit="create_new",
            # no metadata: W&B would record the command line (an --api-base-url with a
            # token in it), the git remote, paths, host and user
            settings=wandb.Settings(
                silent=True,
                console="off",
                x_disable_meta=True,
                disable_git=True,
                disable_code=True,
                x_save_requirements=False,
            ),
        )
        self._run.define_metric("checkpoint_step")

    def log_item(self, entry: TrackedItem) -> None:
        values = {f"{entry.key}/{name}": value for name, value in entry.numbers().items()}
        if entry.step is not None:
            self._run.define_metric(f"{entry.key}/*", step_metric="checkpoint_step")
            values["checkpoint_step"] = entry.step
        self._run.log(values)
        self._run.summary[f"{entry.item}/verdict"] = entry.verdict_text

    def finish(self, entries: Sequence[TrackedItem], failed: bool) -> None:
        for entry in entries:  # final verdicts (Holm decides deferred ones at session end)
            self._run.summary[f"{entry.item}/verdict"] = entry.verdict_text
        columns: list[str | int] = list(TRACKED_COLUMNS)
        table = self._wandb.Table(columns=columns)
        for entry in entries:
            row = entry.as_dict()
            table.add_data(*(row[str(c)] for c in columns))
        self._run.log({"items": table})
        self._run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    """An MLflow run: per item ``<key>/<metric>``... at the checkpoint step (0 outside sweeps),
    verdicts as tags, every item in ``items.json`` at the end."""

    name = "mlflow"

    def __init__(self, project: str, run_name: str, config: Mapping[str, Any]) -> None:
        # lazily: mlflow loads only for sessions that asked for it (pytest start-up)
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient()
        experiment = self._client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(project)
        )
        run = self._client.create_run(experiment_id, run_name=run_name, tags={"tool": "modelbench"})
        self._run_id: str = run.info.run_id
        for name, value in config.items():
            self._client.log_param(self._run_id, name, str(value)[:500])

    def log_item(self, entry: TrackedItem) -> None:
        # lazily: mlflow loads only for sessions that asked for it (pytest start-up)
        from mlflow.entities import Metric, RunTag

        step = entry.step if entry.step is not None else 0
        now = int(time.time() * 1000)
        metrics = [
            Metric(_mlflow_key(f"{entry.key}/{name}"), value, now, step)
            for name, value in entry.numbers().items()
        ]
        tags = [RunTag(_mlflow_key(f"verdict/{entry.item}"), entry.verdict_text)]
        self._client.log_batch(self._run_id, metrics=metrics, tags=tags)  # one call per item

    def finish(self, entries: Sequence[TrackedItem], failed: bool) -> None:
        from mlflow.entities import RunTag

        tags = [RunTag(_mlflow_key(f"verdict/{e.item}"), e.verdict_text) for e in entries]
        self._client.log_batch(self._run_id, tags=tags)  # final verdicts (Holm at session end)
        items = {
            "schema_version": TrackedItem.SCHEMA_VERSION,
            "items": [e.as_dict() for e in entries],
        }
        self._client.log_dict(self._run_id, items, "items.json")
        self._client.set_terminated(self._run_id, status="FAILED" if failed else "FINISHED")


def _mlflow_key(name: str) -> str:
    """MLflow keys allow letters, digits, ``_-. /``: anything else becomes ``_``."""
    return "".join(ch if ch.isalnum() or ch in "_-. /" else "_" for ch in name)[:250]


TRACKERS: dict[str, tuple[str, Callable[[str, str, Mapping[str, Any]], Tracker]]] = {
    "wandb": ("wandb", WandbTracker),
    "mlflow": ("mlflow", MlflowTracker),
}


def check_trackers(names: Sequence[str]) -> None:
    """``--mb-tracker`` (names checked by the options): each package importable, else a usage
    error with the install command."""
    for name in names:
        package = TRACKERS[name][0]
        if importlib.util.find_spec(package) is None:
            raise ModelbenchUsageError(
                f"--mb-tracker {name}: the {package} package is not installed: "
                f"pip install 'pytest-modelbench[{name}]'"
            )


class TrackerReporter:
    """Registered on the controller with ``--mb-tracker``: starts the tracker runs with the first
    finished item (a session without items creates none), finishes them with the session's
    final verdicts (after ``--mb-correction holm``) and prints what went wrong in the terminal
    summary: a tracker's trouble is never a warning a ``filterwarnings = error`` could turn
    into a failed session."""

    def __init__(
        self,
        names: Sequence[str],
        project: str,
        run_id: Callable[[], str],
        config: Callable[[], Mapping[str, Any]],
        verdicts: Callable[[], Sequence[EvalResult]],
    ) -> None:
        self.names = tuple(names)
        self.project = project
        self._run_id = run_id
        self._config = config
        self._verdicts = verdicts  # the session's records, with their final verdicts
        self._trackers: list[Tracker] | None = None
        self.entries: list[TrackedItem] = []
        self.problems: list[str] = []

    def _started(self) -> list[Tracker]:
        if self._trackers is None:
            self._trackers = []
            for name in self.names:
                try:
                    self._trackers.append(
                        TRACKERS[name][1](self.project, self._run_id(), self._config())
                    )
                except Exception as exc:  # a tracker's failure must not stop the benchmarks
                    self._problem(name, "could not start a run", exc)
        return self._trackers

    def pytest_modelbench_item_finished(self, result: EvalResult) -> None:
        entry = TrackedItem.of(result)
        self.entries.append(entry)
        for tracker in list(self._started()):
            try:
                tracker.log_item(entry)
            except Exception as exc:  # a tracker's failure must not stop the benchmarks
                self._problem(tracker.name, f"could not log {entry.item}; not logging further", exc)
                self._started().remove(tracker)

    def finish(self, failed: bool) -> None:
        """Close the tracker runs (once), with every item's final verdict."""
        trackers, self._trackers = self._trackers or [], []
        if not trackers:
            return
        final = {result.item_id: result for result in self._verdicts()}
        entries = [
            dataclasses.replace(
                e, verdict=final[e.item].status, holm_pending=final[e.item].gate_deferred
            )
            if e.item in final
            else e
            for e in self.entries
        ]
        for tracker in trackers:
            try:
                tracker.finish(entries, failed)
            except Exception as exc:  # a tracker's failure must not stop the benchmarks
                self._problem(tracker.name, "could not finish its run", exc)

    def pytest_terminal_summary(
        self, terminalreporter: pytest.TerminalReporter, exitstatus: int
    ) -> None:
        self.finish(failed=exitstatus != 0)
        for problem in self.problems:
            terminalreporter.write_line(f"modelbench: {problem}", yellow=True)

    def pytest_unconfigure(self) -> None:
        self.finish(failed=False)  # a session without a terminal summary (-p no:terminal)

    def _problem(self, name: str, what: str, exc: BaseException) -> None:
        text = redact(str(exc)).strip()  # a tracker's server may echo what it was sent
        message = text.splitlines()[0][:300] if text else ""
        self.problems.append(f"--mb-tracker {name}: {what}: {type(exc).__name__}: {message}")


def register(
    config: pytest.Config,
    names: Sequence[str],
    project: str,
    run_id: Callable[[], str],
    run_config: Callable[[], Mapping[str, Any]],
    verdicts: Callable[[], Sequence[EvalResult]],
) -> None:
    """Called by ``plugin.start_session`` on the controller when ``--mb-tracker`` is given."""
    try:
        check_trackers(names)
    except ModelbenchUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(
        TrackerReporter(names, project, run_id, run_config, verdicts), TRACKER_PLUGIN
    )


__all__ = [
    "TRACKER_PLUGIN",
    "TrackedItem",
    "TrackerReporter",
    "check_trackers",
    "register",
]
