"""Auto-resume, fingerprints and the resume flags as the user sees them (pytester, sim server)."""

from __future__ import annotations

import json
import warnings
from typing import Any

from pytest_modelbench.store.journal import Journal
from tests.conftest import Project, configure, manifest, rows
from tests.resume.conftest import completions, run_pytest

# a test that cuts the power (SIGKILL to the whole pytest process group, xdist workers included)
# once the controller has recorded the gate failure of alpha-qa-seed0
POWER_CUT = """
import json, os, signal, time
from pathlib import Path

def test_power_cut():
    path = Path(r"{cache}") / "v" / "cache" / "lastfailed"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if "test_benchmark[alpha-qa-seed0]" in "".join(json.loads(path.read_text())):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    os.killpg(os.getpgid(0), signal.SIGKILL)
"""


def keys_of(requests: list[Any]) -> set[str]:
    return {r.key for r in requests}


def prefixes(requests: list[Any]) -> set[str]:
    """Which env's questions were asked (questions read '<env>: what is ...')."""
    return {r.key.split(":", 1)[0] for r in requests}


def test_changed_env_arg_recomputes_only_that_env_and_names_the_field(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.8, lookup={})
    configure(project, server.base_url, n=15, envs=("qa", "qb"))
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=2)
    server.clear_log()

    project.env(
        "qa",
        [
            {
                "id": "qa",
                "module": "jsonl",
                "seeds": [0],
                "env_args": {"path": "qa.jsonl", "system_prompt": "Be brief."},
            }
        ],
    )
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "alpha*qa*exact_match*",
            "alpha*qb*(from store)",
            "recomputed alpha-qa-seed0: configuration changed: "
            'env_args.system_prompt: (unset) -> "Be brief."',
        ]
    )
    assert "recomputed alpha-qb" not in result.stdout.str()
    asked = completions(server)
    assert prefixes(asked) == {"qa"} and len(asked) == 15
    (run_dir,) = project.run_dirs()
    assert list((run_dir / "alpha-qa-seed0").glob("results.*.stale.jsonl"))  # old rows kept aside
    metadata = json.loads((run_dir / "alpha-qa-seed0" / "metadata.json").read_text())
    assert metadata["fingerprint_parts"]["env_args"]["system_prompt"] == "Be brief."
    assert manifest(run_dir)["items"]["alpha-qa-seed0"]["fingerprint"] == metadata["fingerprint"]


def test_force_with_k_recomputes_only_the_selected_items(project: Project, sim: Any) -> None:
    server = sim(accuracy=0.8, lookup={})
    configure(project, server.base_url, n=10, envs=("qa", "qb"))
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=2)
    server.clear_log()

    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--force", "-k", "qb")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["recomputed alpha-qb-seed0: --force"])
    assert prefixes(completions(server)) == {"qb"} and len(completions(server)) == 10
    (run_dir,) = project.run_dirs()
    assert list((run_dir / "alpha-qb-seed0").glob("results.*.forced.jsonl"))

    server.clear_log()  # --force is not sticky: the same command without it reuses everything
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=2)
    assert completions(server) == [] and "recomputed" not in result.stdout.str()


def test_no_auto_resume_starts_a_new_run_which_later_runs_continue(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.8, lookup={})
    configure(project, server.base_url, n=10)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    server.clear_log()

    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--no-auto-resume")
    result.assert_outcomes(passed=1)
    _, second = project.run_dirs()
    assert len(completions(server)) == 10 and "(from store)" not in result.stdout.str()
    result.stdout.fnmatch_lines([f"run store: *{second.name}"])

    server.clear_log()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*(from store)", f"run store: *{second.name}"])
    assert completions(server) == [] and len(project.run_dirs()) == 2


