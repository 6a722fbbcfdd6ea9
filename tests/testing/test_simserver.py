"""The simulated OpenAI server: wire shapes, slots, answer policy, faults, CLI, fixture."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pytest_modelbench.suites.contract import Example
from pytest_modelbench.testing import (
    AnswerPolicy,
    Faults,
    Latency,
    SimConfig,
    SimServer,
    is_correct,
    load_lookup,
    lookup_from_examples,
    read_log,
    wire,
)
from pytest_modelbench.testing.loadgen import run_load
from pytest_modelbench.testing.slots import SlotGate

MODEL = "sim-model"


def chat_body(key: str, seed: int | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": key},
        ],
        **extra,
    }
    if seed is not None:
        body["seed"] = seed
    return body


class Reply:
    """What a client saw: status, headers, raw body, or the exception it got instead."""

    def __init__(
        self,
        status: int = 0,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        error: BaseException | None = None,
        elapsed: float = 0.0,
    ) -> None:
        self.status = status
        self.headers = headers or {}
        self.body = body
        self.error = error
        self.elapsed = elapsed

    def json(self) -> Any:
        return json.loads(self.body)

    def content(self) -> str:
        return str(self.json()["choices"][0]["message"]["content"])


async def _send(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    timeout: float = 10.0,
    raw: bytes | None = None,
) -> Reply:
    started = time.monotonic()
    try:
        async with session.request(
            method,
            url,
            json=body if raw is None else None,
            data=raw,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            data = await response.read()
            return Reply(
                response.status, dict(response.headers), data, None, time.monotonic() - started
            )
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return Reply(error=exc, elapsed=time.monotonic() - started)


def request(
    url: str,
    body: Any = None,
    method: str = "POST",
    timeout: float = 10.0,
    raw: bytes | None = None,
) -> Reply:
    """One request from a fresh client (in this thread's own event loop)."""

    async def go() -> Reply:
        async with aiohttp.ClientSession() as session:
            return await _send(session, method, url, body, timeout, raw)

    return asyncio.run(go())


def many(
    url: str, bodies: list[dict[str, Any]], concurrency: int, timeout: float = 30.0
) -> list[Reply]:
    """Send ``bodies`` with ``concurrency`` requests in flight; replies in input order."""

    async def go() -> list[Reply]:
        replies: list[Reply | None] = [None] * len(bodies)
        todo = iter(enumerate(bodies))
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def worker() -> None:
                for index, body in todo:
                    replies[index] = await _send(session, "POST", url, body, timeout)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return [reply for reply in replies if reply is not None]

    return asyncio.run(go())


@pytest.fixture
def server() -> Iterator[SimServer]:
    with SimServer(SimConfig(lookup={"2+2?": ("4", "5")})) as srv:
        yield srv


# -- wire shapes ---------------------------------------------------------------------------


def test_chat_completion_has_the_openai_shape(server: SimServer) -> None:
    reply = request(server.base_url + "/chat/completions", chat_body("2+2?", seed=1))
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/json")
    data = reply.json()
    assert data["id"].startswith("chatcmpl-")
    assert data["object"] == "chat.completion"
    assert isinstance(data["created"], int)
    assert data["model"] == MODEL
    choice = data["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "4"}
    assert choice["finish_reason"] == "stop"
    # whitespace tokens: "You are terse." (3) + "2+2?" (1) in, "4" (1) out
    assert data["usage"] == {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}


def test_completion_has_the_openai_shape_and_answers_each_prompt(server: SimServer) -> None:
    reply = request(server.base_url + "/completions", {"model": MODEL, "prompt": "2+2?"})
    data = reply.json()
    assert reply.status == 200
    assert data["object"] == "text_completion"
    assert data["choices"][0]["text"] == "4"
    assert data["usage"]["total_tokens"] == 2

    batch = request(server.base_url + "/completions", {"model": MODEL, "prompt": ["2+2?", "other"]})
    texts = [choice["text"] for choice in batch.json()["choices"]]
    assert texts == ["4", server.config.fallback]
    assert [choice["index"] for choice in batch.json()["choices"]] == [0, 1]


def test_models_and_health(server: SimServer) -> None:
    models = request(server.base_url + "/models", method="GET").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert request(server.url + "/health", method="GET").status == 200
    assert request(server.base_url + "/models/sim-model", method="GET").json()["id"] == MODEL
    assert request(server.base_url + "/models/other", method="GET").status == 404


def test_unknown_model_is_404_with_an_openai_error(server: SimServer) -> None:
    reply = request(server.base_url + "/chat/completions", {**chat_body("2+2?"), "model": "gpt-9"})
    assert reply.status == 404
    error = reply.json()["error"]
    assert "gpt-9" in error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "model_not_found"
    assert server.counts["client_error"] == 1


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "missing_model"),
        (b'{"model": "sim-model", "messages": "x"}', "invalid_messages"),
    ],
)
def test_bad_request_bodies_are_400(server: SimServer, raw: bytes, code: str) -> None:
    reply = request(server.base_url + "/chat/completions", raw=raw)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == code


