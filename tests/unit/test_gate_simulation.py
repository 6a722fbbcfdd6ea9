"""The paired gate on a simulated benchmark with known truth (perf/gate_power.py's model).

1319 examples with latent difficulty; true accuracy 0.70 for the reference
model, 0.67 for the dropped one. The paired gate must keep its false-alarm
rate near alpha and catch the 3-point drop at least 80% of the time, where
naive fixed thresholds false-alarm far more often.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ALPHA = 0.05
REPETITIONS = 1000  # the perf script's default: the README table is exactly this run


def _load_simulation() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "perf" / "gate_power.py"
    spec = importlib.util.spec_from_file_location("mb_perf_gate_power", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


sim = _load_simulation()


@pytest.fixture(scope="module")
def rates() -> dict[str, Any]:
    result = sim.simulate(sim.make_benchmark(), REPETITIONS, ALPHA)
    return {rate.gate: rate for rate in result.rates}


def test_benchmark_has_the_known_truth() -> None:
    bench = sim.make_benchmark()
    assert len(bench.ids) == 1319
    assert bench.reference_accuracy == pytest.approx(0.70, abs=1e-9)
    assert bench.dropped_accuracy == pytest.approx(0.67, abs=1e-9)
    # the drop lowers every example's accuracy: same difficulty ordering
    assert all(d <= r for d, r in zip(bench.dropped, bench.reference, strict=True))


def test_hash_uniform_is_deterministic_and_uniform() -> None:
    assert sim.hash_uniform(17, 3) == sim.hash_uniform(17, 3)
    assert sim.uniforms(5, 3)[4] == sim.hash_uniform(4, 3)
    draws = sim.uniforms(20_000, 1)
    assert sum(draws) / len(draws) == pytest.approx(0.5, abs=0.01)
    assert sum(d < 0.1 for d in draws) / len(draws) == pytest.approx(0.1, abs=0.01)


@pytest.mark.slow
def test_paired_gate_false_alarm_rate(rates: dict[str, Any]) -> None:
    paired = rates["paired"]
    assert paired.false_alarm <= ALPHA + 0.02


@pytest.mark.slow
def test_paired_gate_power_for_a_3_point_drop(rates: dict[str, Any]) -> None:
    assert rates["paired"].power >= 0.8


@pytest.mark.slow
def test_naive_thresholds_false_alarm_or_miss(rates: dict[str, Any]) -> None:
    paired = rates["paired"]
    for name in ("naive-0.01", "naive-0"):
        naive = rates[name]
        assert naive.false_alarm > 2 * paired.false_alarm or naive.power < paired.power
    # concretely: "score < baseline" fails about half of unchanged runs
    assert rates["naive-0"].false_alarm > 0.4
    assert rates["naive-0.01"].false_alarm > 0.1


def test_markdown_table_lists_every_gate() -> None:
    result = sim.simulate(sim.make_benchmark(n_examples=200), 5, ALPHA)
    table = sim.markdown_table(result)
    assert "| paired gate: exact McNemar vs reference run (margin 0) |" in table
    assert "naive: fail if score < baseline - 0.01" in table
    assert table.count("\n|") == 2 + len(result.rates)
