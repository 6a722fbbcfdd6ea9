"""The session's exchange (replicas across nodes): its rules, its transport, and its place in
a real two-node xdist run with fake GPUs and a fake vLLM."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.running import blocking
from pytest_modelbench.serving.channel import WORKERINPUT_KEY, ExchangeClient, client_from
from pytest_modelbench.serving.exchange import Exchange, reachable_url, tx_nodes
from pytest_modelbench.serving.exchange_book import ExchangeBook
from pytest_modelbench.serving.messages import (
    Ack,
    AskWork,
    GpusGiven,
    Hello,
    LeaseEnded,
    LeaseLost,
    LeaseReady,
    LiveServer,
    Message,
    NoWork,
    Offer,
    Publish,
    Release,
    SessionGpus,
    SharedWith,
    ShareLost,
    SharersGone,
    ShareServer,
    Unshare,
    WaitGpus,
    Wake,
    WantAnswer,
    WantServers,
    Withdraw,
    Withdrawn,
    Work,
    decode,
    decode_frame,
    encode,
)
from pytest_modelbench.serving.tls import SessionTls, session_tls
from pytest_modelbench.testing import read_log
from tests.serving.fakevllm import starts, write_models
from tests.serving.test_multihost import FAKE_SSH, FORWARDED
from tests.serving.test_replicas import BIG, wait_for, write_project

LAUNCH = {"model_name": "m1", "model_path": "m1", "served": "m1", "args": {}, "gpus": 1}


def ask(helper: str, node: str, gpus: int = 1, live: LiveServer | None = None) -> AskWork:
    return AskWork(helper, node, gpus, live)


def want(need: int, *, key: str = "k", lend: bool = False, keeper: str = "gw0") -> WantServers:
    return WantServers(keeper, "a", key, LAUNCH, need, lend)


def test_messages_are_typed_and_decoded_in_one_place() -> None:
    message = AskWork("gw1", "b", 2, LiveServer("k", 8001, True))
    assert decode(encode(message, 7)) == (7, message)
    assert decode(encode(Wake())) == (0, Wake())
    assert decode_frame(encode(Wake(), seq=3)) == (0, 3, Wake())  # an event's number
    assert decode(encode(Hello("gw1", seen=3))) == (0, Hello("gw1", seen=3))
    with pytest.raises(ValueError):
        decode('{"ref": 0, "seq": "3", "msg": {"type": "wake"}}')
    for frame in ('{"ref": 1, "msg": {"type": "nonsense"}}', '{"ref": 1, "msg": {"type": "offer"}}',
                  '{"msg": {}}'):  # fmt: skip
        with pytest.raises(ValueError):
            decode(frame)


def test_a_helper_serves_a_want_of_another_node_once() -> None:
    book = ExchangeBook()
    book.worker_up("gw0")
    book.worker_up("gw1")
    assert book.serve(ask("gw1", "b"))[0] == NoWork(wait=True)  # gw0 may still want servers
    assert book.want(want(1))[1] == [("gw1", Wake())]  # the waiting helper is woken
    assert book.serve(ask("gw2", "a"))[0] == NoWork(local=True)  # its own node: GPUs go back,
    assert book.serve(ask("gw5", "a"))[0] == NoWork(wait=True)  # for one unit only
    assert book.want(want(1))[1] == [("gw5", Wake())]  # the keeper claimed gw2's GPU
    assert book.want(want(1))[1] == []  # nothing changed: nobody is woken
    assert book.serve(ask("gw3", "c", 2))[0] == NoWork(wait=True)  # 2 GPUs do not fit
    job, events = book.serve(ask("gw1", "b"))
    assert isinstance(job, Work) and job.key == "k" and job.launch == LAUNCH and not events
    assert book.serve(ask("gw4", "d"))[0] == NoWork(wait=True)  # the one unit is taken
    # the keeper, not yet told, still needs one: the one starting for it
    assert book.want(want(1))[0] == WantAnswer(starting=1)
    assert book.serve(ask("gw4", "d"))[0] == NoWork(wait=True)  # not offered twice
    url = "http://10.0.0.2:8001/v1"
    assert book.offer("gw1", Offer(job.lease, 8001), url) == [("gw0", LeaseReady(job.lease, url))]
    assert book.want(want(0))[0] == WantAnswer(starting=0)
    released = book.release(Release("gw0"))  # the keeper's model is done: the helper is told
    assert ("gw1", LeaseEnded(job.lease)) in released
    assert book.offer("gw1", Offer(job.lease, 8001), url) == [("gw1", LeaseEnded(job.lease))]
    for worker in ("gw0", "gw2", "gw3", "gw4", "gw5"):
        book.worker_down(worker)
    assert book.serve(ask("gw1", "b"))[0] == NoWork()  # nobody left who could want one


def test_a_worker_waiting_for_gpus_is_woken_by_events_of_its_node() -> None:
    """A worker without a GPU waits on its node: it is pushed GPUs given back there, a server
    published there and any worker's end, never another node's GPUs or servers; a helper of
    its node gives its GPUs back (``local``) instead of waiting for work; once it stopped
    waiting, nothing is pushed to it."""
    book = ExchangeBook()
    for worker in ("gw0", "gw1", "gw2"):
        book.worker_up(worker)
    assert book.serve(ask("gw2", "a"))[0] == NoWork(wait=True)  # gw0 and gw1 still run
    assert book.wait_gpus("gw1", WaitGpus("a")) == [("gw2", Wake())]  # the helper asks again
    assert book.serve(ask("gw2", "a"))[0] == NoWork(local=True)  # its GPUs go to gw1
    assert book.serve(ask("gw3", "b"))[0] == NoWork(wait=True)  # another node's helper waits
    assert book.session_gpus(SessionGpus("a", ("0",))) == [("gw1", GpusGiven(("0",)))]
    assert book.session_gpus(SessionGpus("b", ("1",))) == []
    book.publish("gw0", Publish("k", "b", "http://b:1/v1"))
    assert book.publish("gw0", Publish("k", "a", "http://a:1/v1")) == [("gw1", Wake())]
    assert ("gw1", Wake()) in book.gone("gw0")  # its GPUs are free, or its server gone
    assert ("gw1", Wake()) in book.worker_down("gw0")
    assert book.wait_gpus("gw1", WaitGpus("a", waiting=False)) == []
    assert book.session_gpus(SessionGpus("a", ("2",))) == []
    assert ("gw1", Wake()) not in book.gone("gw2")


def test_a_keeper_gets_what_it_needs_however_late_it_hears() -> None:
    """Seven helpers take seven units between two calls of the keeper: its next call (which
    has not heard of them yet) does not offer seven more."""
    book = ExchangeBook()
    book.want(want(7))
    jobs = [book.serve(ask(f"h{i}", "b"))[0] for i in range(9)]
    assert sum(isinstance(j, Work) for j in jobs) == 7
    assert book.want(want(7))[0] == WantAnswer(7)
    assert not isinstance(book.serve(ask("h9", "b"))[0], Work)
    assert book.want(want(9))[0] == WantAnswer(7)
    assert sum(isinstance(book.serve(ask(f"x{i}", "c"))[0], Work) for i in range(5)) == 2


def test_a_live_server_is_lent_to_another_node_running_its_launch() -> None:
    book = ExchangeBook()
    book.worker_up("gw0")
    book.want(want(0, lend=True))
    other = book.serve(ask("gw3", "b", live=LiveServer("other", 2, False)), "http://b:2/v1")
    assert other[0] == NoWork(wait=True)
    lent, events = book.serve(ask("gw1", "b", live=LiveServer("k", 1, False)), "http://b:1/v1")
    assert isinstance(lent, Work) and lent.lent
    assert events == [("gw0", LeaseReady(lent.lease, "http://b:1/v1"))]  # pushed, no start
    book.want(want(0, lend=False))  # its item is done
    again = book.serve(ask("gw4", "c", live=LiveServer("k", 1, False)), "http://c:1/v1")
    assert again[0] == NoWork(wait=True)


def test_a_live_server_is_lent_on_its_own_node_first_whatever_its_engine() -> None:
    """A worker at its end lends its server to a keeper of its node running that launch (any
    engine: its server is reached on that node), before any of another node; a server other
    nodes cannot reach (not ``remote``) is lent on its node only; and in a session of one node
    a helper with nothing to lend never waits."""
    book = ExchangeBook(nodes=1)
    book.want(want(0, lend=True))  # gw0 on node a
    book.want(WantServers("gw7", "b", "k", LAUNCH, 0, lend=True))
    local = LiveServer("k", 1, False, remote=False)
    lent, events = book.serve(ask("gw1", "a", live=local), "http://127.0.0.1:1/v1")
    assert isinstance(lent, Work) and lent.lent
    assert events == [("gw0", LeaseReady(lent.lease, "http://127.0.0.1:1/v1"))]
    other_node = book.serve(ask("gw2", "c", live=local), "http://c:1/v1")
    assert not isinstance(other_node[0], Work)  # gw7 of node b cannot reach it
    assert book.serve(ask("gw3", "a"))[0] == NoWork()  # one node: nothing to wait for


def test_a_closed_connection_releases_a_keeper_and_loses_a_helper() -> None:
    """No silence is waited for: a start may take its timeout, and a worker's end is its
    connection's close."""
    book = ExchangeBook()
    book.want(want(2))
    first, _ = book.serve(ask("gw1", "b"))
    second, _ = book.serve(ask("gw2", "c"))
    assert isinstance(first, Work) and isinstance(second, Work)
    book.offer("gw1", Offer(first.lease, 1), "http://b:1/v1")
    note = "the worker serving it (gw2 on c) disconnected"
    assert book.gone("gw2") == [("gw0", LeaseLost(second.lease, note))]  # starting, still
    assert book.want(want(2))[0] == WantAnswer(0)  # its next step asks for it again
    third, _ = book.serve(ask("gw3", "d"))
    assert isinstance(third, Work)
    assert sorted(book.gone("gw0"), key=str) == [
        ("gw1", LeaseEnded(first.lease)),
        ("gw3", LeaseEnded(third.lease)),
    ]
    assert not book.leases and not book.wants


