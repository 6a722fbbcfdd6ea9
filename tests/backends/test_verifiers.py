"""Classic verifiers environments (0.1.14-0.3.x) through the plugin == the environment's own
``evaluate`` on the same server (v1 tasksets: test_verifiers_v1.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Project

vf = pytest.importorskip("verifiers", reason="needs the verifiers extra")
if not hasattr(vf, "load_environment"):
    pytest.skip(
        f"classic environments need verifiers 0.1.14-0.3.x (installed: {vf.__version__}); "
        "scripts/test.sh runs this module in .venv-vf-classic",
        allow_module_level=True,
    )


def _warm_up() -> None:
    """Import the verifiers stack at collection: pytester drops modules first imported during a
    test, and numpy cannot be imported twice in one process (a normal pytest run needs nothing)."""
    from datasets import Dataset

    parser = vf.Parser()
    vf.SingleTurnEnv(
        eval_dataset=Dataset.from_list([{"question": "q", "answer": "a"}]),
        parser=parser,
        rubric=vf.Rubric(funcs=[], parser=parser),
    )
    vf.OpenAIChatCompletionsClient  # noqa: B018 - lazy attribute: imports the client stack
    vf.load_environment  # noqa: B018


_warm_up()

ENV_MODULE = """
import verifiers as vf
from datasets import Dataset


def load_environment(n: int = 12, system_prompt: str | None = None):
    rows = [{"question": f"toy: what is {i} + 1?", "answer": str(i + 1)} for i in range(n)]
    parser = vf.Parser()

    def correct(completion, answer, **kwargs) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip().endswith(answer) else 0.0

    def brevity(completion, **kwargs) -> float:
        return 1.0 if len(parser.parse_answer(completion) or "") < 40 else 0.0

    rubric = vf.Rubric(funcs=[correct, brevity], weights=[1.0, 0.5], parser=parser)
    return vf.SingleTurnEnv(
        eval_dataset=Dataset.from_list(rows), system_prompt=system_prompt, parser=parser,
        rubric=rubric,
    )
