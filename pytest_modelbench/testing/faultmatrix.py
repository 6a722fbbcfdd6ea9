"""The fault matrix: real pytest-modelbench sessions against faulty simulated servers, audited.

In :func:`run_matrix` every scenario is one model of a throw-away project whose
``api_base_url`` is its own :class:`SimServer` with one kind of fault (or all of
them); one ``pytest -n 2`` session runs every scenario's item, then the same command
runs again. :func:`run_hang` and :func:`run_outage` change one server mid-run under
two items (one per xdist worker): it starts to hang (every request accepted, none
answered), or it dies and comes back on the same port. :func:`audit_item` then
checks, per example and session, what users rely on: it is answered exactly once
with the server's answer, or reported as an error (never silently wrong), and
``summary.json`` counts both; nothing finished is lost; a re-run asks only for what
is missing.

Shared by the test suite's reliability tests (which assert on the audits) and
``perf/fault_matrix.py`` (which prints them as a table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from pytest_modelbench.backends.jsonl_suite import JsonlSuite
from pytest_modelbench.running.runner import request_seed
from pytest_modelbench.store.summary import ItemSummary
from pytest_modelbench.testing.faults import Faults, Latency
from pytest_modelbench.testing.policy import AnswerPolicy, lookup_from_examples
from pytest_modelbench.testing.reqlog import RequestRecord
from pytest_modelbench.testing.simconfig import SimConfig
from pytest_modelbench.testing.simserver import SimServer

BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"
LEAN = ("-p", "no:html", "-p", "no:metadata", "-p", "no:hypothesispytest", "-p", "no:randomly")
"""Plugins a throw-away session does not need (faster start of the session and its workers)."""

FAULT_OUTCOMES = frozenset({"5xx", "429", "timeout", "reset", "malformed", "hang", "aborted"})
"""Server log outcomes that are injected faults (``ok`` and ``client_error`` are not)."""


# -- the project -------------------------------------------------------------------------


def write_project(
    root: Path, models: Mapping[str, Mapping[str, Any]], envs: Mapping[str, int]
) -> None:
    """A benchmark project in ``root``: ``models``, and per env a jsonl file of ``n`` questions."""
    (root / "configs" / "envs").mkdir(parents=True, exist_ok=True)
    (root / "configs" / "baselines").mkdir(exist_ok=True)
    (root / "benchmarks").mkdir(exist_ok=True)
    (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    (root / "configs" / "models.yaml").write_text(
        yaml.safe_dump({"models": {name: dict(spec) for name, spec in models.items()}})
    )
    for env, n in envs.items():
        with (root / f"{env}.jsonl").open("w") as handle:
            for i in range(n):
                row = {
                    "id": f"{env}{i}",
                    "question": f"{env}: what is {i} + 1?",
                    "answer": str(i + 1),
                }
                handle.write(json.dumps(row) + "\n")
        variant = {"id": env, "module": "jsonl", "env_args": {"path": f"{env}.jsonl"}}
        (root / "configs" / "envs" / f"{env}.yaml").write_text(yaml.safe_dump([variant]))


def example_keys(root: Path, env: str) -> dict[str, str]:
    """Example id → the key the simulator sees for it (the last user message)."""
    examples = JsonlSuite().examples({"path": str(root / f"{env}.jsonl")}, 0)
    return {example.id: example.last_user_text for example in examples}


def lookup_for(root: Path, *envs: str) -> dict[str, tuple[str, str]]:
    """A simulator lookup answering these envs' questions (right or wrong, by accuracy)."""
    suite = JsonlSuite()
    lookup: dict[str, tuple[str, str]] = {}
    for env in envs:
        examples = suite.examples({"path": str(root / f"{env}.jsonl")}, 0)
        lookup.update(
            lookup_from_examples(examples, suite.reference_completion, suite.wrong_completion)
        )
    return lookup


def run_dir(root: Path) -> Path:
    """The one run directory of the project."""
    (only,) = [p for p in (root / "runs").iterdir() if p.is_dir()]
    return only


# -- running pytest ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunOutput:
    """What a pytest session left: exit status, terminal output, wall time."""

    returncode: int
    output: str
    duration_s: float


Run = Callable[[Sequence[str]], RunOutput]
"""Runs pytest with these arguments in the project directory."""

