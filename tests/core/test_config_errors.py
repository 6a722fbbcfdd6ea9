"""Every user mistake in configuration is one ``ERROR:`` line naming file, key, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_modelbench.config.loading import load_baseline_file
from pytest_modelbench.errors import ModelbenchUsageError
from tests.conftest import UNREACHABLE_URL, Project, one_usage_error

URL = UNREACHABLE_URL


def usage_error(project: Project, *args: str) -> str:
    return one_usage_error(project, "--collect-only", *args)


def test_unknown_key_in_env_suggests_the_right_one(base: Project) -> None:
    base.env(
        "qa",
        [
            {"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}},
            {"id": "qa2", "module": "jsonl", "num_example": 5},
        ],
    )
    line = usage_error(base, "--model", "alpha")
    assert line == (
        "ERROR: configs/envs/qa.yaml: variant 2 (qa2): unknown key 'num_example' "
        "(did you mean 'num_examples'?)"
    )


def test_unknown_key_in_models(base: Project) -> None:
    base.models({"alpha": {"model": "m", "api_base_url": URL, "max_concurent": 4}})
    line = usage_error(base, "--model", "alpha")
    assert line == (
        "ERROR: configs/models.yaml: unknown key 'models.alpha.max_concurent' "
        "(did you mean 'max_concurrent'?)"
    )


def test_wrong_type(base: Project) -> None:
    base.env("qa", [{"id": "qa", "module": "jsonl", "num_examples": "all"}])
    line = usage_error(base, "--model", "alpha")
    assert line.startswith(
        "ERROR: configs/envs/qa.yaml: variant 1 (qa): num_examples: Input should be a valid integer"
    )
    assert "(got 'all')" in line


def test_bad_matrix_format(base: Project) -> None:
    base.env(
        "qa",
        [
            {
                "id": "qa",
                "module": "jsonl",
                "env_args": {"path": "qa.jsonl"},
                "matrix": {"system_prompt": ["a", "b"]},
                "matrix_id_format": "{base}-{prompt}",
            }
        ],
    )
    line = usage_error(base, "--model", "alpha")
    assert line == (
        "ERROR: configs/envs/qa.yaml: variant 'qa': matrix_id_format '{base}-{prompt}' uses "
        "unknown placeholder {prompt}; available: {base}, {system_prompt}"
    )


def test_matrix_format_missing_a_swept_key(base: Project) -> None:
    base.env(
        "qa",
        [
            {
                "id": "qa",
                "module": "jsonl",
                "matrix": {"system_prompt": ["a", "b"]},
                "matrix_id_format": "{base}-x",
            }
        ],
    )
    line = usage_error(base, "--model", "alpha")
    assert "does not mention {system_prompt}" in line and "duplicate ids" in line


def test_bad_json_override(base: Project) -> None:
    line = usage_error(base, "--model", "alpha", "--sampling-args", "{temperature: 0.5}")
    assert line.startswith("ERROR: --sampling-args: invalid JSON '{temperature: 0.5}'")
    assert "quote keys with double quotes" in line


def test_json_override_must_be_an_object(base: Project) -> None:
    line = usage_error(base, "--model", "alpha", "--env-args", "[1, 2]")
    assert line == "ERROR: --env-args: expected a JSON object like '{\"key\": 1}', got '[1, 2]'"


def test_unknown_model(base: Project) -> None:
    line = usage_error(base, "--model", "alpah")
    assert line.startswith(
        "ERROR: --model: unknown model 'alpah' (did you mean 'alpha'?); "
        "configs/models.yaml defines: alpha."
    )


def test_unknown_env(base: Project) -> None:
    line = usage_error(base, "--model", "alpha", "--env", "gsm8kk")
    assert line.startswith(
        "ERROR: --env 'gsm8kk': 'gsm8kk' is not an environment file in configs/envs (qa) nor a "
        "variant id; as a module: unknown module 'gsm8kk' (did you mean 'gsm8k'?)"
    )


def test_unknown_variant_id_names_the_ids_of_its_file(base: Project) -> None:
    base.env(
        "qa", [{"id": f"qa-{k}", "module": "jsonl", "env_args": {"path": "qa.jsonl"}} for k in "ab"]
    )
    line = usage_error(base, "--model", "alpha", "--env", "qa-c")
    assert "(did you mean 'qa-b'?); configs/envs/qa.yaml has variant ids qa-a, qa-b;" in line


def test_unknown_env_in_a_job_names_the_job_file(base: Project) -> None:
    job = base.root / "configs" / "job-x.yaml"
    job.write_text("name: x\njobs:\n  - model: alpha\n    env: [qa, m_arc]\n")
    line = usage_error(base, "--mb-config", "configs/job-x.yaml")
    assert line.startswith(
        "ERROR: configs/job-x.yaml: jobs[1].env 'm_arc': 'm_arc' is not an environment file"
    )
    assert "--env" not in line


def test_checkpoints_glob_takes_directories_only(base: Project) -> None:
    ckpts = base.root / "ckpts"
    for name in ("step100", "step200"):
        (ckpts / name).mkdir(parents=True)
    (ckpts / "step300.log").write_text("training log")
    base.models({"run7": {"checkpoints": str(ckpts / "step*"), "api_base_url": UNREACHABLE_URL}})
    result = base.pytester.runpytest("benchmarks/", "--model", "run7", "--collect-only")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*2 items, 2 model(s) (run7-step100, run7-step200)*"])
    base.models({"run7": {"checkpoints": str(ckpts / "*.log"), "api_base_url": UNREACHABLE_URL}})
    line = usage_error(base, "--model", "run7")
    assert "matches no checkpoint directory (only files: " in line and "step300.log" in line


def test_unknown_module_in_env_file(base: Project) -> None:
    base.env("qa", [{"id": "qa", "module": "jsonll"}])
    line = usage_error(base, "--model", "alpha")
    assert line.startswith(
        "ERROR: configs/envs/qa.yaml: variant 'qa': unknown module 'jsonll' (did you mean 'jsonl'?)"
    )


def test_malformed_yaml_names_line(base: Project) -> None:
    base.env("qa", "- id: qa\n  module: jsonl\n   env_args: {path: x}\n")
    line = usage_error(base, "--model", "alpha")
    assert line.startswith("ERROR: configs/envs/qa.yaml: line 3, column 12: malformed YAML")


def test_bad_seeds_option(base: Project) -> None:
    line = usage_error(base, "--model", "alpha", "--seeds", "1,two")
    assert line == "ERROR: --seeds: expected comma-separated integers like 0,1,2, got '1,two'"


def test_api_key_value_instead_of_name(base: Project) -> None:
    base.models({"alpha": {"model": "m", "api_base_url": URL, "api_key_var": "sk-abc123-secret"}})
    line = usage_error(base, "--model", "alpha")
    assert "api_key_var must be the NAME of an environment variable" in line
    assert "secret" not in line


def test_bad_job_file(base: Project) -> None:
    (base.root / "configs" / "job-x.yaml").write_text(
        "name: x\njobs:\n  - model: alpha\n    envs: [qa]\n"
    )
    line = usage_error(base, "--mb-config", "configs/job-x.yaml")
    assert line.startswith(
        "ERROR: configs/job-x.yaml: unknown key 'jobs.0.envs' (did you mean 'env'?)"
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("value: .nan", "gsm8k: value: Input should be a finite number (got nan)"),
        ("value: .inf\n  margin: 0.01", "gsm8k: value: Input should be a finite number"),
        ("value: 0.7\n  margin: -0.2", "gsm8k: margin: Input should be greater than or equal to 0"),
        ("value: 0.7\n  margin: 0.7", "gsm8k: margin 0.7 is not below value 0.7, so no score"),
        ("min: .nan", "gsm8k: min: Input should be a finite number"),
    ],
)
def test_baseline_value_and_margin_are_range_checked(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(f"gsm8k:\n  {entry}\n")
    with pytest.raises(ModelbenchUsageError) as info:
        load_baseline_file(path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_k_selects_unicode_names(base: Project) -> None:
    """pytest escapes non-ASCII in node ids (m\\xe9dqa); -k matches the id as written."""
    base.env("médqa", [{"id": "médqa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    result = base.pytester.runpytest("benchmarks/", "--model", "alpha", "-k", "médqa", "--co")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*1/2 tests collected (1 deselected)*"])
