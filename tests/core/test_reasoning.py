"""Reasoning models: the thinking is kept beside the answer (either vLLM field, or ``<think>``
blocks), its tokens are counted, and a reply cut off by the token budget is counted as
truncated, warned about, and named in a failing gate's paragraph, never just "wrong"."""

from __future__ import annotations

import asyncio
import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest
import yaml

from pytest_modelbench.reporting.html import examples_table
from pytest_modelbench.reporting.rows import Example
from pytest_modelbench.running.client import Completion, split_thinking
from pytest_modelbench.testing import wire
from pytest_modelbench.testing.simserver import SimConfig, SimServer
from tests.conftest import Project, configure, rows
from tests.core.test_client_transport import client, http, run


@pytest.mark.parametrize(
    ("text", "answer", "reasoning"),
    [
        ("The answer is 4", "The answer is 4", None),
        ("<think>2 and 2</think>The answer is 4", "The answer is 4", "2 and 2"),
        ("2 and 2 make 4</think>\nThe answer is 4", "\nThe answer is 4", "2 and 2 make 4"),
        ("<think>2 and 2 make", "", "2 and 2 make"),
        ("Hi <think>a</think> there <think>b</think>!", "Hi  there !", "a\n\nb"),
        ("x < y and <b>bold</b>", "x < y and <b>bold</b>", None),
        ("<THINK>upper</THINK>  def f():\n    return 1", "  def f():\n    return 1", "upper"),
    ],
    ids=["plain", "closed", "closing-only", "cut-off", "two-blocks", "other-tags", "indent"],
)
def test_split_thinking(text: str, answer: str, reasoning: str | None) -> None:
    assert split_thinking(text) == (answer, reasoning)


def body(message: dict[str, Any], finish: str = "stop", **usage: Any) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return http(json.dumps({"id": "c", "choices": [choice], "usage": usage}).encode())


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_client_reads_either_reasoning_field_and_its_tokens(field: str) -> None:
    details = {"reasoning_tokens": 7}
    reply = body(
        {"content": "4", field: "two and two"},
        prompt_tokens=3,
        completion_tokens=9,
        completion_tokens_details=details,
    )
    (completion,), _ = run(lambda _seen: reply, "q")
    assert (completion.text, completion.reasoning, completion.reasoning_tokens) == (
        "4",
        "two and two",
        7,
    )
    assert not completion.truncated


def test_client_reads_a_reply_cut_off_while_thinking() -> None:
    reply = body({"content": None, "reasoning_content": "two and"}, "length", completion_tokens=4)
    (completion,), _ = run(lambda _seen: reply, "q")
    assert completion.text == "" and completion.reasoning == "two and"
    assert completion.truncated and completion.truncated_in_reasoning
    assert completion.reasoning_tokens is None  # not sent: unknown, not zero


def ask(server: SimServer, max_tokens: int, **extra: Any) -> Completion:
    async def go() -> Completion:
        async with client(server.base_url) as c:
            messages = [{"role": "user", "content": "q"}]
            payload = {"model": "sim-model", "messages": messages, "max_tokens": max_tokens}
            return await c.request("/chat/completions", {**payload, **extra})

    return asyncio.run(go())


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "think"])
def test_simulated_reasoning_model(field: str) -> None:
    config = SimConfig(lookup={"q": ("the answer is 4", "no")}, reasoning_words=10)
    with SimServer(config, reasoning_field=field) as server:
        whole = ask(server, 100)
        cut = ask(server, 6)
        short = ask(server, 100, reasoning_effort="low")
        answer_cut = ask(server, 12)
    assert (whole.text.strip(), whole.finish_reason) == ("the answer is 4", "stop")
    assert whole.reasoning is not None and len(whole.reasoning.split()) == 10
    assert whole.reasoning_tokens == 10 and whole.completion_tokens == 14
    assert cut.truncated_in_reasoning and cut.reasoning is not None
    assert len(cut.reasoning.split()) == 6 and cut.completion_tokens == 6
    assert short.reasoning is not None and len(short.reasoning.split()) == 5
    assert answer_cut.truncated and not answer_cut.truncated_in_reasoning
    assert answer_cut.text.strip() == "the answer"


def reasoning_project(project: Project, url: str, *, max_tokens: int) -> None:
    configure(project, url, n=40)
    env = project.root / "configs" / "envs" / "qa.yaml"
    (variant,) = yaml.safe_load(env.read_text())
    variant["sampling_args"] = {"max_tokens": max_tokens}
    env.write_text(yaml.safe_dump([variant]))


def test_thinking_is_stored_and_scoring_reads_the_answer(project: Project, sim: Any) -> None:
    configure(project, "http://placeholder", n=40)
    server = sim(lookup=project.lookup("qa"), accuracy=0.5, reasoning_words=15, seed=1)
    reasoning_project(project, server.base_url, max_tokens=100)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    assert "truncated" not in result.stdout.str()  # no column, no warning: nothing ran out
    (run_dir,) = project.run_dirs()
    item = run_dir / "alpha-qa-seed0"
    summary = json.loads((item / "summary.json").read_text())
    journal = rows(item)
    assert all(len(r["reasoning"].split()) == 15 and r["reasoning_tokens"] == 15 for r in journal)
    assert all(r["completion"].startswith("Let me think.") for r in journal)
    assert summary["tokens"]["reasoning"] == 15 * 40
    assert (summary["truncated"], summary["truncated_in_reasoning"]) == (0, 0)
    right = sum(r["score"] for r in journal)
    assert 0 < right < 40 and summary["metrics"]["exact_match"]["value"] == right / 40


