"""``pytest --help`` with the plugin installed stays light: no heavy dependency is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Project, configure

HEAVY = (
    "vllm",
    "lm_eval",
    "verifiers",
    "pyarrow",
    "torch",
    "transformers",
    "numpy",
    "aiohttp",
    "math_verify",
    "wandb",
    "mlflow",
)

SCRIPT = """
import sys
import pytest
code = pytest.main(["--help"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print("HEAVY:" + ",".join(heavy))
sys.exit(int(code))
"""


def test_help_imports_no_heavy_dependency(tmp_path: object) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(heavy=set(HEAVY))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert "--model=MODEL" in out.stdout  # the plugin is loaded
    heavy_line = next(line for line in out.stdout.splitlines() if line.startswith("HEAVY:"))
    assert heavy_line == "HEAVY:", f"imported at --help: {heavy_line[6:]}"


PLAIN_SESSION = """
import sys
import pytest
code = pytest.main(["-q", "-p", "no:cacheprovider", "test_plain.py"])
loaded = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("pydantic", "aiohttp")
    or m == "pytest_modelbench.config.schema"
    or m.startswith(("pytest_modelbench.suites", "pytest_modelbench.sandbox"))
)
print("LOADED:" + ",".join(loaded))
sys.exit(int(code))
"""


def test_plain_session_imports_no_config_schema(tmp_path: Path) -> None:
    """A session that selects no benchmark items (no --model) never loads modelbench's
    configuration schema, pydantic, aiohttp or the suites: the plugin costs it next to
    nothing."""
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    out = subprocess.run(
        [sys.executable, "-c", PLAIN_SESSION],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
    loaded_line = next(line for line in out.stdout.splitlines() if line.startswith("LOADED:"))
    assert loaded_line == "LOADED:", f"imported by a plain session: {loaded_line[7:]}"


def test_a_session_that_serves_no_model_builds_no_server_pool(project: Project, sim: Any) -> None:
    """Every model at an ``api_base_url``: the items need no server pool, and its modules
    (the pool, replicas, the exchange) are never imported."""
    configure(project, "http://placeholder", ("alpha",), n=5)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    configure(project, server.base_url, ("alpha",), n=5)
    (project.root / "conftest.py").write_text(
        "import sys\n\n\n"
        "def pytest_sessionfinish(session):\n"
        "    found = sorted(m for m in sys.modules if m.startswith('pytest_modelbench.serving.'))\n"
        "    print('SERVING:' + ','.join(found))\n"
    )
    result = project.pytester.runpytest_subprocess("benchmarks/", "--model", "alpha", "-s")
    result.assert_outcomes(passed=1)
    line = next(line for line in result.outlines if "SERVING:" in line)
    loaded = set(line.split("SERVING:", 1)[1].split(","))
    assert not loaded & {
        "pytest_modelbench.serving.pool",
        "pytest_modelbench.serving.replicas",
        "pytest_modelbench.serving.exchange",
        "pytest_modelbench.serving.exchange_book",
        "pytest_modelbench.serving.channel",
        "pytest_modelbench.serving.messages",
    }, line
