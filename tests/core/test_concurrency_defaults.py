"""Requests in flight per item: a served model's engine is fed what it batches, an endpoint keeps
its configured value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_modelbench.config.loading import load_config_set
from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.planning.plan import VLLM_DEFAULT_MAX_NUM_SEQS, build_plan
from tests.reliability.test_fuzz_config import FakeConfig, check_module

MODELS: dict[str, dict[str, Any]] = {
    "served": {"model": "org/served"},  # modelbench serves it with vLLM's defaults
    "seqs": {"model": "org/seqs", "serve": {"args": {"max_num_seqs": 96}}},
    "dashed": {"model": "org/dashed", "serve": {"args": {"max-num-seqs": 48}}},
    "pinned": {"model": "org/pinned", "max_concurrent": 4, "serve": {"args": {"max_num_seqs": 96}}},
    "remote": {"model": "remote", "api_base_url": "http://localhost:9/v1"},
}


def _concurrency(tmp_path: Path, models: str, **options: Any) -> dict[str, int]:
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": MODELS}))
    given = {"mb_model": models, "mb_env": "gsm8k", **options}
    run = RunOptions.from_config(FakeConfig(tmp_path, given, {}))  # type: ignore[arg-type]
    plan = build_plan(load_config_set(tmp_path / "configs"), run, check_module)
    return {item.model_name: item.model.max_concurrent for item in plan.items}


def test_served_models_default_to_the_engine_batch_capacity(tmp_path: Path) -> None:
    assert _concurrency(tmp_path, "served,seqs,dashed,pinned,remote,smollm2-135m,smoke") == {
        "served": VLLM_DEFAULT_MAX_NUM_SEQS,  # vLLM's own max_num_seqs default
        "seqs": 96,  # what the engine is started with
        "dashed": 48,
        "pinned": 4,  # the user's max_concurrent wins
        "remote": 32,  # an endpoint keeps the configured default
        "smollm2-135m": 64,  # its max_num_seqs
        "smoke": 8,
    }


def test_an_ad_hoc_local_model_is_served_at_capacity(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    assert _concurrency(tmp_path, str(tmp_path / "ckpt")) == {"ckpt": VLLM_DEFAULT_MAX_NUM_SEQS}


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"mb_max_concurrent": "7"}, {"served": 7, "remote": 7}),  # --max-concurrent: everything
        ({"mb_api_base_url": "http://localhost:9/v1"}, {"served": 32, "remote": 32}),
    ],
)
def test_command_line_overrides(
    tmp_path: Path, options: dict[str, str], expected: dict[str, int]
) -> None:
    assert _concurrency(tmp_path, "served,remote", **options) == expected
