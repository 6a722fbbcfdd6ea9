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

from collections.abc import Sequence
from typing import TypeVar

from pytest_modelbench.suites.contract import Example

__all__ = ["STRATUM_KEY", "select_examples", "stratified_order"]

STRATUM_KEY = "subject"
E = TypeVar("E", bound=Example)


def stratified_order(examples: Sequence[E]) -> list[E]:
    """``examples`` interleaved across subjects in proportion to their sizes (see the module)."""
    by_stratum: dict[str, list[int]] = {}
    for index, example in enumerate(examples):
        by_stratum.setdefault(str(example.meta.get(STRATUM_KEY)), []).append(index)
    if len(by_stratum) < 2:
        return list(examples)
    placed: list[tuple[float, int, int]] = []
    for rank, indexes in enumerate(by_stratum.values()):  # rank: first appearance in the file
        size = len(indexes)
        placed += [((i + 0.5) / size, rank, index) for i, index in enumerate(indexes)]
    placed.sort()
    return [examples[index] for _, _, index in placed]


def select_examples(examples: Sequence[E], limit: int) -> list[E]:
    """The examples that ``num_examples: limit`` runs (all of them when ``limit`` < 0)."""
    if limit < 0 or limit >= len(examples):
        return list(examples)
    if not any(STRATUM_KEY in example.meta for example in examples):
        return list(examples[:limit])
    return stratified_order(examples)[:limit]
