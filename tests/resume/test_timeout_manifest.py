"""pytest-timeout stopping an item: its manifest entry says ``interrupted``, not ``running``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Project, configure, manifest
from tests.resume.conftest import clean_env


def test_a_timed_out_item_is_left_interrupted(project: Project, sim: Any) -> None:
    project.qa("qa", 100)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"), latency=0.2)
    configure(project, server.base_url, n=100, max_concurrent=1)  # ~20 s: the timeout hits
    env = clean_env()
    plugins = str(Path(sys.prefix) / "coexist-plugins")  # pytest-timeout (scripts/setup.sh)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [plugins, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-p", "no:randomly", "benchmarks/"]
    out = subprocess.run(
        [*command, "--model", "alpha", "--run-id", "r", "--timeout", "3"],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Timeout" in out.stdout + out.stderr, out.stdout[-3000:]
    entry = manifest(project.root / "runs" / "r")["items"]["alpha-qa-seed0"]
    assert entry["status"] == "interrupted", out.stdout[-3000:]
