"""Replies that score 0 for a reason other than the model being wrong (issue 43): an empty
answer, or an answer only in the thinking (``content: null``, ``finish_reason: stop``: a
reasoning parser that is not the model's), is counted in the summary and warned about, as a
reply cut off by the token budget is; "lower reasoning_effort" is advised only for a model
that reasons; of ``max_tokens`` and ``max_completion_tokens`` (one budget under two names)
only the winning one is sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_modelbench.config.loading import load_config_set
from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.planning.plan import build_plan
from tests.conftest import Project, configure
from tests.core.test_reasoning import reasoning_project
from tests.reliability.test_fuzz_config import FakeConfig, check_module


def _summary(project: Project) -> dict[str, Any]:
    (run_dir,) = project.run_dirs()
    data: dict[str, Any] = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    return data


def _silent(project: Project) -> dict[str, tuple[str, str]]:
    """A lookup whose every answer is empty."""
    return {key: ("", "") for key in project.lookup("qa")}


def test_empty_answers_are_counted_and_warned_about(project: Project, sim: Any) -> None:
    configure(project, "http://placeholder", n=40)
    server = sim(lookup=_silent(project))
    reasoning_project(project, server.base_url, max_tokens=100)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "warning: alpha-qa-seed0: 40 of 40 replies had no answer (finish_reason stop, "
            "empty content): each scored 0; look at them in report.html"
        ]
    )
    summary = _summary(project)
    assert (summary["empty_answers"], summary["answers_in_reasoning"]) == (40, 0)
    assert summary["truncated"] == 0


def test_an_answer_only_in_the_thinking_is_counted_and_names_the_parser(
    project: Project, sim: Any
) -> None:
    configure(project, "http://placeholder", n=40)
    server = sim(lookup=_silent(project), reasoning_words=15, reasoning_field="reasoning")
    reasoning_project(project, server.base_url, max_tokens=100)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "warning: alpha-qa-seed0: 40 of 40 replies had no answer, 40 of them only thinking "
            "(content null, finish_reason stop): is the server's reasoning parser the model's "
            "own? (vllm serve --reasoning-parser)"
        ]
    )
    summary = _summary(project)
    assert (summary["empty_answers"], summary["answers_in_reasoning"]) == (40, 40)


def test_truncation_advice_names_reasoning_effort_only_for_a_model_that_reasons(
    project: Project, sim: Any
) -> None:
    configure(project, "http://placeholder", n=40)
    server = sim(lookup=project.lookup("qa"))  # no thinking: "Let me think.\nAnswer: N"
    reasoning_project(project, server.base_url, max_tokens=2)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "warning: alpha-qa-seed0: 40 of 40 replies were truncated (finish_reason length): "
            "raise max_tokens"
        ]
    )
    assert "lower reasoning_effort" not in result.stdout.str()
    assert _summary(project)["empty_answers"] == 0  # cut off, not empty


def _sent(tmp_path: Path, model: dict[str, Any], env: dict[str, Any], **options: Any) -> Any:
    """The sampling args the planned item's requests carry."""
    (tmp_path / "configs" / "envs").mkdir(parents=True, exist_ok=True)
    models = {"models": {"alpha": {"model": "m", "api_base_url": "http://h/v1", **model}}}
    (tmp_path / "configs" / "models.yaml").write_text(yaml.safe_dump(models))
    variant = {"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}, **env}
    (tmp_path / "configs" / "envs" / "qa.yaml").write_text(yaml.safe_dump([variant]))
    given = {"mb_model": "alpha", **options}
    run = RunOptions.from_config(FakeConfig(tmp_path, given, {}))  # type: ignore[arg-type]
    (item,) = build_plan(load_config_set(tmp_path / "configs"), run, check_module).items
    return item.sampling_args()


@pytest.mark.parametrize(
    ("model", "env", "options", "budget"),
    [
        (  # the command line wins, under whichever name it uses
            {"sampling_args": {"max_completion_tokens": 4096}},
            {},
            {"mb_sampling_args": '{"max_tokens": 8}'},
            {"max_tokens": 8},
        ),
        (
            {"sampling_args": {"max_tokens": 4096}},
            {"sampling_args": {"max_tokens": 64}},
            {"mb_sampling_args": '{"max_completion_tokens": 8}'},
            {"max_completion_tokens": 8},
        ),
        (  # an environment's budget over the model's sampling args
            {"sampling_args": {"max_completion_tokens": 4096}},
            {"sampling_args": {"max_tokens": 64}},
            {},
            {"max_tokens": 64},
        ),
        (  # the model's max_tokens key beats the environment's, under either name
            {"max_tokens": 200},
            {"sampling_args": {"max_completion_tokens": 64}},
            {},
            {"max_tokens": 200},
        ),
    ],
    ids=["cli-over-model", "cli-over-all", "env-over-model", "model-key-over-env"],
)
def test_one_token_budget_is_sent_and_it_is_the_winning_one(
    tmp_path: Path, model: Any, env: Any, options: Any, budget: dict[str, int]
) -> None:
    sent = _sent(tmp_path, model, env, **options)
    assert {k: v for k, v in sent.items() if k in ("max_tokens", "max_completion_tokens")} == budget
