"""Expand env specs (with ``matrix`` sweeps) into concrete variants."""

from __future__ import annotations

import itertools
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_modelbench.config.schema import EnvVariantSpec, split_request_args
from pytest_modelbench.errors import ModelbenchUsageError

SAMPLING_PREFIX = "sampling_args."


@dataclass(frozen=True)
class Variant:
    """A concrete environment variant: what one item evaluates (besides model and seed)."""

    env: str
    id: str
    module: str
    num_examples: int
    rollouts_per_example: int
    env_args: Mapping[str, Any]
    sampling_args: Mapping[str, Any]
    seeds: tuple[int, ...]
    metric: str | None
    cost: float | None
    source: Path
    matrix_values: Mapping[str, Any] = field(default_factory=dict)
    # sampling_args.extra_headers, kept apart from the sampling args (which are written to the
    # run store): sent with every request of the variant's items
    extra_headers: Mapping[str, str] = field(default_factory=dict, repr=False)


def _placeholder(key: str) -> str:
    return key.removeprefix(SAMPLING_PREFIX).replace(".", "_")


def _format_fields(fmt: str) -> list[str]:
    try:
        return [name for _, name, _, _ in string.Formatter().parse(fmt) if name is not None]
    except ValueError as exc:
        raise ValueError(f"matrix_id_format {fmt!r} is not a valid format string: {exc}") from None


def expand_variants(
    env: str, spec: EnvVariantSpec, source: Path, shown: str, default_seeds: tuple[int, ...] = (0,)
) -> list[Variant]:
    """One variant, or one per matrix combination with ids from ``matrix_id_format``."""
    seeds = tuple(spec.seeds) if spec.seeds else default_seeds
    base: dict[str, Any] = dict(
        env=env,
        module=spec.module,
        num_examples=spec.num_examples,
        rollouts_per_example=spec.rollouts_per_example,
        seeds=seeds,
        metric=spec.metric,
        cost=spec.cost,
        source=source,
    )
    where = f"{shown}: variant {spec.id!r}"
    if not spec.matrix:
        sampling_args, headers = _request_args(spec.sampling_args, where)
        return [
            Variant(
                id=spec.id,
                env_args=dict(spec.env_args),
                sampling_args=sampling_args,
                extra_headers=headers,
                **base,
            )
        ]
    keys = list(spec.matrix)
    for key in keys:
        if not spec.matrix[key]:
            raise ModelbenchUsageError(f"{where}: matrix.{key} is empty; give at least one value")
    fmt = spec.matrix_id_format or "{base}-" + "-".join(
        f"{_placeholder(k)}{{{_placeholder(k)}}}" for k in keys
    )
    try:
        fields = _format_fields(fmt)
    except ValueError as exc:
        raise ModelbenchUsageError(f"{where}: {exc}") from None
    allowed = {"base", *(_placeholder(k) for k in keys)}
    for name in fields:
        if name not in allowed:
            raise ModelbenchUsageError(
                f"{where}: matrix_id_format {fmt!r} uses unknown placeholder {{{name}}}; "
                f"available: {', '.join('{' + a + '}' for a in sorted(allowed))}"
            )
    missing = [k for k in keys if len(spec.matrix[k]) > 1 and _placeholder(k) not in fields]
    if missing:
        raise ModelbenchUsageError(
            f"{where}: matrix_id_format {fmt!r} does not mention {{{_placeholder(missing[0])}}}, "
            f"so the sweep over {missing[0]} would give duplicate ids; add it to the format"
        )
    variants: list[Variant] = []
    for combo in itertools.product(*(spec.matrix[k] for k in keys)):
        values = dict(zip(keys, combo, strict=True))
        env_args = dict(spec.env_args)
        sampling_args = dict(spec.sampling_args)
        for key, value in values.items():
            if key.startswith(SAMPLING_PREFIX):
                sampling_args[key.removeprefix(SAMPLING_PREFIX)] = value
            else:
                env_args[key] = value
        variant_id = fmt.format(base=spec.id, **{_placeholder(k): v for k, v in values.items()})
        body, headers = _request_args(sampling_args, where)
        variants.append(
            Variant(
                id=variant_id,
                env_args=env_args,
                sampling_args=body,
                extra_headers=headers,
                matrix_values=values,
                **base,
            )
        )
    return variants


def _request_args(args: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``extra_body`` merged into the sampling args, ``extra_headers`` apart (a matrix may set
    either: checked here, where the file is named)."""
    try:
        return split_request_args(args)
    except ValueError as exc:
        raise ModelbenchUsageError(f"{where}: sampling_args: {exc}") from None
