"""``serve.engine``: SGLang and any command serve items end to end; mistakes are one line.

The fake ``sglang`` (tests/serving/fakesglang.py) parses SGLang's real flag names and refuses
others; the ``command`` engine runs the project's simulated server (``python -m
pytest_modelbench.testing``) from an argv template. Both go through the real launch path:
GPU claim, command line, environment, health wait, reuse, stop.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from pytest_modelbench.testing import read_log
from tests.serving import fakesglang
from tests.serving.fakevllm import EXAMPLES, starts, write_models

SEEDS = 4  # fakevllm's qa environment


def test_command_engine_serves_items_with_the_simulator_on_the_claimed_gpus(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:40000,2:0,3:0")  # GPU 1 is busy
    seen = pytester.path / "seen.txt"
    requests = pytester.path / "sim-requests.jsonl"
    # a shell line, as a user would wrap a server: it records what the process was given
    script = (
        f'echo "cuda=$CUDA_VISIBLE_DEVICES gpus={{gpus}} n={{n_gpus}}" >> {seen}; '
        f"exec {sys.executable} -m pytest_modelbench.testing --host {{host}} --port {{port}} "
        f'--models "{{served_name}}" --log {requests}'
    )
    write_models(
        pytester.path,
        {
            "sim": {
                "model": "sim-model",
                "serve": {
                    "engine": "command",
                    "command": ["sh", "-c", script],
                    "gpus": 2,
                    "startup_timeout": 60,
                },
                "max_concurrent": 4,
            }
        },
    )
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "sim")
    result.assert_outcomes(passed=SEEDS)
    lines = seen.read_text().splitlines()
    assert len(lines) == 1  # one server, reused by every seed
    given = dict(field.split("=", 1) for field in lines[0].split())
    assert given["cuda"] == given["gpus"]  # exactly the claimed GPUs, as vLLM's
    assert given["n"] == "2" and set(given["cuda"].split(",")) <= {"0", "2", "3"}
    answered = [r for r in read_log(requests) if r.seed is not None]  # not the health probe
    assert len({(r.key, r.seed) for r in answered}) == EXAMPLES * SEEDS
    assert {r.model for r in answered} == {"sim-model"}
    assert starts(fake_vllm) == []  # no vLLM was started


def test_sglang_engine_serves_items_with_its_real_flags(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fakesglang.install(pytester.path, monkeypatch)
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0,2:0,3:0")
    write_models(
        pytester.path,
        {
            "m1": {
                "model": "org/m1",
                "serve": {
                    "engine": "sglang",
                    "gpus": 2,
                    "args": {"mem_fraction_static": 0.7, "disable_radix_cache": True},
                    "startup_timeout": 60,
                },
                "max_concurrent": 4,
            },
            "m2": {
                "model": "org/m2",
                "serve": {
                    "engine": "sglang",
                    "gpus": 1,
                    "args": {"dp_size": 1, "random_seed": 7, "disable_radix_cache": False},
                    "startup_timeout": 60,
                },
                "max_concurrent": 4,
            },
        },
    )
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "m1,m2", "-n", "2")
    result.assert_outcomes(passed=2 * SEEDS)
    servers = {s["served_model_name"]: s for s in fakesglang.starts(log)}
    assert set(servers) == {"org/m1", "org/m2"}
    m1, m2 = servers["org/m1"], servers["org/m2"]
    assert m1["model_path"] == "org/m1" and m1["host"] == "127.0.0.1"
    assert m1["tp_size"] == 2 and len(m1["gpus"].split(",")) == 2  # TP over the claimed GPUs
    assert m1["mem_fraction_static"] == 0.7 and m1["disable_radix_cache"] is True
    assert m1["random_seed"] == 0  # reproducible unless serve.args says otherwise
    assert m2["tp_size"] == 1 and m2["dp_size"] == 1 and m2["random_seed"] == 7
    assert m2["disable_radix_cache"] is False and len(m2["gpus"].split(",")) == 1
    assert m1["device"] is None  # on GPUs; --device cpu only without one
    assert not set(m1["gpus"].split(",")) & set(m2["gpus"].split(","))
    assert starts(fake_vllm) == []


def test_sglang_rejects_a_flag_it_does_not_know(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake refuses unknown flags as SGLang does: the start fails, with its log."""
    fakesglang.install(pytester.path, monkeypatch)
    write_models(
        pytester.path,
        {
            "m1": {
                "model": "org/m1",
                "serve": {"engine": "sglang", "args": {"max_model_len": 2048}},
            }
        },
    )
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "m1")
    result.assert_outcomes(errors=SEEDS)
    result.stdout.fnmatch_lines(["*SGLang server for 'org/m1'*exited with code 2*"])
    result.stdout.fnmatch_lines(["*unrecognized arguments: --max-model-len 2048*"])