_OUTER_PYTEST_VARS = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
    "PYTEST_CURRENT_TEST",
    "PYTEST_VERSION",
)
"""Variables that would make a pytest started from a test think it is an xdist worker."""


def subprocess_run(root: Path, timeout_s: float = 300.0) -> Run:
    """A :data:`Run` that starts ``python -m pytest`` in ``root``."""

    def run(args: Sequence[str]) -> RunOutput:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _OUTER_PYTEST_VARS and not k.startswith("PYTEST_ADDOPTS")
        }
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *LEAN, *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        return RunOutput(proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - started)

    return run


class Trigger:
    """Runs ``action`` once, in a thread, as soon as ``condition()`` holds (polled every 2 ms).

    Use as a context manager around a run: on exit it stops waiting (if the
    condition never held) and waits for a running action to finish.
    """

    def __init__(self, condition: Callable[[], bool], action: Callable[[], None]) -> None:
        self.condition = condition
        self.action = action
        self.fired_at: float | None = None
        self.finished_at: float | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fault-trigger", daemon=True)

    def _watch(self) -> None:
        while not self._cancel.is_set():
            if self.condition():
                self.fired_at = time.monotonic()
                self.action()
                self.finished_at = time.monotonic()
                return
            self._cancel.wait(0.002)

    def __enter__(self) -> Trigger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fired_at is None:
            self._cancel.set()
        self._thread.join(timeout=120)

    @property
    def fired(self) -> bool:
        return self.fired_at is not None


def answered(server: SimServer, prefix: str) -> int:
    """Completion requests the server answered ``ok`` for keys starting with ``prefix``."""
    return sum(n for key, n in server.answers_per_key().items() if key.startswith(prefix))


def wait_idle(server: SimServer, timeout_s: float = 10.0) -> None:
    """Wait until no request is open on the server (held faults finish and get logged)."""
    deadline = time.monotonic() + timeout_s
    while server.log.pending > 0 and time.monotonic() < deadline:
        time.sleep(0.01)


# -- the audit ---------------------------------------------------------------------------


def journal_rows(item_dir: Path) -> list[dict[str, Any]]:
    """Every whole line of an item's journal, in order (a torn last line is skipped)."""
    path = item_dir / "results.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.endswith("\n"):
            rows.append(json.loads(line))
    return rows


@dataclass(frozen=True)
class Audit:
    """One item after one session: the figures of that session and the invariants' breaches.

    ``requests``, ``faults``, ``refused``, ``attempts`` and ``retries`` count this
    session's traffic; ``completed_once``, ``errors``, ``duplicates``, ``lost`` and
    ``wrong`` describe the journal as it now stands (``duplicates``: examples completed
    more than once). ``problems`` is empty when every invariant holds.
    """

    label: str
    examples: int
    requests: int
    faults: Mapping[str, int]
    refused: int
    attempts: int
    retries: int
    completed_once: int
    errors: int
    duplicates: int
    wrong: int
    lost: int
    status: str | None
    answered: frozenset[str]
    error_ids: frozenset[str]
    asked: Mapping[str, int]
    journal_rows: int
    problems: tuple[str, ...] = field(default=())

    @property
    def faults_injected(self) -> int:
        """Faults the server injected plus attempts that never reached it (refused)."""
        return sum(self.faults.values()) + self.refused

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_item(
    label: str,
    item_dir: Path,
    expected: Mapping[str, str],
    records: Sequence[RequestRecord],
    policy: AnswerPolicy,
    *,
    seed: int = 0,
    since_row: int = 0,
    previous: Audit | None = None,
    all_reach_server: bool = True,
) -> Audit:
    """Check one item's journal and summary against what the server really did.

    ``expected`` maps example id → request key; ``records`` are the server's records
    of this session (other items' keys are ignored); journal rows from index
    ``since_row`` on were written in this session. ``previous`` is the audit of the
    session before: its answered examples must stay answered and not be asked again,
    its failed ones must be asked again.
    ``all_reach_server``: no outage, so every client attempt must be in the server log.
    """
    problems: list[str] = []
    keys = set(expected.values())
    mine = [r for r in records if r.path.endswith("completions") and r.key in keys]
    faults = _server_faults(mine, problems)
    rows = journal_rows(item_dir)
    new_rows = rows[since_row:]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_id.setdefault(str(row["example_id"]), []).append(row)
    extra = sorted(set(by_id) - set(expected))
    if extra:
        problems.append(f"journal rows for unknown examples {extra[:5]}")
    journal = _JournalCheck(policy, seed, new_rows, mine, problems)
    for example_id, key in expected.items():
        journal.check_example(example_id, key, by_id.get(example_id, []))
    asked = Counter(r.key for r in mine)
    if previous is not None:
        journal.lost += _check_resumed(previous, expected, journal.answered, asked, problems)
    attempts = sum(int(row.get("attempts") or 1) for row in new_rows)
    refused = max(0, attempts - len(mine))
    if all_reach_server and attempts != len(mine):
        problems.append(f"the client made {attempts} attempts, the server saw {len(mine)}")
    status = _check_summary(item_dir / "summary.json", journal, problems)
    return Audit(
        label=label,
        examples=len(expected),
        requests=len(mine),
        faults=dict(faults),
        refused=refused,
        attempts=attempts,
        retries=sum(max(0, int(row.get("attempts") or 1) - 1) for row in new_rows),
        completed_once=journal.completed,
        errors=len(journal.error_ids),
        duplicates=journal.duplicates,
        wrong=journal.wrong,
        lost=journal.lost,
        status=status,
        answered=frozenset(journal.answered),
        error_ids=frozenset(journal.error_ids),
        asked=dict(asked),
        journal_rows=len(rows),
        problems=tuple(problems),
    )


