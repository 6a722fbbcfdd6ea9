"""modelbench never takes an option name a neighbour owns (issue 28, "a good neighbour").

Every option exists as ``--mb-<name>``; the short alias (``--model``, ``--env``) is added only
when no other plugin or initial conftest registered it. pytest-operator's ``--model`` comes
from a plugin with the same options, installed by entry point in a subprocess (the real
pytest-operator needs juju and kubernetes; it runs too where ``.venv/coexist-plugins`` has it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_modelbench.testing.fixtures import SimServerFactory
from tests.conftest import Project, configure, manifest, one_usage_error
from tests.resume.conftest import clean_env

CONFTEST_ENV = """
def pytest_addoption(parser):
    parser.addoption("--env", action="store", default="dev", help="deployment environment")
"""

PLAIN_TEST = """
def test_env(request):
    assert request.config.getoption("env") == "prod"
"""

# pytest-operator 0.43's options, as its plugin registers them (a subset, --model included)
OPERATOR_PLUGIN = """
def pytest_addoption(parser):
    parser.addoption("--cloud", action="store")
    parser.addoption("--controller", action="store")
    parser.addoption("--model-alias", action="store")
    parser.addoption("--model", action="store", help="Juju model to use")
    parser.addoption("--keep-models", action="store_true")
"""

OPERATOR_TEST = """
def test_juju_model(request):
    assert request.config.getoption("model") == "juju-model-1"
"""

PLUGINS_DIR = Path(sys.prefix) / "coexist-plugins"


def install_operator_plugin(where: Path) -> Path:
    """A distribution whose pytest11 entry point registers pytest-operator's options."""
    site = where / "site"
    dist = site / "fake_operator-0.43.2.dist-info"
    dist.mkdir(parents=True)
    (site / "fake_operator.py").write_text(OPERATOR_PLUGIN)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-operator\nVersion: 0.43.2\n")
    (dist / "entry_points.txt").write_text("[pytest11]\npytest_operator = fake_operator\n")
    return site


def run_pytest(cwd: Path, *args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_conftest_env_option_stays_the_conftests(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST_ENV)
    pytester.makepyfile(test_plain=PLAIN_TEST)
    assert pytester.runpytest("--version").ret == 0
    result = pytester.runpytest("--env", "prod")
    result.assert_outcomes(passed=1)
    assert "--mb-env" not in result.stdout.str()  # silence outside benchmark sessions
    help_text = pytester.runpytest("--help").stdout.str()
    assert "--mb-env=ENV" in help_text and "--model=MODEL" in help_text
    assert "deployment environment" in help_text  # --env is the conftest's


def test_benchmark_session_names_the_mb_spelling(project: Project) -> None:
    configure(project, "http://127.0.0.1:9/v1", n=3)
    project.pytester.makeconftest(CONFTEST_ENV)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--collect-only")
    assert result.ret == 0, result.stdout.str()
    warnings = [line for line in result.outlines if "--mb-env" in line]
    assert warnings == ["modelbench: another plugin or conftest.py owns --env (use --mb-env)"]
    # errors name the spelling the user can type
    error = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-env", "")
    assert error.ret == pytest.ExitCode.USAGE_ERROR
    assert any(line.startswith("ERROR: --mb-env: empty value") for line in error.errlines)


def test_mb_spelling_runs_beside_the_conftest_option(
    project: Project, sim: SimServerFactory
) -> None:
    configure(project, "http://placeholder", n=4)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    configure(project, server.base_url, n=4)
    project.pytester.makeconftest(CONFTEST_ENV)
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--mb-env", "qa", "--env", "prod", "--run-id", "r1"
    )
    result.assert_outcomes(passed=1)
    assert manifest(project.root / "runs" / "r1")["items"]["alpha-qa-seed0"]["status"] == "finished"


def test_plugin_owning_model(project: Project, tmp_path: Path) -> None:
    site = install_operator_plugin(tmp_path)
    configure(project, "http://127.0.0.1:9/v1", n=3)
    (project.root / "test_juju.py").write_text(OPERATOR_TEST)
    assert run_pytest(project.root, "--version", path=site).returncode == 0
    juju = run_pytest(project.root, "test_juju.py", "--model", "juju-model-1", "-q", path=site)
    assert juju.returncode == 0, juju.stdout + juju.stderr
    assert "--mb-model" not in juju.stdout + juju.stderr
    bench = run_pytest(
        project.root, "benchmarks/", "--mb-model", "alpha", "--collect-only", path=site
    )
    output = bench.stdout + bench.stderr
    assert bench.returncode == 0, output
    assert "modelbench: another plugin or conftest.py owns --model (use --mb-model)" in output
    assert "alpha-qa-seed0" in output


@pytest.mark.skipif(
    not (PLUGINS_DIR / "pytest_operator").exists(),
    reason=f"pytest-operator (with juju, kubernetes) is not in {PLUGINS_DIR}",
)
def test_real_pytest_operator(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    out = run_pytest(pytester.path, "--model", "juju-model-1", "-q", path=PLUGINS_DIR)
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_modelbench_disables_the_shipped_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sim="def test_sim(mb_sim_server):\n    pass\n")
    result = pytester.runpytest("-p", "no:modelbench")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'mb_sim_server' not found*"])
    assert pytester.runpytest().ret == 0  # enabled, the fixture is there


def test_own_test_parametrizing_mb_item_is_not_a_benchmark(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_own="""
import pytest

@pytest.mark.parametrize("mb_item", ["a", "b"])
def test_item(mb_item):
    assert mb_item in ("a", "b")
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)
    assert not (pytester.path / "runs").exists()


def test_option_values_are_not_taken_for_test_directories(pytester: pytest.Pytester) -> None:
    """The aliases come late, but ``--run-name ..`` never makes pytest load conftests from ``..``."""
    (pytester.path.parent / "conftest.py").write_text(CONFTEST_ENV)  # would clash with ours below
    pytester.makeconftest(CONFTEST_ENV.replace("--env", "--deploy-env"))
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest("--run-name", "..", "test_plain.py")
    try:
        result.assert_outcomes(passed=1)
    finally:
        (pytester.path.parent / "conftest.py").unlink()


CONFTEST_MODEL = """
def pytest_addoption(parser):
    parser.addoption("--model", action="store", help="Juju model to use")
"""


def test_messages_name_mb_model_where_a_conftest_owns_model(project: Project) -> None:
    """Issue 43: "pass --model NAME" would send the user to the conftest's option."""
    configure(project, "http://127.0.0.1:9/v1", n=3)
    project.pytester.makeconftest(CONFTEST_MODEL)
    line = one_usage_error(project)
    assert line.startswith(
        "ERROR: no model selected: pass --mb-model NAME (configured in configs/models.yaml: "
        "alpha), --mb-model all, --mb-model smoke, or --mb-config"
    )
    unknown = project.pytester.runpytest("benchmarks/", "--mb-model", "alpah", "--collect-only")
    assert unknown.ret == pytest.ExitCode.USAGE_ERROR
    unknown.stderr.fnmatch_lines(
        ["ERROR: --mb-model: unknown model 'alpah' (did you mean 'alpha'?)*"]
    )
