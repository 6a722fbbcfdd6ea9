"""The session's exchange (replicas across nodes): its rules, its transport, and its place in
a real two-node xdist run with fake GPUs and a fake vLLM."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import pytest

from pytest_modelbench.running import blocking
from pytest_modelbench.serving.exchange import (
    WORKERINPUT_KEY,
    Exchange,
    ExchangeBook,
    ExchangeClient,
    Job,
    client_from,
    tx_nodes,
)
from pytest_modelbench.serving.tls import SessionTls, session_tls
from pytest_modelbench.testing import read_log
from tests.serving.fakevllm import starts
from tests.serving.test_multihost import FAKE_SSH, FORWARDED
from tests.serving.test_replicas import BIG, write_project

LAUNCH = {"model_name": "m1", "model_path": "m1", "served": "m1", "args": {}, "gpus": 1}


def test_a_helper_serves_a_want_of_another_node_once() -> None:
    book = ExchangeBook()
    book.worker_up("gw0")
    book.worker_up("gw1")
    assert book.serve("gw1", "b", 1, now=0.0) == "wait"  # gw0 may still want servers
    book.want("gw0", "a", "k", LAUNCH, 1, now=1.0)
    assert book.serve("gw2", "a", 1, now=1.0) == "local"  # its own node: GPUs go back there,
    assert book.serve("gw5", "a", 1, now=1.0) == "wait"  # for one unit: not every helper's
    book.want("gw0", "a", "k", LAUNCH, 1, now=1.0)  # the keeper claimed gw2's GPU
    assert book.serve("gw3", "c", 2, now=1.0) == "wait"  # a 2-GPU helper does not fit
    job = book.serve("gw1", "b", 1, now=1.0)
    assert isinstance(job, Job) and job.key == "k" and job.launch == LAUNCH
    assert book.serve("gw4", "d", 1, now=1.0) == "wait"  # the one unit is taken
    # the keeper, not yet told, still needs one: the one starting for it
    assert book.want("gw0", "a", "k", LAUNCH, 1, now=2.0) == {
        "starting": 1,
        "ready": [],
        "dead": [],
    }
    assert book.serve("gw4", "d", 1, now=2.0) == "wait"  # not offered twice
    book.offer(job.id, "http://10.0.0.2:8001/v1", None, now=3.0)
    answer = book.want("gw0", "a", "k", LAUNCH, 0, now=3.0)
    assert answer["ready"] == [{"id": job.id, "url": "http://10.0.0.2:8001/v1"}]
    assert book.want("gw0", "a", "k", LAUNCH, 0, now=3.5)["ready"] == []  # handed out once
    assert book.lease(job.id, now=4.0) is True
    book.release("gw0", None)  # the keeper's model is done
    assert book.lease(job.id, now=5.0) is False  # the helper stops its server
    book.worker_down("gw0")
    for helper in ("gw2", "gw3", "gw4", "gw5"):
        book.worker_down(helper)
    assert book.serve("gw1", "b", 1, now=6.0) is None  # nobody left who could want one


def test_a_keeper_gets_what_it_needs_however_late_it_hears() -> None:
    """Seven helpers take seven units between two calls of the keeper: its next call (which
    has not heard of them yet) does not offer seven more."""
    book = ExchangeBook()
    book.want("gw0", "a", "k", LAUNCH, 7, now=0.0)
    jobs = [book.serve(f"h{i}", "b", 1, now=0.0) for i in range(9)]
    assert sum(isinstance(j, Job) for j in jobs) == 7
    assert book.want("gw0", "a", "k", LAUNCH, 7, now=1.0)["starting"] == 7
    assert not isinstance(book.serve("h9", "b", 1, now=1.0), Job)
    assert book.want("gw0", "a", "k", LAUNCH, 9, now=2.0)["starting"] == 7
    assert sum(isinstance(book.serve(f"x{i}", "c", 1, now=2.0), Job) for i in range(5)) == 2


def test_a_start_may_take_its_timeout_without_a_report() -> None:
    book = ExchangeBook(silent_s=30.0)
    book.want("gw0", "a", "k", {**LAUNCH, "timeout_s": 600}, 1, now=0.0)
    job = book.serve("gw1", "b", 1, now=0.0)
    assert isinstance(job, Job)
    for t in range(1, 300):  # a real vLLM start: minutes, the helper blocked in it
        assert book.want("gw0", "a", "k", LAUNCH, 1, now=float(t))["dead"] == []
    book.offer(job.id, "http://b:1/v1", None, now=300.0)
    assert book.want("gw0", "a", "k", LAUNCH, 0, now=300.0)["ready"]
    assert book.lease(job.id, now=301.0)
    dead = []
    for t in range(302, 340):  # ready: 30 s of silence is death again
        dead += book.want("gw0", "a", "k", LAUNCH, 0, now=float(t))["dead"]
    assert len(dead) == 1


def test_a_live_server_is_lent_to_another_node_running_its_launch() -> None:
    book = ExchangeBook()
    book.worker_up("gw0")
    book.want("gw0", "a", "k", LAUNCH, 0, now=0.0, lend=True)
    mine = book.serve("gw2", "a", 1, now=0.0, live=("k", "http://a:1/v1"))
    assert mine == "wait"  # its own node's keeper borrows through handover.py
    other = book.serve("gw3", "b", 1, now=0.0, live=("other-launch", "http://b:2/v1"))
    assert other == "wait"
    lent = book.serve("gw1", "b", 1, now=0.0, live=("k", "http://b:1/v1"))
    assert isinstance(lent, Job) and lent.lent
    answer = book.want("gw0", "a", "k", LAUNCH, 0, now=1.0, lend=True)
    assert answer["ready"] == [{"id": lent.id, "url": "http://b:1/v1"}]
    book.want("gw0", "a", "k", LAUNCH, 0, now=2.0, lend=False)  # its item is done
    again = book.serve("gw4", "c", 1, now=2.0, live=("k", "http://c:1/v1"))
    assert again == "wait"


def test_silent_keepers_release_and_silent_helpers_are_dead() -> None:
    book = ExchangeBook(silent_s=30.0)
    for worker in ("gw0", "gw1", "gw2"):
        book.worker_up(worker)
    book.want("gw0", "a", "k", LAUNCH, 2, now=0.0)
    first = book.serve("gw1", "b", 1, now=0.0)
    second = book.serve("gw2", "c", 1, now=0.0)
    assert isinstance(first, Job) and isinstance(second, Job)
    book.offer(first.id, "http://b:1/v1", None, now=1.0)
    book.offer(second.id, "http://c:1/v1", None, now=1.0)
    book.want("gw0", "a", "k", LAUNCH, 0, now=1.0)
    told = []
    for t in range(2, 40):  # gw1 keeps reporting, gw2 went silent after its offer
        assert book.lease(first.id, now=float(t))
        told += [(t, dead) for dead in book.want("gw0", "a", "k", LAUNCH, 0, now=float(t))["dead"]]
    note = "the worker serving it (gw2 on c) went silent"
    assert told == [(32, {"id": second.id, "note": note})]  # once, after 30 s of silence
    assert book.lease(first.id, now=50.0)
    assert book.lease(first.id, now=75.0) is False  # the keeper has been silent since 40 s


def test_a_failed_start_is_reported_to_its_keeper() -> None:
    book = ExchangeBook()
    book.want("gw0", "a", "k", LAUNCH, 1, now=0.0)
    job = book.serve("gw1", "b", 1, now=0.0)
    assert isinstance(job, Job)
    book.offer(job.id, None, "did not start on b: CUDA out of memory", now=1.0)
    answer = book.want("gw0", "a", "k", LAUNCH, 0, now=1.0)
    assert answer == {
        "starting": 0,
        "ready": [],
        "dead": [{"id": job.id, "note": "did not start on b: CUDA out of memory"}],
    }


def test_the_exchange_answers_only_with_the_session_token() -> None:
    exchange = Exchange()
    exchange.start()
    try:
        given = exchange.workerinput("popen")
        client = client_from({WORKERINPUT_KEY: given}, {})
        assert client is not None and client.url.startswith("https://127.0.0.1:")
        exchange.book.worker_up("gw0")
        assert client.call("want", keeper="gw0", node="a", key="k", launch=LAUNCH, need=1) == {
            "starting": 0,
            "ready": [],
            "dead": [],
        }
        job = client.call("serve", helper="gw1", node="b", gpus=1)
        assert job is not None and job["launch"] == LAUNCH
        assert client.call("offer", id=job["id"], port=8123) == {}
        answer = client.call("want", keeper="gw0", node="a", key="k", launch=LAUNCH, need=0)
        assert answer is not None  # the URL is the address the helper called from
        assert answer["ready"] == [{"id": job["id"], "url": "http://127.0.0.1:8123/v1"}]

        wrong_token = ExchangeClient(
            "127.0.0.1", exchange.port, "x", "k" * 16, tls=SessionTls.of(given["tls"])
        )
        assert wrong_token.call("want") is None  # HTTP 403
        refused = blocking.request(
            f"{client.url}/want",
            method="POST",
            headers={"Authorization": "x"},
            data=b"{}",
            context=SessionTls.of(given["tls"]).client_context(),
        )
        assert refused.status == 403
        assert client.call("nonsense") is None and client.failure is None  # one is no outage
    finally:
        exchange.close()
    assert client.call("serve", helper="gw1", node="b", gpus=1) is None  # gone: no answer


def test_tx_groups_are_nodes_and_ssh_tells_where_the_controller_is() -> None:
    assert tx_nodes(["8*popen"]) == ({"popen"}, False)
    nodes, networked = tx_nodes(
        ["2*popen//env:A=1", "2*popen//python=py -m pytest_modelbench.serving.remote n2"]
    )
    assert len(nodes) == 2 and networked
    assert tx_nodes(["popen//id=gw0", "popen//id=gw1"]) == ({"popen"}, False)
    remote = {"host": "ctl", "networked": True, "port": 1, "token": "t", "server_key": "s" * 16}
    given = {WORKERINPUT_KEY: remote}
    over_ssh = client_from(given, {"SSH_CONNECTION": "10.1.2.3 5000 10.1.2.9 22"})
    assert over_ssh is not None and over_ssh.url == "http://10.1.2.3:1"
    told = client_from(given, {"MODELBENCH_EXCHANGE_HOST": "head", "SSH_CONNECTION": "x 1 y 2"})
    assert told is not None and told.url == "http://head:1"
    named = client_from(given, {})
    assert named is not None and named.url == "http://ctl:1"
    # a popen worker on the controller's node inherits the user's own ssh login: not used
    here = {**remote, "host": "127.0.0.1", "networked": False}
    local = client_from({WORKERINPUT_KEY: here}, {"SSH_CONNECTION": "192.0.2.7 5 192.0.2.9 22"})
    assert local is not None and local.url == "http://127.0.0.1:1"
    assert client_from({}, {}) is None


# -- the real thing: two nodes, one item ---------------------------------------------------------


def _tx(root: Path, host: str, gpu: str) -> list[str]:
    """One worker on a simulated node (fake ssh, as in test_multihost): its GPU, its own claim
    directory, its own request log."""
    env = {
        "MODELBENCH_FAKE_GPUS": f"{gpu}:0",
        "MODELBENCH_GPU_LOCK_DIR": str(root / f"host-{host}" / "gpu-locks"),
        **{name: os.environ[name] for name in FORWARDED},
        "FAKE_VLLM_REQUESTS": str(root / f"requests-{host}.jsonl"),
        **{name: os.environ[name] for name in ("FAKE_VLLM_LATENCY", "FAKE_VLLM_SLOTS")},
    }
    spec = f"1*popen//python={sys.executable} -m pytest_modelbench.serving.remote {host}"
    return ["--tx", spec + "".join(f"//env:{k}={v}" for k, v in env.items())]


def test_a_worker_with_nothing_left_serves_an_item_of_another_node(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes, one GPU and one worker each, one large item. The worker that gets nothing
    starts the item's model on its own node's GPU, listening with the session's server key,
    and the item's requests spread over both nodes; everything stops at the end, and the key
    is written nowhere."""
    root = pytester.path
    ssh = root / "fake-ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("MODELBENCH_SSH", str(ssh))
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.1")
    monkeypatch.setenv("FAKE_VLLM_SLOTS", "4")
    write_project(root, costs={"big": 1000, "small": 200})
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "-k", "big", "--dist", "load",
        *_tx(root, "a", "0"), *_tx(root, "b", "4"),
        "--run-id", "r", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    servers = starts(fake_vllm)
    assert sorted((s["host"], s["gpus"]) for s in servers) == [("a", "0"), ("b", "4")], servers
    assert all(s["keyed"] and s["bind"] == "0.0.0.0" for s in servers), [
        (s["bind"], s["keyed"]) for s in servers
    ]
    # TLS from the session's CA, clients' certificates required; the key files are gone
    assert all(s["tls"] and s["client_certs"] for s in servers), servers
    assert not list(root.glob("modelbench-tls-*"))
    run = root / "runs" / "r"
    helper = next(
        s for s in servers if (run / "servers" / f"{s['worker']}-m1-for-another-node.log").exists()
    )
    keeper = next(s for s in servers if s is not helper)
    assert helper["host"] != keeper["host"] and helper["worker"] != keeper["worker"]

    logs = {h: [r for r in read_log(root / f"requests-{h}.jsonl") if "big" in r.key] for h in "ab"}
    assert sum(map(len, logs.values())) == BIG  # every example once
    assert len(logs[helper["host"]]) >= BIG // 5, {h: len(v) for h, v in logs.items()}
    for server in servers:  # no orphans
        with pytest.raises(ProcessLookupError):
            os.kill(server["pid"], 0)
    log = root / "runs" / "r" / "servers" / f"{helper['worker']}-m1-for-another-node.log"
    assert "VLLM_API_KEY" not in log.read_text()
    (key,) = {s["key"] for s in servers}  # one session, one key
    assert len(key) == 32
    for path in (root / "runs").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    assert key not in result.stdout.str() and key not in result.stderr.str()
    assert json.loads((run / "run_manifest.json").read_text())["items"]