def _server_faults(mine: Sequence[RequestRecord], problems: list[str]) -> Counter[str]:
    """The faults among the server's records of an item; other non-``ok`` outcomes are problems."""
    faults: Counter[str] = Counter(r.outcome for r in mine if r.outcome in FAULT_OUTCOMES)
    strange: Counter[str] = Counter(
        r.outcome for r in mine if r.outcome not in FAULT_OUTCOMES | {"ok"}
    )
    if strange:
        problems.append(f"unexpected server outcomes {dict(strange)}")
    return faults


@dataclass
class _JournalCheck:
    """Walks an item's journal, example by example, against what the server answered."""

    policy: AnswerPolicy
    seed: int
    new_rows: list[dict[str, Any]]
    mine: Sequence[RequestRecord]
    problems: list[str]
    completed: int = 0
    wrong: int = 0
    lost: int = 0
    duplicates: int = 0
    answered: set[str] = field(default_factory=set)
    error_ids: set[str] = field(default_factory=set)
    scores: list[float] = field(default_factory=list)
    ok_answers: Counter[tuple[str, int | None]] = field(init=False)

    def __post_init__(self) -> None:
        self.ok_answers = Counter((r.key, r.seed) for r in self.mine if r.outcome == "ok")

    def check_example(self, example_id: str, key: str, rows: list[dict[str, Any]]) -> None:
        """One example: completed exactly once with the server's answer, or an error row."""
        oks = [row for row in rows if not row.get("error")]
        if len(oks) > 1:
            self.duplicates += 1
            self.problems.append(f"{example_id}: completed {len(oks)} times")
        if not rows:
            self.lost += 1
            self.problems.append(f"{example_id}: neither completed nor reported as an error")
        elif not oks:
            self.error_ids.add(example_id)
            last = rows[-1]
            if not isinstance(last.get("error"), str) or last.get("score") is not None:
                self.problems.append(f"{example_id}: error row without a message or with a score")
        else:
            self.completed += len(oks) == 1
            self.answered.add(example_id)
            self.check_answer(example_id, key, oks[0])

    def check_answer(self, example_id: str, key: str, row: dict[str, Any]) -> None:
        """An answered example's row: the server's answer, its score, really answered."""
        policy = self.policy
        request = request_seed(self.seed, example_id, int(row.get("rollout", 0)))
        if row.get("completion") != policy.answer(key, request):
            self.wrong += 1
            self.problems.append(
                f"{example_id}: scored {row.get('completion')!r}, not the server's answer"
            )
        elif key in policy.lookup and row.get("score") != float(policy.correct(key, request)):
            self.wrong += 1
            self.problems.append(
                f"{example_id}: score {row.get('score')!r} does not match the answer"
            )
        if row in self.new_rows and self.ok_answers[(key, request)] == 0:
            self.wrong += 1
            self.problems.append(f"{example_id}: completed, but the server never answered it")
        if isinstance(row.get("score"), (int, float)):
            self.scores.append(float(row["score"]))


