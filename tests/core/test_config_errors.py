"""Every user mistake in configuration is one ``ERROR:`` line naming file, key, value and fix."""

from __future__ import annotations

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
    assert line.startswith("ERROR: --env gsm8kk: unknown module 'gsm8kk'")


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
