"""The benchmark suite: one item per model × environment variant × seed.

Run with ``pytest benchmarks/ --model NAME``; each item evaluates (or reads
from the run store) and passes or fails against its baseline.
"""

from __future__ import annotations

from pytest_modelbench import EvalResult


def test_benchmark(mb_eval: EvalResult) -> None:
    """Gate the item's primary metric on its baseline (no baseline: passes, marked as such)."""
    mb_eval.check_baseline()
