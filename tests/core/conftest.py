"""Fixtures for core tests: a project directory with configs, and a simulated server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_modelbench.backends.jsonl_suite import JsonlSuite
from pytest_modelbench.testing import SimConfig, SimServer, lookup_from_examples

BENCHMARK_MODULE = """
from pytest_modelbench import EvalResult

def test_benchmark(mb_eval: EvalResult) -> None:
    mb_eval.check_baseline()
"""


def write_qa(path: Path, n: int, prefix: str = "q") -> Path:
    """A JSONL QA file with ``n`` distinct questions."""
    with path.open("w") as handle:
        for i in range(n):
            handle.write(
                json.dumps(
                    {
                        "id": f"{prefix}{i}",
                        "question": f"{prefix}: what is {i} + 1?",
                        "answer": str(i + 1),
                    }
                )
                + "\n"
            )
    return path


class Project:
    """A benchmark project inside ``pytester``'s directory."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        self.root = pytester.path
        (self.root / "configs" / "envs").mkdir(parents=True)
        (self.root / "configs" / "baselines").mkdir()
        (self.root / "benchmarks").mkdir()
        (self.root / "benchmarks" / "test_models.py").write_text(BENCHMARK_MODULE)

    def models(self, models: dict[str, dict[str, Any]]) -> None:
        (self.root / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": models}))

    def env(self, name: str, variants: list[dict[str, Any]] | str) -> Path:
        path = self.root / "configs" / "envs" / f"{name}.yaml"
        path.write_text(variants if isinstance(variants, str) else yaml.safe_dump(variants))
        return path

    def qa(self, name: str, n: int) -> Path:
        return write_qa(self.root / f"{name}.jsonl", n, prefix=name)

    def lookup(self, *names: str) -> dict[str, tuple[str, str]]:
        """Simulator lookup answering the jsonl suite's questions of these files."""
        suite = JsonlSuite()
        lookup: dict[str, tuple[str, str]] = {}
        for name in names:
            examples = suite.examples({"path": str(self.root / f"{name}.jsonl")}, 0)
            lookup.update(
                lookup_from_examples(examples, suite.reference_completion, suite.wrong_completion)
            )
        return lookup

    def run_dirs(self) -> list[Path]:
        return sorted(p for p in (self.root / "runs").iterdir() if p.is_dir())


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


@pytest.fixture
def sim() -> Iterator[Any]:
    """A factory for started simulated servers, stopped at teardown."""
    servers: list[SimServer] = []

    def start(**config: Any) -> SimServer:
        server = SimServer(SimConfig(**config)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