def test_max_tokens_truncates_with_finish_reason_length() -> None:
    with SimServer(fallback="one two three four five") as srv:
        reply = request(srv.base_url + "/chat/completions", chat_body("q", max_tokens=2))
    choice = reply.json()["choices"][0]
    assert choice["message"]["content"] == "one two"
    assert choice["finish_reason"] == "length"
    assert reply.json()["usage"]["completion_tokens"] == 2


def test_streaming_sends_server_sent_events(server: SimServer) -> None:
    body = chat_body("2+2?", stream=True, stream_options={"include_usage": True})
    reply = request(server.base_url + "/chat/completions", body)
    assert reply.headers["Content-Type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in reply.body.decode().splitlines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["content"] == "4"
    assert chunks[1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[2]["usage"]["completion_tokens"] == 1


def test_async_api_serves_in_the_callers_loop() -> None:
    async def go() -> tuple[int, int]:
        async with SimServer(SimConfig(models=("a", "b"))) as srv, aiohttp.ClientSession() as s:
            reply = await _send(
                s, "POST", srv.base_url + "/chat/completions", {**chat_body("q"), "model": "b"}
            )
            return reply.status, len(srv.requests)

    assert asyncio.run(go()) == (200, 1)


# -- slots and latency ------------------------------------------------------------------------


def test_slots_bound_concurrency_and_set_the_pace() -> None:
    slots, latency, n = 8, 0.05, 96
    with SimServer(SimConfig(slots=slots, latency=Latency.fixed(latency))) as srv:
        started = time.monotonic()
        replies = many(
            srv.base_url + "/chat/completions", [chat_body(f"q{i}") for i in range(n)], 32
        )
        wall = time.monotonic() - started
    assert all(reply.status == 200 for reply in replies)
    assert srv.max_in_flight == slots
    assert srv.max_pending > slots  # the others waited for a slot
    assert max(record.queued for record in srv.requests) > latency
    ideal = n * latency / slots
    # The lower bound is the slot semantics; the upper bound only catches gross overhead.
    assert ideal * 0.95 <= wall < ideal * 4 + 2.0


def test_latency_distributions_keep_their_mean() -> None:
    draws = [(i + 0.5) / 20000 for i in range(20000)]
    for latency in (
        Latency.fixed(0.1),
        Latency.uniform(0.1, 0.5),
        Latency.lognormal(0.1, 0.5),
        Latency.exponential(0.1),
    ):
        samples = [latency.sample(u) for u in draws]
        assert math.isclose(sum(samples) / len(samples), 0.1, rel_tol=0.02), latency
        assert min(samples) >= 0.0
    assert Latency(mean=0.0, per_token=0.01).sample(0.5, completion_tokens=10) == pytest.approx(0.1)


def test_latency_is_spread_across_requests() -> None:
    with SimServer(SimConfig(slots=64, latency=Latency.uniform(0.04, 0.5))) as srv:
        many(srv.base_url + "/chat/completions", [chat_body(f"q{i}") for i in range(40)], 40)
    durations = [record.duration for record in srv.requests]
    assert min(durations) >= 0.02 * 0.95
    assert max(durations) - min(durations) > 0.01


# -- answer policy ----------------------------------------------------------------------------


def test_is_correct_is_deterministic_and_calibrated() -> None:
    keys = [f"example {i}" for i in range(20000)]
    verdicts = [is_correct(key, 3, 0.7) for key in keys]
    assert verdicts == [is_correct(key, 3, 0.7) for key in keys]
    assert abs(sum(verdicts) / len(keys) - 0.7) < 4 * math.sqrt(0.7 * 0.3 / len(keys))
    assert verdicts != [is_correct(key, 4, 0.7) for key in keys]  # the seed matters
    assert all(is_correct(key, None, 1.0) for key in keys[:100])
    assert not any(is_correct(key, None, 0.0) for key in keys[:100])


def test_accuracy_over_2000_keys_is_p_and_survives_restart() -> None:
    p, n, seed = 0.7, 2000, 11
    lookup = {f"question {i}": (f"right {i}", f"wrong {i}") for i in range(n)}
    bodies = [chat_body(key, seed=seed) for key in lookup]
    srv = SimServer(SimConfig(slots=256, accuracy=p, lookup=lookup))
    with srv:
        first = [reply.content() for reply in many(srv.base_url + "/chat/completions", bodies, 64)]
    measured = sum(text.startswith("right") for text in first) / n
    assert measured == srv.expected_accuracy(lookup, seed)  # the truth is known exactly
    assert abs(measured - p) < 4 * math.sqrt(p * (1 - p) / n)  # and is p up to sampling noise
    with srv:  # restarted: same answers
        again = [
            reply.content() for reply in many(srv.base_url + "/chat/completions", bodies[:300], 64)
        ]
    assert again == first[:300]
    assert max(srv.answers_per_key().values()) == 2
    assert len(srv.answers_per_key()) == n


def test_per_key_accuracy_override_and_fallback() -> None:
    policy = AnswerPolicy(
        accuracy=0.0, lookup={"a": ("A", "x"), "b": ("B", "y")}, overrides={"a": 1.0}
    )
    assert policy.answer("a", 0) == "A"
    assert policy.answer("b", 0) == "y"
    assert policy.answer("c", 0) == policy.fallback


def test_lookup_from_examples_keys_like_the_server() -> None:
    examples = [
        Example(
            id=f"e{i}",
            messages=({"role": "user", "content": f"What is {i}+{i}?"},),
            gold=2 * i,
            prompt=f"Q: What is {i}+{i}?\nA:",
        )
        for i in range(5)
    ]

    def right(example: Example) -> str:
        return f"The answer is {example.gold}"

    def wrong(example: Example) -> str:
        return f"The answer is {example.gold + 1}"

    chat_lookup = lookup_from_examples(examples, right, wrong)
    text_lookup = lookup_from_examples(examples, right, wrong, chat=False)
    with SimServer(accuracy=1.0, lookup={**chat_lookup, **text_lookup}) as srv:
        chat = request(
            srv.base_url + "/chat/completions",
            {"model": MODEL, "messages": list(examples[3].messages)},
        )
        text = request(
            srv.base_url + "/completions", {"model": MODEL, "prompt": examples[3].prompt}
        )
    assert chat.content() == "The answer is 6"
    assert text.json()["choices"][0]["text"] == "The answer is 6"


def test_load_lookup_reads_both_file_shapes(tmp_path: Path) -> None:
    as_object = tmp_path / "lookup.json"
    as_object.write_text(json.dumps({"k": ["right", "wrong"]}))
    as_records = tmp_path / "lookup.jsonl"
    as_records.write_text(json.dumps({"key": "k", "correct": "right", "wrong": "wrong"}) + "\n")
    assert load_lookup(as_object) == load_lookup(as_records) == {"k": ("right", "wrong")}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"k": "right"}))
    with pytest.raises(ValueError, match="expected \\[correct, wrong\\]"):
        load_lookup(bad)


