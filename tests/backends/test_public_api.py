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
        _ = api.SuiteArgumentError  # private stays private


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
