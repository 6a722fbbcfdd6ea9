"""More xdist workers than free GPUs (issue 38): a worker without a GPU shares a running server
of the same launch on its node, or waits for a GPU to come free; none of its items fails for
want of a GPU while the session can still run it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from tests.resume.conftest import kill_group, start_pytest
from tests.serving.conftest import pid_alive
from tests.serving.fakevllm import install, models, serve_spec, starts, write_models
from tests.serving.test_replicas import wait_for


def test_two_workers_one_gpu_same_model(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = install(pytester.path, monkeypatch, seeds=(0, 1))
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.2")  # both items run at once
    models(pytester.path, gpus=1, names=("m1",))
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "-n", "2", "--mb-dist", "off", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*2 workers, 1 free GPU: 1 worker will share servers*"])
    result.stdout.fnmatch_lines(["*m1: no free GPU for worker gw*"])
    assert {s["gpus"] for s in starts(log)} == {"0"}  # only ever on the one GPU


def test_a_worker_waits_for_the_gpu_its_session_holds_past_the_startup_timeout(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers, one GPU, two models: the worker without the GPU gets the other model's
    items while the GPU's worker still runs its own for longer than ``serve.startup_timeout``.
    It waits (one line says so), woken by the exchange when the GPU comes back, and no item
    fails; the old wait failed them after the start-up timeout."""
    log = install(pytester.path, monkeypatch, seeds=(0, 1))
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "1.0")  # 2 rounds of 4 requests: ~2 s an item
    short = {**serve_spec(1), "serve": {**serve_spec(1)["serve"], "startup_timeout": 3}}
    write_models(pytester.path, {name: {"model": name, **short} for name in ("m1", "m2")})
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1,m2", "-n", "2", "-p", "no:randomly", "-W", "always"
    )
    result.assert_outcomes(passed=4)
    waiting = [
        line
        for line in result.outlines
        if "no free GPU for worker gw" in line and "held by workers of this session" in line
    ]
    assert len(waiting) == 1, result.stdout.str()
    assert "waiting for GPU 0" in waiting[0] and "not failing" in waiting[0]
    assert {s["gpus"] for s in starts(log)} == {"0"}


