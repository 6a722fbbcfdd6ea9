"""A third-party backend written against ``pytest_modelbench.api`` alone (the one in
docs/api.md), registered through ``pytest_modelbench_make_backend`` in a conftest: it runs end
to end against the simulated server, resumes from its journal, and its item is gated."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

import pytest_modelbench.api as api
from tests.conftest import Project

DOCS = Path(__file__).parents[2] / "docs" / "api.md"
QUESTIONS = 20


def third_party_conftest() -> str:
    """The worked backend of docs/api.md (its one ``python`` block), as the docs show it."""
    text = DOCS.read_text()
    start = text.index("```python\n") + len("```python\n")
    return text[start : text.index("```\n", start)]


def test_the_worked_backend_imports_from_the_public_api_alone() -> None:
    tree = ast.parse(third_party_conftest())
    modules = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    ours = {name for name in modules if name.split(".")[0] == "pytest_modelbench"}
    assert ours == {"pytest_modelbench.api"}
    names = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "pytest_modelbench.api"
        for alias in node.names
    }
    assert names <= set(api.__all__), names - set(api.__all__)


def test_every_public_name_resolves() -> None:
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    with pytest.raises(AttributeError):
        _ = api.StoreWriteError  # private stays private


def test_every_error_a_public_docstring_names_is_public() -> None:
    """``Suite.examples`` tells authors to raise ``SuiteArgumentError``: they import it from
    here, and docs/api.md lists it."""
    import re

    documented = DOCS.read_text()
    for name in api.__all__:
        public = getattr(api, name)
        members = vars(public).values() if isinstance(public, type) else ()
        doc = "".join(getattr(o, "__doc__", None) or "" for o in (public, *members))
        for error in set(re.findall(r"`(\w+Error)`", doc)):
            assert error in api.__all__, f"{name}'s docstring names {error}"
            assert f"`{error}`" in documented, error


def _summary(run_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(
        (run_dir / "alpha-arithmetic-seed0" / "summary.json").read_text()
    )
    return summary


def test_a_third_party_backend_runs_resumes_and_is_gated(project: Project, sim: Any) -> None:
    (project.root / "benchmarks" / "conftest.py").write_text(third_party_conftest())
    lookup = {f"What is {i} + 1?": (str(i + 1), f"not {i + 1}") for i in range(QUESTIONS)}
    server = sim(accuracy=1.0, lookup=lookup)
    project.models({"alpha": {"model": "sim-model", "api_base_url": server.base_url}})
    project.env("arithmetic", [{"id": "arithmetic", "module": "arithmetic"}])
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("arithmetic: {value: 0.9}\n")
    run = project.pytester.runpytest
    args = ("benchmarks/", "--model", "alpha", "--mb-run-id", "r1")

    run(*args).assert_outcomes(passed=1)
    run_dir = project.root / "runs" / "r1"
    item_dir = run_dir / "alpha-arithmetic-seed0"
    summary = _summary(run_dir)
    assert summary["metrics"]["exact_match"]["value"] == 1.0
    assert (summary["n_rows"], summary["expected"], summary["resumed_examples"]) == (20, 20, 0)
    assert summary["arithmetic"] == {"asked": QUESTIONS}  # the backend's own field
    verdict = json.loads((item_dir / "result.json").read_text())["verdict"]
    assert verdict["baseline_value"] == 0.9 and verdict["passed"], verdict
    log = api.read_run(run_dir)  # a tool reads the run back through the public API alone
    (item,) = log.items
    assert (item.item_id, item.status, item.verdict) == (
        "alpha-arithmetic-seed0",
        api.ItemStatus.FINISHED,
        api.Verdict.PASS,
    )
    assert log.status() is api.RunStatus.FINISHED and log.gate_failures() == 0

    # a kill after 15 rows: the backend is told what is done and asks only the rest
    lines = (item_dir / "results.jsonl").read_text().splitlines(keepends=True)
    (item_dir / "results.jsonl").write_text("".join(lines[:15]))
    for name in ("summary.json", "result.json", "selection.json"):
        (item_dir / name).unlink(missing_ok=True)
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    manifest["items"]["alpha-arithmetic-seed0"]["status"] = "running"
    (run_dir / "run_manifest.json").write_text(json.dumps(manifest))
    server.clear_log()
    run(*args).assert_outcomes(passed=1)
    assert len([r for r in server.requests if r.path.endswith("completions")]) == 5
    summary = _summary(run_dir)
    assert (summary["n_rows"], summary["resumed_examples"]) == (20, 15)
    assert summary["arithmetic"] == {"asked": 5}

    # the model regresses: the gate fails the item with its paragraph
    server.reconfigure(accuracy=0.0)
    result = run(*args, "--mb-force")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*arithmetic exact_match 0.000 * vs baseline 0.900*regression*"])


CAPPED = "return keys if item.num_examples < 0 else keys[: item.num_examples]"


@pytest.mark.parametrize("honours", [True, False], ids=["as-documented", "ignoring-the-cap"])
def test_the_worked_backend_takes_num_examples_and_one_that_does_not_is_warned(
    project: Project, sim: Any, honours: bool
) -> None:
    """``--num-examples 5`` asks the documented backend 5 questions; a backend that ignores
    the cap (the docs' earlier example) runs all 20 and is told so once, by its module."""
    code = third_party_conftest()
    assert CAPPED in code
    (project.root / "benchmarks" / "conftest.py").write_text(
        code if honours else code.replace(CAPPED, "return keys")
    )
    lookup = {f"What is {i} + 1?": (str(i + 1), f"not {i + 1}") for i in range(QUESTIONS)}
    server = sim(accuracy=1.0, lookup=lookup)
    project.models({"alpha": {"model": "sim-model", "api_base_url": server.base_url}})
    project.env("arithmetic", [{"id": "arithmetic", "module": "arithmetic"}])
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--mb-run-id", "r1", "--num-examples", "5"
    )
    result.assert_outcomes(passed=1)
    asked = len([r for r in server.requests if r.path.endswith("completions")])
    summary = _summary(project.root / "runs" / "r1")
    warning = (
        "*ExampleCapWarning: alpha-arithmetic-seed0: the backend of module 'arithmetic' "
        "(conftest.Arithmetic) evaluated 20 examples where the item's num_examples is 5*"
    )
    if honours:
        assert (asked, summary["n_rows"], summary["expected"]) == (5, 5, 5)
        result.stdout.no_fnmatch_line("*ExampleCapWarning*")
    else:
        assert (asked, summary["n_rows"]) == (20, 20)
        result.stdout.fnmatch_lines([warning])
        assert len(result.stdout.str().split("ExampleCapWarning:")) == 2  # once
        # as an error (-W error), the warning errors the test but the item is finished and kept
        strict = project.pytester.runpytest(
            "benchmarks/", "--model", "alpha", "--mb-run-id", "r2", "--num-examples", "5",
            "-W", "error::UserWarning",
        )  # fmt: skip
        strict.assert_outcomes(errors=1)  # raised in mb_eval's setup
        assert _summary(project.root / "runs" / "r2")["status"] == "finished"


