"""lm-eval tasks through the plugin == the ``lm_eval`` command line on the same server."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Project

lm_eval = pytest.importorskip("lm_eval", reason="needs the lm-eval extra")

N = 12
TASK_YAML = """\
task: toy_qa
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/toy.jsonl   # relative to this file; lm-eval itself reads it from the cwd
test_split: test
output_type: generate_until
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n\\n"]
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "The answer is (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: take_first
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{2,})|(-?[0-9]+)"
      - function: take_first
metadata:
  version: 1.0
"""


def _warm_up() -> None:
    """Import lm-eval's stack at collection: pytester drops modules first imported during a test,
    and numpy cannot be imported twice in one process (a normal pytest run needs nothing)."""
    import datasets  # noqa: F401
    import lm_eval.api.registry
    import lm_eval.evaluator
    import lm_eval.models.openai_completions
    import sqlitedict  # noqa: F401

    lm_eval.api.registry.get_model("local-completions")
    if importlib.util.find_spec("torch") is not None:  # lm-eval records torch's env info
        import torch.utils.collect_env  # noqa: F401
    if importlib.util.find_spec("transformers") is not None:
        import transformers  # noqa: F401


_warm_up()


def write_task(project: Project) -> Path:
    """``tasks/toy_qa.yaml`` with its data in ``tasks/data/toy.jsonl``."""
    tasks = project.root / "tasks"
    (tasks / "data").mkdir(parents=True)
    with (tasks / "data" / "toy.jsonl").open("w") as handle:
        for i in range(N):
            handle.write(
                json.dumps({"question": f"toy: what is {i} + 1?", "answer": str(i + 1)}) + "\n"
            )
    (tasks / "toy_qa.yaml").write_text(TASK_YAML)
    return tasks / "toy_qa.yaml"


def lookup() -> dict[str, tuple[str, str]]:
    """Keyed by the completion prompt lm-eval sends (doc_to_text, zero-shot)."""
    return {
        f"Question: toy: what is {i} + 1?\nAnswer:": (f"The answer is {i + 1}", f"I think {i + 7}")
        for i in range(N)
    }


def configure(
    project: Project, url: str | list[str], *, api: str = "completions", **model: Any
) -> None:
    project.models(
        {
            "lm": {
                "model": "sim-model",
                "api_base_url": url,
                "api": api,
                "max_concurrent": 4,
                **model,
            }
        }
    )
    project.env("toy", [{"id": "toy", "module": "lm_eval:tasks/toy_qa.yaml", "seeds": [42]}])


def _cli(url: str, cwd: Path, out: Path) -> dict[str, Any]:
    """The same evaluation with lm-eval's own command line (run where the YAML's data is found)."""
    model_args = (
        f"model=sim-model,base_url={url}/completions,num_concurrent=4,max_retries=6,"
        "timeout=600,seed=42,tokenized_requests=False,tokenizer_backend=none"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            *(["run"] if importlib.util.find_spec("lm_eval._cli") else []),  # 0.4.12+
            "--model",
            "local-completions",
            "--model_args",
            model_args,
            "--tasks",
            "toy_qa.yaml",
            "--seed",
            "42",
            "--output_path",
            str(out),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.rglob("results_*.json")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.mark.slow
def test_plugin_equals_lm_eval_command_line(project: Project, sim: Any, tmp_path: Path) -> None:
    write_task(project)
    server = sim(accuracy=0.6, lookup=lookup())
    configure(project, server.base_url)
    result = project.pytester.runpytest("benchmarks/", "--model", "lm")
    result.assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    item = run_dir / "lm-toy-seed42"
    summary = json.loads((item / "summary.json").read_text())

    cli = _cli(server.base_url, project.root / "tasks", tmp_path / "cli-out")["results"]["toy_qa"]
    assert summary["primary_metric"] == "exact_match,strict-match"
    for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
        metric, flt = key.split(",")
        assert summary["metrics"][key]["value"] == cli[key]
        assert summary["metrics"][key]["stderr"] == cli[f"{metric}_stderr,{flt}"]
        assert summary["metrics"][key]["n"] == N
    assert 0 < cli["exact_match,strict-match"] < 1  # a mix, so equality means something
    rows = [json.loads(line) for line in (item / "results.jsonl").open()]
    assert len(rows) == N and {r["example_id"] for r in rows} == {str(i) for i in range(N)}
    mean = sum(r["metrics"]["exact_match,strict-match"] for r in rows) / N
    assert mean == pytest.approx(cli["exact_match,strict-match"], abs=1e-12)
    row = rows[0]
    assert row["prompt"] == "Question: toy: what is 0 + 1?\nAnswer:" and row["gold"] == "1"
    assert set(row["extracted"]) == {"strict-match", "flexible-extract"}
    assert summary["lm_eval"]["n-shot"] == {"toy_qa": 0} and summary["lm_eval"]["versions"]


@pytest.mark.slow
def test_interrupted_item_resends_only_unfinished_requests(project: Project, sim: Any) -> None:
    write_task(project)
    broken = sim(accuracy=1.0, lookup=lookup(), faults={"error_5xx": 0.3}, seed=1)
    configure(
        project, broken.base_url, max_retries=0, max_concurrent=1
    )  # one at a time, one attempt each: repeatable
    first = project.pytester.runpytest("benchmarks/", "--model", "lm")
    first.assert_outcomes(errors=1)
    first.stdout.fnmatch_lines(["*lm-eval failed*are cached in*not sent again when you re-run*"])
    answered = {r.key for r in broken.requests if r.outcome == "ok"}
    assert 0 < len(answered) < N
    broken.reconfigure(faults={})  # the same endpoint, healthy again: continues the same item
    broken.clear_log()
    second = project.pytester.runpytest("benchmarks/", "--model", "lm")
    second.assert_outcomes(passed=1)
    resent = [r.key for r in broken.requests if r.path.endswith("completions")]
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "lm-toy-seed42" / "summary.json").read_text())
    cached = summary["lm_eval"]["cached_requests_at_start"]
    # answers the client had read before the failure came from lm-eval's cache (an answer still
    # in flight when lm-eval gave up is asked again); nothing is asked twice
    assert 0 < cached <= len(answered) and len(resent) == len(set(resent)) == N - cached
    assert summary["metrics"]["exact_match,strict-match"]["value"] == 1.0
    assert summary["metrics"]["exact_match,strict-match"]["n"] == N


def test_chat_endpoint_and_unknown_metric(project: Project, sim: Any) -> None:
    write_task(project)
    server = sim(accuracy=1.0, lookup=lookup())  # the user message is the same text
    configure(project, server.base_url, api="chat")
    result = project.pytester.runpytest("benchmarks/", "--model", "lm", "--num-examples", "4")
    result.assert_outcomes(passed=1)
    sent = [r for r in server.requests if "compl" in r.path]
    assert len(sent) == 4 and all(r.path.endswith("/chat/completions") for r in sent)
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "lm-toy-seed42" / "summary.json").read_text())
    strict = summary["metrics"]["exact_match,strict-match"]
    assert strict["value"] == 1.0 and strict["n"] == 4
    project.env("toy", [{"id": "toy", "module": "lm_eval:tasks/toy_qa.yaml", "metric": "acc,none"}])
    bad = project.pytester.runpytest("benchmarks/", "--model", "lm")
    bad.assert_outcomes(errors=1)
    bad.stdout.fnmatch_lines(
        [
            "*unknown metric 'acc,none'*reports: exact_match,strict-match, "
            "exact_match,flexible-extract*"
        ]
    )


def _completions(server: Any) -> int:
    return sum(1 for r in server.requests if r.path.endswith("completions"))


def test_an_endpoint_list_is_spread_over_and_a_url_down_is_served_around(
    project: Project, sim: Any
) -> None:
    """lm-eval takes one base URL: it gets the worker's router, which spreads the requests
    over the whole list (before, every request went to the first URL)."""
    write_task(project)
    one, two = (sim(accuracy=1.0, lookup=lookup(), latency=0.02) for _ in range(2))
    configure(project, [one.base_url, two.base_url])
    result = project.pytester.runpytest("benchmarks/", "--model", "lm")
    result.assert_outcomes(passed=1)
    assert _completions(one) + _completions(two) == N
    assert _completions(one) >= N // 4 and _completions(two) >= N // 4

    two.stop()  # the first URL of the list is down now: the other serves every request
    configure(project, [two.base_url, one.base_url], max_retries=0)
    before = _completions(one)
    again = project.pytester.runpytest("benchmarks/", "--model", "lm", "--force")
    again.assert_outcomes(passed=1)
    assert _completions(one) - before == N


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_modelbench.backends import lm_eval_backend, registry
    from pytest_modelbench.errors import ModelbenchUsageError

    monkeypatch.setattr(lm_eval_backend.importlib.util, "find_spec", lambda _name: None)
    registry._BACKEND_CACHE.pop("lm_eval:hellaswag", None)
    with pytest.raises(ModelbenchUsageError, match=r"pip install 'pytest-modelbench\[lm-eval\]'"):
        registry.resolve_builtin("lm_eval:hellaswag")


@pytest.mark.slow
def test_task_by_name_from_include_path(project: Project, sim: Any) -> None:
    """``lm_eval:<name>`` finds your own task in ``include_path`` (data files still resolved)."""
    write_task(project)
    server = sim(accuracy=1.0, lookup=lookup())
    configure(project, server.base_url)
    project.env(
        "toy",
        [
            {
                "id": "toy",
                "module": "lm_eval:toy_qa",
                "seeds": [42],
                "env_args": {"include_path": str(project.root / "tasks")},
            }
        ],
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "lm", "--num-examples", "3")
    result.assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    summary = json.loads((run_dir / "lm-toy-seed42" / "summary.json").read_text())
    assert summary["metrics"]["exact_match,strict-match"]["value"] == 1.0
    assert summary["metrics"]["exact_match,strict-match"]["n"] == 3


@pytest.mark.parametrize("version", ["0.4.9.1", "0.5.0"])
def test_unsupported_version_names_working_ones(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    from pytest_modelbench.backends import lm_eval_backend
    from pytest_modelbench.errors import ModelbenchUsageError

    monkeypatch.setattr(lm_eval_backend.importlib.metadata, "version", lambda _name: version)
    with pytest.raises(ModelbenchUsageError) as info:
        lm_eval_backend.require_extra("lm_eval:gsm8k")
    assert f"lm-eval {version} is installed" in str(info.value)
    assert "pip install 'lm-eval[api]>=0.4.12,<0.5'" in str(info.value)


def test_live_progress_counts_lm_eval_requests(project: Project, sim: Any) -> None:
    write_task(project)
    server = sim(accuracy=1.0, lookup=lookup(), latency=0.1)  # 12 requests, 2 at once: 0.6 s
    configure(project, server.base_url, max_concurrent=2)
    result = project.pytester.runpytest_subprocess(
        "benchmarks/", "--model", "lm", "--mb-progress-interval", "0.05", timeout=300
    )
    result.assert_outcomes(passed=1)
    shown = [
        (int(done), int(total))
        for done, total in re.findall(r"lm-toy-seed42 (\d+)/(\d+) \(", result.stdout.str())
    ]
    assert shown and {total for _, total in shown} == {N}
    assert any(0 < done < N for done, _ in shown)  # counted while running, not only at the end


PARTIAL_TASK = """\
task: toy_partial
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/toy.jsonl
test_split: test
output_type: generate_until
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n\\n"]
  do_sample: false