def test_a_failed_start_is_reported_to_its_keeper() -> None:
    book = ExchangeBook()
    book.want(want(1))
    job, _ = book.serve(ask("gw1", "b"))
    assert isinstance(job, Work)
    note = "did not start on b: CUDA out of memory"
    assert book.offer("gw1", Offer(job.lease, note=note), None) == [
        ("gw0", LeaseLost(job.lease, note))
    ]
    assert book.want(want(0))[0] == WantAnswer(0)


def test_requests_sent_again_after_a_drop_have_no_second_effect() -> None:
    """A request that must not be lost is sent again after a dropped connection, whether or
    not its first sending arrived: the repeat pushes nothing and loses nothing."""
    book = ExchangeBook()
    book.want(want(2))
    ready, failed = (book.serve(ask("gw1", "b"))[0] for _ in range(2))
    assert isinstance(ready, Work) and isinstance(failed, Work)
    for offer, url in (
        (Offer(ready.lease, 1), "http://b:1/v1"),
        (Offer(failed.lease, note="x"), None),
    ):
        assert book.offer("gw1", offer, url)  # its keeper is told once
        assert book.offer("gw1", offer, url) == []
    assert book.release(Release("gw0", ready.lease)) == [("gw1", LeaseEnded(ready.lease))]
    assert book.release(Release("gw0", ready.lease)) == []

    book.publish("gw2", Publish("k", "b", "http://b:2/v1"))
    shared = book.share("gw3", ShareServer("k", "b"))
    assert isinstance(shared, SharedWith)
    assert book.publish("gw2", Publish("k", "b", "http://b:2/v1")) == []  # its sharer keeps it
    assert book.withdraw("gw2", Withdraw("k")) == (Withdrawn(1), [])
    assert book.withdraw("gw2", Withdraw("k")) == (Withdrawn(1), [])
    assert book.unshare(Unshare(shared.share)) == [("gw2", SharersGone("k"))]
    assert book.unshare(Unshare(shared.share)) == []
    book.wait_gpus("gw4", WaitGpus("b"))
    assert book.wait_gpus("gw4", WaitGpus("b", waiting=False)) == []
    assert book.wait_gpus("gw4", WaitGpus("b", waiting=False)) == [] and not book.gpu_waiters


