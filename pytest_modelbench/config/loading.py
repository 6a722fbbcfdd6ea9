"""Read configuration files safely and report every mistake as one line with its fix."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from pytest_modelbench.config.schema import (
    BaselineEntrySpec,
    EnvVariantSpec,
    JobFile,
    ModelsFile,
    ModelSpec,
)
from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean


@dataclass(frozen=True)
class ConfigSet:
    """Everything under the config directory, validated.

    ``envs`` maps an environment name (the file stem of ``envs/<name>.yaml``)
    to its variant specs; ``baseline_files`` maps a model name to its file
    (read on demand by the gates, so a broken baseline never blocks collection).
    """

    root: Path
    models: Mapping[str, ModelSpec]
    models_path: Path
    envs: Mapping[str, tuple[EnvVariantSpec, ...]]
    env_paths: Mapping[str, Path]
    baseline_files: Mapping[str, Path] = field(default_factory=dict)

    def display(self, path: Path) -> str:
        """A path as users wrote it (relative to the working directory when possible)."""
        return display_path(path)


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_yaml(path: Path) -> Any:
    """``yaml.safe_load`` of a file, with parse errors turned into usage errors."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelbenchUsageError(f"{display_path(path)}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ModelbenchUsageError(
            f"{display_path(path)}:{where}: malformed YAML: {problem} "
            "(check indentation and quote values containing ':' or '#')"
        ) from None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/Union to the BaseModel member, if any."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
            inner = _unwrap(arg)
            if inner is not arg:
                return inner
        return annotation
    return annotation


def _fields_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """Names of the fields valid at ``loc`` (for did-you-mean on unknown keys)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = current.model_fields.get(str(part))
            if info is None:
                return []
            current = info.annotation
            continue
        origin = get_origin(current)
        args = get_args(current)
        if origin in (dict, Mapping, typing.Dict) and len(args) == 2:  # noqa: UP006
            current = args[1]
        elif origin in (list, tuple, Sequence) and args:
            current = args[0]
        else:
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


_SECRET_WORDS = ("key", "token", "secret", "password")


def _describe_input(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_validation_error(
    where: str, model: type[BaseModel], exc: ValidationError, loc_prefix: Sequence[str] = ()
) -> str:
    """One line for the first error of ``exc``: location, key, value, fix."""
    errors = exc.errors()
    # an unknown key explains a "missing" one next to it (a misspelling), so report it first
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(p) for p in err["loc"]]
    key_path = ".".join([*loc_prefix, *loc])
    kind = err["type"]
    if kind == "extra_forbidden":
        valid = _fields_at(model, err["loc"][:-1])
        hint = did_you_mean(loc[-1], valid) or (
            f"; valid keys: {', '.join(valid)}" if valid else ""
        )
        return f"{where}: unknown key {key_path!r}{hint}"
    if kind == "missing":
        return f"{where}: missing required key {key_path!r}"
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if any(word in loc[-1].lower() for word in _SECRET_WORDS):
        return f"{where}: {key_path}: {message}"  # never echo what may be a credential
    return f"{where}: {key_path}: {message} (got {_describe_input(err.get('input'))})"


def load_models_file(path: Path) -> dict[str, ModelSpec]:
    """``models.yaml`` → name → spec (an absent file means no named models)."""
    if not path.exists():
        return {}
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ModelbenchUsageError(
            f"{display_path(path)}: expected a mapping with a 'models:' key, got {type(data).__name__}"
        )
    try:
        return dict(ModelsFile.model_validate(data).models)
    except ValidationError as exc:
        raise ModelbenchUsageError(
            format_validation_error(display_path(path), ModelsFile, exc)
        ) from None


def load_env_file(path: Path) -> tuple[EnvVariantSpec, ...]:
    """``envs/<name>.yaml`` → its variants, each validated."""
    data = read_yaml(path)
    shown = display_path(path)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise ModelbenchUsageError(
            f"{shown}: expected a list of variants (each a mapping with 'id' and 'module'), "
            f"got {type(data).__name__}"
        )
    variants: list[EnvVariantSpec] = []
    for index, raw in enumerate(data, start=1):
        label = f"variant {index}"
        if isinstance(raw, dict) and isinstance(raw.get("id"), str):
            label += f" ({raw['id']})"
        if not isinstance(raw, dict):
            raise ModelbenchUsageError(f"{shown}: {label}: expected a mapping, got {raw!r}")
        try:
            variants.append(EnvVariantSpec.model_validate(raw))
        except ValidationError as exc:
            raise ModelbenchUsageError(
                format_validation_error(f"{shown}: {label}", EnvVariantSpec, exc)
            ) from None
    ids = [v.id for v in variants]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ModelbenchUsageError(
            f"{shown}: duplicate variant id {duplicates[0]!r}; ids must be unique"
        )
    return tuple(variants)


def load_baseline_file(path: Path) -> dict[str, BaselineEntrySpec]:
    """``baselines/<model>.yaml`` → environment/variant id → entry."""
    data = read_yaml(path)
    shown = display_path(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ModelbenchUsageError(
            f"{shown}: expected a mapping of environment id → baseline entry, got {type(data).__name__}"
        )
    entries: dict[str, BaselineEntrySpec] = {}
    for env_id, raw in data.items():
        if not isinstance(raw, dict):
            raise ModelbenchUsageError(
                f"{shown}: {env_id}: expected a mapping with 'value'/'margin', 'min' or 'run', got {raw!r}"
            )
        try:
            entries[str(env_id)] = BaselineEntrySpec.model_validate(raw)
        except ValidationError as exc:
            raise ModelbenchUsageError(
                format_validation_error(f"{shown}: {env_id}", BaselineEntrySpec, exc)
            ) from None
    return entries


def load_job_file(path: Path) -> JobFile:
    """``job-<name>.yaml`` validated."""
    if not path.exists():
        raise ModelbenchUsageError(f"--mb-config: file not found: {display_path(path)}")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ModelbenchUsageError(
            f"{display_path(path)}: expected a mapping with 'name' and 'jobs', got {type(data).__name__}"
        )
    try:
        return JobFile.model_validate(data)
    except ValidationError as exc:
        raise ModelbenchUsageError(
            format_validation_error(display_path(path), JobFile, exc)
        ) from None


def load_config_set(root: Path) -> ConfigSet:
    """Load and validate the whole config directory."""
    models_path = root / "models.yaml"
    models = load_models_file(models_path)
    envs: dict[str, tuple[EnvVariantSpec, ...]] = {}
    env_paths: dict[str, Path] = {}
    env_dir = root / "envs"
    if env_dir.is_dir():
        for path in sorted(env_dir.glob("*.y*ml")):
            if path.suffix not in (".yaml", ".yml"):
                continue
            envs[path.stem] = load_env_file(path)
            env_paths[path.stem] = path
    baseline_dir = root / "baselines"
    baseline_files: dict[str, Path] = {}
    if baseline_dir.is_dir():
        for path in sorted(baseline_dir.glob("*.y*ml")):
            baseline_files[path.stem] = path
    return ConfigSet(
        root=root,
        models=models,
        models_path=models_path,
        envs=envs,
        env_paths=env_paths,
        baseline_files=baseline_files,
    )
