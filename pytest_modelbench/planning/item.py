"""A planned item (model × variant × seed with resolved settings), its id, and the session's plan."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_modelbench.config import ModelSpec, Variant
from pytest_modelbench.config.schema import sampling_over
from pytest_modelbench.names import short_hash

ItemKey = tuple[str, str, str, int]
"""What tells items apart: model name, environment, variant id, seed."""

MAX_LISTED = 3  # ids a note names before "and N more"


@dataclass(frozen=True)
class PlannedItem:
    """One pytest item: a model evaluated on one variant with one seed."""

    item_id: str
    model_name: str
    model: ModelSpec
    variant: Variant
    seed: int
    num_examples: int  # -1 = all

    @property
    def env(self) -> str:
        return self.variant.env

    def sampling_args(self) -> dict[str, Any]:
        """Model sampling args, overridden by the variant's (CLI overrides are already merged)."""
        args = sampling_over(self.model.sampling_args, self.variant.sampling_args)
        if self.model.max_tokens is not None:  # the model's budget beats the environment's
            args = sampling_over(args, {"max_tokens": self.model.max_tokens})
        return args


@dataclass(frozen=True)
class Plan:
    items: tuple[PlannedItem, ...]
    run_name: str
    run_parent: Path | None  # from a job file's output_dir
    notes: tuple[str, ...] = ()
    """One line each, for the user: why the plan has fewer items than models × variants × seeds,
    or why some item ids carry a ``+hash``."""

    def by_id(self) -> dict[str, PlannedItem]:
        """``{item id: item}``. The item id is ``mb_item``'s parametrize id, as pytest writes it
        into node ids after :func:`~pytest_modelbench.names.param_id`."""
        return {item.item_id: item for item in self.items}


def readable_item_id(model_name: str, variant_id: str, seed: int) -> str:
    """``<model>-<variant>-seed<seed>``: the id users read and type (``-k``), and the name of the
    item's directory in existing run stores."""
    return f"{model_name}-{variant_id}-seed{seed}"


def assign_item_ids(keys: Sequence[ItemKey]) -> tuple[dict[ItemKey, str], list[str]]:
    """Each of the distinct ``keys``' item id, and one note per set of names whose readable ids
    collide (model ``x-y`` × variant ``z`` and model ``x`` × variant ``y-z``).

    An item keeps its readable id unless another item has the same one; then each of them gets
    ``+`` and a hash of its whole key. A readable id ends in ``seed<N>``, never in ``+`` and hex
    digits, so a hashed id never equals a readable one, and hashed ids differ by their hashes.
    ``+``, unlike the store's ``~``, is a character that ``-k`` accepts and the run store keeps
    in directory names.
    """
    by_readable: dict[str, list[ItemKey]] = {}
    for key in keys:
        by_readable.setdefault(readable_item_id(key[0], key[2], key[3]), []).append(key)
    ids: dict[ItemKey, str] = {}
    clashes: dict[tuple[tuple[str, str, str], ...], tuple[list[str], list[str]]] = {}
    for readable, group in by_readable.items():
        if len(group) == 1:
            ids[group[0]] = readable
            continue
        hashed = _hashed(readable, group)
        ids.update(hashed)
        names = tuple(dict.fromkeys((model, env, variant) for model, env, variant, _ in group))
        readables, clashed = clashes.setdefault(names, ([], []))
        readables.append(readable)
        clashed.extend(hashed[key] for key in group)
    notes = [_clash_note(names, *shown) for names, shown in clashes.items()]
    return ids, notes


def _hashed(readable: str, group: list[ItemKey]) -> dict[ItemKey, str]:
    """``<readable>+<hash of the key>``; the full SHA-256 should 12 hex digits ever coincide."""
    for digits in (12, 64):
        hashed = {key: f"{readable}+{short_hash(json.dumps(key), digits)}" for key in group}
        if len(set(hashed.values())) == len(group):
            break
    return hashed


def _clash_note(
    names: tuple[tuple[str, str, str], ...], readables: list[str], ids: list[str]
) -> str:
    pairs = [(model, variant) for model, _, variant in names]
    shown = [
        f"model {model!r} with variant {variant!r}"
        + (f" (env {env!r})" if pairs.count((model, variant)) > 1 else "")
        for model, env, variant in names
    ]
    both = "both" if len(names) == 2 else "all"
    return (
        f"{' and '.join(shown)} {both} give the item id{'s' if len(readables) > 1 else ''} "
        f"{listed(readables)}; to tell them apart their ids get a +hash: {listed(ids)}"
    )


def listed(ids: Sequence[str]) -> str:
    """The first few ``ids``, comma-separated, then how many more."""
    more = f" and {len(ids) - MAX_LISTED} more" if len(ids) > MAX_LISTED else ""
    return ", ".join(ids[:MAX_LISTED]) + more
