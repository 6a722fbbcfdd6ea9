"""``results.parquet`` of one run holding built-in, verifiers and lm-eval items (when installed)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Project, configure

pytest.importorskip("verifiers", reason="needs the verifiers extra")
pytest.importorskip("lm_eval", reason="needs the lm-eval extra")
pq = pytest.importorskip("pyarrow.parquet")

from pytest_modelbench.reporting.rows import arrow_schema  # noqa: E402
from tests.backends.test_lm_eval import lookup as lm_lookup  # noqa: E402
from tests.backends.test_lm_eval import write_task  # noqa: E402
from tests.backends.test_verifiers import ENV_MODULE  # noqa: E402
from tests.backends.test_verifiers import _lookup as vf_lookup  # noqa: E402


@pytest.mark.slow
def test_one_schema_for_builtin_verifiers_and_lm_eval_items(
    project: Project, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project.root
    (root / "envmods").mkdir()
    (root / "envmods" / "toy_vf_parquet.py").write_text(ENV_MODULE)
    monkeypatch.setenv("PYTHONPATH", str(root / "envmods"))
    write_task(project)
    configure(project, "http://placeholder", ("alpha",), n=10)
    server = sim(accuracy=0.6, lookup={**vf_lookup(12), **lm_lookup(), **project.lookup("qa")})
    configure(project, server.base_url, ("alpha",), n=10)
    project.models(
        {
            "alpha": {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": 4},
            "lm": {
                "model": "sim-model",
                "api_base_url": server.base_url,
                "api": "completions",
                "max_concurrent": 4,
            },
        }
    )
    project.env(
        "toyvf",
        [
            {
                "id": "toyvf",
                "module": "verifiers:toy-vf-parquet",
                "env_args": {"n": 12},
                "rollouts_per_example": 2,
            }
        ],
    )
    project.env("toylm", [{"id": "toylm", "module": "lm_eval:tasks/toy_qa.yaml", "seeds": [42]}])
    # three sessions continue one run directory; each rewrites the run's reports
    for model, env in (("alpha", "qa"), ("alpha", "toyvf"), ("lm", "toylm")):
        result = project.pytester.runpytest_subprocess(
            "benchmarks/", "--model", model, "--env", env, "-p", "no:cacheprovider", timeout=600
        )
        result.assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    table = pq.read_table(run_dir / "results.parquet")
    assert table.schema.equals(arrow_schema())
    rows = table.to_pylist()
    by_module: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_module.setdefault(row["module"], []).append(row)
    assert {m: len(r) for m, r in by_module.items()} == {
        "jsonl": 10,
        "verifiers:toy-vf-parquet": 24,
        "lm_eval:tasks/toy_qa.yaml": 12,
    }
    for module, module_rows in by_module.items():
        scores = [r["score"] for r in module_rows]
        assert all(s is not None for s in scores), module
        assert all(r["score"] == dict(r["metrics"])[r["metric"]] for r in module_rows), module
        assert all(r["prompt"] and r["gold"] for r in module_rows), module
    vf_rows = by_module["verifiers:toy-vf-parquet"]
    assert {r["rollout"] for r in vf_rows} == {0, 1} and vf_rows[0]["metric"] == "reward"
    assert {"correct", "brevity", "reward"} <= set(dict(vf_rows[0]["metrics"]))
    lm_rows = by_module["lm_eval:tasks/toy_qa.yaml"]
    assert lm_rows[0]["metric"] == "exact_match,strict-match" and lm_rows[0]["seed"] == 42
    assert "strict-match" in lm_rows[0]["extracted"]  # per-filter answers, as JSON text
