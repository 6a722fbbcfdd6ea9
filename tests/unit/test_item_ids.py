"""Item ids: readable where names do not clash, never shared by two different items."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from pytest_modelbench.config.loading import load_config_set
from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.names import param_id, safe_component
from pytest_modelbench.planning.item import ItemKey, Plan, assign_item_ids, readable_item_id
from pytest_modelbench.planning.plan import build_plan
from tests.reliability.test_fuzz_config import FakeConfig, check_module

# words with the characters that make ids ambiguous or unusual: '-' joins ids, '+' marks an id's
# hash and '~' a store directory's, '[' and ']' delimit node-id parameters, 'seed' and digits end
# ids; and non-ASCII
WORDS = st.sampled_from(
    ["x", "y", "x-y", "seed0", "seed0+0123456789ab", "~0", "a]", "[b", "é", "日-本", "\t"]
)
TEXT = st.text(st.sampled_from("xy-+~[]seed01é日\t"), min_size=1, max_size=8)


@st.composite
def item_keys(draw: st.DrawFn) -> list[ItemKey]:
    """Distinct (model, env, variant, seed) keys: groups of one ``-``-joined run of words cut in
    different places (``x-y`` × ``z`` and ``x`` × ``y-z``), so readable ids clash, and keys of
    arbitrary text."""
    keys: dict[ItemKey, None] = {}
    for _ in range(draw(st.integers(0, 6))):
        words = draw(st.lists(WORDS, min_size=2, max_size=4))
        cuts = draw(st.lists(st.integers(1, len(words) - 1), min_size=1, max_size=3))
        seed = draw(st.integers(-1, 11))
        for cut in cuts:
            env = draw(st.sampled_from(["qa", "q-a"]))
            keys[("-".join(words[:cut]), env, "-".join(words[cut:]), seed)] = None
    for _ in range(draw(st.integers(0, 4))):
        keys[(draw(TEXT), "qa", draw(TEXT), draw(st.integers(0, 2)))] = None
    return list(keys)


def test_dashes_that_line_up_get_hashed_ids_and_one_note() -> None:
    keys: list[ItemKey] = [
        ("x-y", "z", "z", 0),
        ("x-y", "y-z", "y-z", 0),
        ("x", "z", "z", 0),
        ("x", "y-z", "y-z", 0),
        ("x-y", "z", "z", 1),
        ("x", "y-z", "y-z", 1),
    ]
    ids, notes = assign_item_ids(keys)
    assert ids[("x-y", "y-z", "y-z", 0)] == "x-y-y-z-seed0"  # no clash: unchanged
    assert ids[("x", "z", "z", 0)] == "x-z-seed0"
    clashing = [ids[k] for k in keys if readable_item_id(k[0], k[2], k[3]).startswith("x-y-z-")]
    assert len(set(clashing)) == 4 and all("+" in i for i in clashing)
    assert notes == [
        "model 'x-y' with variant 'z' and model 'x' with variant 'y-z' both give the item ids "
        f"x-y-z-seed0, x-y-z-seed1; to tell them apart their ids get a +hash: "
        f"{', '.join(clashing[:3])} and 1 more"
    ]
    assert assign_item_ids(list(reversed(keys)))[0] == ids  # the same ids in any order


def test_one_variant_id_in_two_environments_is_two_items() -> None:
    ids, notes = assign_item_ids([("m", "qa", "v", 0), ("m", "math", "v", 0)])
    assert len(set(ids.values())) == 2
    assert notes[0].startswith(
        "model 'm' with variant 'v' (env 'qa') and model 'm' with variant 'v' (env 'math') both"
    )


@given(item_keys())
def test_different_items_never_share_an_id(keys: list[ItemKey]) -> None:
    ids, notes = assign_item_ids(keys)
    assert len(set(ids.values())) == len(keys)
    # ... nor a node-id parameter or a run store directory
    assert len({param_id(i) for i in ids.values()}) == len(keys)
    assert len({safe_component(i) for i in ids.values()}) == len(keys)
    readable = [readable_item_id(m, v, s) for m, _, v, s in keys]
    for key, plain in zip(keys, readable, strict=True):
        unique = readable.count(plain) == 1
        assert ids[key] == plain if unique else ids[key].startswith(f"{plain}+")
        if safe_component(plain) == plain:  # a store-safe name stays its own directory name
            assert safe_component(ids[key]) == ids[key]
    assert bool(notes) == (len(set(readable)) < len(readable))


def plan(tmp_path: Path, **given: str) -> Plan:
    """The plan for models ``x-y`` and ``x`` × variants ``z`` and ``y-z`` (two pairs read
    ``x-y-z``) with these options."""
    configs = tmp_path / "configs"
    (configs / "envs").mkdir(parents=True, exist_ok=True)
    models = {
        name: {"model": "m", "api_base_url": "http://127.0.0.1:9/v1"} for name in ("x-y", "x")
    }
    (configs / "models.yaml").write_text(yaml.safe_dump({"models": models}))
    for vid in ("z", "y-z"):
        variant = {"id": vid, "module": "jsonl", "env_args": {"path": "qa.jsonl"}}
        (configs / "envs" / f"{vid}.yaml").write_text(yaml.safe_dump([variant]))
    options = RunOptions.from_config(FakeConfig(tmp_path, given, {}))  # type: ignore[arg-type]
    return build_plan(load_config_set(configs), options, check_module)


def test_the_planner_plans_every_pair_and_says_why_ids_changed(tmp_path: Path) -> None:
    made = plan(tmp_path, mb_model="all", mb_seeds="0,1")
    assert len(made.items) == 2 * 2 * 2
    assert len({item.item_id for item in made.items}) == 8
    assert len(made.notes) == 1
    assert made.notes[0].startswith(
        "model 'x' with variant 'y-z' and model 'x-y' with variant 'z' both give the item ids "
        "x-y-z-seed0, x-y-z-seed1; to tell them apart their ids get a +hash: x-y-z-seed0+"
    )


def test_the_planner_says_in_one_line_why_it_plans_fewer_items(tmp_path: Path) -> None:
    made = plan(tmp_path, mb_model="x,x", mb_seeds="0,1,1", mb_env="z,y-z,z")
    assert [item.item_id for item in made.items] == [
        "x-z-seed0",
        "x-z-seed1",
        "x-y-z-seed0",
        "x-y-z-seed1",
    ]
    assert made.notes == (
        "4 items planned for 18 listed model × variant × seed combinations: a model, variant or "
        "seed named twice (by --model, --env, --seeds or the job file) is planned once; "
        "repeated: x-z-seed1, x-y-z-seed1, x-z-seed0 and 1 more",
    )
    assert plan(tmp_path, mb_model="all").notes[0].startswith("model 'x' with variant 'y-z'")
    assert plan(tmp_path, mb_model="x").notes == ()
