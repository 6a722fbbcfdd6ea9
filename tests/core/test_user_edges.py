"""The edges a real user hits (issue #28): credentials in a URL, ``extra_body``/``extra_headers``
in the sampling args, a gateway's 200 that carries an error, an env arg a matrix adds, a
baseline written as a percentage. Each is one line naming the file or flag, the value and the
fix, or works as the OpenAI SDK would; never a traceback, never a secret echoed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from pytest_modelbench.backends.verifiers_classic import split_sampling_args
from pytest_modelbench.config.loading import load_models_file
from pytest_modelbench.config.schema import ModelSpec
from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.running.endpoint import Endpoint
from pytest_modelbench.running.urls import UrlSet
from pytest_modelbench.secrets import masked_url
from pytest_modelbench.testing.simserver import SimServer
from tests.conftest import UNREACHABLE_URL, Project, configure, one_usage_error
from tests.core.test_client_transport import CHAT, RawServer, answer, chat, fails, http, run
from tests.core.test_router import post, serving

PASSWORD = "sk-gateway-password-0123456789"

# -- 1. credentials in the URL ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("http://user:pw@host:8000/v1", "http://***@host:8000/v1"),
        ("https://KEY@gw.example.com/v1?x=a@b", "https://***@gw.example.com/v1?x=a@b"),
        ("http://host:8000/v1", None),
        ("http://host/v1/a@b", None),
    ],
)
def test_masked_url_hides_only_the_userinfo(url: str, masked: str | None) -> None:
    assert masked_url(url) == masked


@pytest.mark.parametrize(
    "urls",
    [f"http://user:{PASSWORD}@127.0.0.1:9/v1", [UNREACHABLE_URL, f"http://{PASSWORD}@h/v1"]],
    ids=["one-url", "in-a-list"],
)
def test_credentials_in_api_base_url_are_refused_without_echoing_them(
    base: Project, urls: str | list[str]
) -> None:
    base.models({"gw": {"model": "m", "api_base_url": urls}})
    line = one_usage_error(base, "--model", "gw", "--collect-only")
    assert line.startswith("ERROR: configs/models.yaml: models.gw.api_base_url")
    assert "credentials in the URL (http://***@" in line and "api_key_var" in line
    assert PASSWORD not in line
    assert not (base.root / "runs").exists()


def test_credentials_in_the_api_base_url_flag_are_refused_without_echoing_them(
    base: Project,
) -> None:
    line = one_usage_error(
        base,
        "--model",
        "org/model",
        "--api-base-url",
        f"http://user:{PASSWORD}@127.0.0.1:9/v1",
        "--collect-only",
    )
    assert line == (
        "ERROR: --api-base-url: credentials in the URL (http://***@127.0.0.1:9/v1) are not sent "
        "and would be written to the run store; remove them and export the key as "
        "OPENAI_API_KEY, or give the model an api_key_var in configs/models.yaml (sent as "
        "'Authorization: Bearer <key>')"
    )


def test_a_url_set_never_routes_to_a_url_with_credentials() -> None:
    with pytest.raises(ValueError, match=r"http://\*\*\*@h/v1 carries credentials") as info:
        UrlSet([f"http://u:{PASSWORD}@h/v1"])
    assert PASSWORD not in str(info.value)


# -- 2. extra_body and extra_headers -------------------------------------------------------------


class RecordingSim(SimServer):
    """The simulated server, also keeping each completion request's headers and JSON body."""

    def __init__(self, **changes: Any) -> None:
        super().__init__(**changes)
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path.endswith("completions"):
            body = json.loads(await request.read())  # aiohttp keeps it for the handler
            self.seen.append(({k.lower(): v for k, v in request.headers.items()}, body))
        return await super()._dispatch(request)


@pytest.fixture
def recording() -> Any:
    server = RecordingSim().start()
    yield server
    server.stop()


