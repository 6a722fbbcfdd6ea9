"""Which examples ``--num-examples N`` runs: a deterministic, seed-independent, stratified prefix.

The first N rows of a file are not a sample of it when the file is sorted by subject (MMLU's
first 100 rows are all abstract algebra). Examples that carry a ``subject`` in their ``meta``
are therefore interleaved: each subject's examples keep their file order, and the i-th of a
subject with m examples is placed at (i + ½) / m along the whole. The first N of that order
take every subject in proportion to its size (within one example), the same N gives the same
examples in every run, on every machine and for every seed (so seeds and models are compared
on the same questions), and a larger N keeps the smaller N's examples (so a journal's answers
are reused). Examples without subjects are taken in file order, as ``lm_eval --limit`` does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar, overload

from pytest_modelbench.suites.contract import Example

__all__ = ["STRATUM_KEY", "LazyExamples", "sample_order", "select_examples", "stratified_order"]

STRATUM_KEY = "subject"
ORDER_SALT = b"modelbench sample order 1:"  # a new salt would be a new order for every item
E = TypeVar("E", bound=Example)


class LazyExamples(Sequence[E]):
    """Examples made on first access, each one's stratum (``str(meta["subject"])``) known
    without making it: ``--num-examples 2000`` of MMLU's 14,042 questions formats 2000
    prompts, not all of them (about 0.1 s of every such item's start-up, and its exit)."""

    def __init__(self, strata: Sequence[str], make: Callable[[int], E]) -> None:
        self.strata = strata
        self._make = make
        self._made: list[E | None] = [None] * len(strata)
        self._order: list[int] | None = None

    def stratified(self) -> list[int]:
        """:func:`stratified_order`'s positions, computed once (each item selects twice)."""
        if self._order is None:
            self._order = _stratified_indexes(self.strata)
        return self._order

    def __len__(self) -> int:
        return len(self._made)

    @overload
    def __getitem__(self, index: int) -> E: ...

    @overload
    def __getitem__(self, index: slice) -> list[E]: ...

    def __getitem__(self, index: int | slice) -> E | list[E]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        made = self._made[index]  # IndexError past the end, as a tuple's
        if made is None:
            # two threads may make the same example at once: equal values, either is kept
            made = self._made[index] = self._make(range(len(self))[index])
        return made

    def __eq__(self, other: object) -> bool:
        """Equal to a sequence of equal examples, as the tuple of them it stands for is."""
        if not isinstance(other, (LazyExamples, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))


def _stratified_indexes(strata: Sequence[str]) -> list[int]:
    """Positions of ``strata`` interleaved across strata in proportion to their sizes."""
    by_stratum: dict[str, list[int]] = {}
    for index, stratum in enumerate(strata):
        by_stratum.setdefault(stratum, []).append(index)
    if len(by_stratum) < 2:
        return list(range(len(strata)))
    # Ordered by (place, rank, index), rank being a stratum's first appearance in the file: a
    # stable sort on the place alone, of the indexes listed by rank and then in file order,
    # gives that order (places tie only across strata) and compares floats, not tuples
    # (MMLU: 3 ms instead of 9).
    indexes: list[int] = []
    places: list[float] = []
    for members in by_stratum.values():
        size = len(members)
        indexes += members
        places += [(i + 0.5) / size for i in range(size)]
    return [indexes[at] for at in sorted(range(len(indexes)), key=places.__getitem__)]


def stratified_order(examples: Sequence[E]) -> list[E]:
    """``examples`` interleaved across subjects in proportion to their sizes (see the module)."""
    strata = [str(example.meta.get(STRATUM_KEY)) for example in examples]
    return [examples[index] for index in _stratified_indexes(strata)]


def select_examples(examples: Sequence[E], limit: int) -> list[E]:
    """The examples that ``num_examples: limit`` runs (all of them when ``limit`` < 0)."""
    if limit < 0 or limit >= len(examples):
        return list(examples)
    if isinstance(examples, LazyExamples):  # the same choice, making only the chosen ones
        return [examples[index] for index in examples.stratified()[:limit]]
    if not any(STRATUM_KEY in example.meta for example in examples):
        return list(examples[:limit])
    return stratified_order(examples)[:limit]


def sample_order(examples: Sequence[E]) -> list[E]:
    """The selected examples in a seeded uniformly random order: sorted by a hash of each id
    (the same order on every machine, run and resume). ``--mb-stop-early`` reads results in
    this order, so any prefix of it is a simple random sample of the item. Not stratified:
    interleaving subjects by their size puts the large ones first, and an early decision would
    read a biased sample (the subjects' share evens out as the prefix grows either way)."""
    return sorted(
        examples, key=lambda example: hashlib.sha256(ORDER_SALT + example.id.encode()).digest()
    )