def test_gpus_given_back_are_pushed_to_the_keepers_of_their_node() -> None:
    """Replicas on GPUs the session gave back: the keepers of that node are told at once
    (no lock notes are polled), a keeper that starts wanting later hears of them in its
    answer, and GPUs taken are no longer offered."""
    book = ExchangeBook()
    book.want(want(1))  # gw0 on node a
    book.want(WantServers("gw7", "b", "k", LAUNCH, 1))
    events = book.session_gpus(SessionGpus("a", ("2", "3")))
    assert events == [("gw0", GpusGiven(("2", "3")))]  # not gw7: another node's GPUs
    assert book.want(want(1, keeper="gw9"))[0] == WantAnswer(0, given=("2", "3"))
    assert book.session_gpus(SessionGpus("a", ("2",), free=False)) == []
    assert book.want(want(1))[0].given == ("3",)


def test_a_helper_on_the_controllers_node_is_reached_at_the_controllers_address() -> None:
    """A popen helper calls the exchange over loopback: a keeper on another node must get the
    controller's address it called, not its own loopback."""
    url = "https://127.0.0.1:8123/v1"
    assert reachable_url(url, "10.1.2.3", "10.1.2.9") == "https://10.1.2.9:8123/v1"
    assert reachable_url(url, "::ffff:10.1.2.3", "fd00::9") == "https://[fd00::9]:8123/v1"
    assert reachable_url(url, "127.0.0.1", "127.0.0.1") == url  # a keeper of that node
    assert reachable_url("https://10.1.2.4:1/v1", "10.1.2.3", "10.1.2.9").startswith(
        "https://10.1.2.4:1"
    )


class Party:
    """A worker's client with the events pushed to it collected."""

    def __init__(self, given: dict[str, object], worker: str, host: str = "") -> None:
        environ = {"MODELBENCH_EXCHANGE_HOST": host} if host else {}
        client = client_from({WORKERINPUT_KEY: given, "workerid": worker}, environ)
        assert client is not None
        self.client = client
        self.events: queue.Queue[Message] = queue.Queue()
        client.listen(self.events.put)

    def next(self, timeout_s: float = 10.0) -> Message:
        return self.events.get(timeout=timeout_s)


def test_the_exchange_answers_only_with_the_session_token_and_pushes_events() -> None:
    exchange = Exchange()
    exchange.start()
    try:
        given = exchange.workerinput("popen")
        keeper, helper = Party(given, "gw0"), Party(given, "gw1")
        assert keeper.client.url.startswith("https://127.0.0.1:")
        exchange.worker_up("gw0")
        assert keeper.client.call(want(1)) == WantAnswer(0)
        job = helper.client.call(ask("gw1", "b"))
        assert isinstance(job, Work) and job.launch == LAUNCH
        helper.client.call(Offer(job.lease, port=8123))
        # pushed, at the address the helper called from
        assert keeper.next() == LeaseReady(job.lease, "http://127.0.0.1:8123/v1")
        keeper.client.call(Release("gw0", job.lease))
        assert helper.next() == LeaseEnded(job.lease)

        wrong_token = ExchangeClient(
            "127.0.0.1", exchange.port, "x", "k" * 16, tls=SessionTls.of(given["tls"])
        )
        for _ in range(3):
            assert wrong_token.call(want(1)) is None  # HTTP 403 on the upgrade
        assert wrong_token.failure is not None
        refused = blocking.request(
            f"{keeper.client.url}/exchange",
            headers={"Authorization": "x"},
            context=SessionTls.of(given["tls"]).client_context(),
        )
        assert refused.status == 403
        assert keeper.client.call(Ack()) is None and keeper.client.failure is None  # no outage
    finally:
        exchange.close()
    deadline = time.monotonic() + 10  # the exchange closed the connection: told, not polled
    while keeper.client.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert keeper.client.failure is not None and "closed" in keeper.client.failure
    assert keeper.client.call(ask("gw0", "a")) is None  # gone: no answer