def test_extra_body_is_merged_and_extra_headers_are_sent_by_the_suite_backend(
    project: Project, recording: RecordingSim
) -> None:
    configure(
        project,
        recording.base_url,
        n=3,
        sampling_args={
            "temperature": 0.5,
            "extra_body": {"temperature": 0.0, "chat_template_kwargs": {"enable_thinking": False}},
            "extra_headers": {"X-Title": "modelbench", "X-Gateway-Token": PASSWORD},
        },
    )
    project.env(
        "qa",
        [
            {
                "id": "qa",
                "module": "jsonl",
                "env_args": {"path": "qa.jsonl"},
                "sampling_args": {"extra_headers": {"x-title": "from-the-env"}},
            }
        ],
    )
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--sampling-args", '{"extra_body": {"top_k": 5}}'
    )
    result.assert_outcomes(passed=1)
    assert len(recording.seen) == 3
    for headers, body in recording.seen:
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert (body["temperature"], body["top_k"]) == (0.0, 5)  # extra_body wins, as in the SDK
        assert "extra_body" not in body and "extra_headers" not in body
        assert headers["x-title"] == "from-the-env"  # the variant's beats the model's
        assert headers["x-gateway-token"] == PASSWORD
    (run_dir,) = project.run_dirs()
    metadata = json.loads((run_dir / "alpha-qa-seed0" / "metadata.json").read_text())
    assert metadata["fingerprint_parts"]["sampling_args"]["chat_template_kwargs"] == {
        "enable_thinking": False
    }
    for path in project.root.rglob("*"):  # no header value in any file written
        if path.is_file() and "runs" in path.parts:
            text = path.read_bytes()
            assert PASSWORD.encode() not in text and b"from-the-env" not in text, path


def test_the_router_adds_the_items_headers_over_the_callers() -> None:
    async def go() -> tuple[int, RawServer]:
        async with RawServer(serving) as server:
            headers = {"X-Title": "modelbench", "X-Api-Key": PASSWORD}
            target = Endpoint(
                base_urls=(server.url(),),
                served_model="m",
                api="chat",
                backoff_s=0.001,
                headers=headers,
            )
            async with target.asingle_url(timeout_s=5, max_retries=0) as url:
                status, _, _ = await post(f"{url}/chat/completions", chat("q"), **{"x-title": "t"})
                return status, server

    status, server = asyncio.run(go())
    assert status == 200
    (seen,) = [s for s in server.requests if s.target.endswith("completions")]
    assert (seen.headers["x-title"], seen.headers["x-api-key"]) == ("modelbench", PASSWORD)


