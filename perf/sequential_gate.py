"""``--mb-stop-early`` by simulation with known truth: false certain verdicts, examples used,
and power at the end against the fixed-n gate.

Each repetition draws n_planned 0/1 scores with a known true accuracy, in the sample's order,
and feeds them one at a time to the early-stop rule (``gating.early``: two anytime-valid
betting tests); an item not certain by its last example is decided by the fixed-n gate (the
exact binomial test against the exact baseline, or exact McNemar for the paired gate). The
fixed-n gate alone is run on the same draws, so power is compared on the same data.

* value gate, exact baseline 0.65: a collapse (true 0.10), a clear regression and a clear
  improvement (0.55, 0.75), no change with margin 0.05 and with margin 0.01, and the true
  score exactly at baseline - margin (the hardest case for false certain verdicts);
* paired gate against a reference run of accuracy 0.70: the same model (true change 0) and a
  10-point drop (the new run keeps each reference answer with probability 0.8, else answers
  afresh at its own accuracy);
* under Holm over 20 items at the boundary: each item's early decisions at alpha / 20, and
  the share of sessions with any false certain verdict.

``python perf/sequential_gate.py`` prints the Markdown tables of docs/gating.md and
PERFORMANCE.md (``--reps``, default 1000 per cell).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

from pytest_modelbench.gating import stats
from pytest_modelbench.gating.early import (
    EarlyStopper,
    StopRule,
    fixed_alpha,
    paired_rule,
    value_rule,
)

ALPHA = 0.05
SIZES = (20, 100, 500, 2000)


@dataclass
class Cell:
    regression_certain: int = 0
    fine_certain: int = 0
    used: int = 0
    planned: int = 0
    fail_with_rule: int = 0
    fail_fixed: int = 0
    reps: int = 0

    def add(self, stopper: EarlyStopper, n: int, *, fixed: bool, after: bool) -> None:
        """One repetition: the rule's decision, else the fixed-n gate after it (``after``);
        ``fixed``: today's gate alone on the same draws."""
        self.reps += 1
        self.planned += n
        self.used += stopper.used
        self.fail_fixed += fixed
        if stopper.decision == "regression":
            self.regression_certain += 1
            self.fail_with_rule += 1
        elif stopper.decision == "no regression":
            self.fine_certain += 1
        else:
            self.fail_with_rule += after

    def row(self, label: str, n: int) -> str:
        r = self.reps
        return (
            f"| {label} | {n} | {100 * self.regression_certain / r:.1f}% | "
            f"{100 * self.fine_certain / r:.1f}% | {100 * self.used / self.planned:.1f}% | "
            f"{100 * self.fail_with_rule / r:.1f}% | {100 * self.fail_fixed / r:.1f}% |"
        )


def _feed(rule: StopRule, scores: list[float]) -> EarlyStopper:
    ids = [str(i) for i in range(len(scores))]
    stopper = EarlyStopper(rule, ids, 1, "m")
    for i, score in enumerate(scores):
        if stopper.add({"example_id": ids[i], "metrics": {"m": score}}) is not None:
            break
    return stopper


def value_cell(truth: float, baseline: float, margin: float, n: int, reps: int, seed: int) -> Cell:
    rng = random.Random(seed)
    cell = Cell()
    rule = value_rule(baseline, margin, ALPHA)
    assert rule is not None
    for _ in range(reps):
        scores = [1.0 if rng.random() < truth else 0.0 for _ in range(n)]
        stopper = _feed(rule, scores)
        p = stats.exact_binomial_test(sum(scores), n, baseline, margin, ALPHA).p_value
        fixed = p is not None and p < ALPHA  # today's gate
        after = p is not None and p < fixed_alpha(ALPHA)  # the gate after the rule
        cell.add(stopper, n, fixed=fixed, after=after)
    return cell