# -- faults -----------------------------------------------------------------------------------


def faulty(**faults: Any) -> SimServer:
    return SimServer(SimConfig(faults=Faults(**faults)))


def test_5xx_fault_answers_a_server_error() -> None:
    with faulty(error_5xx=1.0) as srv:
        replies = many(
            srv.base_url + "/chat/completions", [chat_body(f"q{i}") for i in range(30)], 8
        )
    assert {reply.status for reply in replies} <= {500, 502, 503}
    assert len({reply.status for reply in replies}) > 1
    assert replies[0].json()["error"]["type"] == "server_error"
    assert srv.counts == {"5xx": 30}


def test_429_fault_carries_retry_after() -> None:
    with faulty(rate_limit=1.0, retry_after=2.0) as srv:
        reply = request(srv.base_url + "/chat/completions", chat_body("q"))
    assert reply.status == 429
    assert reply.headers["Retry-After"] == "2"
    assert reply.headers["retry-after-ms"] == "2000"
    assert reply.json()["error"]["type"] == "rate_limit_error"
    with faulty(rate_limit=1.0, retry_after=0.25) as srv:
        assert (
            request(srv.base_url + "/chat/completions", chat_body("q")).headers["Retry-After"]
            == "0.25"
        )
    assert srv.max_in_flight == 0  # a 429 never takes a slot


