"""Real ``pytest -n`` runs of a benchmark project: which worker ran which item.

These are the tests that fail if grouping by model stops working (xdist's own
``--dist loadgroup`` is silently broken with pytest 9.2, pytest-xdist #1386, so
modelbench does not rely on it).
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from typing import Any

import pytest

from tests.conftest import Project

RECORDER = """
import json


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # set by xdist on the controller
    if report.when == "call" and node is not None:
        with open("ran.jsonl", "a") as handle:
            handle.write(json.dumps({"worker": node.gateway.id, "nodeid": report.nodeid}) + "\\n")
"""


def setup(project: Project, url: str, models: tuple[str, ...], seeds: int = 4) -> None:
    project.qa("qa", 10)
    project.models(
        {
            name: {
                "model": "sim-model",
                "api_base_url": url,
                "max_concurrent": 8,
                "retry_backoff": 0.01,
            }
            for name in models
        }
    )
    project.env(
        "qa",
        [
            {
                "id": "qa",
                "module": "jsonl",
                "env_args": {"path": "qa.jsonl"},
                "seeds": list(range(seeds)),
            }
        ],
    )
    (project.root / "conftest.py").write_text(RECORDER)


def ran(project: Project) -> dict[str, list[str]]:
    """Worker -> models of the items it ran, in order."""
    sequences: dict[str, list[str]] = defaultdict(list)
    path = project.root / "ran.jsonl"
    for line in path.read_text().splitlines():
        row = json.loads(line)
        item_id = row["nodeid"].split("[", 1)[1].rstrip("]")
        sequences[row["worker"]].append(item_id.split("-", 1)[0])
    path.unlink()
    return dict(sequences)


def server_starts(sequences: dict[str, list[str]]) -> int:
    return sum(1 + sum(a != b for a, b in itertools.pairwise(seq)) for seq in sequences.values())


@pytest.mark.parametrize(
    ("workers", "models"), [(2, ("alpha", "beta")), (3, ("alpha", "beta", "gamma"))]
)
def test_each_worker_stays_on_one_model(
    project: Project, sim: Any, workers: int, models: tuple[str, ...]
) -> None:
    server = sim(accuracy=0.8, lookup={}, latency=0.002)
    setup(project, server.base_url, models)
    result = project.pytester.runpytest(
        "benchmarks/", "--model", ",".join(models), "-n", str(workers), "-v"
    )
    result.assert_outcomes(passed=4 * len(models))
    result.stdout.fnmatch_lines(["*scheduling tests via ModelAffinityScheduling*"])
    sequences = ran(project)
    assert sorted(len(set(seq)) for seq in sequences.values()) == [1] * workers, sequences
    assert {seq[0] for seq in sequences.values()} == set(models)
    assert server_starts(sequences) == len(models)


def test_more_models_than_workers_switch_once_per_model(project: Project, sim: Any) -> None:
    server = sim(accuracy=0.8, lookup={}, latency=0.002)
    setup(project, server.base_url, ("alpha", "beta", "gamma"), seeds=3)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha,beta,gamma", "-n", "2")
    result.assert_outcomes(passed=9)
    sequences = ran(project)
    assert server_starts(sequences) == 3, sequences  # every model's items in one block
    owners = defaultdict(set)
    for worker, seq in sequences.items():
        for model in seq:
            owners[model].add(worker)
    assert all(len(workers) == 1 for workers in owners.values()), sequences


def test_xdist_default_would_split_models(project: Project, sim: Any) -> None:
    """The same run with ``--mb-dist off``: xdist's chunks mix models, so the checks above bite."""
    server = sim(accuracy=0.8, lookup={}, latency=0.002)
    setup(project, server.base_url, ("alpha", "beta", "gamma"))
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha,beta,gamma", "-n", "3", "-v", "--mb-dist", "off"
    )
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(["*scheduling tests via LoadScheduling*"])
    assert server_starts(ran(project)) > 3


def test_remembered_durations_put_the_longest_item_first(project: Project, sim: Any) -> None:
    server = sim(accuracy=0.8, lookup={}, latency=0.002)
    setup(project, server.base_url, ("alpha", "beta"))
    cache = project.root / ".pytest_cache" / "v" / "modelbench"
    cache.mkdir(parents=True)
    durations = {f"{m}-qa-seed{s}": 10.0 + s for m in ("alpha", "beta") for s in range(4)}
    durations.update({"alpha-qa-seed2": 900.0, "beta-qa-seed1": 800.0})
    (cache / "durations").write_text(json.dumps(durations))
    project.pytester.runpytest("benchmarks/", "--model", "alpha,beta", "-n", "2").assert_outcomes(
        passed=8
    )
    lines = [json.loads(line) for line in (project.root / "ran.jsonl").read_text().splitlines()]
    first: dict[str, str] = {}
    for row in lines:
        first.setdefault(row["worker"], row["nodeid"].split("[", 1)[1].rstrip("]"))
    assert sorted(first.values()) == ["alpha-qa-seed2", "beta-qa-seed1"]


def test_plain_test_suites_keep_xdist_default(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    result = pytester.runpytest("-n", "2", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*scheduling tests via LoadScheduling*"])


def test_bad_mb_dist_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_a():\n    pass\n")
    result = pytester.runpytest("--mb-dist", "groups")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mb-dist: expected 'modelbench'*or 'off'*got 'groups'*"])
