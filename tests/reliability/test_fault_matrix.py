"""Real ``pytest -n 2`` sessions against faulty simulated servers: exactly once, nothing lost.

Each test runs whole pytest-modelbench sessions in subprocesses and audits every
item with :func:`~tests.reliability.faultmatrix.audit_item`: each example
is completed exactly once with the server's answer or reported as an error (with
the count in ``summary.json``), nothing finished is lost, and a re-run of the
same command asks the server only for what is missing. The figures of the same
scenarios are printed by ``perf/fault_matrix.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_modelbench.running.runner import request_seed
from pytest_modelbench.testing.faultmatrix import (
    ENVS,
    SCENARIOS,
    Audit,
    Phase,
    audit_item,
    example_keys,
    run_dir,
    run_hang,
    run_matrix,
    run_outage,
    subprocess_run,
)
from pytest_modelbench.testing.reqlog import RequestRecord
from pytest_modelbench.testing.simconfig import SimConfig

EXPECTED_FAULTS = {
    "e5xx": {"5xx"},
    "e429": {"429"},
    "timeout": {"timeout"},
    "reset": {"reset"},
    "malformed": {"malformed"},
    "nochoices": {"malformed"},
    "all": {"5xx", "429", "timeout", "reset", "malformed"},
    "allnoretry": {"5xx", "429", "timeout", "reset", "malformed"},
}
"""Server log outcomes each matrix scenario must show (a 200 without choices logs as malformed)."""


def assert_sound(*phases: Phase) -> None:
    problems = [f"{phase.name}: {problem}" for phase in phases for problem in phase.problems]
    assert not problems, "\n".join(problems)
    for phase in phases:
        assert "Traceback" not in phase.output.output, phase.output.output[-3000:]
        for audit in phase.audits:
            assert audit.completed_once + audit.errors == audit.examples, audit
            assert audit.duplicates == audit.lost == audit.wrong == 0, audit


def asked_only_the_failed(root: Path, env: str, before: Audit, after: Audit) -> bool:
    """The re-run asked for exactly the examples that had failed (client retries aside)."""
    keys = example_keys(root, env)
    return set(after.asked) == {keys[i] for i in before.error_ids}


def summary(root: Path, item: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((run_dir(root) / item / "summary.json").read_text())
    return data


@pytest.mark.slow
def test_each_fault_alone_and_all_combined(tmp_path: Path) -> None:
    faulty, rerun = run_matrix(tmp_path, subprocess_run(tmp_path))
    assert_sound(faulty, rerun)
    assert faulty.output.returncode == 1, faulty.output.output[-3000:]
    assert rerun.output.returncode == 0, rerun.output.output[-3000:]
    for scenario, audit, again in zip(SCENARIOS, faulty.audits, rerun.audits, strict=True):
        assert EXPECTED_FAULTS[scenario.name] <= set(audit.faults), (scenario.name, audit.faults)
        assert audit.refused == 0
        if scenario.expect_status == "finished":
            # every fault cost a retry (a starved client may time out on a few more)
            assert audit.retries >= audit.faults_injected, audit
            assert audit.completed_once == audit.examples
            assert again.requests == 0, f"{scenario.name}: a finished item asked the server again"
        else:
            assert audit.errors > 0.05 * audit.examples, audit
            # the re-run asked for the failed examples only (faults still on, so some twice)
            assert asked_only_the_failed(tmp_path, "qa", audit, again)
            assert again.completed_once + again.errors == again.examples
            assert summary(tmp_path, f"{scenario.name}-qa-seed0")["status"] == "finished"
    failed = next(
        a for s, a in zip(SCENARIOS, faulty.audits, strict=True) if s.name == "allnoretry"
    )
    message = f"allnoretry-qa-seed0: {failed.errors} of {failed.examples} examples failed"
    assert message in faulty.output.output
    assert "error budget" in faulty.output.output


@pytest.mark.slow
def test_server_that_hangs_then_rerun(tmp_path: Path) -> None:
    hung, rerun = run_hang(tmp_path, subprocess_run(tmp_path))
    assert_sound(hung, rerun)
    assert sum(a.faults.get("hang", 0) for a in hung.audits) > 0, hung.audits
    assert hung.output.returncode == 1, hung.output.output[-3000:]
    assert "timeout after 0.25s" in hung.output.output
    assert rerun.output.returncode == 0, rerun.output.output[-3000:]
    for env, before, after in zip(ENVS, hung.audits, rerun.audits, strict=True):
        assert asked_only_the_failed(tmp_path, env, before, after), (env, before, after)
        assert after.completed_once == after.examples
        assert summary(tmp_path, f"alpha-{env}-seed0")["errors"] == 0


@pytest.mark.slow
def test_server_that_dies_and_comes_back(tmp_path: Path) -> None:
    (phase,) = run_outage(tmp_path, subprocess_run(tmp_path))
    assert_sound(phase)
    assert phase.output.returncode == 0, phase.output.output[-3000:]
    assert sum(a.faults_injected for a in phase.audits) > 0, phase.audits
    for audit in phase.audits:
        assert audit.completed_once == audit.examples


@pytest.mark.slow
def test_outage_longer_than_the_retry_budget_then_rerun(tmp_path: Path) -> None:
    down, rerun = run_outage(tmp_path, subprocess_run(tmp_path), ride_out=False)
    assert_sound(down, rerun)
    assert down.output.returncode == 1, down.output.output[-3000:]
    assert rerun.output.returncode == 0, rerun.output.output[-3000:]
    errors = 0
    for env, before, after in zip(ENVS, down.audits, rerun.audits, strict=True):
        errors += before.errors
        assert summary(tmp_path, f"alpha-{env}-seed0")["errors"] == 0
        assert asked_only_the_failed(tmp_path, env, before, after), (env, before, after)
        assert after.completed_once == after.examples
    assert errors > 0


def _write_item(item_dir: Path, rows: list[dict[str, object]], errors: int, scored: int) -> None:
    item_dir.mkdir(parents=True, exist_ok=True)
    with (item_dir / "results.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    scores = [score for r in rows if isinstance(score := r.get("score"), float)]
    value = sum(scores) / len(scores) if scores else None
    summary = {
        "status": "finished",
        "errors": errors,
        "n_scored": scored,
        "metrics": {"exact_match": {"value": value}},
    }
    (item_dir / "summary.json").write_text(json.dumps(summary))


def test_the_audit_catches_duplicates_losses_and_miscounts(tmp_path: Path) -> None:
    """The audit itself on hand-made journals: a sound one passes, each breach is named."""
    policy = SimConfig(accuracy=0.5).policy
    keys = {f"e{i}": f"what is {i} + 1?" for i in range(4)}
    seeds = {i: request_seed(0, i, 0) for i in keys}
    records = [
        RequestRecord("/v1/chat/completions", "m", keys[i], seeds[i], "ok", 200, 0.0, 0.0)
        for i in ("e0", "e1", "e2")
    ] + [RequestRecord("/v1/chat/completions", "m", keys["e3"], seeds["e3"], "5xx", 500, 0.0, 0.0)]

    def row(i: str) -> dict[str, object]:
        answer = policy.answer(keys[i], seeds[i])
        return {"example_id": i, "completion": answer, "score": 1.0, "error": None, "attempts": 1}

    error_row: dict[str, object] = {
        "example_id": "e3",
        "completion": None,
        "score": None,
        "error": "HTTP 500",
    }
    sound: list[dict[str, object]] = [row("e0"), row("e1"), row("e2"), error_row]
    _write_item(tmp_path / "ok", sound, errors=1, scored=3)
    audit = audit_item("ok", tmp_path / "ok", keys, records, policy)
    assert audit.problems == () and (audit.completed_once, audit.errors) == (3, 1)

    _write_item(tmp_path / "dup", [*sound, row("e1")], errors=1, scored=3)
    audit = audit_item("dup", tmp_path / "dup", keys, records, policy)
    assert audit.duplicates == 1 and "e1: completed 2 times" in audit.problems

    _write_item(tmp_path / "lost", sound[:1] + sound[2:], errors=1, scored=2)
    audit = audit_item("lost", tmp_path / "lost", keys, records, policy)
    assert audit.lost == 1 and "e1: neither completed nor reported as an error" in audit.problems

    _write_item(tmp_path / "count", sound, errors=0, scored=4)
    audit = audit_item("count", tmp_path / "count", keys, records, policy)
    assert any("summary.json says 4 scored / 0 errors" in p for p in audit.problems)

    wrong = [{**row("e0"), "completion": "something else"}, *sound[1:]]
    _write_item(tmp_path / "wrong", wrong, errors=1, scored=3)
    audit = audit_item("wrong", tmp_path / "wrong", keys, records, policy)
    assert audit.wrong == 1

    previous = audit_item("ok", tmp_path / "ok", keys, records, policy)
    again = records[:1]  # e0 finished before, asked again; e3 failed before, not asked
    audit = audit_item("again", tmp_path / "ok", keys, again, policy, previous=previous)
    assert "finished examples asked again: ['e0']" in audit.problems
    assert "failed examples not asked again: ['e3']" in audit.problems
