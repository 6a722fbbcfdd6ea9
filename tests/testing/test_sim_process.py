"""``SimProcess``: the simulated server in its own process, as the perf/ scripts start it."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from pytest_modelbench.testing.fakevllm import write_fake_vllm
from pytest_modelbench.testing.process import SimProcess, SimProcessError


def test_serves_until_stopped_and_logs_its_requests(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with SimProcess(["--models", "m-a,m-b", "--log", str(log)]) as server:
        assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
        with urllib.request.urlopen(f"{server.base_url}/models", timeout=10) as answer:
            served = [m["id"] for m in json.load(answer)["data"]]
        assert served == ["m-a", "m-b"]
    assert server.process.returncode == 0  # stopped by SIGTERM, as a server should
    assert [json.loads(line)["path"] for line in log.read_text().splitlines()] == ["/v1/models"]


def test_a_bad_flag_is_an_error_naming_the_flags() -> None:
    with pytest.raises(SimProcessError, match=r"exited with 2 .*--slots nope"):
        SimProcess(["--slots", "nope"], quiet=True)


def test_the_fake_vllm_is_an_importable_api_server(tmp_path: Path) -> None:
    root = write_fake_vllm(tmp_path)
    module = root / "vllm" / "entrypoints" / "openai" / "api_server.py"
    compile(module.read_text(), str(module), "exec")  # a script, run by the server pool
    assert sorted(p.name for p in (root / "vllm").iterdir()) == ["__init__.py", "entrypoints"]