def test_answer_cut_after_thinking_is_truncated_not_in_reasoning(
    project: Project, sim: Any
) -> None:
    configure(project, "http://placeholder", n=40)
    server = sim(lookup=project.lookup("qa"), reasoning_words=15)
    reasoning_project(project, server.base_url, max_tokens=17)  # 2 words left for the answer
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["warning: alpha-qa-seed0: 40 of 40 replies were truncated (finish_reason length): *"]
    )
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    assert (summary["truncated"], summary["truncated_in_reasoning"]) == (40, 0)


def test_budget_too_small_warns_and_the_failing_gate_says_so(project: Project, sim: Any) -> None:
    configure(project, "http://placeholder", n=40)
    server = sim(lookup=project.lookup("qa"), reasoning_words=50)
    reasoning_project(project, server.base_url, max_tokens=8)
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
        "qa: {metric: exact_match, value: 0.9, source: paper}\n"
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--junitxml=out.xml")
    result.assert_outcomes(failed=1)
    junit = ET.parse(project.root / "out.xml").getroot()
    properties = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert (properties["mb_truncated"], properties["mb_truncated_in_reasoning"]) == ("40", "40")
    result.stdout.fnmatch_lines(
        [
            "qa exact_match 0.000 * (configs/baselines/alpha.yaml); 40 of 40 replies were "
            "truncated (finish_reason length, 40 while still thinking): raise max_tokens or "
            "lower reasoning_effort",
            "*model*variant*seed*metric*score*errors*truncated*baseline*verdict",
            "alpha*qa*0*exact_match*0.000*40*0*40*0.900*fail",
            "warning: alpha-qa-seed0: 40 of 40 replies were truncated (finish_reason length, "
            "40 while still thinking): raise max_tokens or lower reasoning_effort",
        ]
    )
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    assert (summary["truncated"], summary["truncated_in_reasoning"]) == (40, 40)
    assert summary["metrics"]["exact_match"]["value"] == 0.0
    assert all(r["completion"] == "" for r in rows(run_dir / "alpha-qa-seed0"))


def test_report_lists_the_thinking_collapsed_beside_the_answer() -> None:
    cut = Example("q1", 0, 0.0, None, "What is 3 + 5?", "", "8", "", "3 + 5 is", "length")
    answered = Example("q2", 0, 0.0, None, "2 + 2?", "5", "4", "5", "2 and 2 <is> 4", "stop")
    html = examples_table([cut, answered], 5)
    assert "score 0.000; out of tokens while thinking" in html
    assert (
        '<td><pre>5</pre><details class="mb-reasoning"><summary>reasoning (14 characters)'
        "</summary><pre>2 and 2 &lt;is&gt; 4</pre></details></td>"
    ) in html


def test_simulated_stream_carries_the_thinking_in_its_delta() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    payload = wire.completion_payload(
        1,
        "m",
        [("", "length")],
        usage,
        chat=True,
        thoughts=["two and"],
        reasoning_field="reasoning",
    )
    events = wire.sse_body(payload, None, chat=True, include_usage=False).split(b"\n\n")
    first = json.loads(events[0].removeprefix(b"data: "))
    delta = first["choices"][0]["delta"]
    assert delta == {"role": "assistant", "content": None, "reasoning": "two and"}


def test_simulated_reasoning_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="reasoning_field='thoughts': use one of reasoning_c"):
        SimConfig(reasoning_field="thoughts")
    with pytest.raises(ValueError, match="reasoning_words=-1"):
        SimConfig(reasoning_words=-1)


def test_a_model_budget_beats_the_environment_and_the_command_line_beats_both(
    project: Project, sim: Any
) -> None:
    """Precedence of ``max_tokens``: env variant < the model's ``max_tokens`` < --sampling-args."""
    configure(project, "http://placeholder", n=10)
    server = sim(lookup=project.lookup("qa"), reasoning_words=15)
    reasoning_project(project, server.base_url, max_tokens=10)  # the env cuts every reply
    models = yaml.safe_load((project.root / "configs" / "models.yaml").read_text())
    models["models"]["alpha"]["max_tokens"] = 200  # the model's budget holds the thinking
    (project.root / "configs" / "models.yaml").write_text(yaml.safe_dump(models))
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "alpha-qa-seed0" / "summary.json").read_text())
    assert summary["truncated"] == 0
    cut = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--run-id", "cli", "--sampling-args",
        '{"max_tokens": 5}',
    )  # fmt: skip
    cut.stdout.fnmatch_lines(["warning: alpha-qa-seed0: 10 of 10 replies were truncated*"])
    summary = json.loads(
        (project.root / "runs" / "cli" / "alpha-qa-seed0" / "summary.json").read_text()
    )
    assert summary["truncated_in_reasoning"] == 10
