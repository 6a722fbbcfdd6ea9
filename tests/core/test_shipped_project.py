"""The shipped project works as shipped: every model of ``configs/`` plans, every job file plans,
and every ``pytest benchmarks/ ...`` command the README shows runs (issue 28).

The commands run against a simulated server (``--api-base-url``), on 3 examples per item,
without xdist: the illustrative ones need a GPU server or a real endpoint otherwise.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from pytest_modelbench.testing.fixtures import SimServerFactory

REPO = Path(__file__).resolve().parents[2]
SHIPPED_MODELS = sorted(yaml.safe_load((REPO / "configs" / "models.yaml").read_text())["models"])
JOB_FILES = sorted(path.name for path in (REPO / "configs").glob("job-*.yaml"))
# the name each README model is sent to the server as
SERVED = ["Qwen/Qwen3-1.7B-Base", "openai/gpt-oss-20b", "smollm2-135m", "my-model", "my-ckpt"]


def readme_commands() -> list[str]:
    """Every ``pytest benchmarks/ ...`` command line of the README (``X`` in the dry run is a
    placeholder for a model name)."""
    commands = []
    for line in (REPO / "README.md").read_text().splitlines():
        match = re.search(r"pytest benchmarks/[^`]*", line)
        if match:
            commands.append(match.group(0).strip())
    return commands


@pytest.fixture
def shipped(pytester: pytest.Pytester) -> Path:
    """A copy of the shipped project: configs/, benchmarks/ and the root conftest."""
    shutil.copytree(REPO / "configs", pytester.path / "configs")
    shutil.copytree(REPO / "benchmarks", pytester.path / "benchmarks")
    shutil.copy(REPO / "conftest.py", pytester.path / "conftest.py")
    return pytester.path


@pytest.mark.parametrize("model", [*SHIPPED_MODELS, "all", "smoke", "smollm2-135m"])
def test_every_shipped_model_plans(pytester: pytest.Pytester, shipped: Path, model: str) -> None:
    result = pytester.runpytest("benchmarks/", "--model", model, "--collect-only")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["* items, * model(s) *"])


@pytest.mark.parametrize("job", JOB_FILES)
def test_every_shipped_job_plans(pytester: pytest.Pytester, shipped: Path, job: str) -> None:
    result = pytester.runpytest("benchmarks/", "--mb-config", f"configs/{job}", "--collect-only")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()


def test_readme_shows_commands() -> None:
    commands = readme_commands()
    assert len(commands) >= 6, commands
    assert any("--model qwen3-1.7b-base" in command for command in commands)


def runnable(command: str, url: str) -> list[str]:
    """The README command's arguments, at the simulated server, on 3 examples, without xdist."""
    args = shlex.split(command.replace("${{ vars.ENDPOINT }}", url))[2:]
    out: list[str] = []
    skip = 0
    for i, arg in enumerate(args):
        if skip:
            skip -= 1
            continue
        if arg in ("-n", "--api-base-url", "--num-examples", "--junitxml"):
            skip = 1
            continue
        out.append("qwen3-1.7b-base" if arg == "X" and args[i - 1] == "--model" else arg)
    return ["benchmarks/", *out, "--api-base-url", url, "--num-examples", "3"]


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_runs(
    pytester: pytest.Pytester,
    shipped: Path,
    mb_sim_server: SimServerFactory,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-readme")  # gpt-oss-20b's api_key_var
    server = mb_sim_server(models=SERVED, accuracy=1.0)
    args = runnable(command, server.base_url)
    result = pytester.runpytest(*args, "--mb-run-dir", str(pytester.path / "runs"))
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, f"{args}\n{output}"
    assert "Traceback" not in output