def _check_resumed(
    previous: Audit,
    expected: Mapping[str, str],
    answered: set[str],
    asked: Counter[str],
    problems: list[str],
) -> int:
    """Compare with the session before: returns how many finished examples were lost."""
    lost = 0
    gone = previous.answered - answered
    if gone:
        lost += len(gone)
        problems.append(f"finished examples lost: {sorted(gone)[:5]}")
    again = sorted(i for i in previous.answered if asked.get(expected[i]))
    if again:
        problems.append(f"finished examples asked again: {again[:5]}")
    skipped = sorted(i for i in previous.error_ids if not asked.get(expected[i]))
    if skipped:
        problems.append(f"failed examples not asked again: {skipped[:5]}")
    return lost


def _check_summary(summary_path: Path, journal: _JournalCheck, problems: list[str]) -> str | None:
    """Check ``summary.json`` agrees with the journal; returns its status (None: no summary)."""
    if not summary_path.exists():
        problems.append("no summary.json")
        return None
    summary = ItemSummary.from_json(json.loads(summary_path.read_text()))
    value = summary.value("exact_match")
    errors, scored = len(journal.error_ids), len(journal.answered)
    if summary.errors != errors or summary.n_scored != scored:
        problems.append(
            f"summary.json says {summary.n_scored} scored / {summary.errors} errors, "
            f"the journal {scored} / {errors}"
        )
    scores = journal.scores
    if scores and (value is None or abs(value - sum(scores) / len(scores)) > 1e-9):
        problems.append(f"summary.json score {value} is not the mean of the journal's scores")
    return summary.status.value if summary.status is not None else summary.extra.get("status")


# -- sessions and their audits -----------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """One pytest session of a scenario and the audit of each of its items."""

    name: str
    output: RunOutput
    audits: tuple[Audit, ...]

    @property
    def problems(self) -> list[str]:
        return [f"{a.label}: {p}" for a in self.audits for p in a.problems]


def merged(label: str, audits: Sequence[Audit]) -> Audit:
    """Several items' audits as one table row (figures summed, problems kept)."""
    faults: Counter[str] = Counter()
    for audit in audits:
        faults.update(audit.faults)
    statuses = {a.status for a in audits}
    return Audit(
        label=label,
        examples=sum(a.examples for a in audits),
        requests=sum(a.requests for a in audits),
        faults=dict(faults),
        refused=sum(a.refused for a in audits),
        attempts=sum(a.attempts for a in audits),
        retries=sum(a.retries for a in audits),
        completed_once=sum(a.completed_once for a in audits),
        errors=sum(a.errors for a in audits),
        duplicates=sum(a.duplicates for a in audits),
        wrong=sum(a.wrong for a in audits),
        lost=sum(a.lost for a in audits),
        status=statuses.pop() if len(statuses) == 1 else None,
        answered=frozenset(),
        error_ids=frozenset(),
        asked={},
        journal_rows=sum(a.journal_rows for a in audits),
        problems=tuple(f"{a.label}: {p}" for a in audits for p in a.problems),
    )


def _expect_status(audit: Audit, status: str) -> Audit:
    if audit.status == status:
        return audit
    problem = f"status {audit.status!r}, expected {status!r}"
    return replace(audit, problems=(*audit.problems, problem))


# -- the matrix: one fault kind per model ------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One model of the matrix: its server's faults and its client's retry budget."""

    name: str  # the model name (part of the item id)
    label: str  # for tables
    faults: Mapping[str, Any]
    max_retries: int = 6
    expect_status: str = "finished"


_EACH = 0.05
_ALL = {
    "error_5xx": _EACH,
    "rate_limit": _EACH,
    "timeout": _EACH,
    "reset": _EACH,
    "malformed": _EACH,
    "missing_choices": _EACH,
    "retry_after": 0.05,
    "hang_s": 1.0,
}
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("e5xx", "HTTP 500/502/503", {"error_5xx": 0.2}),
    Scenario("e429", "429 + Retry-After 0.05 s", {"rate_limit": 0.2, "retry_after": 0.05}),
    Scenario("timeout", "timeout (held 1 s > client 0.5 s)", {"timeout": 0.1, "hang_s": 1.0}),
    Scenario("reset", "connection reset (RST)", {"reset": 0.2}),
    Scenario("malformed", "malformed JSON (truncated 200)", {"malformed": 0.2}),
    Scenario("nochoices", "200 without choices", {"missing_choices": 0.2}),
    Scenario("all", "all of the above at once", _ALL),
    Scenario("allnoretry", "all at once, 1 retry only", _ALL, max_retries=1, expect_status="error"),
)
"""Each fault alone, then all together: with the default retries every item finishes;
with one retry, more examples fail than the error budget allows and the item errors."""

