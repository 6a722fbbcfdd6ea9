"""Where baselines are decided: find an item's baseline, gate its score, write new baselines.

Baselines live in ``configs/baselines/<model>.yaml`` keyed by variant id (or
environment name); a ``run:`` entry or ``--baseline-run RUN_ID`` makes the
gate a paired per-example comparison against that run's journal.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import os
import subprocess
import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pytest_modelbench.config.loading import display_path, load_baseline_file
from pytest_modelbench.config.schema import BaselineEntrySpec
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.gating import early, gates
from pytest_modelbench.names import safe_component
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.store.records import ItemStatus
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runstore import RunStore
from pytest_modelbench.store.setup import SetupRecord, compare_setups
from pytest_modelbench.store.summary import MetricSummary

# a reference item in one of these states has not finished (its summary may be an older one)
_UNFINISHED = (ItemStatus.RUNNING, ItemStatus.INTERRUPTED, ItemStatus.ERROR)


class ItemKeys(Protocol):
    """What names an item: an :class:`EvalResult`, or a planned item's :class:`ItemRef`."""

    @property
    def item_id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def env(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def seed(self) -> int: ...


@dataclass(frozen=True)
class ItemRef:
    """A planned item's names, before it has a result."""

    item_id: str
    model: str
    env: str
    variant: str
    seed: int


@dataclass(frozen=True)
class Reference:
    """A reference run's per-example scores for one item, and what the verdict says of them."""

    scores: dict[str, float]
    model: str | None = None  # the reference's model, when it is not this item's
    unfinished: int | None = None  # rows of an unfinished item (--mb-allow-unfinished-baseline)
    setup: SetupRecord | None = None  # the setup saved with the reference item's record


class BaselineBook:
    """Reads baseline files on demand (a broken file fails only the items that need it)."""

    def __init__(
        self,
        baseline_dir: Path,
        runs_parent: Path,
        *,
        require: bool = False,
        baseline_run: str | None = None,
        alpha: float = gates.DEFAULT_ALPHA,
        baseline_model: str | None = None,
        allow_unfinished: bool = False,
        stop_early: bool = False,
        require_same_setup: bool = False,
    ) -> None:
        self.baseline_dir = baseline_dir
        self.runs_parent = runs_parent
        self.require = require
        self.baseline_run = baseline_run
        self.alpha = alpha
        self.baseline_model = baseline_model  # --mb-baseline-model
        self.allow_unfinished = allow_unfinished  # --mb-allow-unfinished-baseline
        self.stop_early = stop_early  # --mb-stop-early
        self.family: int | None = None  # --mb-correction holm: the family's size m
        self.require_same_setup = require_same_setup  # --mb-require-same-setup
        self._files: dict[str, dict[str, BaselineEntrySpec]] = {}

    def path_for(self, model: str) -> Path:
        return self.baseline_dir / f"{safe_component(model)}.yaml"

    def entries(self, model: str) -> dict[str, BaselineEntrySpec]:
        if model not in self._files:
            path = self.path_for(model)
            self._files[model] = load_baseline_file(path) if path.exists() else {}
        return self._files[model]

    def entry_for(self, result: ItemKeys) -> tuple[BaselineEntrySpec | None, str]:
        entries = self.entries(result.model)
        for key in (result.variant, result.env):
            if key in entries:
                return entries[key], key
        return None, ""

    def planned_baseline_setup(self, item: PlannedItem) -> SetupRecord | None:
        """Before a run (``--collect-only``): the setup of ``item``'s baseline, from its baseline
        file or from the same item of the run it names (``--baseline-run``, ``run:``); None when
        unknown or the file is broken (the run will say why)."""
        try:
            entries = self.entries(item.model_name)
        except ModelbenchUsageError:
            return None
        spec = entries.get(item.variant.id) or entries.get(item.env)
        run_id = self.baseline_run or (spec.run if spec else None)
        if run_id:
            return EvalResult.stored_setup(
                RunStore(self.runs_parent / run_id).item(item.item_id).directory
            )
        return SetupRecord.from_json(spec.setup) if spec is not None else None

    def reference_scores(self, run_id: str, result: ItemKeys, metric: str) -> Reference:
        """Per-example scores (mean over rollouts) of the same variant and seed in run
        ``run_id``: the examples its summary covers, from a finished item only (unless
        ``allow_unfinished``); its model is :meth:`_reference_item`'s."""
        run_dir = self.runs_parent / run_id
        if not run_dir.is_dir():
            raise EvaluationError(
                f"--baseline-run / run: {run_id!r}: no such run directory {display_path(run_dir)} "
                "(list runs with 'ls runs/' or 'modelbench runs')"
            )
        item_id, model, status = self._reference_item(run_id, RunStore(run_dir), result)
        item = RunStore(run_dir).item(item_id)
        summary = item.read_summary()
        finished = summary is not None and summary.finished
        finished = finished and ItemStatus.of(status) not in _UNFINISHED
        if finished and summary is not None and summary.stopped_early:
            finished, status = False, "stopped early (--mb-stop-early)"  # a prefix
        rows = item.selected_rows(summary) if finished and summary else list(item.journal.latest())
        sums: dict[str, list[float]] = defaultdict(list)
        for row in rows:
            value = (row.get("metrics") or {}).get(metric)
            if not row.get("error") and value is not None:
                sums[str(row["example_id"])].append(float(value))
        if not finished and not self.allow_unfinished:
            raise EvaluationError(
                f"reference run {run_id!r}: {item_id} is unfinished ({status or 'no summary'}, "
                f"{len(sums)} example(s) scored in its journal), so it cannot stand for that "
                f"model: finish it (pytest ... --mb-run-id {run_id}) or pass "
                "--mb-allow-unfinished-baseline to compare on the examples it has"
            )
        if not sums:
            raise EvaluationError(
                f"reference run {run_id!r} has no finished results for {item_id}; "
                "run that item there first or drop --baseline-run"
            )
        scores = {key: sum(values) / len(values) for key, values in sums.items()}
        return Reference(
            scores,
            model=model if model != result.model else None,
            unfinished=None if finished else len(rows),
            setup=EvalResult.stored_setup(item.directory),
        )

    def _reference_item(
        self, run_id: str, store: RunStore, result: ItemKeys
    ) -> tuple[str, str, str | None]:
        """(item id, model, manifest status) of ``result``'s variant and seed in the reference
        run: the same model's item, else ``--mb-baseline-model``'s, else the run's one model's
        (a checkpoint compared with yesterday's under another name)."""
        entries = {
            item_id: entry
            for item_id, entry in (store.read_manifest().get("items") or {}).items()
            if isinstance(entry, dict)
        }

        def find(model: str) -> str | None:
            for item_id, entry in entries.items():
                if (entry.get("model"), entry.get("variant"), entry.get("seed")) == (
                    model,
                    result.variant,
                    result.seed,
                ):
                    return str(item_id)
            return None

        models = sorted({str(e["model"]) for e in entries.values() if e.get("model")})
        wanted = self.baseline_model
        if wanted is None:
            if find(result.model) is not None or len(models) != 1:
                wanted = result.model
            else:
                wanted = models[0]  # the run holds one model: pair by variant and seed
        item_id = find(wanted)
        if item_id is not None:
            status = entries[item_id].get("status")
            return item_id, wanted, None if status is None else str(status)
        if not entries:  # a run without a manifest: its directory by this item's id
            return result.item_id, result.model, None
        if wanted not in models:
            flag = "--mb-baseline-model" if self.baseline_model else "pass --mb-baseline-model"
            raise EvaluationError(
                f"reference run {run_id!r} has no model {wanted!r} (it holds "
                f"{', '.join(models) or 'none'}): {flag} NAME names the reference's model"
            )
        raise EvaluationError(
            f"reference run {run_id!r} has no item of {wanted} for {result.variant} seed "
            f"{result.seed}; run that item there first or drop --baseline-run"
        )

    def stop_rule(
        self, item: ItemKeys, metric: str, family: int | None = None, rollouts: int = 1
    ) -> early.StopRule | None:
        """``--mb-stop-early``: when ``item``'s verdict is certain, from its baseline (a value
        on a 0..1 scale, or a reference run's scores); None where no rule applies (no
        baseline, a floor, a reference that cannot be read: the gate then says why).
        ``family``: Holm's m, over which the early decisions' alpha is split; ``rollouts``
        per example (a baseline's n counts rows, the rule examples)."""
        spec, _ = self.entry_for(item)
        metric = (spec.metric if spec and spec.metric else None) or metric
        run_id = self.baseline_run or (spec.run if spec else None)
        alpha = spec.alpha if spec is not None and spec.alpha is not None else self.alpha
        alpha /= max(1, family or 1)
        margin = float(spec.margin or 0.0) if spec else 0.0
        if run_id:
            try:
                reference = self.reference_scores(run_id, item, metric)
            except (EvaluationError, OSError):
                return None
            return early.paired_rule(reference.scores, margin, alpha, run_id, metric)
        if spec is None or spec.value is None:
            return None
        return early.value_rule(
            spec.value,
            margin,
            alpha,
            baseline_n=max(1, spec.n // max(1, rollouts)) if spec.n else None,
            baseline_stderr=spec.stderr,
            metric=metric,
        )

    def _check_stopped(self, result: EvalResult, metric: str, stopped: Mapping[str, Any]) -> None:
        """A decision made while the item ran stands only under the rule it was made by (the
        same baseline, margin and alpha): otherwise one line, never a stale verdict."""
        entry = result.summary.metric(metric) or MetricSummary()
        rows, examples = int(entry.n or 0), int(entry.examples or 0)
        rule = self.stop_rule(result, metric, self.family, max(1, rows // max(1, examples)))
        if rule is None or stopped.get("rule_key") != rule.key:
            raise EvaluationError(
                f"{result.item_id}: stopped early ({stopped.get('decision')} certain at "
                f"{stopped.get('n_used')} of {stopped.get('n_planned')} examples) under another "
                "stop rule than its baseline gives now; re-run with --mb-stop-early to continue "
                "it under this one, or without it to run it to its end"
            )

    def current(self, result: EvalResult, metric: str) -> gates.ScoreSummary:
        entry = result.summary.metric(metric) or MetricSummary()
        value = entry.value
        if value is None:
            raise EvaluationError(
                f"{result.item_id}: metric {metric!r} was not computed; available: "
                f"{', '.join(result.summary.metrics or {}) or '(none)'}"
            )
        stderr = entry.stderr  # None: undefined (one example), not zero
        return gates.ScoreSummary(
            metric=metric,
            value=float(value),
            n=int(entry.examples or entry.n or 0),
            stderr=math.nan if stderr is None else float(stderr),
            ci_low=entry.ci_low,
            ci_high=entry.ci_high,
            subject=result.variant,
        )

    def verdict(self, result: EvalResult) -> gates.GateVerdict:
        spec, key = self.entry_for(result)
        metric = (spec.metric if spec and spec.metric else None) or result.metric
        current = self.current(result, metric)
        run_id = self.baseline_run or (spec.run if spec else None)
        if spec is None and run_id is None:
            return gates.no_baseline_verdict(current, required=self.require)
        path = display_path(self.path_for(result.model)) if spec else None
        if spec is not None:
            self._check_range(spec, f"{path}: {key}", result, metric)
        data = spec.model_dump() if spec else {"run": run_id}
        entry = gates.BaselineEntry.from_mapping({**data, "run": run_id}, metric=metric, path=path)
        stopped = result.summary.stopped_early
        if isinstance(stopped, Mapping) and stopped.get("decision"):  # decided while it ran
            self._check_stopped(result, metric, stopped)
            return gates.stopped_verdict(current, stopped, entry)
        if result.summary.stop_rule:  # early failures spent part of its alpha
            entry_alpha = entry.alpha if entry.alpha is not None else self.alpha
            entry = dataclasses.replace(entry, alpha=early.fixed_alpha(entry_alpha))
        reference = self.reference_scores(run_id, result, metric) if run_id else None
        rule = gates.rule_for(
            entry,
            reference_scores=reference.scores if reference else None,
            reference_model=reference.model if reference else None,
            reference_unfinished=reference.unfinished if reference else None,
            alpha=self.alpha,
            required=self.require,
            current_run=result.directory.parent.name or None,
            item=result.item_id,
        )
        rows = self.example_scores(result, metric)
        errored = self.errored_examples(result)
        if errored:  # no error may move the verdict: gated with them counted wrong
            verdict = gates.gate_with_errors(rule, current, rows, errored)
        else:
            verdict = rule.evaluate(current, None if isinstance(rule, gates.MinRule) else rows)
        verdict = gates.require_decided(verdict) if self.require else verdict
        baseline_setup = (
            reference.setup
            if reference is not None
            else SetupRecord.from_json(spec.setup if spec else None)
        )
        difference = compare_setups(result.setup, baseline_setup).line
        return gates.with_setup(verdict, difference, require=self.require_same_setup)

    def _check_range(
        self, spec: BaselineEntrySpec, where: str, result: EvalResult, metric: str
    ) -> None:
        """A ``value`` or ``min`` outside 0..1 for a metric that scores each example 0 or 1
        (accuracy, exact match): a percentage written for a fraction (``65`` for 0.65), which
        would fail (or pass) every run whatever it scored."""
        bad = [(n, v) for n, v in (("value", spec.value), ("min", spec.min)) if v is not None]
        bad = [(n, v) for n, v in bad if not 0.0 <= v <= 1.0]
        if not bad:
            return
        scores = [v for values in self.example_scores(result, metric).values() for v in values]
        if not scores or any(v not in (0.0, 1.0) for v in scores):
            return  # not a 0/1 metric (or nothing scored): any number may be meant
        name, value = bad[0]
        hint = f"; write {value / 100:g} for {value:g}%" if 1.0 < value <= 100.0 else ""
        raise ModelbenchUsageError(
            f"{where}: {name} {value:g} is outside 0..1, but {metric} scores each example 0 or 1, "
            f"so its score is a fraction{hint}"
        )

    @staticmethod
    def errored_examples(result: EvalResult) -> list[str]:
        """The example id of each errored row the summary covers (one per rollout): left out
        of the score, so the gate counts them both ways."""
        if not result.errors:
            return []
        return [str(row["example_id"]) for row in result.rows() if row.get("error")]

    @staticmethod
    def example_scores(result: EvalResult, metric: str) -> dict[str, list[float]]:
        """Each example's scores of ``metric``, one per rollout, from the item's rows (rows
        with an error have none): the value gate picks its test from them (0/1 or not,
        rollouts or not), the paired gate compares their means."""
        scores: dict[str, list[float]] = defaultdict(list)
        for row in result.rows():
            value = (row.get("metrics") or {}).get(metric)
            if not row.get("error") and value is not None:
                scores[str(row["example_id"])].append(float(value))
        return dict(scores)


def _git_revision(path: str | None) -> str | None:
    if not path or not Path(path).exists():
        return None
    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(Path(path) if Path(path).is_dir() else Path(path).parent),
                "rev-parse",
                "HEAD",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class BaselineWarning(UserWarning):
    """A baseline was left as it was; the message says why and how to replace it."""


def update_baselines(
    baseline_dir: Path,
    records: Sequence[EvalResult],
    run_id: str,
    *,
    replace: bool = False,
    errors: list[str] | None = None,
    include_failed: bool = False,
    skipped: list[str] | None = None,
) -> list[Path]:
    """Write this run's scores as baselines, one file per model, keeping comments and other entries;
    returns the files written.

    Several seeds of one variant are averaged (their n summed). An entry measured on more
    examples than this run is kept (with a warning) unless ``replace`` (``--mb-replace-baselines``).
    A file that cannot be read or written (a read-only ``configs/``) is one line in ``errors``
    (a :class:`BaselineWarning` without it); the other files are still written. A variant
    any of whose items failed its gate is left as it was, with one line in ``skipped`` (a
    regressed model must not become its own baseline), unless ``include_failed``
    (``--mb-update-failed-baselines``).
    """
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    yaml = YAML()
    yaml.preserve_quotes = True
    by_model = _to_write(baseline_dir, records, include_failed, skipped)
    written = []
    today = _dt.date.today().isoformat()
    for model, variants in sorted(by_model.items()):
        path = baseline_dir / f"{safe_component(model)}.yaml"
        try:
            document = (
                yaml.load(path.read_text(encoding="utf-8")) if path.exists() else None
            ) or {}
        except (OSError, YAMLError) as exc:
            reason = (
                exc.strerror
                if isinstance(exc, OSError)
                else f"not valid YAML ({getattr(exc, 'problem', None) or exc})"
            )
            _not_written(path, f"cannot read it: {reason}", errors)
            continue
        changed = False  # every entry kept: the file is left as it is
        for variant, recs in sorted(variants.items()):
            values = [r.score for r in recs if r.score is not None]
            n = sum(r.n for r in recs)
            stderrs = [r.stderr for r in recs if r.stderr is not None]
            stderr = (sum(s * s for s in stderrs) ** 0.5 / len(stderrs)) if stderrs else None
            entry = document.get(variant)
            if entry is None:
                entry = {}
                document[variant] = entry
            elif _keeps_larger(entry, n, replace, display_path(path), variant):
                continue
            entry["metric"] = recs[0].metric
            entry["value"] = round(sum(values) / len(values), 6)
            entry.setdefault("margin", 0.0)
            entry["n"] = n
            if stderr is not None:
                entry["stderr"] = round(stderr, 6)
            entry["source"] = f"modelbench run {run_id}"
            entry["run_id"] = run_id
            entry["date"] = today
            revision = _git_revision(recs[0].model_path)
            if revision:
                entry["revision"] = revision
            setup = recs[0].setup
            if setup is not None:  # what produced the value, compared before later verdicts
                entry["setup"] = setup.to_json()
            else:
                entry.pop("setup", None)
            entry.pop("min", None)  # stale rules of the entry this value replaces
            entry.pop("run", None)
            changed = True
        if not changed:
            continue
        import io

        # lazily: loaded only when baselines are written (pytest start-up)
        from pytest_modelbench.store.files import atomic_write_text

        buffer = io.StringIO()
        yaml.dump(document, buffer)
        try:
            atomic_write_text(path, buffer.getvalue())  # creates baseline_dir when missing
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            _not_written(path, f"cannot write it: {reason}", errors)
            continue
        written.append(path)
    return written


def _to_write(
    baseline_dir: Path,
    records: Sequence[EvalResult],
    include_failed: bool,
    skipped: list[str] | None,
) -> dict[str, dict[str, list[EvalResult]]]:
    """Scored records by model and variant, without variants any of whose items failed its
    gate (one line each in ``skipped``, a :class:`BaselineWarning` without it) unless
    ``include_failed``."""
    by_model: dict[str, dict[str, list[EvalResult]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if record.score is not None:
            by_model[record.model][record.variant].append(record)
    for model, variants in by_model.items():
        for variant, recs in list(variants.items()):
            stopped = [r.item_id for r in recs if r.summary.stopped_early]
            if stopped:  # a prefix chosen by optional stopping: its mean is no baseline
                del variants[variant]
                _say(
                    f"--update-baselines: kept {variant!r} in "
                    f"{display_path(baseline_dir / f'{safe_component(model)}.yaml')}: "
                    f"{', '.join(stopped)} stopped early (--mb-stop-early); run it to its end "
                    "to write its baseline",
                    skipped,
                )
                continue
            if include_failed:
                continue
            failed = [r.item_id for r in recs if r.verdict is not None and not r.verdict.passed]
            if not failed:
                continue
            del variants[variant]
            line = (
                f"--update-baselines: kept {variant!r} in "
                f"{display_path(baseline_dir / f'{safe_component(model)}.yaml')}: "
                f"{', '.join(failed)} failed its gate (pass --mb-update-failed-baselines to "
                "write a failed score as the baseline)"
            )
            _say(line, skipped)
    return by_model


def _say(line: str, lines: list[str] | None) -> None:
    """One line into ``lines`` (the session prints them), or a :class:`BaselineWarning`."""
    if lines is None:
        warnings.warn(BaselineWarning(line), stacklevel=4)
    else:
        lines.append(line)


def _not_written(path: Path, reason: str, errors: list[str] | None) -> None:
    line = (
        f"--update-baselines: {display_path(path)} not updated, {reason}; make "
        f"{display_path(path.parent)} writable and re-run the same command (finished items are "
        "reused, so only the baselines are written)"
    )
    _say(line, errors)


def _keeps_larger(entry: Mapping[str, Any], n: int, replace: bool, shown: str, key: str) -> bool:
    """Whether ``entry`` (a curated baseline) was measured on more examples than ``n``: then it
    is kept, with a warning, unless ``replace``."""
    old_n = entry.get("n")
    if replace or not isinstance(old_n, int) or old_n <= n:
        return False
    warnings.warn(
        BaselineWarning(
            f"{shown}: kept {key!r} (n={old_n}); this run measured only n={n} "
            f"(--num-examples?). Pass --mb-replace-baselines to replace it anyway"
        ),
        stacklevel=3,
    )
    return True