@pytest.mark.parametrize(
    ("serve", "message"),
    [
        (
            {"engine": "sglng"},
            "models.m1.serve.engine: unknown engine 'sglng' (did you mean 'sglang'?); "
            "known engines: command, sglang, vllm",
        ),
        (
            {"engine": "command", "command": ["llama-server", "-m", "{modle}", "--port", "{port}"]},
            "models.m1.serve.command: unknown placeholder {modle}; known: {model}, "
            "{served_name}, {port}, {host}, {gpus}, {n_gpus}",
        ),
        (
            {"engine": "command", "command": ["llama-server", "-m", "{model}"]},
            'models.m1.serve.command: the server must listen on the port modelbench picks: put "{port}"*',
        ),
        (
            {"engine": "command"},
            "models.m1.serve.command: serve.engine: command needs the server's argv as a list*",
        ),
        (
            {"engine": "vllm", "command": ["x", "{port}"]},
            "models.m1.serve.command: only serve.engine: command takes a command*",
        ),
        (
            {"engine": "sglang", "args": {"model_path": "x"}},
            "models.m1.serve.args: 'model_path' is set by modelbench*",
        ),
        (
            {"engine": "command", "command": ["no-such-llama-server", "--port", "{port}"]},
            "models.m1.serve.command[0]: 'no-such-llama-server' not found on PATH (or not "
            "executable): install it or give its full path",
        ),
        (
            {"engine": "sglang"},  # no fake sglang on the path here
            "models.m1.serve.engine: SGLang is not installed for *: install it *",
        ),
        (
            {"engine": "command", "command": "foo --port {port}"},
            "models.m1.serve.command: write the command as a YAML list of its words, "
            'e.g. [foo, --port, "{port}"]',
        ),
        (
            {"engine": "command", "command": "srv --port {port} --api-key 'k e y' --x"},
            "models.m1.serve.command: write the command as a YAML list of its words, "
            'e.g. [srv, --port, "{port}", --api-key, "***", --x]',
        ),
        (
            {"engine": None},
            "models.m1.serve.engine: write an engine name: vllm, sglang or command (or leave "
            "serve.engine out for vllm) (got *)",
        ),
    ],
    ids=[
        "unknown-engine",
        "bad-placeholder",
        "no-port",
        "no-command",
        "command-for-vllm",
        "sglang-reserved",
        "program-missing",
        "sglang-missing",
        "command-string",
        "command-string-with-a-key",
        "engine-null",
    ],
)
def test_serve_mistakes_are_one_usage_line(
    pytester: pytest.Pytester,
    fake_vllm: Path,
    serve: dict[str, object],
    message: str,
) -> None:
    write_models(pytester.path, {"m1": {"model": "org/m1", "serve": serve}})
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "m1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: configs/models.yaml: {message}"])
    assert "Traceback" not in result.stderr.str()
    assert starts(fake_vllm) == []


def test_collect_only_reports_a_missing_engine_package(
    pytester: pytest.Pytester, fake_vllm: Path
) -> None:
    """Not once per item at setup: one usage error before anything runs, collecting too."""
    write_models(pytester.path, {"m1": {"model": "org/m1", "serve": {"engine": "sglang"}}})
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "m1", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: configs/models.yaml: models.m1.serve.engine: SGLang is not installed for *"]
    )


def test_a_missing_program_or_engine_is_left_to_workers_that_run_elsewhere(
    pytester: pytest.Pytester, fake_vllm: Path
) -> None:
    """Workers on another node (``--tx ssh=…``, ``serving.remote``) or another interpreter
    (``python=``) look ``serve.command[0]`` up on their own PATH and SGLang up in their own
    environment: the controller's plan does not refuse what only they have. Every worker
    here, on this interpreter: refused here, before anything runs."""
    from pytest_modelbench.config import load_config_set
    from pytest_modelbench.errors import ModelbenchUsageError
    from pytest_modelbench.planning.item import Plan
    from pytest_modelbench.session.plan_checks import check_engines

    command = {"engine": "command", "command": ["only-on-gpu-nodes", "--port", "{port}"]}
    for serve, refusal in [
        (command, "'only-on-gpu-nodes' not found on PATH"),
        ({"engine": "sglang"}, "SGLang is not installed for"),  # not in this interpreter
    ]:
        write_models(pytester.path, {"m1": {"model": "org/m1", "serve": serve}})
        config_set = load_config_set(pytester.path / "configs")
        item = SimpleNamespace(model=config_set.models["m1"], model_name="m1")
        plan = cast(Plan, SimpleNamespace(items=[item]))
        check_engines(plan, config_set, ["2*ssh=gpu-node//python=python3"])
        check_engines(plan, config_set, ["2*popen//python=/opt/sgl/bin/python"])
        remote = f"popen//python={sys.executable} -m pytest_modelbench.serving.remote node1"
        check_engines(plan, config_set, [remote])
        with pytest.raises(ModelbenchUsageError, match=refusal):
            check_engines(plan, config_set, ["2*popen"])