CLIENT = {"max_concurrent": 8, "timeout": 0.5, "retry_backoff": 0.01}
"""Client settings of the matrix's models (a 0.5 s request timeout keeps timeouts cheap)."""


def _model(url: str, **settings: Any) -> dict[str, Any]:
    return {"model": "sim-model", "api_base_url": url, **CLIENT, **settings}


def run_matrix(
    root: Path,
    run: Run,
    *,
    examples: int = 100,
    workers: int = 2,
    scenarios: Sequence[Scenario] = SCENARIOS,
    rerun: bool = True,
) -> list[Phase]:
    """Every scenario's item in one pytest session (``-n workers``), each audited.

    ``rerun``: then the same command again against the same (still faulty) servers;
    finished items come from the store and only the failed examples are asked again.
    """
    write_project(root, {}, {"qa": examples})
    keys = example_keys(root, "qa")
    lookup = lookup_for(root, "qa")
    with ExitStack() as stack:
        servers = []
        for number, scenario in enumerate(scenarios, start=1):
            config = SimConfig(
                accuracy=0.7,
                lookup=lookup,
                latency=Latency.fixed(0.002),
                seed=number,
                faults=Faults(**scenario.faults),
            )
            servers.append(stack.enter_context(SimServer(config)))
        models = {
            s.name: _model(srv.base_url, max_retries=s.max_retries)
            for s, srv in zip(scenarios, servers, strict=True)
        }
        write_project(root, models, {"qa": examples})
        args = ["benchmarks/", "--model", ",".join(models)]
        if workers:
            args += ["-n", str(workers)]
        phases: list[Phase] = []
        for name in ("faults", "re-run") if rerun else ("faults",):
            marks = [len(server.requests) for server in servers]
            output = run(args)
            directory = run_dir(root)
            before = phases[-1] if phases else None
            audits = []
            for index, (scenario, server) in enumerate(zip(scenarios, servers, strict=True)):
                wait_idle(server)
                previous = before.audits[index] if before is not None else None
                audit = audit_item(
                    scenario.label,
                    directory / f"{scenario.name}-qa-seed0",
                    keys,
                    server.requests[marks[index] :],
                    server.config.policy,
                    since_row=previous.journal_rows if previous is not None else 0,
                    previous=previous,
                )
                wanted = scenario.expect_status if previous is None else "finished"
                audits.append(_expect_status(audit, wanted))
            phases.append(Phase(name, output, tuple(audits)))
    return phases


# -- servers that hang or die: one model, two items, one server ----------------------------


ENVS = ("qa", "qb")


@contextmanager
def _two_item_project(
    root: Path, examples: int, latency: float, **client: Any
) -> Iterator[SimServer]:
    """One model, two envs (``qa``, ``qb``: one item each), one server."""
    write_project(root, {}, dict.fromkeys(ENVS, examples))
    config = SimConfig(
        accuracy=0.7, lookup=lookup_for(root, *ENVS), latency=Latency.fixed(latency), seed=7
    )
    with SimServer(config) as server:
        models = {"alpha": _model(server.base_url, **{"max_concurrent": 4, **client})}
        write_project(root, models, dict.fromkeys(ENVS, examples))
        yield server


def _two_item_args(workers: int, *extra: str) -> list[str]:
    """The command of a two-item project: with workers, xdist's load scheduling puts
    one item on each (model affinity would keep both on one worker, one after the other)."""
    xdist = ["-n", str(workers), "--mb-dist", "off"] if workers else []
    return ["benchmarks/", "--model", "alpha", *xdist, *extra]


