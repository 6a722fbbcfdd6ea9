"""``results.parquet``: one documented, versioned schema for every backend's rows."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.reporting.model import load_run
from pytest_modelbench.reporting.rows import (
    COLUMNS,
    PARQUET_SCHEMA_VERSION,
    ParquetUnavailable,
    arrow_schema,
    write_parquet,
)
from tests.conftest import Project, configure
from tests.reports.conftest import craft_run

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

DOCUMENTED = {
    "schema_version": "int32",
    "run_id": "string",
    "item_id": "string",
    "model": "string",
    "environment": "string",
    "variant": "string",
    "module": "string",
    "seed": "int64",
    "example_id": "string",
    "rollout": "int32",
    "metric": "string",
    "score": "double",
    "metrics": "map<string, double>",
    "prompt_tokens": "int64",
    "completion_tokens": "int64",
    "latency_s": "double",
    "attempts": "int32",
    "error": "string",
    "finish_reason": "string",
    "prompt": "string",
    "completion": "string",
    "gold": "string",
    "extracted": "string",
    "reasoning_tokens": "int64",
    "reasoning": "string",
}


def test_schema_is_the_documented_one() -> None:
    schema = arrow_schema()
    assert {f.name: str(f.type) for f in schema} == DOCUMENTED
    assert [name for name, _, _ in COLUMNS] == list(DOCUMENTED)
    assert schema.metadata[b"modelbench.schema_version"] == str(PARQUET_SCHEMA_VERSION).encode()
    docs = (Path(__file__).parents[2] / "docs" / "reports.md").read_text()
    for name in DOCUMENTED:
        assert f"| `{name}` |" in docs, f"docs/reports.md does not document column {name}"


def test_session_writes_parquet_of_every_example(project: Project, sim: Any) -> None:
    configure(project, "http://placeholder", ("alpha",), n=50, envs=("qa", "math"))
    server = sim(
        accuracy=0.6, lookup=project.lookup("qa", "math"), faults={"error_5xx": 0.1}, seed=2
    )
    configure(project, server.base_url, ("alpha",), n=50, envs=("qa", "math"), max_retries=0)
    project.env(
        "math",
        [
            {
                "id": "math",
                "module": "jsonl",
                "env_args": {"path": "math.jsonl"},
                "rollouts_per_example": 2,
            }
        ],
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-error-budget", "1")
    result.assert_outcomes(passed=2)
    (run_dir,) = project.run_dirs()
    table = pq.read_table(run_dir / "results.parquet")
    assert table.schema.equals(arrow_schema())
    assert table.schema.metadata == arrow_schema().metadata
    rows = table.to_pylist()
    assert len(rows) == 50 + 50 * 2
    assert {r["rollout"] for r in rows if r["variant"] == "math"} == {0, 1}
    errored = [r for r in rows if r["error"]]
    scored = [r for r in rows if not r["error"]]
    assert 0 < sum(r["score"] for r in scored) < len(scored)  # right and wrong answers
    assert errored and all(r["score"] is None and "HTTP 5" in r["error"] for r in errored)
    for row in scored:
        assert row["schema_version"] == PARQUET_SCHEMA_VERSION and row["module"] == "jsonl"
        assert (
            row["metric"] == "exact_match" and dict(row["metrics"])["exact_match"] == row["score"]
        )
        assert row["completion_tokens"] > 0 and row["latency_s"] >= 0 and row["prompt"]
    summary_n = {i.item_id: i.n for i in load_run(run_dir).items}
    assert summary_n == {
        "alpha-qa-seed0": len([r for r in scored if r["variant"] == "qa"]),
        "alpha-math-seed0": len([r for r in scored if r["variant"] == "math"]),
    }


def test_rows_of_other_backends_normalise_to_the_same_schema(tmp_path: Path) -> None:
    """Rows shaped like the verifiers backend's (chat prompts, several rewards, no tokens) and
    lm-eval's (loglikelihood: no completion, integer gold, acc/acc_norm) fit the one schema."""
    verifiers_rows = [
        {
            "example_id": 3,
            "rollout": r,
            "prompt": [{"role": "user", "content": "2+2?"}],
            "completion": [{"role": "assistant", "content": "4"}],
            "gold": {"answer": 4},
            "extracted": 4,
            "metrics": {
                "reward": 0.75,
                "format_reward": 1.0,
                "correct": True,
                "note": "not a number",
            },
            "score": 0.75,
            "tokens": None,
            "latency_s": None,
            "error": None,
        }
        for r in range(2)
    ]
    lm_eval_rows = [
        {
            "example_id": "doc_12",
            "prompt": "Q: capital of France?",
            "completion": None,
            "gold": 2,
            "extracted": ["A", "B"],
            "metrics": {"acc": 1.0, "acc_norm": 0.0},
            "score": None,
            "error": None,
        },
        {"example_id": "doc_13", "prompt": "Q: ?", "metrics": {}, "error": "context too long"},
    ]
    run_dir = craft_run(
        tmp_path,
        "mixed",
        {
            "m-vf-seed0": {
                "model": "m",
                "variant": "vf-math",
                "env": "vf",
                "module": "verifiers:math",
                "metric": "reward",
                "rows": verifiers_rows,
            },
            "m-arc-seed0": {
                "model": "m",
                "variant": "arc",
                "module": "lm_eval:arc_easy",
                "metric": "acc",
                "rows": lm_eval_rows,
            },
        },
    )
    count = write_parquet(load_run(run_dir), tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert count == 4 and table.schema.equals(arrow_schema())
    vf0, vf1, arc12, arc13 = table.to_pylist()
    assert (vf0["example_id"], vf1["rollout"], vf0["score"]) == ("3", 1, 0.75)
    assert dict(vf0["metrics"]) == {"reward": 0.75, "format_reward": 1.0, "correct": 1.0}
    assert (
        vf0["prompt"] == '[{"content": "2+2?", "role": "user"}]' and vf0["gold"] == '{"answer": 4}'
    )
    assert vf0["prompt_tokens"] is None and vf0["module"] == "verifiers:math"
    assert (arc12["score"], arc12["gold"], arc12["extracted"]) == (1.0, "2", '["A", "B"]')
    assert arc12["completion"] is None and arc12["rollout"] == 0
    assert arc13["score"] is None and arc13["error"] == "context too long"


def test_without_pyarrow_the_other_reports_are_still_written(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    with pytest.raises(ParquetUnavailable, match=r"pip install 'pytest-modelbench\[parquet\]'"):
        arrow_schema()
    server = sim(accuracy=1.0, lookup={})
    configure(project, server.base_url, n=5)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["modelbench: results.parquet skipped: *pip install 'pytest-modelbench?parquet?'"]
    )
    (run_dir,) = project.run_dirs()
    assert (run_dir / "report.html").exists() and not (run_dir / "results.parquet").exists()


def test_writing_parquet_does_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas from pa.array / Table.from_pylist (~0.45 s); the writer avoids both.
    A fresh interpreter, so a pandas imported by another test does not hide it."""
    run_dir = craft_run(
        tmp_path, "r", {"m-qa-seed0": {"model": "m", "variant": "qa", "scores": [1.0, 0.0, 0.5]}}
    )
    script = (
        "import sys\n"
        "from pytest_modelbench.reporting.model import load_run\n"
        "from pytest_modelbench.reporting.rows import write_parquet\n"
        "from pathlib import Path\n"
        f"n = write_parquet(load_run(Path({str(run_dir)!r})), Path({str(tmp_path / 'o.parquet')!r}))\n"
        "print(n, 'pandas' in sys.modules, 'pyarrow.compute' in sys.modules)\n"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "False", "False"]  # no pandas, and no cast either
    rows = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert [r["score"] for r in rows] == [1.0, 0.0, 0.5]
    assert [dict(r["metrics"]) for r in rows][1] == {"accuracy": 0.0}


def test_parquet_is_rewritten_only_when_its_inputs_change(tmp_path: Path) -> None:
    from pytest_modelbench.reporting.rows import write_parquet_if_changed

    run_dir = craft_run(
        tmp_path, "r", {"m-qa-seed0": {"model": "m", "variant": "qa", "scores": [1.0, 0.0]}}
    )
    out = run_dir / "results.parquet"
    assert write_parquet_if_changed(load_run(run_dir), out)
    assert not write_parquet_if_changed(load_run(run_dir), out)  # a re-report: nothing to do
    journal = run_dir / "m-qa-seed0" / "results.jsonl"
    with journal.open("a") as handle:  # a resumed item adds an example
        handle.write(journal.read_text().splitlines()[0].replace('"ex0"', '"ex9"') + "\n")
    assert write_parquet_if_changed(load_run(run_dir), out)
    assert len(pq.read_table(out)) == 3
    out.unlink()  # a deleted file is written again
    assert write_parquet_if_changed(load_run(run_dir), out) and out.exists()


def test_a_failed_parquet_write_still_leaves_the_other_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_modelbench.reporting import rows
    from pytest_modelbench.reporting.writer import write_run_reports

    run_dir = craft_run(
        tmp_path, "r", {"m-qa-seed0": {"model": "m", "variant": "qa", "scores": [1.0, 0.0]}}
    )

    def broken(*_args: Any, **_kwargs: Any) -> bool:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rows, "write_parquet_if_changed", broken)
    paths, note, failed = write_run_reports(run_dir, None, examples=5)
    assert failed
    assert [p.name for p in paths][:1] == ["report.html"] and (run_dir / "report.html").exists()
    assert "results.parquet" not in [p.name for p in paths]
    assert note == "results.parquet not written: OSError: [Errno 28] No space left on device"
