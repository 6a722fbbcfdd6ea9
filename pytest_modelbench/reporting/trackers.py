"""Experiment trackers: each item's score goes to W&B and/or MLflow as it finishes.

``--mb-tracker wandb,mlflow`` registers :class:`TrackerReporter` on the controller, an
implementation of ``pytest_modelbench_item_finished``. One tracker run per pytest session,
named after the run directory; one entry per item (score, CI, stderr, n, errors, verdict) and,
for checkpoint sweeps (``<name>-step<N>`` models), score against the checkpoint step. What a
tracker receives is the item's numbers and names only: no endpoint, no sampling secrets, no
environment. A tracker that cannot start or log warns once and is dropped; the benchmark run
goes on (a tracker never fails a gate).

W&B follows its own settings (``WANDB_MODE=offline``, ``WANDB_DIR``, ``WANDB_ENTITY``...);
MLflow uses ``MLFLOW_TRACKING_URI`` (its default is a local ``mlflow.db``).
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import pytest

from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.names import checkpoint_of
from pytest_modelbench.secrets import redact
from pytest_modelbench.store.result import EvalResult

TRACKER_PLUGIN = "modelbench-trackers"
DEFAULT_PROJECT = "modelbench"


class TrackerWarning(UserWarning):
    """A tracker could not start or log; the run goes on without it."""


@dataclass(frozen=True)
class TrackedItem:
    """One finished item as every tracker logs it."""

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
    verdict: str  # "pass", "fail", "no baseline", or "... (Holm pending)"
    baseline: float | None  # the baseline's value, when gated against one
    p_value: float | None
    from_store: bool  # read back from the run store
    family: str | None  # a checkpoint sweep's model name, else None
    step: int | None  # a checkpoint sweep's step, else None

    @classmethod
    def of(cls, result: EvalResult) -> TrackedItem:
        verdict = result.verdict
        status = verdict.status if verdict is not None else "no baseline"
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
            verdict=f"{status} (Holm pending)" if result.gate_deferred else status,
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
            "passed": None if self.verdict.startswith("no baseline") else self.verdict == "pass",
            "baseline": self.baseline,
            "p_value": self.p_value,
        }
        return {
            name: float(value)
            for name, value in values.items()
            if value is not None and math.isfinite(float(value))
        }


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
            settings=wandb.Settings(silent=True, console="off"),
        )
        self._run.define_metric("checkpoint_step")

    def log_item(self, entry: TrackedItem) -> None:
        values = {f"{entry.key}/{name}": value for name, value in entry.numbers().items()}
        if entry.step is not None:
            self._run.define_metric(f"{entry.key}/*", step_metric="checkpoint_step")
            values["checkpoint_step"] = entry.step
        self._run.log(values)
        self._run.summary[f"{entry.item}/verdict"] = entry.verdict

    def finish(self, entries: Sequence[TrackedItem], failed: bool) -> None:
        columns: list[str | int] = list(TrackedItem.__dataclass_fields__)
        table = self._wandb.Table(columns=columns)
        for entry in entries:
            row = asdict(entry)
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
        step = entry.step if entry.step is not None else 0
        for name, value in entry.numbers().items():
            self._client.log_metric(
                self._run_id, _mlflow_key(f"{entry.key}/{name}"), value, step=step
            )
        self._client.set_tag(self._run_id, _mlflow_key(f"verdict/{entry.item}"), entry.verdict)

    def finish(self, entries: Sequence[TrackedItem], failed: bool) -> None:
        self._client.log_dict(self._run_id, {"items": [asdict(e) for e in entries]}, "items.json")
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
    finished item (a session without items creates none) and closes them at session end."""

    def __init__(
        self,
        names: Sequence[str],
        project: str,
        run_id: Callable[[], str],
        config: Callable[[], Mapping[str, Any]],
    ) -> None:
        self.names = tuple(names)
        self.project = project
        self._run_id = run_id
        self._config = config
        self._trackers: list[Tracker] | None = None
        self.entries: list[TrackedItem] = []

    def _started(self) -> list[Tracker]:
        if self._trackers is None:
            self._trackers = []
            for name in self.names:
                try:
                    self._trackers.append(
                        TRACKERS[name][1](self.project, self._run_id(), self._config())
                    )
                except Exception as exc:  # a tracker's failure must not stop the benchmarks
                    _warn(name, "could not start a run", exc)
        return self._trackers

    def pytest_modelbench_item_finished(self, result: EvalResult) -> None:
        entry = TrackedItem.of(result)
        self.entries.append(entry)
        for tracker in list(self._started()):
            try:
                tracker.log_item(entry)
            except Exception as exc:  # a tracker's failure must not stop the benchmarks
                _warn(tracker.name, f"could not log {entry.item}; not logging further", exc)
                self._started().remove(tracker)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        failed = session.exitstatus not in (pytest.ExitCode.OK, 0)
        for tracker in self._trackers or ():
            try:
                tracker.finish(self.entries, failed)
            except Exception as exc:  # a tracker's failure must not stop the benchmarks
                _warn(tracker.name, "could not finish its run", exc)
        self._trackers = None


def register(
    config: pytest.Config,
    names: Sequence[str],
    project: str,
    run_id: Callable[[], str],
    run_config: Callable[[], Mapping[str, Any]],
) -> None:
    """Called by ``plugin.start_session`` on the controller when ``--mb-tracker`` is given."""
    try:
        check_trackers(names)
    except ModelbenchUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(
        TrackerReporter(names, project, run_id, run_config), TRACKER_PLUGIN
    )


def _warn(name: str, what: str, exc: BaseException) -> None:
    text = redact(str(exc)).strip()  # a tracker's server may echo what it was sent
    message = text.splitlines()[0][:300] if text else ""
    warnings.warn(
        TrackerWarning(f"--mb-tracker {name}: {what}: {type(exc).__name__}: {message}"),
        stacklevel=2,
    )


__all__ = [
    "TRACKER_PLUGIN",
    "TrackedItem",
    "TrackerReporter",
    "TrackerWarning",
    "check_trackers",
    "register",
]