def _address() -> str | None:
    """A non-loopback address of this machine, or None."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: the route picks an address
        address = str(probe.getsockname()[0])
        return None if address.startswith("127.") else address
    return None


def test_a_server_on_the_controllers_node_is_lent_at_an_address_other_nodes_reach() -> None:
    """A popen helper on the controller's node calls over loopback; the keeper of another
    node (here: calling at this machine's network address) gets that address, not
    127.0.0.1, which it would dial as its own loopback."""
    address = _address()
    if address is None:
        pytest.skip("this machine has no network address")
    exchange = Exchange(None)  # every interface: a node is reached over the network
    exchange.start()
    try:
        given = exchange.workerinput("popen")
        keeper, helper = Party(given, "gw0", host=address), Party(given, "gw1")
        keeper.client.call(want(1))
        job = helper.client.call(ask("gw1", "b"))
        assert isinstance(job, Work)
        helper.client.call(Offer(job.lease, port=8123, tls=True))
        assert keeper.next() == LeaseReady(job.lease, f"https://{address}:8123/v1")
    finally:
        exchange.close()


HELPER = """
import json, sys, time
from pytest_modelbench.serving.channel import WORKERINPUT_KEY, client_from
from pytest_modelbench.serving.messages import AskWork, Offer, Work
client = client_from({WORKERINPUT_KEY: json.loads(sys.argv[1]), "workerid": "gw1"}, {})
job = client.call(AskWork("gw1", "b", 1))
assert isinstance(job, Work), job
client.call(Offer(job.lease, port=8123))
print("serving", flush=True)
time.sleep(600)
"""


KEEPER = """
import json, sys, time
from pytest_modelbench.serving.channel import WORKERINPUT_KEY, client_from
from pytest_modelbench.serving.messages import WantServers
client = client_from({WORKERINPUT_KEY: json.loads(sys.argv[1]), "workerid": "gw3"}, {})
client.call(WantServers("gw3", "a", "k2", {"gpus": 1}, 1))
print("serving", flush=True)
time.sleep(600)
"""


def test_a_killed_worker_is_noticed_when_the_controller_sees_it_exit(tmp_path: Path) -> None:
    """kill -9 of a helper: its keeper is told the server is lost as soon as xdist tells the
    controller, not after a silence or the time a dropped connection has to come back; kill
    -9 of a keeper: its helper is told to stop serving."""
    exchange = Exchange()
    exchange.start()
    try:
        given = exchange.workerinput("popen")
        keeper = Party(given, "gw0")
        keeper.client.call(want(1))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        helper = subprocess.Popen(
            [sys.executable, "-c", HELPER, json.dumps(given)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert helper.stdout is not None and helper.stdout.readline() == "serving\n"
            ready = keeper.next()
            assert isinstance(ready, LeaseReady)
            killed = time.monotonic()
            helper.kill()
            exchange.worker_down("gw1")  # xdist tells the controller (pytest_testnodedown)
            lost = keeper.next(timeout_s=5.0)  # not after RESUME_S
            noticed_s = time.monotonic() - killed
        finally:
            helper.kill()
            helper.wait()
        note = "the worker serving it (gw1 on b) disconnected"
        assert lost == LeaseLost(ready.lease, note)
        print(f"helper's death noticed after {noticed_s:.3f} s")

        other = Party(given, "gw2")  # now the keeper dies
        dying = subprocess.Popen(
            [sys.executable, "-c", KEEPER, json.dumps(given)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert dying.stdout is not None and dying.stdout.readline() == "serving\n"
            job = other.client.call(ask("gw2", "c"))
            assert isinstance(job, Work) and job.key == "k2"
            other.client.call(Offer(job.lease, port=1))
            killed = time.monotonic()
            dying.kill()
            exchange.worker_down("gw3")
            assert other.next(timeout_s=5.0) == LeaseEnded(job.lease)
            print(f"keeper's death noticed after {time.monotonic() - killed:.3f} s")
        finally:
            dying.kill()
            dying.wait()
    finally:
        exchange.close()


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


def command_engine(root: Path) -> None:
    """``m1`` served by ``engine: command``: the fake vLLM's simulator as a plain server on
    loopback, with no key and no TLS of its own (llama.cpp's server, TGI ...)."""
    script = root / "fakevllm" / "vllm" / "entrypoints" / "openai" / "api_server.py"
    command = [sys.executable, str(script), "--model", "{model}"]
    command += ["--served-model-name", "{served_name}", "--host", "{host}", "--port", "{port}"]
    serve = {"engine": "command", "command": command, "gpus": 1, "startup_timeout": 60}
    write_models(root, {"m1": {"model": "m1", "serve": serve, "max_concurrent": 4}})


def assert_served_for_other_nodes(servers: list[dict[str, Any]], engine: str) -> None:
    """vLLM serves TLS itself; any other engine stays on loopback with no key, behind its
    TLS front."""
    if engine == "vllm":
        assert all(s["keyed"] and s["bind"] == "0.0.0.0" for s in servers), servers
        assert all(s["tls"] and s["client_certs"] for s in servers), servers
    else:
        assert all(s["bind"] == "127.0.0.1" for s in servers), servers
        assert not any(s["keyed"] or s["tls"] or s["flags"] for s in servers), servers


@pytest.mark.parametrize("engine", ["vllm", "command"])
def test_a_worker_with_nothing_left_serves_an_item_of_another_node(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """Two nodes, one GPU and one worker each, one large item. The worker that gets nothing
    starts the item's model on its own node's GPU, reached with the session's server key over
    TLS (vLLM's own, or the TLS front of any other engine), and the item's requests spread
    over both nodes; everything stops at the end, and the key is written nowhere."""
    root = pytester.path
    ssh = root / "fake-ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("MODELBENCH_SSH", str(ssh))
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.1")
    monkeypatch.setenv("FAKE_VLLM_SLOTS", "4")
    write_project(root, costs={"big": 1000, "small": 200})
    if engine == "command":
        command_engine(root)
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "-k", "big", "--dist", "load",
        *_tx(root, "a", "0"), *_tx(root, "b", "4"),
        "--run-id", "r", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    servers = starts(fake_vllm)
    assert sorted((s["host"], s["gpus"]) for s in servers) == [("a", "0"), ("b", "4")], servers
    # TLS from the session's CA, clients' certificates required; the key files are gone
    assert_served_for_other_nodes(servers, engine)
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
    if engine != "vllm":
        return  # its engine never saw the key
    (key,) = {s["key"] for s in servers}  # one session, one key
    assert len(key) == 32
    for path in (root / "runs").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    assert key not in result.stdout.str() and key not in result.stderr.str()
    assert json.loads((run / "run_manifest.json").read_text())["items"]


@pytest.mark.parametrize("engine", ["vllm", "command"])
def test_a_worker_with_nothing_left_lends_its_server_to_another_node(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """Two nodes, one model: when the small item's worker is done, its live server (already
    serving the model, on its node's network: vLLM itself, any other engine through its TLS
    front) answers the big item's requests on the other node at once, without a start, and
    stops when the big item's worker lets it go."""
    root = pytester.path
    ssh = root / "fake-ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("MODELBENCH_SSH", str(ssh))
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.2")
    monkeypatch.setenv("FAKE_VLLM_SLOTS", "4")
    write_project(root, costs={"big": 1000, "small": 200})
    if engine == "command":
        command_engine(root)
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "--dist", "load",
        *_tx(root, "a", "0"), *_tx(root, "b", "4"),
        "--run-id", "r", "-p", "no:cacheprovider", "-q",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    servers = starts(fake_vllm)
    assert sorted(s["host"] for s in servers) == ["a", "b"], servers  # no third start
    assert_served_for_other_nodes(servers, engine)  # lent over TLS
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
        assert client.call(ask("gw1", "b")) is None
    assert client.failure is None and lent.is_alive()
    assert client.call(ask("gw1", "b")) is None
    assert client.failure is not None and client.failure.startswith(
        f"the session's exchange at {client.url} did not answer"
    )
    assert not lent.is_alive() and lent.death_report() == client.failure  # nobody vouches
    client.url = "http://203.0.113.1:9"  # would time out: no longer called at all
    assert client.call(want(1)) is None
    with pytest.warns(ReplicaWarning, match="replicas across nodes are off: .*EXCHANGE_HOST"):
        pool.report_replicas()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool.report_replicas()  # once


REPORT_EXCHANGE = """
import sys


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):  # the controller
        started = "pytest_modelbench.serving.exchange" in sys.modules
        with open("exchange-started", "w") as out:
            out.write(str(started))
"""


def test_the_exchange_runs_only_in_xdist_sessions_that_serve_models(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One node, two workers, a served model: the workers coordinate through the exchange;
    an xdist session with nothing to serve never starts (nor imports) it."""
    root = pytester.path
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0")
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.01")
    write_project(root)
    (root / "conftest.py").write_text(REPORT_EXCHANGE)
    args = ("--model", "m1", "-k", "small", "-n", "2", "-p", "no:cacheprovider")
    result = pytester.runpytest_subprocess("benchmarks/", *args)
    result.assert_outcomes(passed=1)
    assert (root / "exchange-started").read_text() == "True"
    (root / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("test_nothing.py", "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert (root / "exchange-started").read_text() == "False"


# -- TLS from the session's CA ---------------------------------------------------------------


class Relay:
    """A TCP relay that records every byte between a client and the exchange (the wire), and
    can cut its connections (a network blip) and refuse new ones for a while."""

    def __init__(self, port: int) -> None:
        self.wire = bytearray()
        self.refusing = False
        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._open: list[socket.socket] = []
        self._clients: list[socket.socket] = []  # the clients' ends of _open
        self._stale: list[socket.socket] = []  # the exchange's ends, left open by cut_clients
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Both ends see the connection end without a WebSocket close."""
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._open.clear()
        self._clients.clear()

    def cut_clients(self) -> None:
        """Only the clients see their connections end: the exchange's ends stay open, and
        what it sends there is lost (a drop the worker notices first)."""
        self._stale += [sock for sock in self._open if sock not in self._clients]
        for sock in self._clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._open.clear()
        self._clients.clear()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                ours, _ = self._listener.accept()
                if self.refusing:
                    ours.close()
                    continue
                theirs = socket.create_connection(("127.0.0.1", self._target))
                self._open += [ours, theirs]
                self._clients.append(ours)
                for a, b in ((ours, theirs), (theirs, ours)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self.wire += data
                sink.sendall(data)
        if sink not in self._stale:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()
        for sock in self._stale:
            sock.close()


def test_no_token_crosses_the_wire_in_clear_and_clients_without_the_ca_are_refused() -> None:
    exchange = Exchange()
    exchange.start()
    relay = Relay(exchange.port)
    try:
        given = exchange.workerinput("popen")
        exchange.worker_up("gw0")
        client = client_from({WORKERINPUT_KEY: {**given, "port": relay.port}}, {})
        assert client is not None and client.url.startswith("https://")
        assert client.call(want(1)) == WantAnswer(0)
        wire = bytes(relay.wire)
        assert wire[:1] == b"\x16"  # a TLS handshake record opens the connection
        for secret in (exchange.token, "Bearer", "keeper", "/exchange", '"want"'):
            assert secret.encode() not in wire, secret

        url = f"https://127.0.0.1:{exchange.port}/exchange"
        plain = f"http://127.0.0.1:{exchange.port}/exchange"
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
        assert client.call(want(1)) is None
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


def test_a_socket_that_fails_ends_the_channel_when_not_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read that raises (a pong that cannot be sent once the worker stalled past the
    heartbeat): pending calls fail, and when the connection cannot be made again within
    ``RESUME_S`` the channel ends, calls stop and whoever waits for an event is told."""
    import aiohttp

    from pytest_modelbench.serving import channel

    monkeypatch.setattr(channel, "RESUME_S", 0.5, raising=False)
    exchange = Exchange()
    exchange.start()
    try:
        keeper = Party(exchange.workerinput("popen"), "gw0")
        assert keeper.client.call(want(1)) == WantAnswer(0)
        failed = threading.Event()
        keeper.client.when_failed(failed.set)
        socket_ = keeper.client._socket
        assert socket_ is not None

        async def broken() -> aiohttp.WSMessage:
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")

        socket_.receive = broken  # type: ignore[method-assign]  # from its next frame on
        with socket.create_server(("127.0.0.1", 0)) as closed:
            keeper.client.url = f"https://127.0.0.1:{closed.getsockname()[1]}"
        exchange.book.waiting.add("gw0")
        exchange.worker_down("gw9")  # Wake pushed to gw0: its read returns, the next raises
        assert keeper.next() == Wake()
        assert failed.wait(10)
        assert keeper.client.failure is not None
        assert "ClientConnectionResetError" in keeper.client.failure
        assert keeper.client.call(want(1)) is None
    finally:
        exchange.close()


def test_malformed_requests_of_a_peer_get_an_error_and_harm_nobody_else() -> None:
    """Fields of the wrong type are refused where messages are decoded, a request the book
    cannot take fails that request only, and a worker of another version is refused in one
    line."""
    import asyncio

    import aiohttp

    exchange = Exchange()
    exchange.start()
    given = exchange.workerinput("popen")

    async def send(frames: list[dict[str, object]], *, refused: bool = False) -> list[object]:
        context = SessionTls.of(given["tls"]).client_context()
        url = f"https://127.0.0.1:{exchange.port}/exchange"
        headers = {"Authorization": f"Bearer {given['token']}"}
        replies: list[object] = []
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(url, headers=headers, ssl=context) as ws,
        ):
            for ref, frame in enumerate(frames, 1):
                await ws.send_str(json.dumps({"ref": ref, "msg": frame}))
                reply = await asyncio.wait_for(ws.receive(), 10)
                replies.append(
                    reply.json()["msg"] if reply.type == aiohttp.WSMsgType.TEXT else None
                )
            if refused:  # then the exchange closes the socket
                replies.append((await asyncio.wait_for(ws.receive(), 10)).type)
        return replies

    def error(reply: object) -> str:
        assert isinstance(reply, dict) and reply["type"] == "ack", reply
        return str(reply["error"])

    try:
        hello = {"type": "hello", "worker": "gw3"}
        want_ = {"type": "want", "keeper": "gw3", "node": "a", "key": "k", "launch": LAUNCH}
        first = asyncio.run(
            send([
                {"type": "hello", "worker": {}},
                hello,
                {**want_, "need": "2"},
                {**want_, "launch": {**LAUNCH, "gpus": None}, "need": 1},
                {"type": "ask-work", "helper": "gw3", "node": "b", "gpus": 1,
                 "live": {"type": "live", "key": "k", "port": "x", "tls": True}},
            ])
        )  # fmt: skip
        assert "hello: worker is not a str" in error(first[0])
        assert error(first[1]) == "None"  # the hello, after a refused one
        assert "want: need is not a int ('2')" in error(first[2])
        assert "gpus is not a count (None)" in error(first[3])
        assert "live: port is not a int" in error(first[4])
        assert exchange.book.wants == {}  # nothing stored that fails others' requests
        exchange.book.workers.add("gw0")
        helper = Party(given, "gw1")
        assert helper.client.call(ask("gw1", "b")) == NoWork(wait=True)
        assert helper.client.failure is None

        other = asyncio.run(send([{**hello, "schema_version": 99}], refused=True))
        assert error(other[0]) == (
            "worker gw3 speaks version 99 of the exchange's messages, the controller 2: "
            "install the same pytest-modelbench on every node"
        )
        assert other[1] in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    finally:
        exchange.close()


def test_a_closed_channel_answers_nothing_and_starts_no_thread() -> None:
    exchange = Exchange()
    exchange.start()
    try:
        keeper = Party(exchange.workerinput("popen"), "gw0")
        assert keeper.client.call(want(1)) == WantAnswer(0)
        keeper.client.close()
        threads = {t.name for t in threading.enumerate()}
        assert keeper.client.call(SessionGpus("a", ("0",))) is None
        assert {t.name for t in threading.enumerate()} <= threads
        assert keeper.client.failure is None  # closed by its worker: not a failure
    finally:
        exchange.close()


def test_a_call_that_times_out_gives_its_connection_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exchange that accepts the connection and says nothing (a stalled node): the call
    answers nothing after its timeout, and the connection attempt does not go on."""
    import asyncio

    from pytest_modelbench.serving import channel

    monkeypatch.setattr(channel, "CALL_TIMEOUT_S", 0.3)
    tls = session_tls()[1]
    with socket.create_server(("127.0.0.1", 0)) as silent:
        client = ExchangeClient("127.0.0.1", silent.getsockname()[1], "t", "k" * 16, tls=tls)
        try:
            assert client.call(want(1)) is None
            loop = client._loop
            assert loop is not None

            async def others() -> int:
                return len(asyncio.all_tasks() - {asyncio.current_task()})

            deadline = time.monotonic() + 10  # unfixed, it goes on for 30 s (aiohttp's default)
            while asyncio.run_coroutine_threadsafe(others(), loop).result(5):
                assert time.monotonic() < deadline, "the connection attempt went on"
                time.sleep(0.05)
        finally:
            client.close()


def test_the_exchange_closes_workers_that_do_not_answer_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Workers that stalled (their buffers full, nothing read) are not waited for at the
    session's end, which never raises."""
    import asyncio

    import aiohttp

    from pytest_modelbench.serving import exchange as exchange_module

    monkeypatch.setattr(exchange_module, "CLOSE_S", 0.5, raising=False)
    exchange = Exchange()
    exchange.start()
    given = exchange.workerinput("popen")
    connected, done = threading.Event(), threading.Event()

    async def stalled_workers() -> None:
        context = SessionTls.of(given["tls"]).client_context()
        url = f"https://127.0.0.1:{exchange.port}/exchange"
        headers = {"Authorization": f"Bearer {given['token']}"}
        async with aiohttp.ClientSession() as session:
            for n in range(2):
                ws = await session.ws_connect(url, headers=headers, ssl=context)
                await ws.send_str(encode(Hello(f"gw{n}"), 1))
                await ws.receive()
            connected.set()
            done.wait(120)  # this loop stalls: nothing is read or answered

    worker = threading.Thread(target=asyncio.run, args=(stalled_workers(),))
    worker.start()
    try:
        assert connected.wait(10)
        big = LeaseLost("l", "x" * 1_000_000)
        exchange._push_soon([(f"gw{n}", big) for n in range(2) for _ in range(48)])
        time.sleep(1)  # the pushes fill both workers' buffers
        exchange.close()  # unfixed: the close frames wait for room, and stop_loop raised
    finally:
        done.set()
        worker.join(30)


def test_a_dropped_connection_is_made_again_and_nothing_it_held_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A network blip: the keeper connects again as itself, its lease stays, and an event
    pushed while it was away follows; a worker away longer than ``RESUME_S`` has ended."""
    from pytest_modelbench.serving import channel
    from pytest_modelbench.serving import exchange as exchange_module

    monkeypatch.setattr(exchange_module, "RESUME_S", 2.0, raising=False)
    monkeypatch.setattr(channel, "RESUME_S", 2.0, raising=False)
    monkeypatch.setattr(channel, "RETRY_S", 0.1, raising=False)
    exchange = Exchange()
    exchange.start()
    relay = Relay(exchange.port)
    try:
        given = exchange.workerinput("popen")
        tls = SessionTls.of(given["tls"])
        keeper = Party(given, "gw0")
        keeper.client = ExchangeClient(
            "127.0.0.1", relay.port, exchange.token, "k" * 16, worker="gw0", tls=tls
        )
        keeper.client.listen(keeper.events.put)
        helper = Party(given, "gw1")
        assert keeper.client.call(want(2)) == WantAnswer(0)
        first, second = helper.client.call(ask("gw1", "b")), helper.client.call(ask("gw1", "b"))
        assert isinstance(first, Work) and isinstance(second, Work)
        helper.client.call(Offer(first.lease, port=8123))
        assert isinstance(keeper.next(), LeaseReady)

        relay.refusing = True  # away for a while
        relay.cut()
        wait_for(lambda: "gw0" not in exchange.connections)
        helper.client.call(Offer(second.lease, note="did not start"))  # pushed while away
        relay.refusing = False
        assert keeper.next() == LeaseLost(second.lease, "did not start")  # once back
        assert "gw0" in exchange.connections and keeper.client.failure is None
        assert first.lease in exchange.book.leases  # the keeper's lease was kept
        assert helper.events.empty()  # its helper was never told to stop
        assert keeper.client.call(want(2)) == WantAnswer(0)  # calls go on

        relay.refusing = True  # away for good
        relay.cut()
        assert helper.next() == LeaseEnded(first.lease)  # after RESUME_S: it has ended
        wait_for(lambda: keeper.client.failure is not None)
        assert "was not made again within 2 s" in str(keeper.client.failure)
    finally:
        relay.close()
        exchange.close()


def test_events_lost_to_a_drop_the_worker_noticed_first_are_replayed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drop the worker notices before the exchange does: an event pushed into the dead
    connection meanwhile follows, once, when the worker connects again (and none it already
    had comes twice); a Release sent while its keeper is away takes effect once it is back."""
    from pytest_modelbench.serving import channel
    from pytest_modelbench.serving import exchange as exchange_module

    monkeypatch.setattr(exchange_module, "RESUME_S", 5.0, raising=False)
    monkeypatch.setattr(channel, "RESUME_S", 5.0, raising=False)
    monkeypatch.setattr(channel, "RETRY_S", 0.1, raising=False)
    exchange = Exchange()
    exchange.start()
    relays = {"gw0": Relay(exchange.port), "gw1": Relay(exchange.port)}
    try:
        given = exchange.workerinput("popen")
        tls = SessionTls.of(given["tls"])
        keeper, helper = Party(given, "gw0"), Party(given, "gw1")
        for party, worker in ((keeper, "gw0"), (helper, "gw1")):
            port, token = relays[worker].port, exchange.token
            party.client = ExchangeClient(
                "127.0.0.1", port, token, "k" * 16, worker=worker, tls=tls
            )
            party.client.listen(party.events.put)
        assert keeper.client.call(want(2)) == WantAnswer(0)
        first, second = helper.client.call(ask("gw1", "b")), helper.client.call(ask("gw1", "b"))
        assert isinstance(first, Work) and isinstance(second, Work)
        for lease in (first.lease, second.lease):
            assert helper.client.call(Offer(lease, port=8123)) == Ack()
            assert isinstance(keeper.next(), LeaseReady)
        assert keeper.client.call(Publish("s", "b", "http://b:3/v1")) == Ack()
        shared = helper.client.call(ShareServer("s", "b"))
        assert isinstance(shared, SharedWith)

        relays["gw1"].refusing = True
        relays["gw1"].cut_clients()
        wait_for(lambda: not helper.client.connected)
        assert "gw1" in exchange.connections  # the exchange has not noticed
        assert keeper.client.call(Release("gw0", first.lease)) == Ack()  # pushed into the void
        assert keeper.client.call(Withdraw("s", lost="it died")) == Withdrawn(0)
        relays["gw1"].refusing = False
        assert helper.next() == LeaseEnded(first.lease)  # replayed on its resume, in order
        assert helper.next() == ShareLost(shared.share, "it died")

        relays["gw0"].refusing = True
        relays["gw0"].cut_clients()
        wait_for(lambda: not keeper.client.connected)
        back = threading.Timer(0.5, setattr, (relays["gw0"], "refusing", False))
        back.start()
        assert keeper.client.call(Release("gw0", second.lease)) == Ack()  # sent again once back
        assert second.lease not in exchange.book.leases
        assert helper.next() == LeaseEnded(second.lease)
        assert keeper.client.failure is None and helper.client.failure is None
        assert keeper.client.call(want(0)) == WantAnswer(0)  # anything replayed came before
        assert helper.client.call(SessionGpus("b", (), free=False)) == Ack()
        assert keeper.events.empty() and helper.events.empty()  # nothing came twice
    finally:
        for relay in relays.values():
            relay.close()
        exchange.close()


def test_a_lasting_call_without_a_reply_on_a_live_connection_is_sent_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow exchange (it greets, then never answers): a Release is not sent again on the
    same live connection (copies would pile up on the busy exchange), and the call gives up
    after its timeout, not after the resume grace too."""
    import asyncio

    from aiohttp import web

    from pytest_modelbench.running.router import start_loop, stop_loop
    from pytest_modelbench.serving import channel

    monkeypatch.setattr(channel, "CALL_TIMEOUT_S", 0.5)
    monkeypatch.setattr(channel, "RESUME_S", 3.0)
    got: list[str] = []
    port: list[int] = []

    async def accept(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for frame in socket:
            ref, message = decode(frame.data)
            got.append(type(message).__name__)
            if isinstance(message, Hello):
                await socket.send_str(encode(Ack(), ref))
        return socket

    runner: list[web.AppRunner] = []

    async def setup() -> None:
        app = web.Application()
        app.router.add_get("/exchange", accept)
        runner.append(web.AppRunner(app))
        await runner[0].setup()
        site = web.TCPSite(runner[0], "127.0.0.1", 0)
        await site.start()
        port.append(int(runner[0].addresses[0][1]))

    loop, thread = start_loop("silent-exchange", setup)
    client = ExchangeClient("127.0.0.1", port[0], "t", "k" * 16, worker="gw0")
    try:
        started = time.monotonic()
        assert client.call(Release("gw0", "lease-1")) is None
        took = time.monotonic() - started
        assert got == ["Hello", "Release"], got  # once
        assert took < 2.5, took  # not held for the resume grace (3 s)
    finally:
        client.close()

        async def shutdown() -> None:
            await asyncio.gather(*(r.cleanup() for r in runner))

        stop_loop(loop, thread, shutdown)
