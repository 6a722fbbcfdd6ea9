"""Controller and workers (pytest-xdist): which process this is, and the keys that cross over.

Only the controller writes the pytest cache, the manifest summary and the
reports; workers evaluate and send their results back as ``mb_*`` user
properties (see :mod:`pytest_modelbench.store.records`).
"""

from __future__ import annotations

from typing import Any

import pytest

WORKER_RUN_DIR = "modelbench_run_dir"  # workerinput: the run directory every worker writes
WORKER_PROGRESS_DIR = "modelbench_progress_dir"  # workerinput: where workers report progress


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def worker_input(config: pytest.Config) -> dict[str, Any]:
    """What the controller sent this worker (empty on the controller or without xdist)."""
    data: dict[str, Any] = getattr(config, "workerinput", {})
    return data
