"""The pure scheduling policy: affinity, longest first, joining, stealing, crashes."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_modelbench.scheduling.policy import (
    AffinityPolicy,
    Job,
    PolicySettings,
    Send,
    Shutdown,
    Steal,
)

START = 60.0


def jobs(model: str | None, costs: Sequence[float], first: int = 0) -> list[Job]:
    return [Job((first + i,), model, cost) for i, cost in enumerate(costs)]


def policy(workers: Sequence[str], *groups: list[Job], **settings: float) -> AffinityPolicy:
    p = AffinityPolicy(PolicySettings(**{"start_cost": START, **settings}))  # type: ignore[arg-type]
    for worker in workers:
        p.add_worker(worker)
    for group in groups:
        p.add_jobs(group)
    return p


def sent(actions: Sequence[object], worker: str) -> list[int]:
    return [i for a in actions if isinstance(a, Send) and a.worker == worker for i in a.indices]


class Run:
    """Drives the policy like xdist's workers: run the head while holding two, or after shutdown."""

    def __init__(
        self, p: AffinityPolicy, costs: dict[int, float], models: dict[int, str | None]
    ) -> None:
        self.p, self.costs, self.models = p, costs, models
        self.queues: dict[str, list[int]] = {w: [] for w in p.workers}  # type: ignore[misc]
        self.down: set[str] = set()
        self.ran: dict[str, list[int]] = {w: [] for w in self.queues}
        self.starts = 0
        self.now = 0.0

    def apply(self, actions: Sequence[object]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self.queues[str(action.worker)].extend(action.indices)
            elif isinstance(action, Shutdown):
                self.down.add(str(action.worker))
            else:
                raise AssertionError(f"unexpected {action}")

    def run(self) -> float:
        self.apply(self.p.step(0.0))
        busy: dict[str, float] = {}
        server: dict[str, str | None] = {}
        while True:
            for worker, queue in self.queues.items():
                if worker not in busy and queue and (len(queue) >= 2 or worker in self.down):
                    index = queue[0]
                    model = self.models[index]
                    extra = 0.0
                    if model is not None and server.get(worker) != model:
                        server[worker], extra = model, START
                        self.starts += 1
                    busy[worker] = self.now + self.costs[index] + extra
            if not busy:
                return self.now
            worker = min(busy, key=lambda w: busy[w])
            self.now = busy.pop(worker)
            index = self.queues[worker].pop(0)
            self.ran[worker].append(index)
            self.p.complete(worker, index, self.now)
            self.apply(self.p.step(self.now))


def test_a_worker_runs_its_models_items_longest_first() -> None:
    p = policy(["w"], jobs("a", [5, 50, 20, 1]))
    run = Run(p, {0: 5, 1: 50, 2: 20, 3: 1}, dict.fromkeys(range(4), "a"))
    run.run()
    assert run.ran["w"] == [1, 2, 0, 3]
    assert run.starts == 1 and p.finished


def test_workers_stay_on_their_model() -> None:
    a, b = jobs("a", [10] * 6), jobs("b", [10] * 6, first=6)
    p = policy(["w1", "w2"], a, b)
    models = {j.indices[0]: j.model for j in a + b}
    run = Run(p, dict.fromkeys(models, 10.0), models)
    run.run()
    assert {models[i] for i in run.ran["w1"]} == {"a"}
    assert {models[i] for i in run.ran["w2"]} == {"b"}
    assert run.starts == 2


def test_unserved_model_goes_to_the_first_free_worker_and_small_joins_do_not_pay() -> None:
    # 2 workers, 3 models of 3 short items: a worker finishing its model serves the third;
    # the other one stops instead of restarting its server for one short item
    groups = [jobs(m, [5, 5, 5], first=3 * k) for k, m in enumerate("abc")]
    p = policy(["w1", "w2"], *groups)
    models = {j.indices[0]: j.model for g in groups for j in g}
    run = Run(p, dict.fromkeys(models, 5.0), models)
    run.run()
    assert run.starts == 3
    per_worker = [[models[i] for i in run.ran[w]] for w in ("w1", "w2")]
    assert sorted(len(set(seq)) for seq in per_worker) == [1, 2]
    for seq in per_worker:  # contiguous: each model is one block on its worker
        assert seq == sorted(seq, key=seq.index)


def test_largest_remaining_model_is_served_first() -> None:
    p = policy(["w1"], jobs("small", [10]), jobs("big", [100, 100], first=1))
    actions = p.step(0.0)
    assert sent(actions, "w1")[0] in (1, 2)
    assert p.model_of("w1") == "big"


def test_extra_workers_join_the_model_with_most_work_per_server() -> None:
    a = jobs("a", [600] * 12)
    b = jobs("b", [600] * 2, first=12)
    p = policy(["w1", "w2", "w3", "w4"], a, b)
    p.step(0.0)
    assert sorted(str(p.model_of(w)) for w in p.workers) == ["a", "a", "a", "b"]


def test_a_free_worker_joins_another_model_when_that_pays() -> None:
    # w2's model b is done early; model a still has an hour of work on one server
    a = jobs("a", [600] * 6)
    b = jobs("b", [10, 10], first=6)
    p = policy(["w1", "w2"], a, b)
    models = {j.indices[0]: j.model for j in a + b}
    run = Run(p, {j.indices[0]: j.cost for j in a + b}, models)
    makespan = run.run()
    assert {models[i] for i in run.ran["w2"]} == {"a", "b"}
    assert run.starts == 3
    assert makespan <= 3 * 600 + 2 * START + 20


def test_the_next_item_is_chosen_as_list_scheduling_would() -> None:
    # a worker must commit its next item while running the current one: the worker that
    # starts the longest item must not also get the second longest queued behind it
    p = policy(["w1", "w2"], jobs("a", [100, 90, 10, 10]))
    actions = p.step(0.0)
    assert sent(actions, "w1") == [0, 3] and sent(actions, "w2") == [1, 2]


def test_plain_tests_fill_in_without_a_switch_and_cheap_items_are_batched() -> None:
    plain = jobs(None, [0.05] * 30, first=1)
    p = policy(["w1"], jobs("a", [100]), plain, batch_s=1.0)
    indices = sent(p.step(0.0), "w1")
    assert indices[0] == 0 and p.model_of("w1") == "a"  # the benchmark item first
    assert 10 < len(indices) <= 22  # then about a second's worth of plain tests, not all 30


def test_idle_worker_steals_unstarted_items_from_the_tail() -> None:
    p = policy(["w1", "w2"], jobs(None, [0.2] * 12), batch_s=1.0)
    p.step(0.0)
    first, second = p.pending_indices("w1"), p.pending_indices("w2")
    assert len(first) > 2 and len(second) >= 2 and not p.unassigned
    for index in second:  # w2 runs through its batch while w1 is still on its first item
        p.complete("w2", index, 0.1)
    actions = p.step(0.1)
    (steal,) = [a for a in actions if isinstance(a, Steal)]
    assert steal.victim == "w1" and steal.thief == "w2"
    assert set(steal.indices) <= set(first[2:])  # never the running or the already pulled item
    assert not p.finished  # a steal is in flight
    after = p.stolen("w1", list(steal.indices), 0.1)
    assert sorted(sent(after, "w2")) == sorted(steal.indices)
    assert not set(steal.indices) & set(p.pending_indices("w1"))


def test_same_model_steal_needs_no_server_start() -> None:
    p = policy(["w1", "w2"], jobs("a", [0.2] * 40), batch_s=1.0, start_cost=0.5)
    p.step(0.0)
    assert p.model_of("w1") == p.model_of("w2") == "a"
    while p.unassigned:  # w2 races through its items; w1 never finishes its first
        for index in p.pending_indices("w2"):
            p.complete("w2", index, 0.1)
        actions = p.step(0.1)
    steals = [a for a in actions if isinstance(a, Steal)]
    if not steals:
        for index in p.pending_indices("w2"):
            p.complete("w2", index, 0.1)
        steals = [a for a in p.step(0.1) if isinstance(a, Steal)]
    assert steals and steals[0].victim == "w1"


def test_failed_steal_leaves_the_victim_alone() -> None:
    p = policy(["w1", "w2"], jobs(None, [0.2] * 12), batch_s=1.0)
    p.step(0.0)
    for index in p.pending_indices("w2"):
        p.complete("w2", index, 0.1)
    assert [a for a in p.step(0.1) if isinstance(a, Steal)]
    after = p.stolen("w1", [], 0.1)  # the victim had already started some of them
    assert after == [Shutdown("w2")]


def test_no_steal_across_models_when_the_server_start_costs_more() -> None:
    p = policy(["w1", "w2"], jobs("a", [0.2] * 12), jobs("b", [1.0, 1.0], first=12), batch_s=1.0)
    p.step(0.0)
    assert p.model_of("w1") == "a" and p.model_of("w2") == "b"
    assert len(p.pending_indices("w1")) > 2
    for index in p.pending_indices("w2"):
        p.complete("w2", index, 2.0)
    assert p.step(2.0) == [Shutdown("w2")]  # 2 s of a's work are not worth a 60 s start


def test_crashed_worker_returns_its_item_and_the_rest_is_rescheduled() -> None:
    p = policy(["w1", "w2"], jobs("a", [100, 90, 80, 70]))
    p.step(0.0)
    held = p.pending_indices("w1")
    assert p.remove_worker("w1") == held[0]
    assert p.unassigned == len(held) - 1
    p.complete("w2", p.pending_indices("w2")[0], 150.0)
    assert set(held[1:]) <= set(sent(p.step(150.0), "w2"))


def test_items_of_a_lost_worker_are_drained_only_when_nobody_can_run_them() -> None:
    p = policy(["w1", "w2"], jobs("a", [100, 90, 80, 70]))
    p.step(0.0)
    held = p.pending_indices("w1")
    assert p.drain_if_unrunnable() == []  # both can still work
    p.mark_shutdown("w2")
    p.remove_worker("w1")  # lost; its unstarted items go back to the pools
    assert p.drain_if_unrunnable() == sorted(held[1:])  # w2 was told to stop: nobody left
    assert p.unassigned == 0 and p.drain_if_unrunnable() == []


def test_finished_when_nothing_is_left_to_hand_out() -> None:
    p = policy(["w1"], jobs("a", [1, 1]))
    assert not p.finished
    p.step(0.0)
    assert not p.finished  # w1 holds two: it is running
    p.complete("w1", 0, 1.0)
    assert p.step(1.0) == [Shutdown("w1")]
    assert p.finished and p.has_pending
    p.complete("w1", 1, 2.0)
    assert not p.has_pending


def test_first_jobs_spread_over_nodes() -> None:
    """Four workers on two nodes (two ``--tx`` groups), two long jobs: one per node, so the
    idle GPUs of each node can serve replicas of the job running there."""
    policy = AffinityPolicy(PolicySettings(start_cost=10.0))
    for worker, node in (("a0", "A"), ("a1", "A"), ("b0", "B"), ("b1", "B")):
        policy.add_worker(worker, 0.0, node)
    policy.add_jobs([Job((0,), "m", 1000.0), Job((1,), "m", 900.0)])
    sends = [a for a in policy.step(0.0) if isinstance(a, Send)]
    assert {str(a.worker)[0] for a in sends} == {"a", "b"}
    assert all(len(a.indices) == 1 for a in sends)


def test_node_key_is_the_tx_group() -> None:
    from types import SimpleNamespace

    from pytest_modelbench.scheduling.dist import _node_key

    def node(spec: str) -> object:
        return SimpleNamespace(gateway=SimpleNamespace(spec=spec))

    remote = "popen//id=gw{}//python=.venv/bin/python -m pytest_modelbench.serving.remote n2"
    assert _node_key(node(remote.format(3))) == _node_key(node(remote.format(4)))
    assert _node_key(node("popen//id=gw0")) == _node_key(node("popen//id=gw1")) == "popen"
    assert _node_key(node("popen//id=gw0")) != _node_key(node(remote.format(0)))
    assert _node_key(SimpleNamespace()) is None
