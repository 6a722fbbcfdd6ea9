"""Shared helpers and fixtures for the plugin's own tests: a benchmark project inside pytester's
directory (``Project``/``project``), simulated servers (``sim``, the shipped ``mb_sim_server``),
``configure`` for jsonl environments at a server, and readers of a run directory."""

from __future__ import annotations

# Imported here so in-process pytester runs find them in the snapshot of sys.modules that
# pytester restores: the scoring pool pickles concurrent.futures' worker function by name, and a
# copy re-imported inside a pytester run is "not the same object".
import concurrent.futures.process  # noqa: F401
import contextlib
import json
import multiprocessing.popen_spawn_posix
import multiprocessing.resource_tracker
import multiprocessing.synchronize  # noqa: F401
import shutil
import ssl
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

# mlflow (--mb-tracker) imports the importlib_metadata backport, which takes distribution
# discovery over from the stdlib (removes PathFinder.find_distributions, adds its own finder to
# sys.meta_path). pytester restores sys.meta_path after each run, which would drop that finder
# and leave later runs unable to find any plugin; imported here, it is in the snapshot.
with contextlib.suppress(ImportError):
    import importlib_metadata  # noqa: F401

from pytest_modelbench.backends.jsonl_suite import JsonlSuite
from pytest_modelbench.testing import lookup_from_examples
from pytest_modelbench.testing.fixtures import SimServerFactory

pytest_plugins = ["pytester"]

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


UNREACHABLE_URL = "http://127.0.0.1:9/v1"  # nothing listens: a test that sent a request fails


def with_qa(project: Project) -> Project:
    """``alpha`` at an unreachable endpoint and a 3-example ``qa`` jsonl environment."""
    project.qa("qa", 3)
    project.models({"alpha": {"model": "m", "api_base_url": UNREACHABLE_URL}})
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    return project


@pytest.fixture
def base(project: Project) -> Project:
    """A project that plans but must never send a request (see :func:`with_qa`)."""
    return with_qa(project)


def one_usage_error(project: Project, *args: str) -> str:
    """The one ``ERROR:`` line of ``pytest benchmarks/ *args`` stopped by a usage error."""
    result = project.pytester.runpytest("benchmarks/", *args)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.errlines
    assert "Traceback" not in output
    return errors[0]


@pytest.fixture
def sim(mb_sim_server: SimServerFactory) -> SimServerFactory:
    """Started simulated servers: the shipped ``mb_sim_server`` fixture (stopped at teardown)."""
    return mb_sim_server


def configure(
    project: Project,
    url: str,
    models: Sequence[str] = ("alpha",),
    *,
    n: int = 20,
    envs: Sequence[str] = ("qa",),
    seeds: Sequence[int] | None = None,
    served: str = "sim-model",
    **model: Any,
) -> None:
    """Models at ``url`` and one jsonl environment per name in ``envs`` (``<name>.jsonl`` with
    ``n`` questions, written once). ``served`` is the model name sent to the server; ``{name}``
    in it becomes the model's name; ``model`` adds models.yaml keys."""
    for env in envs:
        if not (project.root / f"{env}.jsonl").exists():
            project.qa(env, n)
        variant: dict[str, Any] = {
            "id": env,
            "module": "jsonl",
            "env_args": {"path": f"{env}.jsonl"},
        }
        if seeds is not None:
            variant["seeds"] = list(seeds)
        project.env(env, [variant])
    project.models(
        {
            name: {
                "model": served.format(name=name),
                "api_base_url": url,
                "max_concurrent": 8,
                "retry_backoff": 0.01,
                **model,
            }
            for name in models
        }
    )


def rows(item_dir: Path) -> list[dict[str, Any]]:
    """Whole journal lines of an item (what a resume would keep), last row per example."""
    text = (item_dir / "results.jsonl").read_bytes().decode()
    complete = text[: text.rfind("\n") + 1] if "\n" in text else ""
    out: dict[str, dict[str, Any]] = {}
    for line in complete.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[f"{row['example_id']}/{row.get('rollout', 0)}"] = row
    return list(out.values())


def manifest(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "run_manifest.json").read_text())
    return data


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost: (cert, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_server_context(certificate: tuple[Path, Path]) -> Iterator[ssl.SSLContext]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    yield context
