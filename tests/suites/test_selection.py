"""``--num-examples N``: which examples a subset holds (deterministic, seed-stable, stratified)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_modelbench.suites import load_suite
from pytest_modelbench.suites.contract import Example
from pytest_modelbench.suites.selection import _stratified_indexes, select_examples


def _examples(suite: str, seed: int = 0) -> list[Example]:
    return list(load_suite(suite).examples({}, seed))


def _subjects(examples: list[Example]) -> Counter[str]:
    return Counter(str(e.meta["subject"]) for e in examples)


def test_mmlu_subset_spans_the_subjects_in_proportion() -> None:
    everything = _examples("mmlu")
    chosen = select_examples(everything, 570)
    sizes = _subjects(everything)
    counts = _subjects(chosen)
    assert len(chosen) == 570
    assert set(counts) == set(sizes)  # all 57 subjects, not the first rows of abstract algebra
    for subject, size in sizes.items():
        share = 570 * size / len(everything)
        assert abs(counts[subject] - share) <= 1, (subject, counts[subject], share)


def test_subset_is_the_same_for_every_seed_and_call() -> None:
    a = [e.id for e in select_examples(_examples("mmlu-medical", seed=0), 100)]
    b = [e.id for e in select_examples(_examples("mmlu-medical", seed=7), 100)]
    assert a == b == [e.id for e in select_examples(_examples("mmlu-medical", seed=0), 100)]


@pytest.mark.parametrize("suite", ["mmlu", "medmcqa", "gsm8k"])
def test_a_larger_subset_keeps_the_smaller_one(suite: str) -> None:
    everything = _examples(suite)
    small = {e.id for e in select_examples(everything, 40)}
    large = {e.id for e in select_examples(everything, 120)}
    assert small < large


def test_suites_without_subjects_take_the_first_rows_like_lm_eval_limit() -> None:
    everything = _examples("gsm8k")
    assert select_examples(everything, 25) == everything[:25]


def test_no_limit_or_a_large_one_keeps_file_order() -> None:
    everything = _examples("mmlu-medical")
    assert select_examples(everything, -1) == everything
    assert select_examples(everything, len(everything) + 5) == everything


def test_within_a_subject_file_order_is_kept() -> None:
    chosen = select_examples(_examples("mmlu"), 1000)
    positions = {e.id: i for i, e in enumerate(_examples("mmlu"))}
    by_subject: dict[str, list[int]] = {}
    for example in chosen:
        by_subject.setdefault(str(example.meta["subject"]), []).append(positions[example.id])
    assert all(p == sorted(p) for p in by_subject.values())


def _by_place_rank_index(strata: list[str]) -> list[int]:
    """The order's definition: the i-th of m at (i + ½) / m, then the stratum's first appearance
    in the file, then file order."""
    ranks: dict[str, int] = {}
    sizes = Counter(strata)
    seen: Counter[str] = Counter()
    placed = []
    for index, stratum in enumerate(strata):
        ranks.setdefault(stratum, len(ranks))
        placed.append(((seen[stratum] + 0.5) / sizes[stratum], ranks[stratum], index))
        seen[stratum] += 1
    return [index for _, _, index in sorted(placed)]


@given(st.lists(st.sampled_from("abcdefg"), max_size=60))
def test_the_order_is_by_place_then_first_appearance_then_file_order(strata: list[str]) -> None:
    assert _stratified_indexes(strata) == _by_place_rank_index(strata)


@pytest.mark.parametrize("suite", ["mmlu", "medmcqa"])
def test_the_order_of_a_suite_is_by_place_then_first_appearance(suite: str) -> None:
    strata = [str(e.meta["subject"]) for e in _examples(suite)]
    assert _stratified_indexes(strata) == _by_place_rank_index(strata)
