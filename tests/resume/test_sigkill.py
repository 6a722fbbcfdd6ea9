"""Kill ``pytest -n 2`` (the whole process group) at random moments; resuming must lose nothing.

The simulated server runs in this process and logs every request with its
arrival time, so the test can tell which requests a killed run had in flight:
the only examples that may be requested twice are those asked before a kill
whose answer never reached the journal.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.running.runner import request_seed
from tests.conftest import Project, configure, manifest, rows
from tests.resume.conftest import comparable, completions, kill_group, run_pytest, start_pytest

MODELS = ("alpha", "beta")
SEEDS = (0, 1, 2, 3)
EXAMPLES = 30
KILLS = 10
LEAN = ("-p", "no:html", "-p", "no:metadata", "-p", "no:hypothesispytest", "-p", "no:anyio")
Identity = tuple[str, str, int]  # (served model, prompt, request seed): one example of one item


def wait_idle(server: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.in_flight and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)


def identity_map(run_dir: Path) -> dict[str, dict[str, Identity]]:
    """item id -> example id -> how the server sees that example's request."""
    out: dict[str, dict[str, Identity]] = {}
    for model in MODELS:
        for seed in SEEDS:
            item = f"{model}-qa-seed{seed}"
            out[item] = {
                r["example_id"]: (
                    f"sim-{model}",
                    r["prompt"],
                    request_seed(seed, r["example_id"], 0),
                )
                for r in rows(run_dir / item)
            }
    return out


def journaled(run_dir: Path, ids: dict[str, dict[str, Identity]]) -> set[Identity]:
    """Examples with a whole, error-free journal line (what a resume keeps)."""
    done: set[Identity] = set()
    for item, by_example in ids.items():
        if (run_dir / item / "results.jsonl").exists():
            done |= {
                by_example[r["example_id"]] for r in rows(run_dir / item) if not r.get("error")
            }
    return done


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_matches_an_uninterrupted_run(
    project: Project, sim: Any
) -> None:
    rng = random.Random(5)
    project.qa("qa", EXAMPLES)
    server = sim(
        models=[f"sim-{m}" for m in MODELS], accuracy=0.6, lookup=project.lookup("qa"), latency=0.02
    )
    configure(
        project,
        server.base_url,
        n=EXAMPLES,
        models=MODELS,
        seeds=SEEDS,
        served="sim-{name}",
        max_concurrent=2,
    )
    args = ("benchmarks/", "--model", ",".join(MODELS), "-n", "2", *LEAN)

    # the uninterrupted run (in this process: results do not depend on -n)
    project.pytester.runpytest(
        "benchmarks/",
        "--model",
        ",".join(MODELS),
        "--run-id",
        "reference",
    ).assert_outcomes(passed=len(MODELS) * len(SEEDS))
    ref_dir = project.root / "runs" / "reference"
    ids = identity_map(ref_dir)
    total = len(SEEDS) * len(MODELS) * EXAMPLES
    assert sum(len(v) for v in ids.values()) == total
    key_of = {identity: identity for by_example in ids.values() for identity in by_example.values()}

    run_dir = project.root / "runs" / "crashy"
    server.clear_log()
    # per killed attempt: launch and kill times (server clock), journaled examples after the kill
    attempts: list[tuple[float, float, set[Identity]]] = []
    log = project.root / "crashy.log"
    while len(attempts) < KILLS:
        launched = time.monotonic()
        seen = len(completions(server))
        proc = start_pytest(project.root, *args, "--run-id", "crashy", log=log)
        trigger = rng.randint(2, 12)  # kill after this many more answers, plus a random delay
        deadline = launched + 90
        while proc.poll() is None and len(completions(server)) < seen + trigger:
            assert time.monotonic() < deadline, "a resumed run made no progress"
            time.sleep(0.002)
        assert proc.poll() is None, f"the run finished before kill {len(attempts) + 1}"
        time.sleep(rng.uniform(0.0, 0.03))
        killed_at = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
        kill_group(proc)
        assert proc.returncode == -signal.SIGKILL
        attempts.append((launched, killed_at, journaled(run_dir, ids)))
    assert len(attempts[-1][2]) < total, "every kill came too late to interrupt anything"
    wait_idle(server)

    final_launch = time.monotonic()
    final = run_pytest(project.root, *args, "--run-id", "crashy")
    assert final.returncode == 0, final.output
    assert "crashy" in final.output and "(from store)" in final.output

    # each attempt: requests that reached the server between its launch and the next one
    requests = completions(server)
    in_flight: set[Identity] = set()
    in_flight_requests = 0
    before: set[Identity] = set()
    next_launches = [launched for launched, _, _ in attempts[1:]] + [final_launch]
    for (launched, killed_at, after), next_launch in zip(attempts, next_launches, strict=True):
        asked = [r for r in requests if launched <= r.start < next_launch]
        # a request may reach the server just after the kill (sent before it); none much later
        assert all(r.start < killed_at + 0.5 for r in asked), "a request outlived the kill"
        asked_ids = [key_of[(r.model, r.key, r.seed)] for r in asked]
        assert after >= before, "a kill lost examples that were already journaled"
        assert not set(asked_ids) & before, "a resumed run re-asked an example that was journaled"
        assert max(Counter(asked_ids).values(), default=1) == 1
        lost = [i for i in asked_ids if i not in after]  # in flight at the kill
        in_flight |= set(lost)
        in_flight_requests += len(lost)
        before = after
    final_asked = [key_of[(r.model, r.key, r.seed)] for r in requests if r.start >= final_launch]
    assert not set(final_asked) & before and len(final_asked) == len(set(final_asked))

    # results identical to the uninterrupted run
    for item in ids:
        assert comparable(run_dir / item) == comparable(ref_dir / item), item
        crash_entry, ref_entry = manifest(run_dir)["items"][item], manifest(ref_dir)["items"][item]
        assert crash_entry["status"] == ref_entry["status"] == "finished"
        assert crash_entry["fingerprint"] == ref_entry["fingerprint"]
        assert crash_entry["score"] == pytest.approx(ref_entry["score"], rel=1e-12, abs=1e-12)

    # no example asked twice, except those in flight at a kill (asked, never journaled)
    per_example = Counter(key_of[(r.model, r.key, r.seed)] for r in completions(server))
    assert set(per_example) == set(key_of)
    repeated = {i: n - 1 for i, n in per_example.items() if n > 1}
    assert set(repeated) <= in_flight
    assert sum(repeated.values()) == in_flight_requests
    print(
        f"{KILLS} kills; {len(in_flight)} examples in flight at a kill were asked again; "
        f"{sum(per_example.values())} requests for {total} examples"
    )
