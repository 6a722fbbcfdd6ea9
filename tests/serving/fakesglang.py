"""A fake ``sglang`` package for pytester runs: SGLang's flag names, a simulated server.

:func:`install` puts ``sglang.launch_server`` on the ``PYTHONPATH`` of the pytest run under
test, beside the fake vLLM (``tests/serving/fakevllm.py``). Its argparse parser knows the
flags of SGLang's ``ServerArgs`` (``python/sglang/srt/server_args.py``) that modelbench may
send, under their real names and aliases, and refuses any other (exit code 2, as SGLang's
own parser does), so a misspelt flag fails the start. It appends one JSON line per start to
``sglang-starts.jsonl`` (parsed flags, ``CUDA_VISIBLE_DEVICES``) and serves the simulator.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

LAUNCH_SERVER = """
import argparse, json, os, time
from pytest_modelbench.testing import SimConfig, SimServer

parser = argparse.ArgumentParser(prog="python -m sglang.launch_server", allow_abbrev=False)
add = parser.add_argument
add("--model-path", "--model", dest="model_path", required=True)
add("--served-model-name")
add("--host", default="127.0.0.1")
add("--port", type=int, default=30000)
add("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
add("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
add("--mem-fraction-static", type=float)
add("--random-seed", type=int)
add("--device")
add("--api-key")
add("--context-length", type=int)
add("--disable-radix-cache", action="store_true")
args = parser.parse_args()  # an unknown flag: usage message, exit code 2
record = dict(vars(args), gpus=os.environ.get("CUDA_VISIBLE_DEVICES"))
with open(os.environ["FAKE_SGLANG_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
served = args.served_model_name or args.model_path
config = SimConfig(models=(served,), port=args.port, host=args.host, api_key=args.api_key)
with SimServer(config):
    while True:
        time.sleep(3600)
"""


def install(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake ``sglang`` package under ``root``, first on PYTHONPATH; its start log."""
    package = root / "fakesglang" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(LAUNCH_SERVER)
    log = root / "sglang-starts.jsonl"
    current = os.environ.get("PYTHONPATH")
    first = str(root / "fakesglang")
    monkeypatch.setenv("PYTHONPATH", first + (os.pathsep + current if current else ""))
    monkeypatch.setenv("FAKE_SGLANG_LOG", str(log))
    return log


def starts(log: Path) -> list[dict[str, Any]]:
    """One record per start of the fake SGLang, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]