def test_restart_seeds_matching_items_and_recomputes_stale_ones(project: Project, sim: Any) -> None:
    server = sim(accuracy=0.8, lookup={})
    configure(project, server.base_url, n=12, envs=("qa", "qb"))
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=2)
    (old,) = project.run_dirs()
    project.env(
        "qb",
        [
            {
                "id": "qb",
                "module": "jsonl",
                "seeds": [0],
                "env_args": {"path": "qb.jsonl", "system_prompt": "Think."},
            }
        ],
    )
    server.clear_log()

    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--restart", old.name)
    result.assert_outcomes(passed=2)
    old_again, new = project.run_dirs()
    assert old_again == old
    assert prefixes(completions(server)) == {"qb"} and len(completions(server)) == 12
    result.stdout.fnmatch_lines(
        [
            "alpha*qa*(from store)",
            f"run store: *{new.name}",
            f"recomputed alpha-qb-seed0: not reused from {old.name}: configuration changed: "
            'env_args.system_prompt: (unset) -> "Think."',
        ]
    )
    entry = manifest(new)["items"]["alpha-qa-seed0"]
    assert entry["seeded_from"] == old.name and entry["status"] == "finished"
    assert "seeded_from" not in manifest(new)["items"]["alpha-qb-seed0"]
    assert manifest(new)["restart_from"] == old.name
    seeded, source = new / "alpha-qa-seed0", old / "alpha-qa-seed0"
    assert rows(seeded) == rows(source)
    assert (seeded / "summary.json").read_text() == (source / "summary.json").read_text()
    # the journal is shared (hard link), not copied, and the old run is untouched
    assert (seeded / "results.jsonl").stat().st_ino == (source / "results.jsonl").stat().st_ino
    assert "system_prompt" not in (old / "alpha-qb-seed0" / "metadata.json").read_text()

    # the same command again continues the restarted run; a plain run does too
    server.clear_log()
    for extra in (["--restart", old.name], []):
        result = project.pytester.runpytest("benchmarks/", "--model", "alpha", *extra)
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines([f"run store: *{new.name}"])
    assert completions(server) == [] and len(project.run_dirs()) == 2


def test_restart_of_an_unknown_run_is_a_usage_error(project: Project, sim: Any) -> None:
    server = sim(accuracy=1.0, lookup={})
    configure(project, server.base_url, n=3)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (old,) = project.run_dirs()
    server.clear_log()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--restart", "run-1999")
    assert result.ret == 4
    result.stderr.fnmatch_lines(
        [
            f"ERROR: --restart run-1999: no run directory *run-1999 (no run_manifest.json there); "
            f"runs under *runs: {old.name}. "
            "Give a run id from there or the path of a run directory",
        ]
    )
    assert completions(server) == [] and project.run_dirs() == [old]


def test_damaged_and_torn_journal_lines_warn_and_only_those_examples_are_redone(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.7, lookup={})
    configure(project, server.base_url, n=20)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    item = run_dir / "alpha-qa-seed0"
    before = {r["example_id"]: r for r in rows(item)}
    # a crash mid-item: no summary, a damaged line in the middle, a half-written last line
    lines = (item / "results.jsonl").read_text().splitlines(keepends=True)
    damaged_id = json.loads(lines[5])["example_id"]
    torn_id = json.loads(lines[-1])["example_id"]
    lines[5] = '{"example_id": "qa5", "completion": \x00garbage\n'
    lines[-1] = lines[-1][: len(lines[-1]) // 2]
    (item / "results.jsonl").write_text("".join(lines))
    (item / "summary.json").unlink()
    server.clear_log()

    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*StoreWarning: *results.jsonl: dropped an unfinished last line (crash while writing)",
            "*StoreWarning: *results.jsonl: skipped 1 damaged line(s); "
            "those examples will be redone",
        ]
    )
    assert sorted(keys_of(completions(server))) == sorted(
        before[i]["prompt"] for i in (damaged_id, torn_id)
    )
    after = {r["example_id"]: r for r in rows(item)}
    assert sorted(after) == sorted(before)
    assert all(after[i]["completion"] == before[i]["completion"] for i in before)
    summary = json.loads((item / "summary.json").read_text())
    assert summary["metrics"]["exact_match"]["n"] == 20 and summary["resumed_examples"] == 18
    # the bad lines were moved aside, so later readers see a clean journal (and no warnings)
    aside = (item / "results.damaged.jsonl").read_text()
    assert "garbage" in aside and aside.count("\n") == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(Journal(item / "results.jsonl").read()) == 20


