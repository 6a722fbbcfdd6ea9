"""``pytest --help`` with the plugin installed stays light: no heavy dependency is imported."""

from __future__ import annotations

import subprocess
import sys

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