"""


def _lookup(n: int) -> dict[str, tuple[str, str]]:
    return {
        f"toy: what is {i} + 1?": (
            f"The answer is {i + 1}",
            f"Hmm, it is {i + 7}, I think, after a long deliberation",
        )
        for i in range(n)
    }


@pytest.fixture
def env_module(
    project: Project, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> str:
    """A classic environment module, importable by its id (unique per test: envs are cached)."""
    name = f"toy_vf_{request.node.name.replace('test_', '')[:20]}"
    (project.root / "envmods").mkdir()
    (project.root / "envmods" / f"{name}.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(project.root / "envmods"))
    yield name
    sys.modules.pop(name, None)


def _direct(
    base_url: str, env_id: str, env_args: dict[str, Any], rollouts: int
) -> list[dict[str, Any]]:
    import verifiers as vf
    from openai import AsyncOpenAI

    env = vf.load_environment(env_id, **env_args)
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key="x"))
    results = asyncio.run(
        env.evaluate(
            client,
            "sim-model",
            num_examples=-1,
            rollouts_per_example=rollouts,
            on_progress=lambda *_: None,
        )
    )
    return list(results["outputs"])


@pytest.mark.slow
def test_plugin_equals_direct_evaluate(project: Project, sim: Any, env_module: str) -> None:
    server = sim(accuracy=0.6, lookup=_lookup(12))
    env_args = {"n": 12, "system_prompt": "Answer briefly."}
    project.models(
        {"vf": {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": 4}}
    )
    env_id = env_module.replace("_", "-")  # ids use dashes; load_environment maps them to modules
    project.env(
        "toy",
        [
            {
                "id": "toy",
                "module": f"verifiers:{env_id}",
                "env_args": env_args,
                "rollouts_per_example": 2,
            }
        ],
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "vf")
    result.assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    item = run_dir / "vf-toy-seed0"
    summary = json.loads((item / "summary.json").read_text())
    rows = [json.loads(line) for line in (item / "results.jsonl").open()]

    outputs = _direct(server.base_url, env_id, env_args, rollouts=2)
    direct_mean = sum(o["reward"] for o in outputs) / len(outputs)
    direct: dict[str, list[float]] = defaultdict(list)
    for output in outputs:
        direct[str(output["example_id"])].append(output["reward"])
    plugin: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        plugin[row["example_id"]].append(row["score"])

    assert summary["primary_metric"] == "reward" and summary["errors"] == 0
    assert summary["metrics"]["reward"]["n"] == len(outputs) == 24
    assert summary["metrics"]["reward"]["value"] == pytest.approx(direct_mean, abs=1e-12)
    assert {k: sorted(v) for k, v in plugin.items()} == {k: sorted(v) for k, v in direct.items()}
    assert (
        0 < direct_mean < 1.5
    )  # a mix of right and wrong answers, so the comparison means something
    for name in ("correct", "brevity"):  # each rubric function is a metric
        direct_metric = sum(o["metrics"][name] for o in outputs) / len(outputs)
        assert summary["metrics"][name]["value"] == pytest.approx(direct_metric, abs=1e-12)
    row = rows[0]
    assert row["prompt"].startswith("toy: what is") and row["gold"] == str(
        int(row["example_id"]) + 1
    )
    assert row["completion"] and row["detail"]["prompt_messages"][0]["role"] == "system"


@pytest.mark.slow
def test_failed_examples_resume_and_reach_the_journal(
    project: Project, sim: Any, env_module: str
) -> None:
    """Requests that fail for good become error rows; the re-run sends only those again."""
    lookup = _lookup(10)
    broken = sim(accuracy=1.0, lookup=lookup, faults={"error_5xx": 0.5}, seed=1)
    env_id = env_module.replace("_", "-")
    project.env("toy", [{"id": "toy", "module": f"verifiers:{env_id}", "env_args": {"n": 10}}])
    project.models(
        {"vf": {"model": "sim-model", "api_base_url": broken.base_url, "max_retries": 0}}
    )
    first = project.pytester.runpytest("benchmarks/", "--model", "vf")
    first.assert_outcomes(errors=1)  # over the 5% error budget
    (run_dir,) = project.run_dirs()
    rows = [json.loads(line) for line in (run_dir / "vf-toy-seed0" / "results.jsonl").open()]
    failed = {r["example_id"] for r in rows if r["error"]}
    assert len(rows) == 10 and 0 < len(failed) < 10
    broken.reconfigure(faults={})  # the same endpoint, healthy again: continues the same item
    broken.clear_log()
    second = project.pytester.runpytest("benchmarks/", "--model", "vf")
    second.assert_outcomes(passed=1)
    sent = [r for r in broken.requests if r.path.endswith("completions")]
    assert len(sent) == len(failed)
    summary = json.loads((run_dir / "vf-toy-seed0" / "summary.json").read_text())
    assert summary["errors"] == 0 and summary["metrics"]["reward"]["value"] == 1.5
    assert summary["resumed_examples"] == 10 - len(failed)


def test_an_endpoint_list_is_spread_over_and_a_url_down_is_served_around(
    project: Project, sim: Any, env_module: str
) -> None:
    """The environment's client takes one base URL: it gets the worker's router, which
    spreads the requests over the whole list and goes around a URL that is down."""
    one, two = (sim(accuracy=1.0, lookup=_lookup(12), latency=0.02) for _ in range(2))
    env_id = env_module.replace("_", "-")
    project.env("toy", [{"id": "toy", "module": f"verifiers:{env_id}", "env_args": {"n": 12}}])
    urls = [one.base_url, two.base_url]
    project.models({"vf": {"model": "sim-model", "api_base_url": urls, "max_concurrent": 4}})
    project.pytester.runpytest("benchmarks/", "--model", "vf").assert_outcomes(passed=1)
    sent = [sum(r.path.endswith("completions") for r in s.requests) for s in (one, two)]
    assert sum(sent) == 12 and min(sent) >= 3

    two.stop()  # the first URL of the list is down now: the other serves every request
    project.models({"vf": {"model": "sim-model", "api_base_url": urls[::-1], "max_retries": 0}})
    one.clear_log()
    again = project.pytester.runpytest("benchmarks/", "--model", "vf", "--force")
    again.assert_outcomes(passed=1)
    assert sum(r.path.endswith("completions") for r in one.requests) == 12


def test_unloadable_environment_is_a_clear_item_error(project: Project, sim: Any) -> None:
    server = sim(accuracy=1.0, lookup={})
    project.models({"vf": {"model": "sim-model", "api_base_url": server.base_url}})
    project.env("ghost", [{"id": "ghost", "module": "verifiers:no-such-env-xyz"}])
    result = project.pytester.runpytest("benchmarks/", "--model", "vf")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*cannot load verifiers environment 'no-such-env-xyz'*"])
    assert Path(project.root).exists()
