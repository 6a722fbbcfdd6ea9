"""A finished 200-item run, re-run with the same command: everything from the store, no requests.

The time per item is measured by ``perf/resume_rerun.py`` (figure in PERFORMANCE.md), not asserted.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Project, configure, manifest

ITEMS = 200


@pytest.mark.slow
def test_rerun_of_200_finished_items_reports_all_from_store_with_zero_requests(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.8, lookup={})
    configure(project, server.base_url, n=2, seeds=tuple(range(ITEMS)))
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=ITEMS)
    server.clear_log()

    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=ITEMS)
    from_store = [
        line for line in result.outlines if line.startswith("alpha") and "(from store)" in line
    ]
    assert len(from_store) == ITEMS
    # no completion: one /v1/models, to confirm the same model still answers at that endpoint
    assert [r.path for r in server.requests] == ["/v1/models"]
    (run_dir,) = project.run_dirs()
    entries = manifest(run_dir)["items"]
    assert len(entries) == ITEMS and {e["status"] for e in entries.values()} == {"finished"}