def paired_cell(drop: float, n: int, reps: int, seed: int, margin: float = 0.0) -> Cell:
    rng = random.Random(seed)
    cell = Cell()
    for _ in range(reps):
        ref = [1.0 if rng.random() < 0.70 else 0.0 for _ in range(n)]
        # keep each reference answer with probability 0.8, else answer afresh at q, so the new
        # run's accuracy is 0.8 * 0.70 + 0.2 q = 0.70 - drop
        q = (0.14 - drop) / 0.2
        new = [r if rng.random() < 0.8 else (1.0 if rng.random() < q else 0.0) for r in ref]
        reference = {str(i): v for i, v in enumerate(ref)}
        rule = paired_rule(reference, margin, ALPHA, "ref")
        assert rule is not None
        stopper = _feed(rule, new)
        worse = sum(1 for a, b in zip(new, ref, strict=True) if a < b)
        better = sum(1 for a, b in zip(new, ref, strict=True) if a > b)
        p = stats.mcnemar_exact(better, worse, "less").p_value
        fixed, after = p < ALPHA, p < fixed_alpha(ALPHA)
        cell.add(stopper, n, fixed=fixed, after=after)
    return cell


def holm_family(n: int, reps: int, seed: int, items: int = 20) -> tuple[float, float]:
    """Shares of sessions of ``items`` items, all exactly at the baseline (where both nulls
    hold), with any false "regression certain" (a false failure: the family-wise error) and
    with any false "no regression certain", each item's early decisions at alpha / items."""
    rng = random.Random(seed)
    rule = value_rule(0.65, 0.0, ALPHA / items)
    assert rule is not None
    failures = passes = 0
    for _ in range(reps):
        decisions = set()
        for _ in range(items):
            scores = [1.0 if rng.random() < 0.65 else 0.0 for _ in range(n)]
            decisions.add(_feed(rule, scores).decision)
        failures += "regression" in decisions
        passes += "no regression" in decisions
    return failures / reps, passes / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--sizes", type=str, default=",".join(map(str, SIZES)))
    parser.add_argument("--holm-only", action="store_true", help="only the Holm table")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.perf_counter()
    print(
        "| case | n planned | regression certain | no regression certain | examples used | "
        "fails (rule, then fixed-n) | fails (fixed-n alone) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    cases = [
        ("collapse: true 0.10 vs 0.65", 0.10, 0.65, 0.0),
        ("regression: true 0.55 vs 0.65", 0.55, 0.65, 0.0),
        ("improvement: true 0.75 vs 0.65", 0.75, 0.65, 0.0),
        ("boundary: true 0.65 vs 0.65, margin 0", 0.65, 0.65, 0.0),
        ("boundary: true 0.60 vs 0.65, margin 0.05", 0.60, 0.65, 0.05),
        ("no change: true 0.65 vs 0.65, margin 0.05", 0.65, 0.65, 0.05),
        ("no change: true 0.65 vs 0.65, margin 0.01", 0.65, 0.65, 0.01),
    ]
    for label, truth, baseline, margin in [] if args.holm_only else cases:
        for n in sizes:
            print(
                value_cell(truth, baseline, margin, n, args.reps, seed=n).row(label, n), flush=True
            )
    paired = (("paired: same model", 0.0), ("paired: 10-point drop", 0.10))
    for label, drop in [] if args.holm_only else paired:
        for n in sizes:
            print(paired_cell(drop, n, args.reps, seed=7 * n).row(label, n), flush=True)
    print()
    print(
        "| Holm over 20 items at the boundary | n planned | sessions with a false regression "
        "certain | sessions with a false no regression certain |"
    )
    print("|---|---:|---:|---:|")
    for n in sizes:
        reps = max(100, args.reps // 5)
        failed, passed = holm_family(n, reps, seed=11 * n)
        print(
            f"| alpha / 20 per item, {reps} sessions | {n} | {100 * failed:.1f}% | {100 * passed:.1f}% |"
        )
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
