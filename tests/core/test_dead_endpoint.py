"""A dead endpoint stops the item at once, with one error naming it; finished work is kept."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from tests.conftest import Project, configure

N = 300


def _completions(server: Any) -> int:
    return sum(1 for r in server.requests if r.path.endswith("completions"))


def test_an_endpoint_that_dies_stops_the_item_and_the_rerun_continues(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.7, lookup={}, latency=0.02, slots=4)
    port = server.port
    configure(
        project, server.base_url, n=N, max_concurrent=4, max_retries=6, retry_backoff=0.5, timeout=5
    )  # a request in flight when the server dies may never be answered

    def stop_mid_item() -> None:  # the server dies once some examples are answered
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _completions(server) < 30:
            time.sleep(0.01)
        server.stop()

    stopper = threading.Thread(target=stop_mid_item)
    stopper.start()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    stopper.join()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            f"*alpha-qa-seed0: endpoint http://127.0.0.1:{port}/v1 is not accepting connections "
            "(ConnectionRefusedError*failed connection attempts in a row*); stopped the item. "
            f"* of {N} examples are kept; re-running the same command continues with the rest*"
        ]
    )
    (run_dir,) = project.run_dirs()
    rows = [json.loads(line) for line in (run_dir / "alpha-qa-seed0" / "results.jsonl").open()]
    answered = {r["example_id"] for r in rows if not r["error"]}
    assert 0 < len(answered) < N
    # the examples in flight when it died failed; nothing after them was even tried
    assert len([r for r in rows if r["error"]]) <= 4 * 2
    revived = sim(accuracy=0.7, lookup={}, latency=0.001, port=port)
    again = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    again.assert_outcomes(passed=1)
    asked = [r for r in revived.requests if r.path.endswith("completions")]
    assert len(asked) == N - len(answered)
    # every example has a finished last line; the failed tries stay before it (append-only)
    lines = (run_dir / "alpha-qa-seed0" / "results.jsonl").read_text().splitlines()
    last = {json.loads(line)["example_id"]: json.loads(line) for line in lines}
    assert len(last) == N and not any(row["error"] for row in last.values())
