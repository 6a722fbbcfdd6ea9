"""Items: model × variant × seed with readable ids; -k, --model, --env, job files, the plan."""

from __future__ import annotations

import pytest

from tests.conftest import Project

URL = "http://127.0.0.1:9/v1"


@pytest.fixture
def twelve(project: Project) -> Project:
    """2 models × (1 plain + 1 sweep of 2) variants × 2 seeds = 12 items."""
    project.qa("qa", 5)
    project.models(
        {"alpha": {"model": "m", "api_base_url": URL}, "beta": {"model": "m", "api_base_url": URL}}
    )
    project.env(
        "qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}, "seeds": [0, 1]}]
    )
    project.env(
        "qa-sys",
        [
            {
                "id": "qa-sys",
                "module": "jsonl",
                "env_args": {"path": "qa.jsonl"},
                "seeds": [0, 1],
                "matrix": {"system_prompt": ["brief", "careful"]},
                "matrix_id_format": "{base}-{system_prompt}",
            },
        ],
    )
    return project


def test_twelve_items_with_documented_ids(twelve: Project) -> None:
    result = twelve.pytester.runpytest("benchmarks/", "--model", "all", "--collect-only", "-q")
    ids = [line for line in result.outlines if line.startswith("benchmarks/")]
    assert len(ids) == 12
    assert "benchmarks/test_models.py::test_benchmark[alpha-qa-seed0]" in ids
    assert "benchmarks/test_models.py::test_benchmark[beta-qa-sys-careful-seed1]" in ids
    result.stdout.fnmatch_lines(
        ["*modelbench plan*", "12 items, 2 model(s) (alpha, beta), 60 examples*"]
    )


def test_k_selects_subset(twelve: Project) -> None:
    result = twelve.pytester.runpytest(
        "benchmarks/",
        "--model",
        "alpha,beta",
        "--collect-only",
        "-q",
        "-k",
        "beta and sys and not seed1",
    )
    ids = [line for line in result.outlines if line.startswith("benchmarks/")]
    assert ids == [
        "benchmarks/test_models.py::test_benchmark[beta-qa-sys-brief-seed0]",
        "benchmarks/test_models.py::test_benchmark[beta-qa-sys-careful-seed0]",
    ]


def test_model_option_restricts(twelve: Project) -> None:
    result = twelve.pytester.runpytest("benchmarks/", "--model", "alpha", "--collect-only", "-q")
    ids = [line for line in result.outlines if line.startswith("benchmarks/")]
    assert len(ids) == 6 and all("[alpha-" in i for i in ids)


def test_env_and_seed_overrides(twelve: Project) -> None:
    result = twelve.pytester.runpytest(
        "benchmarks/",
        "--model",
        "alpha",
        "--env",
        "qa-sys-brief",
        "--seeds",
        "7,8,9",
        "--collect-only",
        "-q",
    )
    ids = [
        line.split("[")[1].rstrip("]") for line in result.outlines if line.startswith("benchmarks/")
    ]
    assert ids == [
        "alpha-qa-sys-brief-seed7",
        "alpha-qa-sys-brief-seed8",
        "alpha-qa-sys-brief-seed9",
    ]


def test_num_examples_caps_the_plan(twelve: Project) -> None:
    result = twelve.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--env", "qa", "--num-examples", "2", "--collect-only"
    )
    result.stdout.fnmatch_lines(
        ["alpha-qa-seed0 * 2 *", "2 items, 1 model(s) (alpha), 4 examples*"]
    )


def test_job_file_runs_exactly_its_jobs(twelve: Project) -> None:
    (twelve.root / "configs" / "job-small.yaml").write_text(
        "name: small\n"
        "models:\n  gamma: {model: m, api_base_url: 'http://127.0.0.1:9/v1'}\n"
        "jobs:\n  - model: gamma\n    env: [qa]\n  - model: alpha\n    env: [qa-sys-careful]\n"
    )
    result = twelve.pytester.runpytest(
        "benchmarks/", "--mb-config", "configs/job-small.yaml", "--collect-only", "-q"
    )
    ids = sorted(
        line.split("[")[1].rstrip("]") for line in result.outlines if line.startswith("benchmarks/")
    )
    assert ids == [
        "alpha-qa-sys-careful-seed0",
        "alpha-qa-sys-careful-seed1",
        "gamma-qa-seed0",
        "gamma-qa-seed1",
    ]


