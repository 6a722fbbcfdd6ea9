"""False-alarm rate and power of the baseline gates, by simulation with known truth.

A benchmark of 1319 examples (the size of GSM8K's test set) gets a latent
per-example difficulty: the reference model answers example i correctly with
probability a_i = sigmoid(z_i + s), z_i ~ Normal(0, spread), s chosen so the
mean of a_i is exactly 0.70. A "dropped" model has a_i' = sigmoid(z_i + s - d)
with d chosen so its mean is exactly 0.67 (a true 3-point drop). One run of a
model is correct on example i iff hash_uniform(i, seed) < a_i (SplitMix64 of the
example index and the run's seed); the reference and the new run use different
seeds, so they share difficulty but not luck.

Each repetition samples a reference run and a new run (same model: no true
change; dropped model: true drop) and asks every gate whether to fail:

* the paired gate (``PairedRule``: one-sided exact McNemar against the
  reference run's per-example scores, margin 0);
* the value gate (``NonInferiorityRule``) against the reference run's score
  with its n (Farrington–Manning score test, unpaired);
* the value gate against the reference model's true accuracy as an exact
  baseline (exact binomial test), once with one row per example and once with
  4 rollouts per example (exact binomial on Rao–Scott effective counts);
* naive fixed thresholds: fail if score < baseline - t.

Run ``python perf/gate_power.py`` for the Markdown tables in the README: the
1319-example table, then false alarms and power at every n from 5 to 2000
(``--sizes``; repetitions shrink for large n to keep the run under 5 minutes
on 2 cores). ``tests/unit/test_gate_simulation.py`` imports this module.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pytest_modelbench.gating.gates import GateRule, NonInferiorityRule, PairedRule, ScoreSummary
from pytest_modelbench.gating.stats import proportion_estimate

N_EXAMPLES = 1319
P_REF = 0.70
DROP = 0.03
SPREAD = 4.0
ALPHA = 0.05
REPETITIONS = 1000
NAIVE_THRESHOLDS = (0.01, 0.0)
ROLLOUTS = 4
SIZES = (5, 10, 20, 50, 100, 200, 500, 1000, 2000)
GATES = ("paired", "value", "value-exact", "value-rollouts")


@dataclass(frozen=True)
class Benchmark:
    """Fixed per-example probabilities of a correct answer: reference model and dropped model."""

    ids: tuple[str, ...]
    reference: tuple[float, ...]
    dropped: tuple[float, ...]

    @property
    def reference_accuracy(self) -> float:
        return math.fsum(self.reference) / len(self.reference)

    @property
    def dropped_accuracy(self) -> float:
        return math.fsum(self.dropped) / len(self.dropped)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _solve_increasing(f: Callable[[float], float], lo: float, hi: float) -> float:
    """Root of an increasing function on [lo, hi] by bisection."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def make_benchmark(
    n_examples: int = N_EXAMPLES,
    p_ref: float = P_REF,
    drop: float = DROP,
    spread: float = SPREAD,
    seed: int = 0,
) -> Benchmark:
    """Latent difficulties calibrated so the true accuracies are exactly p_ref and p_ref - drop."""
    rng = random.Random(seed)
    z = [rng.gauss(0.0, spread) for _ in range(n_examples)]

    def mean_accuracy(shift: float) -> float:
        return math.fsum(_sigmoid(v + shift) for v in z) / n_examples

    s = _solve_increasing(lambda shift: mean_accuracy(shift) - p_ref, -50.0, 50.0)
    d = _solve_increasing(lambda dd: (p_ref - drop) - mean_accuracy(s - dd), 0.0, 50.0)
    return Benchmark(
        ids=tuple(f"ex{i:04d}" for i in range(n_examples)),
        reference=tuple(_sigmoid(v + s) for v in z),
        dropped=tuple(_sigmoid(v + s - d) for v in z),
    )


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finalizer: a bijective 64-bit hash with full avalanche."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hash_uniform(example: int, seed: int) -> float:
    """A uniform draw in [0, 1) fixed by (example index, seed): the run's luck on that example."""
    return _mix64(_mix64(seed) ^ example) / 2.0**64


def uniforms(n_examples: int, seed: int) -> list[float]:
    """hash_uniform(i, seed) for every example i (one run's luck)."""
    base = _mix64(seed)
    return [_mix64(base ^ i) / 2.0**64 for i in range(n_examples)]