process_results: !function partial.process_results
metric_list:
  - metric: score
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

PARTIAL_SCORING = """\
def process_results(doc, results):
    # partial credit: 0.2 for answering in the asked format, 0.8 more for the right number
    reply = results[0].strip()
    formatted = reply.startswith(("The answer is", "I think"))
    right = reply.endswith(" " + doc["answer"])
    return {"score": 0.2 * formatted + 0.8 * right}
"""


def test_constant_partial_credit_through_process_results_fails_its_gate(
    project: Project, sim: Any
) -> None:
    """A checkpoint that keeps the format and gets every answer wrong scores exactly 0.2 on
    every example: an exact test fails it against 0.95 (before: "undecidable", exit 0)."""
    write_task(project)
    (project.root / "tasks" / "toy_partial.yaml").write_text(PARTIAL_TASK)
    (project.root / "tasks" / "partial.py").write_text(PARTIAL_SCORING)
    server = sim(accuracy=0.0, lookup=lookup())
    project.models({"lm": {"model": "sim-model", "api_base_url": server.base_url}})
    project.env("toy", [{"id": "toy", "module": "lm_eval:tasks/toy_partial.yaml", "seeds": [42]}])
    (project.root / "configs" / "baselines" / "lm.yaml").write_text("toy: {value: 0.95}\n")
    result = project.pytester.runpytest("benchmarks/", "--model", "lm")
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "toy score,none 0.200 * vs baseline 0.950 (margin 0): regression of 0.750, "
            f"*exact test for {N} equal scores in ?0, 1?*"
        ]
    )
