"""A planned item (model × variant × seed with resolved settings) and the session's plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_modelbench.config import ModelSpec, Variant


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
        return {**self.model.sampling_args, **self.variant.sampling_args}


@dataclass(frozen=True)
class Plan:
    items: tuple[PlannedItem, ...]
    run_name: str
    run_parent: Path | None  # from a job file's output_dir

    def by_id(self) -> dict[str, PlannedItem]:
        return {item.item_id: item for item in self.items}
