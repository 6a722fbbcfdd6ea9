"""lm-eval task specs for ``module: lm_eval:<task>``: names, local YAML files, metric names.

A task YAML is loaded with lm-eval's own loader (``include:`` and ``!function``
work) and its ``dataset_kwargs.data_files`` are resolved relative to the YAML
file, which lm-eval itself does not do (it resolves them from the working
directory). Metric names are lm-eval's result keys: ``<metric>,<filter>``,
e.g. ``exact_match,strict-match`` or ``acc,none``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean
from pytest_modelbench.planning.item import PlannedItem

# lm-eval's default metrics when a task has no metric_list (api/task.py)
_DEFAULT_METRICS = {
    "generate_until": ("exact_match",),
    "multiple_choice": ("acc", "acc_norm"),
    "loglikelihood": ("perplexity", "acc"),
    "loglikelihood_rolling": ("word_perplexity", "byte_perplexity", "bits_per_byte"),
}


@dataclass(frozen=True)
class TaskSpec:
    """What to pass to ``simple_evaluate(tasks=[...])`` and what it will report."""

    name: str  # the task or group name lm-eval reports results under
    spec: str | dict[str, Any]  # a registered name, or the loaded config of a YAML file
    yaml_path: Path | None
    include_path: str | None
    metric_names: tuple[str, ...]  # "<metric>,<filter>", primary first; empty when unknown
    checksum: str  # of the YAML and its data files (part of the item fingerprint)


def is_yaml_path(task: str) -> bool:
    return task.endswith((".yaml", ".yml")) or "/" in task


def find_yaml(task: str, item: PlannedItem) -> Path:
    """The task YAML: absolute, or relative to the working directory, env file or project."""
    path = Path(task).expanduser()
    source = Path(item.variant.source)
    candidates = (
        [path]
        if path.is_absolute()
        else [
            Path.cwd() / path,
            source.parent / path,
            source.parent.parent.parent / path,  # configs/envs/x.yaml → the project root
        ]
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ModelbenchUsageError(
        f"{source.name}: variant {item.variant.id!r}: lm-eval task file {task!r} not found "
        f"(looked in {', '.join(str(c.parent) for c in candidates)}); give a path to a task YAML"
    )


def load_yaml(path: Path) -> dict[str, Any]:
    """A task YAML through lm-eval's loader (``include:`` merged, ``!function`` resolved)."""
    try:
        from lm_eval.tasks._yaml_loader import load_yaml as loader  # lm-eval >= 0.4.10

        config: dict[str, Any] = loader(path, resolve_func=True)
    except ImportError:  # older 0.4.x
        from lm_eval.utils import load_yaml_config

        config = load_yaml_config(str(path))
    return config


def _resolve_files(value: Any, base: Path) -> Any:
    """``data_files`` (a path, a list, or split → path(s)) with relative paths made absolute."""
    if isinstance(value, str):
        if "://" in value or Path(value).is_absolute():
            return value
        candidate = base / value
        return str(candidate) if candidate.exists() or any(base.glob(value)) else value
    if isinstance(value, list):
        return [_resolve_files(v, base) for v in value]
    if isinstance(value, dict):
        return {k: _resolve_files(v, base) for k, v in value.items()}
    return value


def resolve_data_files(config: dict[str, Any], base: Path) -> dict[str, Any]:
    """A copy of ``config`` whose ``dataset_kwargs.data_files`` are relative to ``base``."""
    kwargs = config.get("dataset_kwargs")
    if not isinstance(kwargs, Mapping) or "data_files" not in kwargs:
        return config
    return {
        **config,
        "dataset_kwargs": {**kwargs, "data_files": _resolve_files(kwargs["data_files"], base)},
    }


def _data_paths(config: Mapping[str, Any]) -> list[str]:
    kwargs = config.get("dataset_kwargs")
    files = kwargs.get("data_files") if isinstance(kwargs, Mapping) else None
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk(files)
    return found


def _checksum(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path).encode() + b"\x00")
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"missing")
    return digest.hexdigest()