def sample_run(
    ids: Sequence[str], accuracies: Sequence[float], luck: Sequence[float]
) -> dict[str, float]:
    """Per-example 0/1 scores of one run: correct iff its luck on the example < the accuracy."""
    return {key: 1.0 if u < acc else 0.0 for key, acc, u in zip(ids, accuracies, luck, strict=True)}


def sample_rollouts(
    ids: Sequence[str], accuracies: Sequence[float], lucks: Sequence[Sequence[float]]
) -> dict[str, list[float]]:
    """Per-example 0/1 scores of one run with one rollout per luck vector (independent draws
    from the example's accuracy: rollouts share its difficulty, not their luck)."""
    return {
        key: [1.0 if luck[i] < acc else 0.0 for luck in lucks]
        for i, (key, acc) in enumerate(zip(ids, accuracies, strict=True))
    }


def _summary(scores: Mapping[str, float | Sequence[float]]) -> ScoreSummary:
    values = [v for s in scores.values() for v in ((s,) if isinstance(s, float) else s)]
    est = proportion_estimate(math.fsum(values), len(values))
    return ScoreSummary.from_estimate("accuracy", est, "sim")


@dataclass(frozen=True)
class GateRates:
    """How often a gate failed an item: with no true change, and with the true drop."""

    gate: str
    false_alarm: float
    power: float


@dataclass(frozen=True)
class SimulationResult:
    benchmark: Benchmark
    repetitions: int
    alpha: float
    flip_rate: float  # mean share of examples that differ between two runs of the same model
    rates: tuple[GateRates, ...]


def _repetition(
    bench: Benchmark, rep: int, alpha: float, thresholds: Sequence[float], rollouts: int
) -> tuple[dict[tuple[str, str], bool], int]:
    """One (reference, new) pair per scenario: which gates fail, and the null run's flips."""
    n = len(bench.ids)
    ref = sample_run(bench.ids, bench.reference, uniforms(n, seed=2 * rep))
    luck = uniforms(n, seed=2 * rep + 1)  # the new run's; shared by both scenarios
    rng = random.Random(1_000_003 + rep)  # rollouts' luck: the C generator, for speed
    roll_luck = [[rng.random() for _ in range(n)] for _ in range(rollouts)]
    ref_score = math.fsum(ref.values()) / n
    gates: dict[str, GateRule] = {
        "paired": PairedRule(reference=ref, margin=0.0, alpha=alpha),
        "value": NonInferiorityRule(value=ref_score, alpha=alpha, baseline_n=n),
        "value-exact": NonInferiorityRule(value=bench.reference_accuracy, alpha=alpha),
    }
    fails: dict[tuple[str, str], bool] = {}
    flips = 0
    for scenario, accuracies in (("null", bench.reference), ("drop", bench.dropped)):
        new = sample_run(bench.ids, accuracies, luck)
        summary = _summary(new)
        for name, gate in gates.items():
            fails[name, scenario] = not gate.evaluate(summary, new).passed
        if rollouts:
            rows = sample_rollouts(bench.ids, accuracies, roll_luck)
            verdict = gates["value-exact"].evaluate(_summary(rows), rows)
            fails["value-rollouts", scenario] = not verdict.passed
        for t in thresholds:
            fails[f"naive-{t:g}", scenario] = summary.value < ref_score - t - 1e-12
        if scenario == "null":
            flips = sum(1 for key in bench.ids if new[key] != ref[key])
    return fails, flips


def simulate(
    bench: Benchmark,
    repetitions: int = REPETITIONS,
    alpha: float = ALPHA,
    thresholds: Sequence[float] = NAIVE_THRESHOLDS,
    rollouts: int = ROLLOUTS,
) -> SimulationResult:
    """Run every gate on ``repetitions`` (reference, new) pairs per scenario; count failures."""
    names = [g for g in GATES if rollouts or g != "value-rollouts"]
    names += [f"naive-{t:g}" for t in thresholds]
    fails = {(name, scenario): 0 for name in names for scenario in ("null", "drop")}
    flips = 0
    for rep in range(repetitions):
        failed, flipped = _repetition(bench, rep, alpha, thresholds, rollouts)
        for key, value in failed.items():
            fails[key] += value
        flips += flipped
    rates = tuple(
        GateRates(name, fails[name, "null"] / repetitions, fails[name, "drop"] / repetitions)
        for name in names
    )
    return SimulationResult(
        bench, repetitions, alpha, flips / (repetitions * len(bench.ids)), rates
    )