def test_timeout_fault_outlasts_the_client_then_closes() -> None:
    with faulty(timeout=1.0, hang_s=0.6) as srv:
        impatient = request(srv.base_url + "/chat/completions", chat_body("a"), timeout=0.2)
        patient = request(srv.base_url + "/chat/completions", chat_body("b"), timeout=5.0)
    assert isinstance(impatient.error, asyncio.TimeoutError)
    assert isinstance(patient.error, aiohttp.ServerDisconnectedError)
    assert patient.elapsed >= 0.6 * 0.95
    assert srv.counts == {"timeout": 2}  # the impatient one is logged too


def test_timeout_fault_can_answer_late() -> None:
    with faulty(timeout=1.0, hang_s=0.3, after_hang="respond") as srv:
        reply = request(srv.base_url + "/chat/completions", chat_body("a"))
    assert reply.status == 200 and reply.elapsed >= 0.3 * 0.95
    assert srv.requests[-1].outcome == "timeout"


def test_reset_fault_resets_the_connection() -> None:
    with faulty(reset=1.0) as srv:
        reply = request(srv.base_url + "/chat/completions", chat_body("a"))
    assert isinstance(reply.error, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError))
    assert srv.counts == {"reset": 1}


def test_malformed_fault_sends_truncated_json() -> None:
    with faulty(malformed=1.0) as srv:
        reply = request(srv.base_url + "/chat/completions", chat_body("a"))
    assert reply.status == 200
    with pytest.raises(json.JSONDecodeError):
        reply.json()
    assert srv.requests[-1].outcome == "malformed"


def test_missing_choices_fault_sends_valid_json_without_choices() -> None:
    with faulty(missing_choices=1.0) as srv:
        reply = request(srv.base_url + "/chat/completions", chat_body("a"))
    assert reply.status == 200
    assert "choices" not in reply.json() and reply.json()["object"] == "chat.completion"
    assert (srv.requests[-1].outcome, srv.requests[-1].detail) == ("malformed", "no_choices")


def test_fault_rates_are_honoured_and_replay_per_request() -> None:
    faults = Faults(error_5xx=0.10, rate_limit=0.05, malformed=0.05)
    bodies = [chat_body(f"q{i}", seed=1) for i in range(1000)]
    outcomes = []
    for _ in range(2):
        with SimServer(SimConfig(slots=128, faults=faults, seed=5)) as srv:
            many(srv.base_url + "/chat/completions", bodies, 64)
        outcomes.append({record.key: record.outcome for record in srv.requests})
        counts = srv.counts
        for outcome, rate in (("5xx", 0.10), ("429", 0.05), ("malformed", 0.05)):
            assert abs(counts[outcome] / 1000 - rate) < 4 * math.sqrt(rate * (1 - rate) / 1000)
    assert outcomes[0] == outcomes[1]  # same requests, same faults, whatever the arrival order