def test_ctrl_c_while_a_worker_waits_for_the_sessions_gpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the worker without a GPU waits for the one its session holds: pytest ends
    (interrupted), and no engine is left behind."""
    log = install(pytester.path, monkeypatch, seeds=(0, 1, 2))
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "1.0")
    short = {**serve_spec(1), "serve": {**serve_spec(1)["serve"], "startup_timeout": 1}}
    write_models(pytester.path, {name: {"model": name, **short} for name in ("m1", "m2")})
    out = pytester.path / "pytest.log"
    proc = start_pytest(pytester.path, "benchmarks/", "--model", "m1,m2", "-n", "2", log=out)
    requests = pytester.path / "requests.jsonl"
    try:
        deadline = time.monotonic() + 60
        while not (requests.exists() and requests.read_text().count("\n") >= 4):
            assert proc.poll() is None, out.read_text(errors="replace")
            assert time.monotonic() < deadline, "the items never ran"
            time.sleep(0.05)
        time.sleep(1.5)  # the other worker is past its 1 s start-up timeout, still waiting
        assert len(starts(log)) == 1
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        kill_group(proc)
    output = out.read_text(errors="replace")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "error" not in output.splitlines()[-1], output  # no item failed for want of a GPU
    assert len(starts(log)) == 1, output
    assert [s["pid"] for s in starts(log) if pid_alive(s["pid"])] == [], output


HOLDER = """
import sys
from pytest_modelbench.serving.gpu_claims import claim
held = claim(1, option=sys.argv[1], session=sys.argv[2])
print("held", flush=True)
sys.stdin.read()
"""


def hold_gpu(gpu: str, session: str) -> subprocess.Popen[str]:
    """A process that claims ``gpu`` for ``session`` until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, gpu, session],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_gpus_held_by_others_still_fail_after_the_startup_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a worker of its session holds the GPU, a worker without one waits past the
    start-up timeout. Once only others hold GPUs (another session's claim, another program's
    memory), the wait is bounded again: it fails after the timeout, naming the holders and
    the fix."""
    from pytest_modelbench.errors import EvaluationError
    from pytest_modelbench.serving import pool as pool_module
    from pytest_modelbench.serving.channel import WORKERINPUT_KEY, client_from, this_node
    from pytest_modelbench.serving.exchange import Exchange
    from pytest_modelbench.serving.gpu_claims import NoFreeGpuError
    from pytest_modelbench.serving.pool import ServerPool
    from pytest_modelbench.serving.slot import Launch

    monkeypatch.setenv("MODELBENCH_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0")
    monkeypatch.setattr(pool_module, "SESSION_LOOK_S", 0.5)  # no event: the holder is no worker
    session = "s1"
    ours, foreign = hold_gpu("0", session), hold_gpu("1", "another-session")
    exchange = Exchange()
    exchange.start()
    client = client_from({WORKERINPUT_KEY: exchange.workerinput("popen"), "workerid": "gw1"}, {})
    assert client is not None
    try:
        pool = ServerPool(tmp_path / "run", session=session, exchange=client)
        with pytest.raises(NoFreeGpuError) as no_gpu:
            pool.gpus.gpus(1, "m1")  # the session holds GPU 0: the item waits
        launch = Launch("m1", "m1", "m1", {}, 1, 1.0)
        failed: list[BaseException] = []

        def wait() -> None:
            try:
                pool._share_or_wait(launch, no_gpu.value)
            except BaseException as exc:  # what the item would get
                failed.append(exc)

        waiter = threading.Thread(target=wait)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            waiter.start()
            time.sleep(2.5)  # well past the 1 s start-up timeout
            assert waiter.is_alive() and not failed, failed
            assert exchange.book.gpu_waiters == {"gw1": this_node()}
            with exchange.book._lock:  # the registration is lost (a reconnect, a lost reply)
                exchange.book.gpu_waiters.clear()
            time.sleep(1.5)  # the waiter says it again at its next look
            assert exchange.book.gpu_waiters == {"gw1": this_node()}
            # GPU 0 comes back to the session, but another program's job takes its memory
            monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:40000,1:0")
            assert ours.stdin is not None
            ours.stdin.close()
            ours.wait(10)
            waiter.join(20)
        assert not waiter.is_alive()
        assert len(failed) == 1 and isinstance(failed[0], EvaluationError), failed
        message = str(failed[0])
        assert "\n" not in message
        assert f"pid={foreign.pid}" in message and "session=another-session" in message
        assert "busy (> 1024 MiB in use): 0" in message
        assert "use fewer xdist workers (-n)" in message
        assert "waited 1 s (serve.startup_timeout)" in message
        assert "held by other sessions or programs" in message
        lines = [str(w.message) for w in said if "no free GPU for worker" in str(w.message)]
        assert len(lines) == 1 and "held by workers of this session" in lines[0], lines
        assert exchange.book.gpu_waiters == {}
    finally:
        for proc in (ours, foreign):
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
            proc.wait(10)
        client.close()
        exchange.close()


def test_two_workers_one_gpu_busy(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:40000")  # someone else's job on GPU 1
    models(pytester.path, gpus=1)
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1,m2", "--seeds", "0,1", "-n", "2", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=4)
    assert {s["gpus"] for s in starts(fake_vllm)} == {"0"}  # never the busy GPU


def test_gpus_option_naming_fewer_gpus_than_workers(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0,2:0")
    models(pytester.path, gpus=1, names=("m1",))
    result = pytester.runpytest_subprocess(
        "benchmarks/",
        "--model",
        "m1",
        "--seeds",
        "0,1,2",
        "-n",
        "3",
        "--gpus",
        "1",
        "--mb-dist",
        "off",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=3)
    assert {s["gpus"] for s in starts(fake_vllm)} == {"1"}


def test_owner_stops_its_server_only_after_the_sharers_let_go() -> None:
    """Through the session's exchange: any number of sharers at once, none new once it is
    withdrawn, the owner's wait ends when the last lets go, and a sharer whose worker is
    gone (its connection closed) lets go too."""
    from pytest_modelbench.serving.channel import WORKERINPUT_KEY, client_from
    from pytest_modelbench.serving.exchange import Exchange
    from pytest_modelbench.serving.sharing import Published, share

    exchange = Exchange()
    exchange.start()
    try:
        given = exchange.workerinput("popen")
        owner, a, b, c = (
            client_from({WORKERINPUT_KEY: given, "workerid": w}, {})
            for w in ("gw0", "gw1", "gw2", "gw3")
        )
        assert owner is not None and a is not None and b is not None and c is not None
        published = Published(owner, "key", "n1", "http://127.0.0.1:1/v1")
        assert share(a, "other-key", "n1") is None  # another launch: not shared
        assert share(a, "key", "n2") is None  # another node's server: not shared
        first, second, third = share(a, "key", "n1"), share(b, "key", "n1"), share(c, "key", "n1")
        assert first is not None and second is not None and third is not None
        assert first.base_url == "http://127.0.0.1:1/v1" and first.worker == "gw0"
        closed = threading.Event()
        closer = threading.Thread(target=lambda: (published.close(), closed.set()))
        closer.start()
        served = exchange.book.served["gw0"]
        wait_for(lambda: served.withdrawn)
        assert share(a, "key", "n1") is None  # withdrawn: no new sharer finds it
        first.stop()
        c.close()  # the third sharer's worker ends
        wait_for(lambda: list(served.sharers.values()) == ["gw2"])  # its connection closed
        assert not closed.wait(1)  # the second sharer's item still runs
        second.stop()
        closer.join(5)
        assert closed.is_set()
    finally:
        exchange.close()


def test_a_sharer_is_told_when_the_owner_is_gone() -> None:
    from pytest_modelbench.serving.channel import WORKERINPUT_KEY, client_from
    from pytest_modelbench.serving.exchange import Exchange
    from pytest_modelbench.serving.sharing import Published, share

    exchange = Exchange()
    exchange.start()
    try:
        given = exchange.workerinput("popen")
        owner = client_from({WORKERINPUT_KEY: given, "workerid": "gw0"}, {})
        sharer = client_from({WORKERINPUT_KEY: given, "workerid": "gw1"}, {})
        assert owner is not None and sharer is not None
        Published(owner, "key", "n1", "http://127.0.0.1:1/v1")
        found = share(sharer, "key", "n1")
        assert found is not None and found.is_alive()
        owner.close()  # its worker ended
        deadline = time.monotonic() + 10
        while found.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not found.is_alive()
        assert (
            found.death_report()
            == "the server of worker gw0, shared, is gone (its worker gw0 ended)"
        )
    finally:
        exchange.close()


def test_a_sharer_is_told_when_the_owners_server_died_and_shares_its_restart() -> None:
    """The owner's worker lives on: its server died and is restarted at another address (as
    ``ServerSlot.restart`` does), or published again in its place; its sharers lose the old
    one at once and share the new one."""
    import queue

    from pytest_modelbench.serving.channel import WORKERINPUT_KEY, client_from
    from pytest_modelbench.serving.exchange import Exchange
    from pytest_modelbench.serving.messages import Message, Publish, ShareLost
    from pytest_modelbench.serving.sharing import Published, share

    exchange = Exchange()
    exchange.start()
    try:
        given = exchange.workerinput("popen")
        owner = client_from({WORKERINPUT_KEY: given, "workerid": "gw0"}, {})
        sharer = client_from({WORKERINPUT_KEY: given, "workerid": "gw1"}, {})
        assert owner is not None and sharer is not None
        events: queue.Queue[Message] = queue.Queue()
        sharer.listen(events.put)
        published = Published(owner, "key", "n1", "http://127.0.0.1:1111/v1")
        found = share(sharer, "key", "n1")
        assert found is not None and found.is_alive()
        published.close(lost="it died")  # the slot's restart: nobody waits for the sharers
        Published(owner, "key", "n1", "http://127.0.0.1:2222/v1")
        assert events.get(timeout=10) == ShareLost(found.handle, "it died")
        assert not found.is_alive()
        assert found.death_report() == "the server of worker gw0, shared, is gone (it died)"
        found.stop()
        again = share(sharer, "key", "n1")  # the item's retry shares the restarted server
        assert again is not None and again.base_url == "http://127.0.0.1:2222/v1"
        owner.call(Publish("key", "n1", "http://127.0.0.1:3333/v1"))  # in its place
        lost = events.get(timeout=10)
        assert isinstance(lost, ShareLost) and lost.share == again.handle
        assert not again.is_alive()
    finally:
        exchange.close()


def test_ctrl_c_while_a_worker_shares_a_server(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it): the owner of a shared
    server does not wait for the items sharing it; no engine is left behind."""
    log = install(pytester.path, monkeypatch, seeds=(0, 1))
    (pytester.path / "qa.jsonl").write_text(
        "".join(
            json.dumps({"id": i, "question": f"q{i}", "answer": "a"}) + "\n" for i in range(400)
        )
    )
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.2")
    models(pytester.path, gpus=1, names=("m1",))
    out = pytester.path / "pytest.log"
    proc = start_pytest(
        pytester.path, "benchmarks/", "--model", "m1", "-n", "2", "--mb-dist", "off", log=out
    )
    requests = pytester.path / "requests.jsonl"
    try:
        deadline = time.monotonic() + 60
        while not (requests.exists() and requests.read_text().count("\n") >= 12):
            assert proc.poll() is None, out.read_text(errors="replace")
            assert time.monotonic() < deadline, "the items never ran"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        kill_group(proc)
    output = out.read_text(errors="replace")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    assert len(starts(log)) == 1, output  # one GPU, one server: the other worker shared it
    assert [s["pid"] for s in starts(log) if pid_alive(s["pid"])] == [], output


def test_a_served_run_without_xdist(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header's worker count reads xdist's options only where xdist is loaded."""
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    models(pytester.path, gpus=1, names=("m1",))
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "--seeds", "0", "-p", "no:xdist", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1)
