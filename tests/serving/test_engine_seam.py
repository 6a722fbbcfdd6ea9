"""The engine seam's pure parts: flags, placeholders, environment, fingerprints, masked keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_modelbench.config.schema import ServeSpec
from pytest_modelbench.planning.fingerprint import model_identity
from pytest_modelbench.serving import ENGINES, LaunchSpec, engine_for
from pytest_modelbench.serving.command import render_command
from pytest_modelbench.serving.process import ServerProcess
from pytest_modelbench.serving.server import engine_env
from pytest_modelbench.serving.sglang import sglang_flags


def test_every_engine_is_registered_under_its_name() -> None:
    assert sorted(ENGINES) == ["command", "sglang", "vllm"]
    assert all(engine.name == name for name, engine in ENGINES.items())
    assert engine_for(None) is ENGINES["vllm"]  # no serve section: vLLM, as before


def test_sglang_flags_on_the_cpu_and_with_data_parallel() -> None:
    assert sglang_flags({}, 0) == ["--random-seed", "0", "--device", "cpu"]
    # dp_size given: modelbench adds no --tp-size of its own
    assert sglang_flags({"dp_size": 2}, 2) == ["--dp-size", "2", "--random-seed", "0"]
    assert sglang_flags({"tp_size": 2, "enable_x": False}, 2) == [
        "--tp-size",
        "2",
        "--random-seed",
        "0",
    ]


def test_command_placeholders_and_literal_braces() -> None:
    argv = render_command(
        ["srv", "{model}", "--json", '{{"a": 1}}', "--port={port}", "{gpus}"],
        {"model": "m", "port": "9", "gpus": "0,1"},
    )
    assert argv == ["srv", "m", "--json", '{"a": 1}', "--port=9", "0,1"]


def test_a_command_server_gets_exactly_the_claimed_gpus(tmp_path: Path) -> None:
    spec = LaunchSpec(
        model="m",
        served_name="m",
        log_path=tmp_path / "log",
        cache_dir=tmp_path,
        gpus=("3", "5"),
        command=("srv", "--port", "{port}", "--devices", "{gpus}", "{host}"),
        host="0.0.0.0",  # a command server carries no key: it stays on this host
    )
    server = ENGINES["command"].server(spec)
    process = server.process  # type: ignore[attr-defined]
    assert process.env["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert process._argv_for_port(8000) == [
        "srv",
        "--port",
        "8000",
        "--devices",
        "3,5",
        "127.0.0.1",
    ]
    assert engine_env(None, "m", base={"CUDA_VISIBLE_DEVICES": "0"})["CUDA_VISIBLE_DEVICES"] == ""


def test_credential_flags_are_masked_in_the_logged_command(tmp_path: Path) -> None:
    process = ServerProcess(lambda _port: [], env={}, log_path=tmp_path / "log")
    process.argv = ["srv", "--api-key", "s3cr3t", "--token=abc", "--port", "1"]
    shown = process.command_line()
    assert "s3cr3t" not in shown and "abc" not in shown
    assert shown == "srv --api-key '***' '--token=***' --port 1"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_fingerprint_of_engines_without_a_command_is_unchanged(engine: str) -> None:
    serve = ServeSpec(engine=engine).model_dump(mode="json")
    assert model_identity("m", "org/m", "chat", serve)["serve"] == {"engine": engine, "args": {}}


def test_the_command_is_part_of_the_fingerprint() -> None:
    def identity(command: list[str]) -> object:
        serve = ServeSpec(engine="command", command=command).model_dump(mode="json")
        return model_identity("m", "org/m", "chat", serve)

    assert identity(["a", "{port}"]) != identity(["b", "{port}"])
