"""The plan's checks before anything runs: each a usage error that names the file, key or flag
to fix, rather than an item error at run time."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_modelbench.config import ConfigSet
from pytest_modelbench.config.loading import display_path
from pytest_modelbench.config.variants import SAMPLING_PREFIX
from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean, one_of, shown_value
from pytest_modelbench.planning.item import Plan, PlannedItem

if TYPE_CHECKING:  # imported where used, lazily, for pytest's start-up time
    from pytest_modelbench.backends.protocol import Backend
    from pytest_modelbench.config.schema import ServeSpec


def check_engines(plan: Plan, config_set: ConfigSet, tx: Sequence[str] = ()) -> None:
    """Each served model's ``serve.engine`` and its settings: a usage error now, naming
    the model's key in models.yaml, rather than an item error when its server starts.
    ``serve.command``'s program on ``PATH`` and SGLang's package are looked for here only
    when every xdist worker (``--tx``) runs on this node with this interpreter: another node
    or interpreter may have them where this one does not (its server start says so there)."""
    # lazily: loaded only when this runs, not at every pytest start-up
    from pytest_modelbench.serving.engines import engine_for

    checked: set[str] = set()
    for item in plan.items:
        spec = item.model
        if spec.api_base_url or spec.solutions or item.model_name in checked:
            continue
        checked.add(item.model_name)
        try:
            engine = engine_for(spec.serve)
            if spec.serve and _workers_run_here(tx):
                _check_here(engine, spec.serve)
        except ValueError as exc:
            where = display_path(config_set.models_path)
            raise ModelbenchUsageError(f"{where}: models.{item.model_name}.{exc}") from None


def _workers_run_here(tx: Sequence[str]) -> bool:
    """Whether every xdist worker runs on this node with this interpreter, so that what this
    process finds (a program on ``PATH``, an engine's package) is what they will find."""
    from pytest_modelbench.serving.exchange import tx_nodes

    return not tx_nodes(tx)[1] and not any("python=" in str(spec) for spec in tx)


def _check_here(engine: object, serve: ServeSpec) -> None:
    """What only this node can say of an engine: ``serve.command``'s program is on ``PATH``,
    SGLang is installed (ValueError naming the key otherwise)."""
    from pytest_modelbench.serving.command import CommandEngine, check_program
    from pytest_modelbench.serving.sglang import SglangEngine

    if isinstance(engine, CommandEngine):
        check_program(serve.command or ())
    elif isinstance(engine, SglangEngine):
        engine.check_here(serve)


def check_env_args(
    plan: Plan, given: Mapping[str, Any], backend_for: Callable[[str], Backend | None]
) -> None:
    """``--env-args`` keys, and env args a ``matrix:`` sweep adds, that a planned variant's
    module refuses: a usage error now that names the flag or the env file's matrix key,
    rather than an item error at run time."""
    checked: set[str] = set()
    for item in plan.items:
        swept = [k for k in item.variant.matrix_values if not k.startswith(SAMPLING_PREFIX)]
        if (not given and not swept) or item.variant.id in checked:
            continue
        checked.add(item.variant.id)
        message = _env_args_refusal(backend_for(item.variant.module), item)
        if message is None:
            continue
        # the flag is to blame when the refusal names one of its keys, the matrix when it
        # names one of its keys; any other mistake of the env file itself is reported where
        # the file is named, when the item runs
        if any(repr(key) in message for key in given):
            raise ModelbenchUsageError(
                f"--env-args: variant {item.variant.id!r} (module {item.variant.module}): {message}"
            )
        blamed = next((key for key in swept if repr(key) in message), None)
        if blamed is not None:
            raise ModelbenchUsageError(
                f"{display_path(item.variant.source)}: variant {item.variant.id!r}: "
                f"matrix.{blamed}: {message}"
            )


def check_baseline_metrics(
    plan: Plan, config_set: ConfigSet, backend_for: Callable[[str], Backend | None]
) -> None:
    """A baseline entry's ``metric`` that the item's suite never computes: a usage error
    now, rather than an item error after its requests. Only suites that declare all their
    metrics are checked (not verifiers, lm-eval, nor suites with aggregate metrics)."""
    # lazily: loaded only when this runs, not at every pytest start-up
    from pytest_modelbench.config.loading import load_baseline_file
    from pytest_modelbench.names import safe_component

    files: dict[Path, dict[str, Any]] = {}
    for item in plan.items:
        path = config_set.root / "baselines" / f"{safe_component(item.model_name)}.yaml"
        if path not in files:  # (each file was validated when the plan was checked)
            files[path] = load_baseline_file(path) if path.is_file() else {}
        entries = files[path]
        key = next((k for k in (item.variant.id, item.env) if k in entries), None)
        metric = entries[key].metric if key is not None else None
        if metric is None:
            continue
        suite = getattr(backend_for(item.variant.module), "suite", None)
        known = getattr(suite, "metrics", None)
        if not isinstance(known, tuple) or hasattr(suite, "aggregate"):
            continue
        if metric not in known:
            raise ModelbenchUsageError(
                f"{display_path(path)}: {key}: metric {shown_value(metric)} is not computed "
                f"by {item.variant.module}{did_you_mean(metric, known)}; it computes "
                f"{one_of(known)}"
            )


def _env_args_refusal(backend: Backend | None, item: PlannedItem) -> str | None:
    """The backend's own complaint about the item's env args, or None when it accepts them
    (or cannot check them before running: the verifiers and lm-eval backends)."""
    suite = getattr(backend, "suite", None)  # built-in suites and jsonl
    if suite is None:
        return None
    # built-in suites check their declared args without loading data; jsonl checks when it
    # reads its file (cached for the run)
    check = getattr(suite, "parse_args", None)
    try:
        if check is not None:
            check(item.variant.env_args)
        else:
            suite.examples(item.variant.env_args, item.seed)
    except ValueError as exc:  # SuiteArgumentError
        message = str(exc)
        for prefix in (f"{suite.name}: ", "env_args: "):
            message = message.removeprefix(prefix)
        return message
    return None
