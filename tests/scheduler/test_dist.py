"""ModelAffinityScheduling (the xdist side) with stand-in worker nodes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pytest_modelbench.scheduling.costs import TableCosts
from pytest_modelbench.scheduling.dist import ModelAffinityScheduling


class Node:
    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.steals: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def send_steal(self, indices: list[int]) -> None:
        self.steals.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def make(
    workers: int, table: dict[str, tuple[str | None, float]]
) -> tuple[Any, list[Node], list[str]]:
    reports: list[Any] = []
    config: Any = SimpleNamespace(
        getvalue=lambda _name: [f"{workers}*popen"],
        hook=SimpleNamespace(pytest_collectreport=lambda report: reports.append(report)),
        reports=reports,
    )
    sched = ModelAffinityScheduling(
        config,
        jobs=TableCosts(table, {"a": 60.0, "b": 60.0}),
        clock=lambda: 0.0,
    )
    nodes = [Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
    return sched, nodes, list(table)


TABLE: dict[str, tuple[str | None, float]] = {
    **{f"b.py::test_benchmark[a-qa-seed{i}]": ("a", 600.0 + i) for i in range(4)},
    **{f"b.py::test_benchmark[b-qa-seed{i}]": ("b", 500.0 + i) for i in range(4)},
}


def test_collection_then_one_model_per_worker_longest_first() -> None:
    sched, nodes, collection = make(2, TABLE)
    sched.add_node_collection(nodes[0], collection)
    assert not sched.collection_is_completed
    sched.add_node_collection(nodes[1], collection)
    sched.schedule()
    assert nodes[0].sent == [3, 2] and nodes[1].sent == [7, 6]
    assert sched.node2pending == {nodes[0]: [3, 2], nodes[1]: [7, 6]}
    assert sched.has_pending and not sched.tests_finished
    sched.mark_test_complete(nodes[0], 3, 600.0)
    assert nodes[0].sent[-1] == 1


def test_different_collections_abort_like_xdist() -> None:
    sched, nodes, collection = make(2, TABLE)
    sched.add_node_collection(nodes[0], collection)
    sched.add_node_collection(nodes[1], collection[:-1])
    sched.schedule()
    assert sched.tests_finished and nodes[0].sent == []
    assert sched.config.reports and sched.config.reports[0].outcome == "failed"


def test_crashed_node_reports_its_item_and_others_take_the_rest() -> None:
    sched, nodes, collection = make(2, TABLE)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    assert sched.remove_node(nodes[0]) == collection[3]
    for index in (7, 6, 5):  # gw1 finishes model b, then serves a, which nobody serves now
        sched.mark_test_complete(nodes[1], index, 500.0)
    assert nodes[1].sent == [7, 6, 5, 4, 2]


def test_rerun_item_goes_back_to_the_pool_and_shutdowns_end_the_run() -> None:
    sched, nodes, collection = make(1, dict(list(TABLE.items())[:2]))
    sched.add_node_collection(nodes[0], collection)
    sched.schedule()
    sched.mark_test_complete(nodes[0], 1, 1.0)
    assert nodes[0].shutting_down  # nothing left: run the held item and exit
    sched.mark_test_pending(collection[1])  # e.g. a rerun plugin
    assert not sched.tests_finished or sched.policy.unassigned == 1
    sched.mark_test_complete(nodes[0], 0, 1.0)
    assert sched.remove_node(nodes[0]) is None


def test_node_shut_down_by_xdist_gets_nothing_more() -> None:
    sched, nodes, collection = make(2, TABLE)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    nodes[0].shutting_down = True  # e.g. -x after a failure
    before = list(nodes[0].sent)
    sched.mark_test_complete(nodes[0], 3, 1.0)
    assert nodes[0].sent == before