def test_half_finished_item_continues_and_its_duration_is_remembered(
    project: Project, sim: Any
) -> None:
    server = sim(accuracy=0.7, lookup={})
    configure(project, server.base_url, n=30, envs=("qa", "qb"))
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=2)
    (run_dir,) = project.run_dirs()
    item = run_dir / "alpha-qa-seed0"
    uninterrupted = sorted((r["example_id"], r["completion"], r["score"]) for r in rows(item))
    summary_before = json.loads((item / "summary.json").read_text())
    lines = (item / "results.jsonl").read_text().splitlines(keepends=True)
    (item / "results.jsonl").write_text("".join(lines[:11]))  # as if killed after 11 examples
    (item / "summary.json").unlink()
    server.clear_log()

    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=2)
    assert len(completions(server)) == 19 and prefixes(completions(server)) == {"qa"}
    assert (
        sorted((r["example_id"], r["completion"], r["score"]) for r in rows(item)) == uninterrupted
    )
    summary = json.loads((item / "summary.json").read_text())
    assert summary["metrics"] == summary_before["metrics"]  # identical to the uninterrupted run
    assert summary["resumed_examples"] == 11 and summary["duration_estimated"] is True
    assert summary["duration_s"] >= summary["wall_s"]

    cache = project.root / ".pytest_cache" / "v" / "modelbench" / "durations"
    durations = json.loads(cache.read_text())
    assert set(durations) == {"alpha-qa-seed0", "alpha-qb-seed0"}
    assert durations["alpha-qa-seed0"] == summary["duration_s"] > 0
    entries = manifest(run_dir)["items"]
    assert entries["alpha-qa-seed0"]["duration_s"] == summary["duration_s"]
    assert entries["alpha-qa-seed0"]["resumed_examples"] == 11


def test_lf_after_a_killed_session_reruns_the_failed_item(project: Project, sim: Any) -> None:
    """pytest writes lastfailed at session end; modelbench keeps it current as items finish."""
    server = sim(accuracy=0.5, lookup={})  # no lookup: every answer is wrong, score 0
    configure(project, server.base_url, n=40, envs=("qa", "qb"))
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa: {min: 0.5}\n")
    crash = project.root / "benchmarks" / "test_zz_crash.py"
    crash.write_text(POWER_CUT.format(cache=project.root / ".pytest_cache"))
    killed = run_pytest(project.root, "benchmarks/", "--model", "alpha", "-n", "2")
    assert killed.returncode == -9, killed.output
    lastfailed = json.loads((project.root / ".pytest_cache/v/cache/lastfailed").read_text())
    assert list(lastfailed) == ["benchmarks/test_models.py::test_benchmark[alpha-qa-seed0]"]

    crash.unlink()
    server.clear_log()
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--lf")
    result.assert_outcomes(failed=1)  # only the failed item runs
    result.stdout.fnmatch_lines(
        ["run-last-failure: rerun previous 1 failure*", "*alpha*qa*(from store)*"]
    )
    assert completions(server) == []  # the failed item's result is reused, its gate re-decided

    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa: {min: 0.0}\n")
    project.pytester.runpytest("benchmarks/", "--model", "alpha", "--lf").assert_outcomes(passed=1)
    lastfailed = json.loads((project.root / ".pytest_cache/v/cache/lastfailed").read_text() or "{}")
    assert lastfailed == {}