def test_a_retry_gets_a_fresh_draw() -> None:
    with faulty(error_5xx=0.5) as srv:
        statuses = [
            request(srv.base_url + "/chat/completions", chat_body("same")).status for _ in range(20)
        ]
    assert 200 in statuses and set(statuses) - {200}
    assert [record.attempt for record in srv.requests] == list(range(20))


def test_hang_forever_accepts_and_never_answers() -> None:
    srv = faulty(hang_forever=True).start()
    try:
        assert isinstance(
            request(srv.base_url + "/models", method="GET", timeout=0.3).error, asyncio.TimeoutError
        )
        assert isinstance(
            request(srv.url + "/health", method="GET", timeout=0.3).error, asyncio.TimeoutError
        )
    finally:
        started = time.monotonic()
        srv.stop()
    assert time.monotonic() - started < 5.0
    assert srv.counts == {"hang": 2}


def test_faults_validate_their_rates() -> None:
    with pytest.raises(ValueError, match="sum to"):
        Faults(error_5xx=0.6, timeout=0.6)
    with pytest.raises(ValueError, match="rate must lie"):
        Faults(reset=1.5)
    with pytest.raises(ValueError, match="slots"):
        SimConfig(slots=0)
    config = SimConfig(latency=0.05, faults={"error_5xx": 0.1}, models=["a"])  # type: ignore[arg-type]
    assert config.latency == Latency.fixed(0.05)
    assert config.faults.error_5xx == 0.1
    assert config.models == ("a",)


# -- lifecycle and the request log ------------------------------------------------------------


def test_stop_then_start_serves_again_on_the_same_port() -> None:
    srv = SimServer(SimConfig(latency=Latency.fixed(0.5))).start()
    port = srv.port

    async def scenario() -> tuple[Reply, Reply]:
        async with aiohttp.ClientSession() as session:
            in_flight = asyncio.ensure_future(
                _send(session, "POST", srv.base_url + "/chat/completions", chat_body("a"))
            )
            await asyncio.sleep(0.1)
            await asyncio.to_thread(srv.stop)
            dropped = await in_flight
            down = await _send(session, "GET", srv.base_url + "/models")
            return dropped, down

    dropped, down = asyncio.run(scenario())
    assert isinstance(dropped.error, aiohttp.ServerDisconnectedError)
    assert isinstance(down.error, aiohttp.ClientConnectorError)
    srv.reconfigure(latency=Latency())
    with srv:
        assert srv.port == port
        assert request(srv.base_url + "/chat/completions", chat_body("b")).status == 200
    assert [record.outcome for record in srv.requests] == ["aborted", "ok"]