def test_marker_restricts_user_tests(twelve: Project) -> None:
    (twelve.root / "benchmarks" / "test_own.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.modelbench(variant='qa', model='beta')\n"
        "def test_floor(mb_eval):\n    assert mb_eval.score >= 0\n"
    )
    result = twelve.pytester.runpytest(
        "benchmarks/test_own.py", "--model", "all", "--collect-only", "-q"
    )
    ids = [line for line in result.outlines if line.startswith("benchmarks/")]
    assert ids == [
        "benchmarks/test_own.py::test_floor[beta-qa-seed0]",
        "benchmarks/test_own.py::test_floor[beta-qa-seed1]",
    ]


def test_no_model_is_a_usage_error(twelve: Project) -> None:
    result = twelve.pytester.runpytest("benchmarks/", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: no model selected: pass --model NAME (configured in configs/models.yaml: alpha, beta)*"
        ]
    )


def test_builtin_module_via_env_needs_no_config(project: Project) -> None:
    project.qa("qa", 3)
    result = project.pytester.runpytest(
        "benchmarks/",
        "--model",
        "org/some-model",
        "--api-base-url",
        URL,
        "--env",
        "jsonl",
        "--env-args",
        '{"path": "qa.jsonl"}',
        "--collect-only",
        "-q",
    )
    result.stdout.fnmatch_lines(
        ["benchmarks/test_models.py::test_benchmark[some-model-jsonl-seed0]"]
    )


@pytest.fixture
def dashes(project: Project) -> Project:
    """Models ``x-y`` and ``x`` × variants ``z`` and ``y-z``: two of the four pairs read ``x-y-z``."""
    project.qa("qa", 3)
    project.models({name: {"model": "m", "api_base_url": URL} for name in ("x-y", "x")})
    for variant in ("z", "y-z"):
        project.env(variant, [{"id": variant, "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    return project


def collected_ids(result: pytest.RunResult) -> list[str]:
    return [line.split("[", 1)[1][:-1] for line in result.outlines if line.startswith("bench")]


def test_names_with_dashes_give_every_item_its_own_id(dashes: Project) -> None:
    result = dashes.pytester.runpytest("benchmarks/", "--model", "all", "--collect-only", "-q")
    ids = collected_ids(result)
    assert len(ids) == len(set(ids)) == 4, result.outlines
    assert {"x-y-y-z-seed0", "x-z-seed0"} < set(ids)  # ids without a clash stay as they were
    hashed = [i for i in ids if i.startswith("x-y-z-seed0+")]
    assert len(hashed) == 2
    result.stdout.fnmatch_lines(
        ["x-y-z-seed0+* x * y-z * 0 *", "x-y-z-seed0+* x-y * z * 0 *", "4 items, 2 model(s)*"]
    )
    result.stdout.fnmatch_lines(
        [
            "*PlanWarning: model 'x' with variant 'y-z' and model 'x-y' with variant 'z' both "
            "give the item id x-y-z-seed0; to tell them apart their ids get a +hash: "
            "x-y-z-seed0+*, x-y-z-seed0+*"
        ]
    )
    # a hashed id is one that -k takes whole
    picked = dashes.pytester.runpytest(
        "benchmarks/", "--model", "all", "--collect-only", "-q", "-k", hashed[0]
    )
    assert collected_ids(picked) == [hashed[0]]


def test_an_item_listed_twice_is_planned_once(dashes: Project) -> None:
    result = dashes.pytester.runpytest(
        "benchmarks/", "--model", "x,x", "--seeds", "0,1,1", "--collect-only", "-q"
    )
    assert collected_ids(result) == ["x-y-z-seed0", "x-y-z-seed1", "x-z-seed0", "x-z-seed1"]
    result.stdout.fnmatch_lines(["*PlanWarning: 4 items planned for * listed*repeated*"])