def metric_names(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``<metric>,<filter>`` result keys a task (or group) reports, in config order."""
    if "aggregate_metric_list" in config:  # a group
        names = []
        for entry in config.get("aggregate_metric_list") or []:
            filters = entry.get("filter_list", "none")
            for flt in [filters] if isinstance(filters, str) else filters:
                names.append(f"{entry['metric']},{flt}")
        return tuple(names)
    metrics = [
        m["metric"] for m in config.get("metric_list") or [] if isinstance(m.get("metric"), str)
    ]
    if not metrics:
        metrics = list(_DEFAULT_METRICS.get(str(config.get("output_type", "generate_until")), ()))
    filters = [f["name"] for f in config.get("filter_list") or [] if "name" in f] or ["none"]
    return tuple(f"{m},{f}" for m in metrics for f in filters)


@functools.lru_cache(maxsize=4)
def task_manager(include_path: str | None, include_defaults: bool = True) -> Any:
    """A cached ``TaskManager`` (indexing lm-eval's ~15k built-in tasks takes seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=include_defaults)


def _index_entry(manager: Any, name: str) -> tuple[bool, Path | None, dict[str, Any] | None]:
    """(registered?, its YAML file, its config if the index holds it) for a task name.

    lm-eval >= 0.4.12 indexes ``Entry`` objects (``yaml_path``, ``cfg``); 0.4.10-0.4.11
    index dicts (``{"type", "yaml_path"}``).
    """
    index = getattr(manager, "task_index", None)
    entry = index.get(name) if isinstance(index, Mapping) else None
    if entry is None:
        return False, None, None
    if isinstance(entry, Mapping):
        raw = entry.get("yaml_path")
        yaml_file = (
            Path(raw) if isinstance(raw, (str, Path)) and str(raw).endswith("yaml") else None
        )
        return True, yaml_file, None
    raw = getattr(entry, "yaml_path", None)
    cfg = getattr(entry, "cfg", None)
    return True, Path(raw) if raw else None, dict(cfg) if cfg is not None else None


def _registered_config(manager: Any, name: str) -> dict[str, Any] | None:
    registered, yaml_file, cfg = _index_entry(manager, name)
    if not registered:
        return None
    if cfg is not None:
        return cfg
    if yaml_file is not None:
        return load_yaml(yaml_file)
    return {}  # a python task or a tag: metrics are known when it runs


@functools.lru_cache(maxsize=64)
def _task_spec_cached(task: str, yaml_path: str | None, include_path: str | None) -> TaskSpec:
    if yaml_path is not None:
        path = Path(yaml_path)
        raw = load_yaml(path)
        config = resolve_data_files(raw, path.parent)
        name = str(config.get("task") or config.get("group") or path.stem)
        files = [path, *(Path(p) for p in _data_paths(config) if Path(p).is_file())]
        return TaskSpec(name, config, path, include_path, metric_names(config), _checksum(files))
    manager = task_manager(include_path)
    registered = _registered_config(manager, task)
    if registered is None:
        known = list(getattr(manager, "all_tasks", ()))
        raise ModelbenchUsageError(
            f"lm-eval has no task, group or tag named {task!r}{did_you_mean(task, known)} "
            "(list them with 'lm_eval ls tasks'; for your own tasks give a YAML path, "
            "module: lm_eval:path/to/task.yaml, or env_args.include_path)"
        )
    _, yaml_file, _ = _index_entry(manager, task)
    relative = [p for p in _data_paths(registered) if "://" not in p and not Path(p).is_absolute()]
    if yaml_file and relative and "group" not in registered:  # a local task found by name
        return _task_spec_cached(task, str(yaml_file), include_path)
    return TaskSpec(task, task, None, include_path, metric_names(registered), "")


def task_spec(task: str, item: PlannedItem, include_path: str | None) -> TaskSpec:
    """The task for this item (YAML paths resolved against the item's config location)."""
    if is_yaml_path(task):
        return _task_spec_cached(task, str(find_yaml(task, item)), include_path)
    return _task_spec_cached(task, None, include_path)