def _audit_phase(
    name: str,
    root: Path,
    output: RunOutput,
    server: SimServer,
    first_record: int,
    before: Phase | None,
    *,
    all_reach_server: bool = True,
) -> Phase:
    records = server.requests[first_record:]
    audits = []
    for index, env in enumerate(ENVS):
        item_dir = run_dir(root) / f"alpha-{env}-seed0"
        previous = before.audits[index] if before is not None else None
        audits.append(
            audit_item(
                f"{name} ({env})",
                item_dir,
                example_keys(root, env),
                records,
                server.config.policy,
                since_row=previous.journal_rows if previous is not None else 0,
                previous=previous,
                all_reach_server=all_reach_server,
            )
        )
    return Phase(name, output, tuple(audits))


def _started(server: SimServer, examples: int) -> Callable[[], bool]:
    """True once both items are well under way (a quarter of each answered)."""
    return lambda: all(answered(server, f"{env}:") >= examples // 4 for env in ENVS)


def run_hang(
    root: Path, run: Run, *, examples: int = 40, timeout_s: float = 0.25, workers: int = 2
) -> list[Phase]:
    """The server starts to hang mid-run (accepts, never answers); then it is restarted healthy.

    Session 1 (``--mb-timeout timeout_s``, one retry): each unanswered example fails
    after two timeouts and the items error over the budget, keeping what finished.
    Session 2, same command against the restarted server: only the failed examples.
    """
    with _two_item_project(root, examples, 0.05, max_concurrent=8, max_retries=1) as server:
        hang = Faults(hang_forever=True)

        def start_hanging() -> None:
            server.reconfigure(faults=hang)

        with Trigger(_started(server, examples), start_hanging):
            first = run(_two_item_args(workers, "--mb-timeout", f"{timeout_s:g}"))
        server.stop()  # the operator restarts the hung server: its open requests are dropped
        server.reconfigure(faults=Faults())
        server.start()
        hung = _audit_phase("server hangs", root, first, server, 0, None)
        mark = len(server.requests)
        second = run(_two_item_args(workers))
        wait_idle(server)
        return [hung, _audit_phase("re-run, server healthy", root, second, server, mark, hung)]


def run_outage(
    root: Path,
    run: Run,
    *,
    outage_s: float = 2.0,
    examples: int = 60,
    workers: int = 2,
    ride_out: bool = True,
) -> list[Phase]:
    """The server dies mid-run and comes back on the same port ``outage_s`` later.

    ``ride_out``: the default retry budget (6 retries, backoff from 0.5 s: at least
    15 s of patience) covers the outage and the session passes. Otherwise a short
    budget (2 retries, 10 ms backoff) gives up during the outage: the items error,
    and a second session of the same command finishes only the failed examples.
    """
    client = {"retry_backoff": 0.5, "max_retries": 6} if ride_out else {"max_retries": 2}
    with _two_item_project(root, examples, 0.02, **client) as server:

        def die_and_return() -> None:
            server.stop()
            time.sleep(outage_s)
            server.start()

        with Trigger(_started(server, examples), die_and_return):
            first = run(_two_item_args(workers))
        wait_idle(server)
        name = f"server down {outage_s:g} s" + ("" if ride_out else ", 2 retries 10 ms apart")
        phases = [_audit_phase(name, root, first, server, 0, None, all_reach_server=False)]
        if not ride_out:
            mark = len(server.requests)
            second = run(_two_item_args(workers))
            wait_idle(server)
            phases.append(
                _audit_phase("re-run, server back", root, second, server, mark, phases[0])
            )
        return phases


# -- the table ---------------------------------------------------------------------------


def _faults_cell(audit: Audit) -> str:
    kinds = dict(sorted(audit.faults.items()))
    if audit.refused:
        kinds["refused"] = audit.refused
    detail = ", ".join(f"{kind} {n}" for kind, n in kinds.items())
    return f"{audit.faults_injected} ({detail})" if detail else "0"


def markdown_table(audits: Sequence[Audit]) -> str:
    """The audits as a Markdown table (one row per item and session, or per merged group)."""
    lines = [
        "| scenario | requests | faults injected | retries | examples | completed once "
        "| errors reported | duplicates | wrong | lost |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in audits:
        lines.append(
            f"| {a.label} | {a.requests} | {_faults_cell(a)} | {a.retries} | {a.examples} "
            f"| {a.completed_once} | {a.errors} | {a.duplicates} | {a.wrong} | {a.lost} |"
        )
    return "\n".join(lines)