def test_sampling_args_read_the_same_for_every_backend(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "models": {
                    "q": {
                        "sampling_args": {
                            "max_tokens": 8,
                            "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
                            "extra_headers": {"X-Title": "t"},
                        }
                    }
                }
            }
        )
    )
    spec = load_models_file(path)["q"]
    assert spec.sampling_args == {
        "max_tokens": 8,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert spec.extra_headers == {"X-Title": "t"}
    assert "X-Title" not in json.dumps(spec.model_dump()) and "X-Title" not in repr(spec)
    # classic verifiers hands the OpenAI SDK the same request: known keys, the rest in extra_body
    assert split_sampling_args(spec.sampling_args) == {
        "max_tokens": 8,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
    }


@pytest.mark.parametrize(
    ("sampling_args", "message"),
    [
        ({"extra_headers": {"X-Token": 12345678}}, "the value of 'X-Token' must be a string"),
        ({"extra_headers": "Bearer sk-abcdefgh12345678"}, "extra_headers must be a mapping"),
        ({"extra_headers": {"Content-Length": "1"}}, "'Content-Length' is set by the HTTP"),
        ({"extra_body": [1]}, "extra_body must be a mapping of request fields"),
    ],
)
def test_malformed_extras_are_one_line_without_the_value(
    tmp_path: Path, sampling_args: dict[str, Any], message: str
) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": {"q": {"sampling_args": sampling_args}}}))
    with pytest.raises(ModelbenchUsageError) as info:
        load_models_file(path)
    text = str(info.value)
    assert text.startswith(f"{path}: models.q.sampling_args: ") and message in text
    assert "12345678" not in text and "\n" not in text


def test_malformed_extras_in_the_flag_name_the_flag(base: Project) -> None:
    line = one_usage_error(
        base, "--model", "alpha", "--sampling-args", '{"extra_headers": [1]}', "--collect-only"
    )
    assert line.startswith("ERROR: --sampling-args: extra_headers must be a mapping")


def test_a_model_spec_built_in_code_reads_the_extras_too() -> None:
    spec = ModelSpec(sampling_args={"extra_body": {"top_k": 2}, "extra_headers": {"A": "b"}})
    assert (spec.sampling_args, spec.extra_headers) == ({"top_k": 2}, {"A": "b"})
    merged = spec.with_sampling_args({"extra_headers": {"a": "c"}, "seed": 1})
    assert (merged.sampling_args, merged.extra_headers) == ({"top_k": 2, "seed": 1}, {"a": "c"})


# -- 3. a 200 whose body is an error -------------------------------------------------------------


def test_a_200_with_an_error_body_fails_at_once_with_the_servers_message() -> None:
    body = b'{"error": {"message": "model gpt-x is not allowed for this key", "code": 403}}'
    failure, server = fails(lambda _seen: http(body), retries=6)
    assert failure.attempts == 1 and len(server.requests) == 1
    assert "model gpt-x is not allowed for this key" in failure.reason
    assert "malformed" not in failure.reason


def test_a_200_with_a_retryable_error_code_is_retried_and_keeps_the_message() -> None:
    body = b'{"error": {"message": "upstream overloaded", "code": "503"}}'
    failure, server = fails(lambda _seen: http(body), retries=2)
    assert failure.attempts == 3 and len(server.requests) == 3
    assert failure.retry_reasons == ["error 503 in a 200 response"] * 3
    assert failure.reason.endswith("with error 503: upstream overloaded")


def test_a_200_error_then_an_answer_is_an_answer() -> None:
    replies = iter([http(b'{"error": {"message": "busy", "code": 429}}'), http(answer("4"))])
    (completion,), _ = run(lambda _seen: next(replies), "q")
    assert (completion.text, completion.attempts) == ("4", 2)


def test_the_client_sends_the_extra_headers_on_every_request() -> None:
    async def go() -> RawServer:
        async with RawServer(lambda _seen: http(answer("x"))) as server:
            target = Endpoint(
                base_urls=(server.url(),), served_model="m", api="chat", headers={"X-A": "1"}
            )
            async with target.client(timeout_s=5, max_retries=0) as client:
                await client.request(CHAT, chat("q"))
            return server

    (seen,) = asyncio.run(go()).requests
    assert seen.headers["x-a"] == "1"


# -- 4. an env arg a matrix adds -----------------------------------------------------------------


def test_an_env_arg_a_matrix_adds_that_the_suite_refuses_is_a_usage_error(base: Project) -> None:
    base.env(
        "gsm8k",
        [{"id": "gsm", "module": "gsm8k", "matrix": {"num_fewshots": [0, 5]}}],
    )
    line = one_usage_error(base, "--model", "alpha", "--env", "gsm8k", "--collect-only")
    assert line == (
        "ERROR: configs/envs/gsm8k.yaml: variant 'gsm-num_fewshots0': matrix.num_fewshots: "
        "unknown env arg 'num_fewshots' (did you mean 'num_fewshot'?); accepted: num_fewshot, "
        "system_prompt"
    )


# -- 5. a baseline written as a percentage -------------------------------------------------------


def test_a_percentage_baseline_for_a_0_1_metric_is_one_line(project: Project, sim: Any) -> None:
    project.qa("qa", 20)
    server = sim(accuracy=0.7, lookup=project.lookup("qa"))
    configure(project, server.base_url, n=20)
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa:\n  value: 65\n")
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(errors=1)  # the item cannot be gated, as with any broken baseline
    result.stdout.fnmatch_lines(
        [
            "configs/baselines/alpha.yaml: qa: value 65 is outside 0..1, but exact_match scores "
            "each example 0 or 1, so its score is a fraction; write 0.65 for 65%"
        ]
    )
    assert "Traceback" not in result.stdout.str() and "regression" not in result.stdout.str()
