"""Read configuration files safely and report every mistake as one line with its fix."""

from __future__ import annotations

import functools
import math
import types
import typing
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from pytest_modelbench.config.schema import (
    QUIET_ERROR,
    BaselineEntrySpec,
    EnvVariantSpec,
    JobFile,
    ModelsFile,
    ModelSpec,
)
from pytest_modelbench.config.variants import expand_variants
from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean, shown_value

if TYPE_CHECKING:
    import yaml


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


MAX_DEPTH = 50
"""Deepest nesting of mappings and lists a configuration file may have."""
MAX_VALUES = 1_000_000
"""Most values a file may expand to (YAML aliases can repeat a subtree many times)."""
MAX_INT_BITS = 256
"""Largest integers a file may hold (larger ones cannot be printed or serialised safely)."""


class _TooDeep(Exception):
    """A document nests deeper than :data:`MAX_DEPTH`."""


@functools.cache
def _loader() -> type[yaml.SafeLoader]:
    """``safe_load``'s loader, stopping at :data:`MAX_DEPTH` levels before recursing deeper."""
    # lazily: a session without configuration files never reads YAML (pytest start-up)
    import yaml

    class _Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.depth >= MAX_DEPTH:
                raise _TooDeep
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return _Loader


def read_yaml(path: Path) -> Any:
    """``yaml.safe_load`` of a file, with parse errors turned into usage errors.

    Besides malformed YAML this refuses what ``safe_load`` builds but nothing
    downstream can use: text that is not UTF-8, nesting deeper than
    :data:`MAX_DEPTH`, aliases that refer to themselves or expand past
    :data:`MAX_VALUES` values, and integers wider than :data:`MAX_INT_BITS` bits.
    """
    # lazily: a session without configuration files never reads YAML (pytest start-up)
    import yaml

    shown = display_path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelbenchUsageError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ModelbenchUsageError(
            f"{shown}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
            "save the file as UTF-8"
        ) from None
    try:
        data = yaml.load(text, Loader=_loader())  # a SafeLoader: no tags that run code
    except _TooDeep:
        raise ModelbenchUsageError(
            f"{shown}: nested too deeply (more than {MAX_DEPTH} levels of mappings or lists)"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = _short(getattr(exc, "problem", None) or str(exc).splitlines()[0], 120)
        hint = "check indentation and quote values containing ':' or '#'"
        if isinstance(exc, yaml.constructor.ConstructorError):
            hint = "tags such as !!python/object are not allowed; write plain values"
        raise ModelbenchUsageError(f"{shown}:{where}: malformed YAML: {problem} ({hint})") from None
    except Exception as exc:
        # safe_load's value constructors fail in many ways: an integer with more digits
        # than Python converts, a !!timestamp that is not one...
        raise ModelbenchUsageError(
            f"{shown}: malformed YAML: a value cannot be read ({_short(str(exc), 120)}); "
            "check numbers, dates and tagged values"
        ) from None
    check_shape(data, shown)
    return data


def check_shape(data: Any, shown: str) -> None:
    """Refuse nesting, self-reference, expansion and integer sizes nothing downstream handles.

    ``shown`` names where the data came from (a file, a flag) in the message.
    """
    sizes: dict[int, int] = {}  # id of a container already measured -> values it expands to

    def measure(node: Any, depth: int, path: tuple[int, ...]) -> int:
        if isinstance(node, int) and not isinstance(node, bool):
            if node.bit_length() > MAX_INT_BITS:
                raise ModelbenchUsageError(
                    f"{shown}: an integer of {node.bit_length()} bits is too large "
                    f"(at most {MAX_INT_BITS} bits)"
                )
            return 1
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in path:
            raise ModelbenchUsageError(
                f"{shown}: a YAML alias refers to a mapping or list that contains it; "
                "a configuration must be a tree"
            )
        if key in sizes:
            return sizes[key]
        if depth > MAX_DEPTH:
            raise ModelbenchUsageError(
                f"{shown}: nested too deeply (more than {MAX_DEPTH} levels of mappings or lists)"
            )
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        total = 1
        for child in children:
            total += measure(child, depth + 1, (*path, key))
            if total > MAX_VALUES:
                raise ModelbenchUsageError(
                    f"{shown}: expands to more than {MAX_VALUES:,} values "
                    "(through YAML aliases); write a smaller file"
                )
        sizes[key] = total
        return total

    measure(data, 0, ())


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


def _plain(value: Any) -> bool:
    """A short printable string, shown as it is in messages (anything else through repr)."""
    return isinstance(value, str) and value.isprintable() and 0 < len(value) <= 60


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_validation_error(
    where: str, model: type[BaseModel], exc: ValidationError, loc_prefix: Sequence[str] = ()
) -> str:
    """One line for the first error of ``exc``: location, key, value, fix."""
    errors = exc.errors()
    # an unknown key explains a "missing" one next to it (a misspelling), so report it first
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [_short(str(p)) for p in err["loc"]]
    key_path = ".".join([*loc_prefix, *loc])
    kind = err["type"]
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if not loc:  # a rule about the mapping as a whole (a model validator)
        return f"{where}: {key_path + ': ' if key_path else ''}{message}"
    if kind == "extra_forbidden":
        valid = _fields_at(model, err["loc"][:-1])
        hint = did_you_mean(loc[-1], valid) or (
            f"; valid keys: {', '.join(valid)}" if valid else ""
        )
        return f"{where}: unknown key {key_path!r}{hint}"
    if kind == "missing":
        return f"{where}: missing required key {key_path!r}"
    if kind == QUIET_ERROR or any(word in loc[-1].lower() for word in _SECRET_WORDS):
        return f"{where}: {key_path}: {message}"  # never echo what may be a credential
    return f"{where}: {key_path}: {message} (got {shown_value(err.get('input'))})"


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
    """``envs/<name>.yaml`` → its variants, each validated (matrix sweeps included)."""
    return _read_env_file(path)[0]


def _read_env_file(path: Path) -> tuple[tuple[EnvVariantSpec, ...], list[str]]:
    """The validated variants of an env file and the ids they expand to."""
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
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        if _plain(raw_id):
            label += f" ({raw_id})"
        if not isinstance(raw, dict):
            raise ModelbenchUsageError(
                f"{shown}: {label}: expected a mapping, got {shown_value(raw)}"
            )
        try:
            variants.append(EnvVariantSpec.model_validate(raw))
        except ValidationError as exc:
            raise ModelbenchUsageError(
                format_validation_error(f"{shown}: {label}", EnvVariantSpec, exc)
            ) from None
    counts = Counter(v.id for v in variants)
    duplicates = sorted(i for i, n in counts.items() if n > 1)
    if duplicates:
        raise ModelbenchUsageError(
            f"{shown}: duplicate variant id {duplicates[0]!r}; ids must be unique"
        )
    expanded: dict[str, str] = {}  # variant id after matrix expansion -> the spec's id
    for spec in variants:
        for variant_id in _expanded_ids(path, spec, shown):
            if variant_id in expanded:
                other = expanded[variant_id]
                how = "twice" if other == spec.id else f"that variant {other!r} has too"
                raise ModelbenchUsageError(
                    f"{shown}: variant {spec.id!r}: the matrix gives the id {variant_id!r} "
                    f"{how}; make matrix_id_format or the values tell the variants apart"
                )
            expanded[variant_id] = spec.id
    return tuple(variants), list(expanded)


MAX_MATRIX = 100_000
"""Most variants one matrix sweep may expand to."""


def _expanded_ids(path: Path, spec: EnvVariantSpec, shown: str) -> list[str]:
    """The ids a spec's matrix expands to, with every way the expansion can fail named."""
    if not spec.matrix:
        return [spec.id]
    combinations = math.prod(len(values) for values in spec.matrix.values())
    if combinations > MAX_MATRIX:
        raise ModelbenchUsageError(
            f"{shown}: variant {spec.id!r}: the matrix expands to {combinations:,} variants "
            f"(at most {MAX_MATRIX:,}); split the sweep"
        )
    try:
        return [v.id for v in expand_variants(path.stem, spec, path, shown)]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ModelbenchUsageError(
            f"{shown}: variant {spec.id!r}: matrix_id_format {spec.matrix_id_format!r} cannot "
            f"be applied to the matrix values: {exc} (use placeholders like {{base}} and "
            "{name} without format specs that do not fit the values)"
        ) from None


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
        name = env_id if _plain(env_id) else shown_value(env_id)
        if not isinstance(raw, dict):
            raise ModelbenchUsageError(
                f"{shown}: {name}: expected a mapping with 'value'/'margin', "
                f"'min' or 'run', got {shown_value(raw)}"
            )
        try:
            entries[str(env_id)] = BaselineEntrySpec.model_validate(raw)
        except ValidationError as exc:
            raise ModelbenchUsageError(
                format_validation_error(f"{shown}: {name}", BaselineEntrySpec, exc)
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
    owners: dict[str, Path] = {}  # variant id -> the env file that defines it
    if env_dir.is_dir():
        for path in sorted(env_dir.glob("*.y*ml")):
            if path.suffix not in (".yaml", ".yml"):
                continue
            if path.stem in envs:
                raise ModelbenchUsageError(
                    f"{display_path(path)}: environment {path.stem!r} is also defined by "
                    f"{display_path(env_paths[path.stem])}; keep one of the two files"
                )
            envs[path.stem], ids = _read_env_file(path)
            env_paths[path.stem] = path
            for variant_id in ids:
                if variant_id in owners:
                    raise ModelbenchUsageError(
                        f"{display_path(path)}: variant id {variant_id!r} is also defined in "
                        f"{display_path(owners[variant_id])}; variant ids must be unique "
                        "across env files (item ids are built from them)"
                    )
                owners[variant_id] = path
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
