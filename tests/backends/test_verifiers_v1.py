"""verifiers v1 tasksets through the plugin == ``vf-eval`` on the same streaming server.

A toy taskset package (8 arithmetic tasks, a weighted exact-match reward, a brevity reward
and a metric) is put on ``PYTHONPATH``; the simulated server answers each question right or
wrong by its text (streamed chat completions with usage, as the null harness asks). The
rollouts run for real: the null harness program, built with uv, in the subprocess runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Project

vf = pytest.importorskip("verifiers.v1", reason="needs the verifiers extra (0.4)")

pytestmark = pytest.mark.slow

TASKSET = """
import verifiers.v1 as vf

ROWS = [(f"toy: what is {i} + 1?", str(i + 1)) for i in range(8)]


class ToyData(vf.TaskData):
    answer: str


class ToyTask(vf.Task[ToyData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().endswith(self.data.answer))

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) < 40)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ToyConfig(vf.TasksetConfig):
    system: str = "Answer briefly."


class ToyTasks(vf.Taskset[ToyTask, ToyConfig]):
    def load(self):
        for question, answer in ROWS:
            yield ToyTask(
                ToyData(prompt=question, answer=answer, system_prompt=self.config.system),
                self.config.task,
            )


__all__ = ["ToyTasks", "ToyTask", "ToyData", "ToyConfig"]
"""

QUESTIONS = {f"toy: what is {i} + 1?": str(i + 1) for i in range(8)}
WRONG = {"toy: what is 2 + 1?", "toy: what is 5 + 1?", "toy: what is 6 + 1?"}


def answer_for(question: str) -> tuple[str, str]:
    right, wrong = f"The answer is {QUESTIONS[question]}", "Hmm, after a long deliberation: 99"
    return (wrong, right) if question in WRONG else (right, wrong)  # the sim answers "right"


@pytest.fixture
def taskset(project: Project, monkeypatch: pytest.MonkeyPatch) -> str:
    """The toy taskset as an importable package (here and in subprocesses)."""
    packages = project.root / "taskpkgs"
    (packages / "toy_tasks").mkdir(parents=True)
    (packages / "toy_tasks" / "__init__.py").write_text(TASKSET)
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(packages), os.environ.get("PYTHONPATH")]))
    )
    yield "toy-tasks"
    sys.modules.pop("toy_tasks", None)


def setup_project(project: Project, sim: Any, env_id: str, **variant: Any) -> Any:
    server = sim(accuracy=1.0, lookup={q: answer_for(q) for q in QUESTIONS})
    project.models({"vf": {"model": "sim-model", "api_base_url": server.base_url}})
    project.env("toy", [{"id": "toy", "module": f"verifiers:{env_id}", **variant}])
    return server


def journal(project: Project) -> list[dict[str, Any]]:
    (run_dir,) = project.run_dirs()
    return [json.loads(line) for line in (run_dir / "vf-toy-seed0" / "results.jsonl").open()]


def vf_eval(base_url: str, env_id: str, out: Path, n: int) -> list[dict[str, Any]]:
    """``vf-eval`` itself (the v1 CLI) on the same server: its episodes from traces.jsonl."""
    command = [
        str(Path(sys.executable).parent / "vf-eval"), env_id,
        "--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess",
        "-m", "sim-model", "--client.base-url", base_url, "--client.api-key-var", "NO_SUCH_KEY_VAR",
        "-n", str(n), "-r", "1", "-c", "4", "--no-push", "--no-rich",
        "-o", str(out), "--run.name", "parity",
    ]  # fmt: skip
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (out / "parity" / "traces.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def total_reward(trace: dict[str, Any]) -> float:
    rewards = trace["rewards"].values()
    return sum(r["score"] * r["weight"] for r in rewards if r is not None)


def test_taskset_matches_vf_eval_on_the_same_server(
    project: Project, sim: Any, taskset: str, tmp_path: Path
) -> None:
    server = setup_project(project, sim, taskset)
    result = project.pytester.runpytest("benchmarks/", "--model", "vf")
    result.assert_outcomes(passed=1)
    rows = journal(project)
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "vf-toy-seed0" / "summary.json").read_text())

    episodes = vf_eval(server.base_url, taskset, tmp_path / "vf-eval", n=8)
    theirs = {ep["task"]["hash"][:16]: total_reward(ep["traces"][0]) for ep in episodes}
    ours = {row["example_id"]: row["score"] for row in rows}
    assert len(ours) == len(theirs) == 8
    assert ours == theirs  # the same per-task rewards
    mean = sum(theirs.values()) / 8
    assert summary["metrics"]["reward"]["value"] == pytest.approx(mean, abs=1e-12)
    assert mean == pytest.approx((5 * 1.5 + 3 * 0.5) / 8)  # 5 right and brief, 3 wrong and brief

    assert summary["primary_metric"] == "reward" and summary["errors"] == 0
    assert summary["metrics"]["correct"]["value"] == pytest.approx(5 / 8)
    assert summary["metrics"]["brief"]["value"] == 1.0
    assert summary["metrics"]["reply_chars"]["value"] > 10
    assert summary["verifiers"]["line"] == "v1"
    assert summary["verifiers"]["stop_conditions"] == {"agent_completed": 8}
    row = next(r for r in rows if r["prompt"] == "toy: what is 0 + 1?")
    assert row["gold"] == "1" and row["completion"] == "The answer is 1" and row["score"] == 1.5
    assert row["tokens"]["prompt"] > 0 and row["tokens"]["completion"] > 0
    assert row["detail"]["rewards"]["correct"] == {"score": 1.0, "weight": 1.0}
    requests = [r for r in server.requests if r.path.endswith("chat/completions")]
    assert len(requests) == 16  # 8 by modelbench, 8 by vf-eval


def test_an_endpoint_list_is_spread_over_and_a_url_down_is_served_around(
    project: Project, sim: Any, taskset: str
) -> None:
    """The harnesses take one base URL: they get the worker's router, which spreads the
    (streamed) requests over the whole list and goes around a URL that is down."""
    one = setup_project(project, sim, taskset)
    two = sim(accuracy=1.0, lookup={q: answer_for(q) for q in QUESTIONS})
    urls = [one.base_url, two.base_url]
    project.models({"vf": {"model": "sim-model", "api_base_url": urls, "max_concurrent": 4}})
    project.pytester.runpytest("benchmarks/", "--model", "vf").assert_outcomes(passed=1)
    sent = [sum(r.path.endswith("chat/completions") for r in s.requests) for s in (one, two)]
    assert sum(sent) == 8 and min(sent) >= 2
    assert all(row["score"] is not None and not row["error"] for row in journal(project))

    two.stop()  # the first URL of the list is down now: the other serves every rollout
    project.models({"vf": {"model": "sim-model", "api_base_url": urls[::-1], "max_retries": 0}})
    one.clear_log()
    again = project.pytester.runpytest("benchmarks/", "--model", "vf", "--force")
    again.assert_outcomes(passed=1)
    assert sum(r.path.endswith("chat/completions") for r in one.requests) == 8


def test_resume_by_task_and_num_examples(project: Project, sim: Any, taskset: str) -> None:
    server = setup_project(project, sim, taskset, rollouts_per_example=2)
    first = project.pytester.runpytest("benchmarks/", "--model", "vf", "--num-examples", "3")
    first.assert_outcomes(passed=1)
    assert len(journal(project)) == 6
    server.clear_log()
    second = project.pytester.runpytest("benchmarks/", "--model", "vf", "--num-examples", "5")
    second.assert_outcomes(passed=1)
    sent = [r for r in server.requests if r.path.endswith("chat/completions")]
    assert len(sent) == 4  # only the 2 new tasks x 2 rollouts
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "vf-toy-seed0" / "summary.json").read_text())
    assert summary["metrics"]["reward"]["n"] == 10 and summary["resumed_examples"] == 6
    assert summary["verifiers"]["any_reward@2"] == 1.0
    by_task: dict[str, set[int]] = defaultdict(set)
    for row in journal(project):
        by_task[row["example_id"]].add(row["rollout"])
    assert all(rollouts == {0, 1} for rollouts in by_task.values()) and len(by_task) == 5


def test_missing_uv_is_one_error_before_any_rollout(
    project: Project, sim: Any, taskset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = setup_project(project, sim, taskset)
    python = project.root / "bare" / "python"  # a Python with no uv beside it, none on PATH
    python.parent.mkdir()
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in ("/usr/bin", "/bin") if os.path.isdir(p)))
    result = project.pytester.runpytest("benchmarks/", "--model", "vf")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*vf-toy-seed0: verifiers v1 tasksets build each rollout's harness with uv, which is "
         "neither on PATH nor beside *: pip install 'pytest-modelbench?verifiers?' (or pip "
         "install uv); no rollout was started*"]
    )  # fmt: skip
    assert not [r for r in server.requests if r.path.endswith("completions")]


def test_completions_api_is_refused(project: Project, sim: Any, taskset: str) -> None:
    server = setup_project(project, sim, taskset)
    project.models(
        {"vf": {"model": "sim-model", "api_base_url": server.base_url, "api": "completions"}}
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "vf")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*model 'vf' has api: completions; verifiers v1 harnesses speak chat completions "
         "only: set api: chat (the default) for this model*"]
    )  # fmt: skip


def test_harness_and_taskset_config_from_env_args(project: Project, sim: Any, taskset: str) -> None:
    setup_project(project, sim, taskset, env_args={"system": "Be terse.", "harness": "nope"})
    result = project.pytester.runpytest("benchmarks/", "--model", "vf")
    output = result.stdout.str() + result.stderr.str()
    assert "cannot load verifiers taskset 'toy-tasks'" in output and "nope" in output
    assert "Traceback" not in output


def test_classic_environment_under_v1_only_verifiers_names_the_way_out(
    base: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    if hasattr(__import__("verifiers"), "load_environment"):
        pytest.skip("a classic verifiers is installed: classic environments run")
    (base.root / "classicpkg").mkdir()
    (base.root / "classicpkg" / "old_env.py").write_text("def load_environment(**kw):\n    pass\n")
    monkeypatch.syspath_prepend(str(base.root / "classicpkg"))
    base.env("old", [{"id": "old", "module": "verifiers:old-env"}])
    result = base.pytester.runpytest("benchmarks/", "--model", "alpha", "--env", "old")
    result.assert_outcomes(errors=1)  # before any request (the endpoint is unreachable)
    result.stdout.fnmatch_lines(
        ["old.yaml: variant 'old': 'old-env' is a classic verifiers environment (it exports "
         "load_environment), which verifiers 0.4.* cannot run: 0.4 removed the classic API. *"
         "pytest-modelbench?verifiers-classic?*or port it to a v1 taskset (docs/backends.md)"]
    )  # fmt: skip
    assert "Traceback" not in result.stdout.str()
    sys.modules.pop("old_env", None)


def test_the_key_reaches_verifiers_under_a_name_harnesses_never_see(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_modelbench.backends.verifiers_v1 import KEY_VAR, key_for_harness

    monkeypatch.setenv("HF_TOKEN", "hf-secret")  # a name verifiers' runtime would pass on
    with key_for_harness("hf-secret", "HF_TOKEN"):
        assert os.environ[KEY_VAR] == "hf-secret" and "API_KEY" in KEY_VAR
        assert "HF_TOKEN" not in os.environ
    assert os.environ["HF_TOKEN"] == "hf-secret" and KEY_VAR not in os.environ
    with key_for_harness(None, None):
        assert os.environ[KEY_VAR] == "EMPTY"


PARTIAL_TASKSET = TASKSET.replace("@vf.reward(weight=1.0)", "@vf.reward(weight=0.8)").replace(
    "@vf.reward(weight=0.5)", "@vf.reward(weight=0.2)"
)


def test_a_rubric_collapse_to_constant_partial_credit_fails_the_paired_gate(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's rubric: 0.8 for the right answer, 0.2 for a brief one. Yesterday every task
    scored 1.0; today's checkpoint stays brief and gets every answer wrong: 0.2 on every task,
    8 equal drops of 0.8, p = (0.5 / 0.9)^8 = 0.009 by the exact bounded test (before:
    "undecidable", a pass)."""
    packages = project.root / "partialpkgs"
    (packages / "partial_tasks").mkdir(parents=True)
    (packages / "partial_tasks" / "__init__.py").write_text(PARTIAL_TASKSET)
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(packages), os.environ.get("PYTHONPATH")]))
    )
    right_first = {
        q: (f"The answer is {a}", "Hmm, after a long deliberation: 99")
        for q, a in QUESTIONS.items()
    }
    server = sim(accuracy=1.0, lookup=right_first)
    project.models({"vf": {"model": "sim-model", "api_base_url": server.base_url}})
    project.env("toy", [{"id": "toy", "module": "verifiers:partial-tasks"}])
    try:
        project.pytester.runpytest("benchmarks/", "--model", "vf").assert_outcomes(passed=1)
        (yesterday,) = project.run_dirs()
        server.reconfigure(accuracy=0.0)
        result = project.pytester.runpytest(
            "benchmarks/", "--model", "vf", "--baseline-run", yesterday.name
        )
    finally:
        sys.modules.pop("partial_tasks", None)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"toy reward 0.200 * vs run {yesterday.name} 1.000 (margin 0, 8 paired examples): "
            "regression of 0.800, Δ -0.800, 90% CI ?-0.862, -0.238?, p=0.009, exact test for 8 "
            "equal paired differences in ?-1, 1?; 8 worse*"
        ]
    )