def test_a_worker_with_nothing_left_lends_its_server_to_another_node(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes, one model: when the small item's worker is done, its live server (already
    serving the model, on its node's network) answers the big item's requests on the other
    node at once, without a start, and stops when the big item's worker lets it go."""
    root = pytester.path
    ssh = root / "fake-ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("MODELBENCH_SSH", str(ssh))
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.2")
    monkeypatch.setenv("FAKE_VLLM_SLOTS", "4")
    write_project(root, costs={"big": 1000, "small": 200})
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "--dist", "load",
        *_tx(root, "a", "0"), *_tx(root, "b", "4"),
        "--run-id", "r", "-p", "no:cacheprovider", "-q",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    servers = starts(fake_vllm)
    assert sorted(s["host"] for s in servers) == ["a", "b"], servers  # no third start
    assert all(s["tls"] and s["client_certs"] for s in servers), servers  # lent over TLS
    logs = {h: read_log(root / f"requests-{h}.jsonl") for h in "ab"}
    (small_host,) = [h for h, log in logs.items() if any("small" in r.key for r in log)]
    lent = [r for r in logs[small_host] if "big" in r.key]
    assert len(lent) >= BIG // 5, len(lent)  # the lent server did a real share of the big item
    last_small = max(r.end for r in logs[small_host] if "small" in r.key)
    assert min(r.start for r in lent) >= last_small - 1.0  # lent once its own item was done
    assert sum(1 for log in logs.values() for r in log if "big" in r.key) == BIG
    for server in servers:  # no orphans
        with pytest.raises(ProcessLookupError):
            os.kill(server["pid"], 0)


def test_an_unreachable_exchange_is_reported_once_and_not_called_again(tmp_path: Path) -> None:
    from pytest_modelbench.serving.pool import ServerPool
    from pytest_modelbench.serving.process import free_port
    from pytest_modelbench.serving.replica_policy import RemoteServer, ReplicaWarning

    client = ExchangeClient("127.0.0.1", free_port(), "t", "k" * 16)
    pool = ServerPool(tmp_path, session="s", exchange=client)
    lent = RemoteServer("lease", "http://10.0.0.2:1/v1", pool.replicas)
    for _ in range(2):  # a blip is not the end
        assert client.call("serve", helper="gw1", node="b", gpus=1) is None
    assert client.failure is None and lent.is_alive()
    assert client.call("serve", helper="gw1", node="b", gpus=1) is None
    assert client.failure is not None and client.failure.startswith(
        f"the session's exchange at {client.url} did not answer"
    )
    assert not lent.is_alive() and lent.death_report() == client.failure  # nobody vouches
    client.url = "http://203.0.113.1:9"  # would time out: no longer called at all
    assert client.call("want", keeper="gw0") is None
    with pytest.warns(ReplicaWarning, match="replicas across nodes are off: .*EXCHANGE_HOST"):
        pool.report_replicas()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool.report_replicas()  # once


# -- TLS from the session's CA ---------------------------------------------------------------


class Relay:
    """A TCP relay that records every byte between a client and the exchange (the wire)."""

    def __init__(self, port: int) -> None:
        self.wire = bytearray()
        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                ours, _ = self._listener.accept()
                theirs = socket.create_connection(("127.0.0.1", self._target))
                for a, b in ((ours, theirs), (theirs, ours)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self.wire += data
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()


def test_no_token_crosses_the_wire_in_clear_and_clients_without_the_ca_are_refused() -> None:
    exchange = Exchange()
    exchange.start()
    relay = Relay(exchange.port)
    try:
        given = exchange.workerinput("popen")
        exchange.book.worker_up("gw0")
        client = client_from({WORKERINPUT_KEY: {**given, "port": relay.port}}, {})
        assert client is not None and client.url.startswith("https://")
        answer = client.call("want", keeper="gw0", node="a", key="k", launch=LAUNCH, need=1)
        assert answer == {"starting": 0, "ready": [], "dead": []}
        wire = bytes(relay.wire)
        assert wire[:1] == b"\x16"  # a TLS handshake record opens the connection
        for secret in (exchange.token, "Bearer", "keeper", "/want"):
            assert secret.encode() not in wire, secret

        url = f"https://127.0.0.1:{exchange.port}/want"
        plain = f"http://127.0.0.1:{exchange.port}/want"
        headers = {"Authorization": f"Bearer {exchange.token}"}
        ca_only = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts the CA, shows no certificate
        ca_only.check_hostname = False
        ca_only.load_verify_locations(cadata=given["tls"]["ca"])
        stranger = session_tls()[1]  # a worker's material from another session's CA
        for context in (ca_only, stranger.client_context()):
            with pytest.raises(blocking.Unreachable):  # refused at the handshake
                blocking.request(url, method="POST", headers=headers, data=b"{}", context=context)
        with pytest.raises(blocking.Unreachable):  # the system's trust: the client refuses
            blocking.request(url, method="POST", headers=headers, data=b"{}")
        with pytest.raises(blocking.Unreachable):  # plain HTTP is not answered
            blocking.request(plain, method="POST", headers=headers, data=b"{}")
    finally:
        relay.close()
        exchange.close()


def test_without_cryptography_the_exchange_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)  # as if not installed
    exchange = Exchange()
    with pytest.raises(OSError, match="pip install cryptography"):
        exchange.start()  # the session reports "replicas across nodes are off: ..."


def test_tls_material_that_cannot_be_loaded_turns_replicas_off_not_the_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full or read-only temp directory: the worker's client says why and is never called."""
    exchange = Exchange()
    exchange.start()
    try:
        given = exchange.workerinput("popen")

        def full(*args: object, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(tempfile, "TemporaryDirectory", full)  # the key file cannot be made
        client = client_from({WORKERINPUT_KEY: given}, {})
        assert client is not None
        assert client.failure is not None and "TLS material" in client.failure
        assert client.call("want", keeper="gw0", node="a", key="k", launch=LAUNCH, need=1) is None
        from pytest_modelbench.serving.gpus import GpuClaimer
        from pytest_modelbench.serving.replica_policy import ReplicaPolicy
        from pytest_modelbench.serving.slot import ServerSlot

        slot = ServerSlot(Path("."), "gw0")
        policy = ReplicaPolicy(slot, GpuClaimer(None, None), cache_dir=Path("."), exchange=client)
        assert policy.listen() == {}  # its servers stay on loopback, needing no TLS files
    finally:
        exchange.close()


def test_a_server_for_other_nodes_serves_tls_to_the_session_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM (the fake, through vLLM's own ``--ssl-*`` flags) listening for other nodes: the
    session's workers reach it over TLS (probes and the endpoint pool alike), clients without
    the session's certificate and plain HTTP get nothing, and its key file is gone once it
    serves."""
    import asyncio

    from pytest_modelbench.running.client import OpenAIClient
    from pytest_modelbench.running.pool import EndpointUnavailable
    from pytest_modelbench.running.urls import UrlSet
    from pytest_modelbench.serving.vllm import VllmServer
    from pytest_modelbench.testing.fakevllm import write_fake_vllm

    fake = write_fake_vllm(tmp_path)
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))  # where the key files go
    worker = session_tls()[1]
    env = {
        "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]),
        "FAKE_VLLM_LOG": str(tmp_path / "servers.jsonl"),
    }
    server = VllmServer(
        "m1", "m1", {}, None, tmp_path / "server.log", tmp_path, env=env,
        check_installed=False, host="0.0.0.0", api_key="k" * 32, tls=worker,
    )  # fmt: skip
    with server:
        assert server.base_url.startswith("https://127.0.0.1:")
        (held,) = private.iterdir()  # kept while it serves: each API server process reads it
        assert held.stat().st_mode & 0o777 == 0o700
        (started,) = starts(tmp_path / "servers.jsonl")
        assert started["tls"] and started["client_certs"] and started["bind"] == "0.0.0.0"

        async def models(urls: UrlSet) -> list[str]:
            async with OpenAIClient(urls, api_key="k" * 32) as client:
                return await client.preflight("m1", timeout_s=10)

        context = worker.client_context()
        assert asyncio.run(models(UrlSet([server.base_url], tls=context))) == ["m1"]
        with pytest.raises(EndpointUnavailable, match="TLS verification failed"):
            asyncio.run(models(UrlSet([server.base_url])))  # the user's trust store
        ca_only = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts the CA, shows no certificate
        ca_only.check_hostname = False
        ca_only.load_verify_locations(cadata=worker.ca)
        stranger = session_tls()[1].client_context()  # another session's worker
        for other in (ca_only, stranger):
            with pytest.raises(blocking.Unreachable):
                blocking.request(f"{server.base_url}/models", context=other)
        plain = server.base_url.replace("https://", "http://")
        with pytest.raises(blocking.Unreachable):
            blocking.request(f"{plain}/models")
    assert not list(private.iterdir())  # removed when it stops
    assert "PRIVATE KEY" not in (tmp_path / "server.log").read_text()
    assert "PRIVATE KEY" not in repr(worker)  # nor in a traceback's locals