def test_request_log_and_jsonl_file(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with SimServer(SimConfig(log_path=str(log), lookup={"k": ("r", "w")})) as srv:
        request(srv.base_url + "/chat/completions", chat_body("k", seed=3))
        request(srv.base_url + "/chat/completions", {**chat_body("k"), "model": "nope"})
        request(srv.base_url + "/models", method="GET")
    records = srv.requests
    assert read_log(log) == records
    first = records[0]
    assert (first.path, first.model, first.key, first.seed, first.outcome, first.status) == (
        "/v1/chat/completions",
        MODEL,
        "k",
        3,
        "ok",
        200,
    )
    assert first.end >= first.start
    assert srv.counts == {"ok": 2, "client_error": 1}
    assert srv.answers_per_key() == {"k": 1}
    assert json.loads(log.read_text().splitlines()[0])["schema_version"] == 1
    srv.clear_log()
    assert srv.requests == [] and srv.max_in_flight == 0


# -- command line and fixture ----------------------------------------------------------------


def test_cli_prints_the_url_first_and_serves(tmp_path: Path) -> None:
    lookup = tmp_path / "lookup.json"
    lookup.write_text(json.dumps({"k": ["right", "wrong"]}))
    log = tmp_path / "log.jsonl"
    command = [
        sys.executable, "-m", "pytest_modelbench.testing",
        "--port", "0", "--slots", "4", "--latency", "0.01", "--accuracy", "1.0",
        "--lookup", str(lookup), "--log", str(log), "--models", "m1,m2", "--fault-429", "0",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        reply = request(url + "/chat/completions", {**chat_body("k"), "model": "m2"})
        assert reply.content() == "right"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "ok=1" in err
    assert [record.key for record in read_log(log)] == ["k"]


def test_cli_rejects_a_bad_rate() -> None:
    command = [sys.executable, "-m", "pytest_modelbench.testing", "--fault-5xx", "2"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "rate must lie in [0, 1]" in proc.stderr


def test_mb_sim_server_fixture(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(
        """
        import json, urllib.request
        import pytest

        def test_it(mb_sim_server):
            srv = mb_sim_server(slots=2, latency=0.01, lookup={"k": ("yes", "no")})
            body = json.dumps({"model": "sim-model", "prompt": "k"}).encode()
            req = urllib.request.Request(srv.base_url + "/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req) as resp:
                assert json.load(resp)["choices"][0]["text"] == "yes"
            assert srv.answers_per_key() == {"k": 1}

        def test_bad_field(mb_sim_server):
            with pytest.raises(TypeError, match="unknown SimConfig field"):
                mb_sim_server(slot=2)
        """
    )
    # Load exactly this plugin, whether or not the package's entry points are installed.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = pytester.runpytest_subprocess("-p", "pytest_modelbench.testing.fixtures")
    result.assert_outcomes(passed=2)


def test_cli_module_aliases_run_the_same_main() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "error::RuntimeWarning"}
    for module in ("pytest_modelbench.testing", "pytest_modelbench.testing.simserver"):
        proc = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert proc.returncode == 0, proc.stderr
        assert "--fault-5xx" in proc.stdout


# -- building blocks ---------------------------------------------------------------------------


@pytest.mark.parametrize("chat", [True, False])
def test_fast_body_template_matches_the_dict_payload(chat: bool) -> None:
    choices = [('he said "hi"\n\\ é 中', "stop"), ("x", "length")]
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    fast = json.loads(wire.completion_bytes(7, 'm"odel', choices, usage, chat=chat))
    slow = wire.completion_payload(7, 'm"odel', choices, usage, chat=chat)
    assert abs(fast.pop("created") - slow.pop("created")) <= 1
    assert fast == slow


def test_slot_gate_is_fifo_and_survives_cancelled_waiters() -> None:
    async def go() -> list[str]:
        gate = SlotGate(1)
        order: list[str] = []
        assert gate.try_take()

        async def user(name: str) -> None:
            await gate.take()
            order.append(name)
            await asyncio.sleep(0)
            gate.give()

        tasks = [asyncio.ensure_future(user(name)) for name in "abc"]
        await asyncio.sleep(0)
        tasks[1].cancel()  # b gives up while queued
        assert not gate.try_take()  # a is queued: no overtaking
        gate.give()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert gate.try_take() and not gate.try_take()  # exactly one slot left
        return order

    assert asyncio.run(go()) == ["a", "c"]


def test_load_generator_reports_throughput() -> None:
    with SimServer(SimConfig(slots=16, latency=Latency.fixed(0.01))) as srv:
        result = asyncio.run(run_load(srv.base_url, 64, 16))
    assert result.outcomes == {"200": 64}
    assert result.wall_s >= 64 * 0.01 / 16 * 0.95
    assert result.p50_s >= 0.01 * 0.95
    assert result.to_json()["throughput"] == pytest.approx(result.throughput, abs=0.1)


def test_load_generator_cli_serves_and_compares_with_ideal() -> None:
    command = [
        sys.executable, "-m", "pytest_modelbench.testing.loadgen",
        "--serve", "--slots 8 --latency 0.02", "--requests", "40", "--concurrency", "16",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.splitlines()[0])
    assert line["outcomes"] == {"200": 40}
    assert line["ideal_s"] == pytest.approx(40 * 0.02 / 8)
    assert line["ratio"] >= 0.95
