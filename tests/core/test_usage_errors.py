"""User mistakes on the command line, in markers and in where pytest runs: one ``ERROR:`` line
that names the flag, the value and the fix; never silent, never a traceback."""

from __future__ import annotations

import os
import stat
from typing import Any

import pytest

from tests.conftest import UNREACHABLE_URL, Project, configure, manifest, one_usage_error

URL = UNREACHABLE_URL


def usage_error(project: Project, *args: str) -> str:
    """The one ``ERROR:`` line of a run that stopped with a usage error."""
    return one_usage_error(project, *args)


# -- empty values given explicitly ------------------------------------------------------------


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_empty_env_is_an_error_not_every_environment(base: Project, value: str) -> None:
    line = usage_error(base, "--model", "alpha", "--env", value, "--collect-only")
    assert line.startswith(f"ERROR: --env: empty value {value!r}")
    assert "leave --env out to run every environment" in line


@pytest.mark.parametrize("value", ["", ","])
def test_empty_model_is_an_error(base: Project, value: str) -> None:
    line = usage_error(base, "--model", value, "--collect-only")
    assert line.startswith(f"ERROR: --model: empty value {value!r}")
    assert "--model all" in line


def test_env_not_given_still_selects_every_environment(base: Project) -> None:
    result = base.pytester.runpytest("benchmarks/", "--model", "alpha", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["benchmarks/test_models.py::test_benchmark[alpha-qa-seed0]"])


# -- run ids and run directories --------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["../../x", "a/b", "..", ".", "a\\b", ""])
def test_run_id_must_be_one_path_component(base: Project, run_id: str) -> None:
    line = usage_error(base, "--model", "alpha", "--run-id", run_id, "--collect-only")
    assert line.startswith(f"ERROR: --run-id: {run_id!r} is not a run directory name")
    assert "letters, digits" in line
    assert not (base.root.parent / "x").exists()


def test_run_dir_that_is_a_file(base: Project) -> None:
    (base.root / "taken").write_text("not a directory\n")
    line = usage_error(base, "--model", "alpha", "--run-dir", "taken")
    assert line.startswith("ERROR: --run-dir: cannot create run directories in ")
    assert "taken" in line and "choose a writable directory" in line


def test_run_dir_under_a_file(base: Project) -> None:
    (base.root / "taken").write_text("not a directory\n")
    line = usage_error(base, "--model", "alpha", "--run-dir", "taken/runs")
    assert line.startswith("ERROR: --run-dir: cannot create run directories in ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_run_dir_under_a_read_only_directory(base: Project) -> None:
    locked = base.root / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        line = usage_error(base, "--model", "alpha", "--run-dir", "locked/runs")
    finally:
        locked.chmod(stat.S_IRWXU)
    assert line.startswith("ERROR: --run-dir: cannot create run directories in ")


# -- marker keywords ----------------------------------------------------------------------------


def test_marker_keyword_typo_names_the_test_and_the_fix(base: Project) -> None:
    (base.root / "benchmarks" / "test_own.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.modelbench(envv='qa')\n"
        "def test_floor(mb_eval):\n    assert mb_eval.score >= 0\n"
    )
    line = usage_error(base, "benchmarks/test_own.py", "--model", "alpha", "--collect-only")
    assert line == (
        "ERROR: benchmarks/test_own.py::test_floor: @pytest.mark.modelbench: unknown keyword "
        "'envv' (did you mean 'env'?); accepted: model, env, variant"
    )


def test_marker_positional_argument_is_refused(base: Project) -> None:
    (base.root / "benchmarks" / "test_own.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.modelbench('qa')\n"
        "def test_floor(mb_eval):\n    assert mb_eval.score >= 0\n"
    )
    line = usage_error(base, "benchmarks/test_own.py", "--model", "alpha", "--collect-only")
    assert line.startswith("ERROR: benchmarks/test_own.py::test_floor: @pytest.mark.modelbench")
    assert "keywords" in line and "env='qa'" in line


# -- --env-args keys no module accepts -----------------------------------------------------------


def test_env_args_key_unknown_to_the_suite_blames_the_flag(base: Project) -> None:
    base.env("gsm8k", [{"id": "gsm8k", "module": "gsm8k"}])
    line = usage_error(
        base,
        "--model",
        "alpha",
        "--env",
        "gsm8k",
        "--env-args",
        '{"num_fewshots": 2}',
        "--collect-only",
    )
    assert line == (
        "ERROR: --env-args: variant 'gsm8k' (module gsm8k): unknown env arg 'num_fewshots' "
        "(did you mean 'num_fewshot'?); accepted: num_fewshot, system_prompt"
    )


def test_env_args_key_unknown_to_jsonl_blames_the_flag(base: Project) -> None:
    line = usage_error(base, "--model", "alpha", "--env-args", '{"pth": "x"}', "--collect-only")
    assert line.startswith("ERROR: --env-args: variant 'qa' (module jsonl): unknown key 'pth'")
    assert "(did you mean 'path'?)" in line


def test_env_args_bad_value_blames_the_flag(base: Project) -> None:
    line = usage_error(
        base, "--model", "alpha", "--env", "gsm8k", "--env-args", '{"num_fewshot": -3}'
    )
    assert line.startswith("ERROR: --env-args: ")
    assert "'num_fewshot'" in line and "-3" in line


def test_env_args_accepted_by_the_suite(base: Project) -> None:
    result = base.pytester.runpytest(
        "benchmarks/",
        "--model",
        "alpha",
        "--env",
        "gsm8k",
        "--env-args",
        '{"num_fewshot": 2}',
        "--collect-only",
        "-q",
    )
    result.stdout.fnmatch_lines(["benchmarks/test_models.py::test_benchmark[alpha-gsm8k-seed0]"])


# -- running from a subdirectory ------------------------------------------------------------------


def test_subdirectory_uses_the_root_configs_and_runs(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project.root / "pytest.ini").write_text("[pytest]\n")
    configure(project, "http://placeholder", n=5)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    configure(project, server.base_url, n=5)
    # jsonl data paths are taken as given (from the current directory): give this one whole
    data = str(project.root / "qa.jsonl")
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": data}}])
    monkeypatch.chdir(project.root / "benchmarks")
    result = project.pytester.runpytest(".", "--model", "alpha", "--run-id", "sub")
    result.assert_outcomes(passed=1)
    assert not (project.root / "benchmarks" / "runs").exists()
    run_dir = project.root / "runs" / "sub"
    assert manifest(run_dir)["items"]["alpha-qa-seed0"]["status"] == "finished"


def test_relative_run_dir_is_taken_from_the_rootdir(
    base: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    (base.root / "pytest.ini").write_text("[pytest]\n")
    (base.root / "taken").write_text("not a directory\n")
    monkeypatch.chdir(base.root / "benchmarks")
    # from benchmarks/, "taken" would be a new directory; from the rootdir it is the file
    result = base.pytester.runpytest(".", "--model", "alpha", "--run-dir", "taken")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --run-dir: cannot create run directories in *taken*"])
    assert not (base.root / "benchmarks" / "taken").exists()


def test_unknown_model_without_a_models_file_says_the_file_is_missing(project: Project) -> None:
    line = one_usage_error(project, "--model", "fixed")
    assert line.startswith("ERROR: --model: unknown model 'fixed'")
    assert "configs/models.yaml (which does not exist: configs are read from the rootdir)" in line
