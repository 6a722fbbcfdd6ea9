"""``module: verifiers:<id>``: a v1 taskset or a classic environment, whichever the id names.

The id names a Python package (``owner/my-env`` → ``my_env``). A package whose ``__all__``
exports a ``verifiers.v1.Taskset`` (or one of verifiers' own tasksets) runs as a v1 taskset
(:mod:`.verifiers_v1`, verifiers 0.4, the current line; also 0.3.x's ``verifiers.v1``); one
that exports ``load_environment`` runs as a classic environment (:mod:`.verifiers_classic`,
verifiers 0.1.14 to 0.3.x). The line is decided once per id and process, on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_modelbench.backends.protocol import ItemContext, Outcome
from pytest_modelbench.backends.verifiers_common import line_of, require_extra
from pytest_modelbench.planning.item import PlannedItem

if TYPE_CHECKING:  # each line's module is imported when an item of it runs (start-up time)
    from pytest_modelbench.backends.verifiers_classic import ClassicEnvironment
    from pytest_modelbench.backends.verifiers_v1 import V1Taskset


class VerifiersBackend:
    """Delegates every call to the v1 or classic implementation for this id."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self.name = f"verifiers:{env_id}"
        self._impl: V1Taskset | ClassicEnvironment | None = None

    def implementation(self, item: PlannedItem) -> V1Taskset | ClassicEnvironment:
        if self._impl is None:
            where = f"{Path(item.variant.source).name}: variant {item.variant.id!r}"
            if line_of(self.env_id, where) == "v1":
                # lazily: each line's module imports only what it runs (pytest start-up)
                from pytest_modelbench.backends.verifiers_v1 import V1Taskset

                self._impl = V1Taskset(self.env_id)
            else:
                from pytest_modelbench.backends.verifiers_classic import ClassicEnvironment

                self._impl = ClassicEnvironment(self.env_id)
        return self._impl

    @property
    def selects_by_example(self) -> bool:
        """v1 journals answer by task whatever ``--num-examples`` says (known once loaded)."""
        return bool(getattr(self._impl, "selects_by_example", False))

    def primary_metric(self, item: PlannedItem) -> str:
        metric: str = self.implementation(item).primary_metric(item)
        return metric

    def fingerprint_parts(self, item: PlannedItem) -> dict[str, Any]:
        parts: dict[str, Any] = self.implementation(item).fingerprint_parts(item)
        return parts

    def count_examples(self, item: PlannedItem) -> int:
        return int(self.implementation(item).count_examples(item))

    def tokens_per_example(self) -> int:
        return 800

    def evaluate(self, ctx: ItemContext) -> Outcome:
        outcome: Outcome = self.implementation(ctx.item).evaluate(ctx)
        return outcome


__all__ = ["VerifiersBackend", "require_extra"]
