"""Checkpoints whose weight file is not named as the index says (model.safetensors vs
model-00001-of-00001.safetensors): served from a shadow directory, or a clear failure."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.config.schema import ModelSpec
from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.planning.plan import expand_checkpoints
from pytest_modelbench.serving.checkpoints import (
    INDEX_NAME,
    CheckpointNamingError,
    ShardRename,
    check_shard_names,
    servable_checkpoint,
    shadow_directory,
)
from tests.serving.fakevllm import qa_env, serve_spec, starts, write_models

SHARD = "model-00001-of-00001.safetensors"
TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def safetensors(path: Path, names: tuple[str, ...] = TENSORS) -> Path:
    """A valid (tiny) safetensors file holding ``names``."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    for i, name in enumerate(names):
        header[name] = {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4 * len(names))
    return path


def checkpoint(
    directory: Path,
    files: tuple[str, ...] = ("model.safetensors",),
    shards: dict[str, str] | None = None,
) -> Path:
    """A checkpoint as the training code writes it: config, weight files and an index."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"model_type": "llama"}')
    (directory / "tokenizer.json").write_text("{}")
    for name in files:
        safetensors(directory / name)
    shards = shards if shards is not None else dict.fromkeys(TENSORS, SHARD)
    (directory / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    return directory


# -- detection ---------------------------------------------------------------------------


def test_the_known_mismatch_is_found(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "step400")
    assert check_shard_names(ckpt) == ShardRename(ckpt, SHARD, "model.safetensors")


def test_consistent_checkpoints_and_checkpoints_without_index_are_left_alone(
    tmp_path: Path,
) -> None:
    assert check_shard_names(checkpoint(tmp_path / "ok", files=(SHARD,))) is None
    plain = tmp_path / "plain"
    plain.mkdir()
    safetensors(plain / "model.safetensors")
    assert check_shard_names(plain) is None


def test_several_candidates_fail_with_the_mv_to_run(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "step1", files=("model.safetensors", "ema.safetensors"))
    with pytest.raises(CheckpointNamingError) as info:
        check_shard_names(ckpt)
    message = str(info.value)
    assert str(ckpt) in message and SHARD in message
    assert "ema.safetensors, model.safetensors" in message
    assert f"mv {ckpt}/<the right one> {ckpt}/{SHARD}" in message


def test_several_missing_shards_fail_naming_them(tmp_path: Path) -> None:
    shards = {
        TENSORS[0]: "model-00001-of-00002.safetensors",
        TENSORS[1]: "model-00002-of-00002.safetensors",
    }
    ckpt = checkpoint(tmp_path / "step2", shards=shards)
    with pytest.raises(CheckpointNamingError) as info:
        check_shard_names(ckpt)
    message = str(info.value)
    assert (
        "model-00001-of-00002.safetensors, model-00002-of-00002.safetensors, which are missing"
        in message
    )
    assert f"mv {ckpt}/model.safetensors {ckpt}/model-00001-of-00002.safetensors" in message


def test_no_candidate_means_an_incomplete_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNamingError, match="incomplete"):
        check_shard_names(checkpoint(tmp_path / "step3", files=()))


def test_a_candidate_without_the_indexed_weights_is_not_used(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "step4", files=())
    safetensors(ckpt / "adapter.safetensors", names=("lora_A",))
    with pytest.raises(CheckpointNamingError, match="lacks 2 of the 2 tensors"):
        check_shard_names(ckpt)
    (ckpt / "adapter.safetensors").write_text("not safetensors")
    with pytest.raises(CheckpointNamingError, match="not a readable safetensors file"):
        check_shard_names(ckpt)


def test_unreadable_index_is_named(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "step5")
    (ckpt / INDEX_NAME).write_text("{")
    with pytest.raises(CheckpointNamingError, match=f"{ckpt / INDEX_NAME}: cannot read"):
        check_shard_names(ckpt)


# -- the shadow directory ----------------------------------------------------------------


def test_shadow_links_every_file_and_the_missing_name_without_touching_the_checkpoint(
    tmp_path: Path,
) -> None:
    ckpt = checkpoint(tmp_path / "ckpts" / "step400")
    before = sorted(os.listdir(ckpt))
    served, note = servable_checkpoint(ckpt, tmp_path / "shadows")
    assert served.parent == tmp_path / "shadows" and served.name.startswith("step400-")
    assert sorted(os.listdir(served)) == sorted([*before, SHARD])
    for name in before:
        assert (served / name).is_symlink() and (served / name).resolve() == (ckpt / name).resolve()
    assert (served / SHARD).resolve() == (ckpt / "model.safetensors").resolve()
    assert sorted(os.listdir(ckpt)) == before  # the user's checkpoint is unchanged
    assert note is not None and "\n" not in note
    assert note.startswith(f"checkpoint {ckpt}: {INDEX_NAME} names {SHARD}")
    assert f"mv {ckpt}/model.safetensors {ckpt}/{SHARD}" in note
    # again (another worker, a resumed run): the same directory, reused
    assert servable_checkpoint(ckpt, tmp_path / "shadows") == (served, note)
    assert len(os.listdir(tmp_path / "shadows")) == 1


def test_a_retrained_checkpoint_gets_a_new_shadow(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "step400")
    first = shadow_directory(ShardRename(ckpt, SHARD, "model.safetensors"), tmp_path / "s")
    safetensors(ckpt / "model.safetensors", names=(*TENSORS, "extra"))
    second = shadow_directory(ShardRename(ckpt, SHARD, "model.safetensors"), tmp_path / "s")
    assert first != second


def test_a_fine_checkpoint_is_served_as_it_is(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "good", files=(SHARD,))
    assert servable_checkpoint(ckpt, tmp_path / "shadows") == (ckpt, None)
    assert not (tmp_path / "shadows").exists()


# -- through the plugin: a checkpoint sweep served by the (fake) vLLM ----------------------


def test_sweep_expands_in_numeric_step_order(tmp_path: Path) -> None:
    for name in ("step100", "step9", "final", "step10"):
        (tmp_path / name).mkdir()
    spec = ModelSpec(checkpoints=str(tmp_path / "*"))
    expanded = expand_checkpoints("run7", spec)
    assert [label for label, _ in expanded] == [
        "run7-final",  # no step number: first
        "run7-step9",
        "run7-step10",
        "run7-step100",
    ]
    assert [s.model for _, s in expanded] == [
        str(tmp_path / n) for n in ("final", "step9", "step10", "step100")
    ]
    assert all(s.checkpoints is None for _, s in expanded)


def test_sweep_over_two_runs_with_the_same_step_is_a_usage_error(tmp_path: Path) -> None:
    for run in ("a", "b"):
        (tmp_path / run / "step100").mkdir(parents=True)
    spec = ModelSpec(checkpoints=str(tmp_path / "*" / "step*"))
    with pytest.raises(ModelbenchUsageError) as info:
        expand_checkpoints("run7", spec)
    message = str(info.value)
    assert message.startswith("models.run7.checkpoints: ")
    assert str(tmp_path / "a" / "step100") in message
    assert str(tmp_path / "b" / "step100") in message
    assert "'run7-step100'" in message and "narrow the pattern" in message


def test_sweep_of_misnamed_checkpoints_serves_each_from_its_shadow(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pytester.path
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    ckpts = {step: checkpoint(root / "run7" / f"step{step}") for step in (200, 100)}
    before = {step: sorted(os.listdir(ckpt)) for step, ckpt in ckpts.items()}
    write_models(root, {"run7": {"checkpoints": str(root / "run7" / "step*"), **serve_spec(1)}})
    qa_env(root, seeds=(0,))
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "run7", "--run-id", "sweep", "-v", "-p", "no:cacheprovider",
        "--mb-no-reports",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_benchmark[[]run7-step100-qa-seed0[]] PASSED*",
            "*test_benchmark[[]run7-step200-qa-seed0[]] PASSED*",
        ]
    )
    servers = starts(fake_vllm)
    assert [s["model"] for s in servers] == ["run7-step100", "run7-step200"]
    shadows = root / "runs" / "sweep" / "servers" / "checkpoints"
    for server, step in zip(servers, (100, 200), strict=True):
        served = Path(server["path"])
        assert served.parent == shadows and served.name.startswith(f"step{step}-")
        assert (served / SHARD).resolve() == (ckpts[step] / "model.safetensors").resolve()
        assert sorted(os.listdir(ckpts[step])) == before[step]  # untouched
        result.stdout.fnmatch_lines(
            [
                f"*CheckpointWarning: checkpoint {ckpts[step]}: {INDEX_NAME} names {SHARD} but "
                f"the weights are in model.safetensors; serving it from {served}, where {SHARD} "
                f"links to model.safetensors (the checkpoint is unchanged; to fix it: "
                f"mv {ckpts[step]}/model.safetensors {ckpts[step]}/{SHARD})"
            ]
        )


def test_sweep_serves_good_misnamed_and_broken_checkpoints_each_their_way(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pytester.path
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    good = checkpoint(root / "run7" / "step200", files=(SHARD,))
    misnamed = checkpoint(root / "run7" / "step400")
    broken = checkpoint(root / "run7" / "step600", files=("model.safetensors", "ema.safetensors"))
    write_models(root, {"run7": {"checkpoints": str(root / "run7" / "step*"), **serve_spec(1)}})
    qa_env(root, seeds=(0,))
    result = pytester.runpytest_subprocess(
        "benchmarks/",
        "--model",
        "run7",
        "--run-id",
        "sweep",
        "-p",
        "no:cacheprovider",
        "--mb-no-reports",
    )
    result.assert_outcomes(passed=2, errors=1)  # a server that cannot start errors its items
    run_dir = root / "runs" / "sweep"
    servers = {s["model"]: s for s in starts(fake_vllm)}
    assert sorted(servers) == ["run7-step200", "run7-step400"]  # served names: the model labels
    assert servers["run7-step200"]["path"] == str(good)
    shadow = Path(servers["run7-step400"]["path"])
    assert shadow.parent == run_dir / "servers" / "checkpoints"
    assert (shadow / SHARD).resolve() == (misnamed / "model.safetensors").resolve()
    assert not (misnamed / SHARD).exists()
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_benchmark[[]run7-step600-qa-seed0[]]*",
            f"run7-step600: {broken}: {INDEX_NAME} names {SHARD}, which is missing, and several "
            f"unlisted files could be it (ema.safetensors, model.safetensors); rename the right "
            f"one: mv {broken}/<the right one> {broken / SHARD}",
            "*= warnings summary =*",
            "*test_benchmark*run7-step400-qa-seed0*",
            f"*CheckpointWarning: checkpoint {misnamed}: {INDEX_NAME} names {SHARD} but the weights "
            f"are in model.safetensors; serving it from {shadow}, where*",
        ],
        consecutive=False,
    )