def repetitions_for(n_examples: int, budget: int = 2_000_000) -> int:
    """Repetitions at benchmark size n: 4000 up to n = 500, then a fixed budget of simulated
    examples (2000 at n = 1000, 1000 at n = 2000) keeps the run under 5 minutes on 2 cores."""
    return max(1000, min(4000, budget // n_examples))


def size_table(sizes: Sequence[int] = SIZES, alpha: float = ALPHA, spread: float = SPREAD) -> str:
    """False alarms (no true change) and power (true 3-point drop) of each gate at each n."""
    lines = [
        "| examples | repetitions | paired (exact McNemar) | value, baseline n (Farrington–"
        "Manning) | value, exact baseline (exact binomial) | value, exact baseline, "
        f"{ROLLOUTS} rollouts (Rao–Scott) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        repetitions = repetitions_for(size)
        bench = make_benchmark(n_examples=size, spread=spread)
        result = simulate(bench, repetitions, alpha, thresholds=())
        cells = " | ".join(
            f"{100 * r.false_alarm:.1f}% / {100 * r.power:.1f}%" for r in result.rates
        )
        lines.append(f"| {size} | {repetitions} | {cells} |")
    return "\n".join(lines)


_LABELS = {
    "paired": "paired gate: exact McNemar vs reference run (margin 0)",
    "value": "value gate: Farrington–Manning score test vs reference run's score, baseline n given",
    "value-exact": "value gate: exact binomial vs the true accuracy as an exact baseline",
    "value-rollouts": f"value gate, exact baseline, {ROLLOUTS} rollouts per example (Rao–Scott)",
}


def _label(gate: str) -> str:
    if gate in _LABELS:
        return _LABELS[gate]
    t = float(gate.removeprefix("naive-"))
    return f"naive: fail if score < baseline - {t:g}" if t else "naive: fail if score < baseline"


def markdown_table(result: SimulationResult) -> str:
    """The README table: one row per gate, false-alarm rate and power."""
    b = result.benchmark
    lines = [
        f"{len(b.ids)} examples, true accuracy {b.reference_accuracy:.3f} (reference) vs "
        f"{b.dropped_accuracy:.3f} (dropped), alpha = {result.alpha:g}, "
        f"{result.repetitions} repetitions; two runs of the same model disagree on "
        f"{100 * result.flip_rate:.1f}% of examples.",
        "",
        "| gate | false alarms (no true change) | power (true 3-point drop) |",
        "|---|---:|---:|",
    ]
    for rate in result.rates:
        lines.append(
            f"| {_label(rate.gate)} | {100 * rate.false_alarm:.1f}% | {100 * rate.power:.1f}% |"
        )
    return "\n".join(lines)


def sensitivity_table(
    spreads: Sequence[float], sizes: Sequence[int], repetitions: int, alpha: float = ALPHA
) -> str:
    """Paired gate vs a fixed threshold tuned for 1319 examples, across benchmark shapes."""
    lines = [
        "| examples | latent spread | run-to-run flips | paired: false alarms | paired: power "
        "| score < baseline - 0.02: false alarms | score < baseline - 0.02: power |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        for spread in spreads:
            bench = make_benchmark(n_examples=size, spread=spread)
            result = simulate(bench, repetitions, alpha, thresholds=(0.02,), rollouts=0)
            paired, naive = result.rates[0], result.rates[-1]
            lines.append(
                f"| {size} | {spread:g} | {100 * result.flip_rate:.1f}% "
                f"| {100 * paired.false_alarm:.1f}% | {100 * paired.power:.1f}% "
                f"| {100 * naive.false_alarm:.1f}% | {100 * naive.power:.1f}% |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repetitions", type=int, default=REPETITIONS, help="runs per scenario")
    parser.add_argument("--spread", type=float, default=SPREAD, help="sd of latent logits")
    parser.add_argument(
        "--sensitivity", action="store_true", help="also vary benchmark size and spread"
    )
    parser.add_argument(
        "--sizes",
        type=lambda text: tuple(int(v) for v in text.split(",") if v),
        default=SIZES,
        help="benchmark sizes of the false-alarm table (comma-separated; empty: none)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result = simulate(make_benchmark(spread=args.spread), args.repetitions)
    print(markdown_table(result))
    if args.sizes:
        print()
        print(size_table(args.sizes, spread=args.spread))
    if args.sensitivity:
        print()
        print(sensitivity_table((2.0, 3.0, 4.0, 5.0), (500, 1319, 5000), args.repetitions))
    print(f"\n(simulated in {time.perf_counter() - started:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