OWN_SUITE = """
from pytest_modelbench.api import Example, Score, SuiteArgumentError, SuiteBackend


class Sums:
    name = "sums"
    primary_metric = "accuracy"
    metrics = ("accuracy",)
    tokens_per_example = 8
    blocking_score = False

    def data_checksum(self):
        return "sums/1"

    def examples(self, env_args, seed):
        unknown = set(env_args) - {"size"}
        if unknown:
            raise SuiteArgumentError(f"unknown env arg {sorted(unknown)[0]!r}: sums takes size")
        return [Example(id="s0", messages=({"role": "user", "content": "1+1?"},), gold="2")]

    def score(self, example, completion):
        return Score(metrics={"accuracy": float(completion.strip() == example.gold)})

    def reference_completion(self, example):
        return example.gold

    def wrong_completion(self, example):
        return "no"


def pytest_modelbench_make_backend(config, module):
    return SuiteBackend(Sums()) if module == "sums" else None
"""


def test_a_suite_written_against_the_api_refuses_an_env_arg_with_one_line(
    project: Project,
) -> None:
    """The ``Suite`` docstring's ``SuiteArgumentError`` is importable from the public API, and
    raising it errors the item with one line naming the variant, not a traceback."""
    (project.root / "benchmarks" / "conftest.py").write_text(OWN_SUITE)
    project.models({"alpha": {"model": "m", "api_base_url": "http://127.0.0.1:9/v1"}})
    project.env("sums", [{"id": "sums", "module": "sums", "env_args": {"sise": 3}}])
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-run-id", "r1")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["sums.yaml: variant 'sums': unknown env arg 'sise': sums takes size"]
    )
    result.stdout.no_fnmatch_line("*Traceback*")


OLD_STYLE = '''
from pytest_modelbench.api import Example


class OldStyle:
    """Written for an earlier release: {how}."""

    def count_examples(self, item):
        return 1

    def fingerprint_parts(self, item):
        return {}

    def primary_metric(self, item):
        return "exact_match"

    def evaluate(self, ctx):
        {body}


def pytest_modelbench_make_backend(config, module):
    return OldStyle() if module == "old" else None
'''


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("return {'metrics': {}}", "returned dict, not an Outcome"),
        ("return ctx.store.journal", "ItemContext.store is gone"),
    ],
    ids=["returns-a-dict", "writes-the-store"],
)
def test_a_backend_written_for_an_earlier_release_fails_its_item_with_one_line(
    project: Project, sim: Any, body: str, said: str
) -> None:
    """Not "interrupted" with no word: the item errors and says what changed, where to read."""
    conftest = OLD_STYLE.replace("{body}", body).replace("{how}", said)
    (project.root / "benchmarks" / "conftest.py").write_text(conftest)
    project.models({"alpha": {"model": "sim-model", "api_base_url": sim().base_url}})
    project.env("old", [{"id": "old", "module": "old"}])
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-run-id", "r1")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{said}*docs/api.md*"])
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.no_fnmatch_line("*AttributeError*")
    manifest = json.loads((project.root / "runs" / "r1" / "run_manifest.json").read_text())
    assert manifest["items"]["alpha-old-seed0"]["status"] == "error"
