"""The setup record and where each field comes from: serving args (output-changing only),
weights, chat template, NVML, the reported version; what a comparison lists (issue 42)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.config import ModelSpec, Variant
from pytest_modelbench.evaluation import setup as gather
from pytest_modelbench.gating import gates
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.store.setup import SetupRecord, compare_setups
from pytest_modelbench.store.verdict import GateVerdict


def _item(model: str = "m", **spec: Any) -> PlannedItem:
    variant = Variant(
        env="qa",
        id="qa",
        module="jsonl",
        num_examples=-1,
        rollouts_per_example=1,
        env_args={},
        sampling_args={"temperature": 0.6},
        seeds=(0,),
        metric=None,
        cost=None,
        source=Path("configs/envs/qa.yaml"),
    )
    return PlannedItem("m-qa-seed0", "m", ModelSpec(model=model, **spec), variant, 0, -1)


def _serve(gpus: int = 1, **args: Any) -> dict[str, Any]:
    return {"serve": {"engine": "vllm", "gpus": gpus, "args": args}}


def test_serving_args_keep_what_changes_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    item = _item(
        **_serve(2, dtype="bfloat16", port=8001, gpu_memory_utilization=0.9, **{"max-num-seqs": 8})
    )
    assert gather.serve_args(item) == {
        "dtype": "bfloat16",
        "max_num_seqs": 8,
        "tensor_parallel_size": 2,
    }
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert gather.serve_args(item)["batch_invariant"] == "1"  # type: ignore[index]
    assert gather.serve_args(_item(api_base_url="http://x/v1")) is None  # not ours to know


def test_planned_setup_of_a_local_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"hidden_size": 64}')
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    item = _item(str(ckpt), max_tokens=256, **_serve())
    first = gather.planned_setup(item, {"data": "abc"})
    assert first.engine == "vllm" and first.gpu_count == 1
    assert first.sampling_args == {"temperature": 0.6} and first.max_tokens == 256
    assert first.prompt_format == "chat jsonl" and first.data is not None
    assert first.weights is not None and first.weights.startswith("files ")
    assert first.chat_template is not None

    (ckpt / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ other }}"}))
    (ckpt / "config.json").write_text('{"hidden_size": 128}')
    second = gather.planned_setup(item, {"data": "abc"})
    assert second.differences(first) == ["weights", "chat_template"]

    template = tmp_path / "t.jinja"
    template.write_text("{{ given }}")
    given = gather.planned_setup(_item(str(ckpt), **_serve(chat_template=str(template))))
    assert given.chat_template not in (None, first.chat_template, second.chat_template)
    assert given.serve_args == {}  # the template is compared by content, not by its path
    pinned = gather.planned_setup(_item("org/name", **_serve(revision="abc123")))
    assert pinned.weights == "revision abc123"


def fake_pynvml(names: list[str]) -> types.ModuleType:
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(names)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: names[h].encode()  # type: ignore[attr-defined]
    module.nvmlSystemGetDriverVersion = lambda: "550.54.15"  # type: ignore[attr-defined]
    module.nvmlSystemGetCudaDriverVersion = lambda: 12040  # type: ignore[attr-defined]
    return module


def test_nvml_facts_of_the_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        sys.modules, "pynvml", fake_pynvml(["NVIDIA A100-SXM4-80GB", "NVIDIA H100"])
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gather.nvml_facts() == ("NVIDIA H100", "550.54.15", "12.4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gather.nvml_facts()[0] == "NVIDIA A100-SXM4-80GB / NVIDIA H100"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: unknown, never invented
    assert gather.nvml_facts() == (None, None, None)


def test_a_version_nobody_reports_is_unknown() -> None:
    assert gather.reported_version(["http://127.0.0.1:9/v1"]) is None


def test_only_fields_both_sides_know_are_compared() -> None:
    baseline = SetupRecord(engine="vllm", engine_version="0.32.0", gpu_count=1, max_tokens=512)
    unknown = SetupRecord(engine="vllm", gpu_count=1, max_tokens=512)  # version not reported
    assert compare_setups(unknown, baseline).line == ""
    assert compare_setups(None, baseline).line == ""  # a run before setups were recorded
    changed = SetupRecord(
        engine="vllm",
        engine_version="0.32.0",
        gpu_count=1,
        max_tokens=512,
        sampling_args={"temperature": 0.7},
    )
    before = SetupRecord(
        engine="vllm",
        engine_version="0.32.0",
        gpu_count=1,
        max_tokens=512,
        sampling_args={"temperature": 0.0},
    )
    assert compare_setups(changed, before).line == (
        "setup differs (sampling.temperature): baseline: vllm 0.32.0, 1×GPU, max_tokens 512, "
        "temperature 0.0; this run: vllm 0.32.0, 1×GPU, max_tokens 512, temperature 0.7"
    )


def test_record_round_trip() -> None:
    record = SetupRecord(engine="vllm", serve_args={"dtype": "bf16"}, gpu_count=0)
    assert SetupRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    assert SetupRecord.from_json({"schema_version": 99, "engine": "x"}) is None
    assert record.describe() == "vllm, CPU, bf16"


def test_holm_keeps_a_setup_failure() -> None:
    """Under --mb-require-same-setup an item that passes its test still fails after Holm."""
    tested = GateVerdict(
        passed=True,
        rule="value",
        metric="acc",
        value=0.8,
        alpha=0.05,
        p_value=0.5,
        delta=0.01,
        baseline_value=0.79,
    )
    failed = gates.with_setup(tested, "setup differs (engine_version): ...", require=True)
    assert not failed.passed and failed.setup_failed
    (settled,) = gates.holm_adjust_verdicts([failed])
    assert not settled.passed and settled.setup_failed
    assert "fails under --mb-require-same-setup: setup differs" in settled.message
    assert "improvement of 0.010" in settled.message  # the test's own outcome, as it was
    shown = gates.with_setup(tested, "setup differs (engine_version): ...")
    assert shown.passed and shown.message.endswith("; setup differs (engine_version): ...")


def test_an_earlier_cpu_record_of_serve_gpus_is_not_compared_with_the_cpu() -> None:
    """Records made on a machine without GPU took ``serve.gpus`` (1) as the GPU count, with
    no GPU model: read back, that count is unknown, so ``--mb-require-same-setup`` does not
    fail every CPU item against a baseline recorded before the CPU was recorded as such."""
    earlier = SetupRecord.from_json(
        {"schema_version": 1, "engine": "command", "gpu_count": 1, "max_tokens": 64}
    )
    assert earlier is not None and earlier.gpu_count is None
    assert earlier.differences(SetupRecord(engine="command", gpu_count=0, max_tokens=64)) == []
    on_gpus = {"schema_version": 1, "engine": "vllm", "gpu_count": 2, "gpu_model": "H100"}
    read = SetupRecord.from_json(on_gpus)
    assert read is not None and read.gpu_count == 2  # NVML saw them: compared as ever
