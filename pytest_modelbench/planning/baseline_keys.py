"""Baseline entries that match nothing are mistakes: a typo there would switch the gate off."""

from __future__ import annotations

from collections.abc import Iterable

from pytest_modelbench.config import ConfigSet, expand_variants
from pytest_modelbench.config.loading import display_path, load_baseline_file
from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean, one_of
from pytest_modelbench.names import safe_component
from pytest_modelbench.planning.item import PlannedItem


def check_baseline_keys(config: ConfigSet, items: Iterable[PlannedItem]) -> None:
    """Every entry of the planned models' baseline files must name a configured environment or
    variant (or one this session plans), and every entry must be valid: a mistake there is a
    usage error before anything runs, not a failure found after the item's requests."""
    planned = list(items)
    known = set(config.envs)
    for env, specs in config.envs.items():
        path = config.env_paths[env]
        for spec in specs:
            known.add(spec.id)
            known.update(v.id for v in expand_variants(env, spec, path, display_path(path)))
    known |= {item.env for item in planned} | {item.variant.id for item in planned}
    for model in sorted({item.model_name for item in planned}):
        path = config.root / "baselines" / f"{safe_component(model)}.yaml"
        if not path.is_file():
            continue
        entries = load_baseline_file(path)
        for key in entries:
            if key not in known:
                raise ModelbenchUsageError(
                    f"{display_path(path)}: entry {key!r} matches no environment or variant"
                    f"{did_you_mean(key, known)}, so it would gate nothing; rename it to one of "
                    f"{one_of(sorted(known))} or remove it"
                )
