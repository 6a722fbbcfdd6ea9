"""Item costs: node ids to items, remembered durations, hints and token estimates."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_modelbench.config import ModelSpec
from pytest_modelbench.config.loading import load_config_set
from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.config.variants import Variant
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.planning.plan import build_plan
from pytest_modelbench.scheduling.costs import (
    ENDPOINT_SWITCH_S,
    FINISHED_S,
    PLAIN_TEST_S,
    SERVER_START_S,
    TOKENS_PER_S,
    NodeItems,
    PlanCosts,
)
from pytest_modelbench.scheduling.durations import DURATIONS_KEY, read_durations
from tests.conftest import UNREACHABLE_URL, Project
from tests.reliability.test_fuzz_config import FakeConfig, check_module


def variant(
    vid: str, *, n: int = -1, rollouts: int = 1, cost: float | None = None, module: str = "jsonl"
) -> Variant:
    return Variant(
        env=vid,
        id=vid,
        module=module,
        num_examples=n,
        rollouts_per_example=rollouts,
        env_args={},
        sampling_args={},
        seeds=(0,),
        metric=None,
        cost=cost,
        source=Path("configs/envs/x.yaml"),
    )


def item(model: str, v: Variant, seed: int = 0, url: str | None = None) -> PlannedItem:
    spec = ModelSpec(model=model, api_base_url=url)
    return PlannedItem(f"{model}-{v.id}-seed{seed}", model, spec, v, seed, v.num_examples)


class Backend:
    def __init__(self, examples: int = 50, tokens: int = 400) -> None:
        self.examples, self.tokens, self.counted = examples, tokens, 0

    def count_examples(self, _item: PlannedItem) -> int:
        self.counted += 1
        return self.examples

    def tokens_per_example(self) -> int:
        return self.tokens


def costs(items: list[PlannedItem], backend: Any = None, **kwargs: Any) -> PlanCosts:
    backend = backend or Backend()
    return PlanCosts({i.item_id: i for i in items}, lambda _module: backend, **kwargs)


@pytest.mark.parametrize(
    ("nodeid", "expected"),
    [
        ("benchmarks/test_models.py::test_benchmark[alpha-qa-seed0]", "alpha-qa-seed0"),
        ("benchmarks/test_models.py::test_extra[alpha-qa-seed0-strict]", "alpha-qa-seed0"),
        ("benchmarks/test_models.py::test_extra[3-alpha-qa-seed0]", "alpha-qa-seed0"),
        ("benchmarks/test_models.py::Test::test_x[alpha-qa-seed1]", "alpha-qa"),  # longest known
        ("bench[1]/test_models.py::test_benchmark[alpha-qa-seed0]", "alpha-qa-seed0"),
        ("benchmarks/test_models.py::test_benchmark[a::b-qa-seed0]", "a::b-qa-seed0"),
        ("benchmarks/test_models.py::test_benchmark[mod\\xe8le-qa-seed0]", "modèle-qa-seed0"),
        ("tests/test_plain.py::test_plain", None),
        ("tests/test_plain.py::test_param[1]", None),
    ],
)
def test_node_ids_map_to_items(nodeid: str, expected: str | None) -> None:
    qa = variant("qa")
    known = ["alpha-qa-seed0", "alpha-qa", "a::b-qa-seed0", "modèle-qa-seed0"]
    found = NodeItems({i: PlannedItem(i, "m", ModelSpec(), qa, 0, -1) for i in known})(nodeid)
    assert (found.item_id if found else None) == expected


def test_the_plan_map_sends_every_collected_item_to_its_own_model(project: Project) -> None:
    """Names with ``-`` that read alike and a non-ASCII name (escaped in node ids): each node id
    the workers collect is its own item, with its own model."""
    project.qa("qa", 3)
    names = ("x-y", "x", "modèle")
    project.models({name: {"model": "m", "api_base_url": UNREACHABLE_URL} for name in names})
    for vid in ("z", "y-z"):
        project.env(vid, [{"id": vid, "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    result = project.pytester.runpytest("benchmarks/", "--model", "all", "--collect-only", "-q")
    nodeids = [line for line in result.outlines if line.startswith("benchmarks/")]
    assert "benchmarks/test_models.py::test_benchmark[mod\\xe8le-y-z-seed0]" in nodeids
    options = RunOptions.from_config(FakeConfig(project.root, {"mb_model": "all"}, {}))  # type: ignore[arg-type]
    plan = build_plan(load_config_set(project.root / "configs"), options, check_module)
    assert len(nodeids) == len(plan.items) == 3 * 2

    item_of = NodeItems(plan.by_id())
    found = [item_of(nodeid) for nodeid in nodeids]
    assert {(i.model_name, i.variant.id) for i in found if i} == {
        (model, vid) for model in names for vid in ("z", "y-z")
    }
    jobs = costs(list(plan.items)).jobs(nodeids)
    assert sorted(j.indices for j in jobs) == [(i,) for i in range(6)]
    for job in jobs:
        item = found[job.indices[0]]
        assert item is not None and job.model == item.model_name


def test_remembered_durations_tolerate_junk() -> None:
    class Cache:
        def __init__(self, value: Any) -> None:
            self.value = value

        def get(self, key: str, _default: Any) -> Any:
            assert key == DURATIONS_KEY
            return self.value

    good = {"a": 1.5, "b": 3, "c": "slow", "d": -1, "e": float("nan"), "f": True}
    assert read_durations(SimpleNamespace(cache=Cache(good))) == {"a": 1.5, "b": 3.0}  # type: ignore[arg-type]
    assert read_durations(SimpleNamespace(cache=Cache(["a"]))) == {}  # type: ignore[arg-type]
    assert read_durations(SimpleNamespace(cache=Cache(None))) == {}  # type: ignore[arg-type]
    assert read_durations(SimpleNamespace()) == {}  # type: ignore[arg-type]  # -p no:cacheprovider


def test_estimate_is_examples_times_rollouts_times_tokens() -> None:
    backend = Backend(examples=50, tokens=400)
    items = [item("m", variant("qa", rollouts=4), seed=s) for s in range(3)]
    items.append(item("m", variant("capped", n=10)))
    c = costs(items, backend)
    assert c.cost(items[0].item_id).seconds == pytest.approx(50 * 4 * 400 / TOKENS_PER_S)
    assert c.cost(items[3].item_id).seconds == pytest.approx(10 * 400 / TOKENS_PER_S)
    for i in items:
        c.cost(i.item_id)
    assert backend.counted == 1  # data loaded once per variant; capped variants not at all


def test_durations_win_and_calibrate_the_estimates_per_model() -> None:
    qa, math = variant("qa"), variant("math")
    items = [
        item("slow", qa),
        item("slow", math),
        item("fast", qa),
        item("fast", math),
        item("new", qa),
    ]
    durations = {"slow-qa-seed0": 400.0, "fast-qa-seed0": 20.0}
    c = costs(items, Backend(examples=50, tokens=400), durations=durations)
    assert c.cost("slow-qa-seed0") == c.cost("slow-qa-seed0")
    assert c.cost("slow-qa-seed0").source == "duration" and c.cost("slow-qa-seed0").seconds == 400.0
    # same token estimate for both variants: each model's own speed carries over
    assert c.cost("slow-math-seed0").seconds == pytest.approx(400.0)
    assert c.cost("fast-math-seed0").seconds == pytest.approx(20.0)
    assert c.cost("new-qa-seed0").seconds == pytest.approx(210.0)  # no history: all models' rate


def test_hints_finished_items_and_switch_costs() -> None:
    hinted = item("m", variant("code", cost=900.0))
    done = item("m", variant("qa"))
    remote = item("api", variant("qa"), url="http://127.0.0.1:9/v1")
    c = costs([hinted, done, remote], finished={done.item_id})
    assert (c.cost(hinted.item_id).seconds, c.cost(hinted.item_id).source) == (900.0, "hint")
    assert c.cost(done.item_id).model is None and c.cost(done.item_id).seconds == FINISHED_S
    assert c.start_costs() == {"m": SERVER_START_S, "api": ENDPOINT_SWITCH_S}


def test_jobs_group_every_test_of_one_item() -> None:
    it = item("m", variant("qa"))
    c = costs([it])
    collection = [
        f"benchmarks/test_models.py::test_benchmark[{it.item_id}]",
        "tests/test_plain.py::test_plain",
        f"benchmarks/test_extra.py::test_rows[{it.item_id}]",
    ]
    jobs = c.jobs(collection)
    assert sorted((j.indices, j.model, j.cost) for j in jobs) == [
        ((0, 2), "m", c.cost(it.item_id).seconds + PLAIN_TEST_S),
        ((1,), None, PLAIN_TEST_S),
    ]
    assert c.job(2, collection[2]).model == "m"
