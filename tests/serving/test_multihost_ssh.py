"""Two nodes reached through real OpenSSH servers on loopback, writing one run directory.

The setup of ``test_multihost.py`` (two ``--tx`` groups of two workers started through
``pytest_modelbench.serving.remote``, each node with its own fake GPUs and claim directory,
one shared ``--run-dir``, a fake vLLM), with the fake ``ssh`` replaced by the real thing:
two ``sshd`` processes from Debian's ``openssh-server`` (``/usr/sbin/sshd -D -e``), each on
a free loopback port with its own generated host key, accepting one generated user key for
the current user. The client side is an ssh config in a temporary directory: hosts ``a``
and ``b`` (the names ``test_multihost.tx`` puts in the specs) map to the two ports, with
strict host key checking against a generated ``known_hosts``; ``$MODELBENCH_SSH`` is
``ssh -F <that config> -T -o BatchMode=yes``. Each sshd sets ``FAKE_HOST`` to its node's
name in the sessions it starts (``SetEnv``), as a node's own environment would, so the fake
vLLM records where it ran; everything else the remote side needs comes from ``//env:``.

A node "goes away" when its listening sshd and every process below it (the per-connection
sshd, the worker, its servers) are killed together; stopping only the listener would leave
the open sessions running. To choose the moment, a node's servers can be held back: its
``vllm`` waits for a file before it becomes the fake vLLM, so every worker of that node is
inside an item, holding its next one, until the test lets it go.

Works as root (sshd needs ``/run/sshd``, created here) or as any user (sshd then lets only
that user in). The tests skip when ``sshd``, ``ssh`` or ``ssh-keygen`` is missing, or when
sshd cannot start or let the current user in; the reason quotes sshd's log.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.serving.remote import SSH_ENV
from tests.serving.fakevllm import EXAMPLES, models, qa_env, requests, starts
from tests.serving.test_multihost import HOSTS, MODELS, SEEDS, check_placement, tx

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")  # sshd running as root refuses to start without it

SSHD_CONFIG = """\
ListenAddress 127.0.0.1:{port}
HostKey {dir}/host_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {keys}
AllowUsers {user}
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
SetEnv FAKE_HOST={name}
LogLevel INFO
"""

SSH_CONFIG = """\
Host {name}
  HostName 127.0.0.1
  Port {port}
"""

SSH_DEFAULTS = """\
Host *
  User {user}
  IdentityFile {key}
  IdentitiesOnly yes
  UserKnownHostsFile {known_hosts}
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 10
  LogLevel ERROR
"""


@dataclass
class Node:
    """One sshd standing in for a node."""

    name: str
    port: int
    log: Path
    process: subprocess.Popen[bytes]
    probes: int = 0  # the fixture's own logins

    def logins(self) -> int:
        """Sessions this sshd let in, the fixture's probe aside."""
        return self.log.read_text().count("Accepted publickey for ") - self.probes

    def go_away(self) -> None:
        """Kill this sshd, its sessions and everything they started, as a node that dies."""
        stopped: set[int] = set()
        while True:  # stop the whole tree first, so that nothing forks or exits meanwhile
            tree = descendants(self.process.pid) | {self.process.pid}
            if tree <= stopped:
                break
            for pid in tree - stopped:
                signal_pid(pid, signal.SIGSTOP)
            stopped |= tree
        for pid in stopped:
            signal_pid(pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def descendants(root: int) -> set[int]:
    """Every process below ``root``, by parent pid (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def signal_pid(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
        os.kill(pid, sig)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def keygen(path: Path, comment: str) -> str:
    """A new ed25519 key pair at ``path``; the public key, ``TYPE BASE64``."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    kind, key, *_ = path.with_name(path.name + ".pub").read_text().split()
    return f"{kind} {key}"


def start_sshd(directory: Path, name: str, user: str, keys: Path) -> Node:
    """sshd for node ``name`` on a free loopback port, listening; skips the test if it cannot."""
    directory.mkdir()
    keygen(directory / "host_key", f"host-{name}")
    log = directory / "sshd.log"
    for _attempt in range(3):  # the free port may be taken before sshd binds it
        port = free_port()
        config = directory / "sshd_config"
        config.write_text(
            SSHD_CONFIG.format(port=port, dir=directory, keys=keys, user=user, name=name)
        )
        with log.open("wb") as err:
            process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL, stderr=err
            )
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            if "Server listening on" in log.read_text():
                return Node(name, port, log, process)
            time.sleep(0.02)
        if process.poll() is None:
            process.kill()
        process.wait()
        if "Address already in use" not in log.read_text():
            break
    pytest.skip(f"{SSHD} does not start here: {log.read_text().strip()!r}")


@pytest.fixture
def ssh_nodes(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Node]]:
    """Nodes ``a`` and ``b`` of ``HOSTS``, each a real sshd; ``$MODELBENCH_SSH`` reaches them."""
    missing = [tool for tool in (SSHD, "ssh", "ssh-keygen") if shutil.which(tool) is None]
    if missing:
        pytest.skip(
            f"needs OpenSSH ({', '.join(missing)} not found; apt-get install openssh-server)"
        )
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):  # else sshd says why it cannot start: a skip
            PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    user = getpass.getuser()
    directory = tmp_path_factory.mktemp("ssh")
    key = directory / "user_key"
    keys = directory / "authorized_keys"
    keys.write_text(keygen(key, "modelbench-test") + "\n")
    nodes: dict[str, Node] = {}
    try:
        for name in HOSTS:
            nodes[name] = start_sshd(directory / f"node-{name}", name, user, keys)
        known_hosts = directory / "known_hosts"
        known_hosts.write_text(
            "".join(
                f"[127.0.0.1]:{node.port} "
                + (directory / f"node-{name}" / "host_key.pub").read_text()
                for name, node in nodes.items()
            )
        )
        config = directory / "ssh_config"
        config.write_text(
            "".join(SSH_CONFIG.format(name=n.name, port=n.port) for n in nodes.values())
            + SSH_DEFAULTS.format(user=user, key=key, known_hosts=known_hosts)
        )
        config.chmod(0o600)  # ssh refuses a config that others can write
        ssh = f"ssh -F {config} -T -o BatchMode=yes"
        for name in nodes:
            probe = subprocess.run(
                [*ssh.split(), name, "echo $FAKE_HOST"],
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
            )
            if probe.stdout.strip() != name:
                pytest.skip(
                    f"sshd on port {nodes[name].port} does not let {user} in: "
                    f"{probe.stderr.strip()!r}; sshd log: {nodes[name].log.read_text()!r}"
                )
            nodes[name].probes = nodes[name].logins()
        monkeypatch.setenv(SSH_ENV, ssh)
        yield nodes
    finally:
        for node in nodes.values():
            if node.process.poll() is None:
                node.go_away()


ITEMS = [f"{m}-qa-seed{s}" for m in MODELS for s in SEEDS]

# A vllm that holds its servers back: each leaves a note (``waiting-<worker>``: the model) and
# waits for a ``go`` file, then becomes the fake vLLM. A node with it has every worker inside
# an item (waiting for its server), holding its next item, for as long as the test wants.
HELD_SERVER = """
import argparse, os, sys, time
held, fake = {held!r}, {fake!r}
parser = argparse.ArgumentParser()
parser.add_argument("--served-model-name")
args, _ = parser.parse_known_args()
note = os.path.join(held, "waiting-" + os.environ["PYTEST_XDIST_WORKER"])
with open(note + ".tmp", "w") as out:
    out.write(args.served_model_name)
os.rename(note + ".tmp", note)
while not os.path.exists(os.path.join(held, "go")):
    time.sleep(0.02)
os.environ["PYTHONPATH"] = fake
os.execv(sys.executable, [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *sys.argv[1:]])
"""


def held_vllm(root: Path, host: str) -> str:
    """``PYTHONPATH`` for node ``host`` whose servers wait for :func:`release` (``HELD_SERVER``)."""
    held = root / f"held-{host}"
    package = held / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package.parents[1], package.parents[0], package):
        (folder / "__init__.py").write_text("")
    fake = os.environ["PYTHONPATH"]  # fakevllm.install put the fake vLLM first on it
    (package / "api_server.py").write_text(HELD_SERVER.format(held=str(held), fake=fake))
    return os.pathsep.join([str(held), fake])


def waiting(root: Path, host: str) -> dict[str, str]:
    """Node ``host``'s workers whose server is held back, and the model each one serves."""
    held = root / f"held-{host}"
    notes = (p for p in held.glob("waiting-gw*") if p.suffix != ".tmp")  # .tmp: being written
    return {p.name.removeprefix("waiting-"): p.read_text() for p in notes}


def release(root: Path, host: str) -> None:
    (root / f"held-{host}" / "go").touch()


def run_args(root: Path, *, held: tuple[str, ...] = ()) -> list[str]:
    """The two-node run of ``test_multihost.py``; servers on nodes in ``held`` wait for
    :func:`release`."""
    models(root, gpus=1, names=MODELS)
    qa_env(root, SEEDS)
    specs: list[str] = []
    for host in HOSTS:
        flag, spec = tx(root, host)
        if host in held:
            spec += f"//env:PYTHONPATH={held_vllm(root, host)}"  # the last value of a name wins
        specs += [flag, spec]
    return [
        "benchmarks/",
        "--model",
        ",".join(MODELS),
        "--dist",
        "load",
        *specs,
        "--run-dir",
        "shared/runs",  # relative: resolved once, on the controller
        "--run-id",
        "sweep",
        "-p",
        "no:cacheprovider",
        "--mb-no-reports",
    ]


def chat_requests(root: Path) -> Counter[tuple[str, str, int | None]]:
    """How often each (model, example, seed) was asked, all servers together."""
    return Counter(
        (r.model, r.key, r.seed) for r in requests(root) if r.path.endswith("chat/completions")
    )


def manifest_items(root: Path) -> dict[str, dict[str, object]]:
    path = root / "shared" / "runs" / "sweep" / "run_manifest.json"
    if not path.exists():
        return {}
    items: dict[str, dict[str, object]] = json.loads(path.read_text())["items"]
    return items


@pytest.mark.slow
def test_two_ssh_nodes_share_one_run_directory(
    pytester: pytest.Pytester, fake_vllm: Path, ssh_nodes: dict[str, Node]
) -> None:
    root = pytester.path
    result = pytester.runpytest_subprocess(*run_args(root), timeout=120)
    result.assert_outcomes(passed=len(ITEMS))

    # every worker came in through its node's sshd: one login each
    assert {name: node.logins() for name, node in ssh_nodes.items()} == {"a": 2, "b": 2}

    # every example was requested exactly once
    asked = chat_requests(root)
    assert len(asked) == len(ITEMS) * EXAMPLES
    assert set(asked.values()) == {1}

    # each server ran on a GPU of its worker's node (FAKE_HOST comes from that node's sshd),
    # claimed in that node's directory; the worker came back from $HOME to the project
    check_placement(root, fake_vllm)

    # one run directory, one manifest naming every item once, finished
    items = manifest_items(root)
    assert sorted(items) == sorted(ITEMS)
    assert {e["status"] for e in items.values()} == {"finished"}


def lose_node_b(
    pytester: pytest.Pytester,
    node: Node,
    args: list[str],
    ready: Callable[[], bool],
    then: Callable[[], None],
) -> pytest.RunResult:
    """Run pytest; once ``ready()``, node b goes away, then ``then()``."""
    done: list[pytest.RunResult | BaseException] = []

    def run() -> None:
        try:
            done.append(pytester.runpytest_subprocess(*args, timeout=120))
        except BaseException as exc:  # raised again below, in the test's thread
            done.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while thread.is_alive() and not ready():
            assert time.monotonic() < deadline, "the run never got to where node b goes away"
            time.sleep(0.02)
        node.go_away()
        then()
    finally:
        thread.join()
    (result,) = done
    if isinstance(result, BaseException):
        raise result
    return result


def failed_items(output: str, message: str) -> list[str]:
    """The items of the lines of ``output`` that read ``message`` (``{item}``: the item's test)."""
    before, after = message.split("{item}")
    test = re.escape("'benchmarks/test_models.py::test_benchmark[") + r"(m\d-qa-seed\d)"
    pattern = re.escape(before) + test + re.escape("]'" + after)
    return re.findall("^" + pattern, output, re.MULTILINE)


@pytest.mark.slow
@pytest.mark.parametrize("node_a", ["busy", "done"])
def test_node_lost_mid_run_fails_only_its_own_items(
    pytester: pytest.Pytester, fake_vllm: Path, ssh_nodes: dict[str, Node], node_a: str
) -> None:
    """Node b goes away while each of its two workers runs its first item (waiting for its
    server) and holds its next one.

    ``busy``: node a's workers are in their first items too (also waiting for their servers,
    which start once b is gone); they run b's held items after their own. ``done``: node a has
    finished its items and its workers have exited, so b's held items fail too: nobody is
    left to run them.
    """
    root = pytester.path
    args = run_args(root, held=("a", "b") if node_a == "busy" else ("b",))

    def ready() -> bool:
        if len(waiting(root, "b")) < 2:
            return False  # b's workers are not both in their first item yet
        if node_a == "busy":  # a's workers are in their first item too
            return len(waiting(root, "a")) == 2
        on_a = [s["model"] for s in starts(fake_vllm) if s["host"] == "a"]
        finished = {i for i, e in manifest_items(root).items() if e["status"] == "finished"}
        return len(on_a) == 2 and {f"{m}-qa-seed{s}" for m in on_a for s in SEEDS} <= finished

    def then() -> None:
        if node_a == "busy":
            release(root, "a")

    result = lose_node_b(pytester, ssh_nodes["b"], args, ready, then)
    lost = waiting(root, "b")
    output = "\n".join(result.outlines)

    # the run went to its end: no internal error, the usual summary
    assert "INTERNALERROR" not in output, output
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    assert "modelbench summary" in output, output

    # each of b's workers failed the item it was running, naming itself and node b; with node
    # a done, the items b's workers held failed too, saying why
    assert sorted(lost) == ["gw2", "gw3"]  # the second --tx group
    failed: set[str] = set()
    for worker, model in lost.items():
        assert f"[{worker}] node down: " in output, output
        running = failed_items(
            output, f"worker '{worker}' on node b went away while running {{item}}"
        )
        held = failed_items(
            output,
            f"not run: worker '{worker}' on node b went away before it started {{item}}, "
            "and no other worker is left to run it",
        )
        assert len(running) == 1, output
        assert len(held) == (1 if node_a == "done" else 0), output
        assert all(item.startswith(f"{model}-") for item in running + held), output
        failed.update(running + held)
    result.assert_outcomes(passed=len(ITEMS) - len(failed), failed=len(failed))
    if node_a == "done":
        assert failed == {i for i in ITEMS if i.split("-")[0] in lost.values()}

    # nothing started on b after it went away (no second login), no server there ever
    # answered; with node a busy, it served b's models too, for the items b held
    assert ssh_nodes["b"].logins() == 2
    servers = starts(fake_vllm)
    assert {s["host"] for s in servers} == {"a"}
    assert all(s["gpus"] in HOSTS["a"] for s in servers), servers
    if node_a == "busy":
        assert sorted(s["model"] for s in servers) == sorted(MODELS)

    # no example was asked twice (lost items were not retried); the others ran in full, once
    asked = chat_requests(root)
    assert set(asked.values()) == {1}
    finished = {i for i, e in manifest_items(root).items() if e["status"] == "finished"}
    assert finished == set(ITEMS) - failed
    for item in finished:
        rows = (root / "shared" / "runs" / "sweep" / item / "results.jsonl").read_text()
        assert len(rows.splitlines()) == EXAMPLES


@pytest.mark.slow
def test_an_idle_ssh_node_serves_the_item_running_on_the_other(
    pytester: pytest.Pytester,
    fake_vllm: Path,
    ssh_nodes: dict[str, Node],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicas across nodes over real ssh: one large item, two nodes of two workers. The
    workers of the other node find the controller's exchange where their ssh session came
    from (``$SSH_CONNECTION``), start the item's model on their own GPUs, and answer a share
    of its requests; every example is asked once and nothing is left running."""
    from tests.serving.test_replicas import BIG

    root = pytester.path
    specs = _big_item_on_two_nodes(root)
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "-k", "big", "--dist", "load", *specs,
        "--run-id", "r", "-p", "no:cacheprovider", timeout=180,
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    servers = starts(fake_vllm)
    keeper = servers[0]  # the first to start: the item's own
    others = [s for s in servers if s["host"] != keeper["host"]]
    assert others, servers  # the other node served it too
    assert all(s["gpus"] in HOSTS[s["host"]] for s in servers)  # each on its own node's GPU
    big = {s["gpus"]: [r for r in requests_of(root, s["gpus"]) if "big" in r.key] for s in servers}
    assert sum(map(len, big.values())) == BIG  # every example once
    assert sum(len(big[s["gpus"]]) for s in others) >= BIG // 10, {
        g: len(v) for g, v in big.items()
    }
    for server in servers:  # no orphans, on either node
        with pytest.raises(ProcessLookupError):
            os.kill(server["pid"], 0)


def requests_of(root: Path, gpu: str) -> list[Any]:
    from pytest_modelbench.testing import read_log

    path = root / f"requests-gpu{gpu}.jsonl"
    return read_log(path) if path.exists() else []


# -- what listens on the network -------------------------------------------------------------

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # on ``lo`` every packet is seen going out and coming in: keep one


class Capture:
    """Every TCP payload on the loopback interface (where the two nodes' traffic runs), from
    a packet socket (``AF_PACKET``, which needs ``CAP_NET_RAW``), by (source, destination)
    port."""

    def __init__(self) -> None:
        self.flows: dict[tuple[int, int], bytearray] = {}
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        with contextlib.suppress(OSError):  # as root: a buffer that no burst overruns
            self._sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
        self._sock.bind(("lo", 0))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                frame, address = self._sock.recvfrom(1 << 18)
            except TimeoutError:
                continue
            if address[2] != PACKET_OUTGOING:
                self._add(frame)

    def _add(self, frame: bytes) -> None:
        kind, packet = int.from_bytes(frame[12:14], "big"), frame[14:]
        if kind == 0x0800 and packet[9] == 6:  # IPv4, TCP
            segment = packet[(packet[0] & 0x0F) * 4 : int.from_bytes(packet[2:4], "big")]
        elif kind == 0x86DD and packet[6] == 6:  # IPv6, TCP (no extension headers on lo)
            segment = packet[40 : 40 + int.from_bytes(packet[4:6], "big")]
        else:
            return
        ports = (int.from_bytes(segment[0:2], "big"), int.from_bytes(segment[2:4], "big"))
        payload = segment[(segment[12] >> 4) * 4 :]
        if payload:
            self.flows.setdefault(ports, bytearray()).extend(payload)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()

    def to_and_from(self, ports: set[int], but: set[int]) -> dict[tuple[int, int], bytes]:
        """The flows that one of ``ports`` serves, both directions, but those of clients
        on ports ``but``."""
        return {
            p: bytes(data) for p, data in self.flows.items() if ports & set(p) and not but & set(p)
        }


@dataclass(frozen=True)
class Listener:
    """A listening socket of a process of the session, outside loopback."""

    pid: int
    host: str
    port: int

    @property
    def address(self) -> tuple[str, int]:
        """Where a client on this node reaches it."""
        wildcard = {"0.0.0.0": "127.0.0.1", "::": "::1"}
        return wildcard.get(self.host, self.host), self.port


def network_listeners(roots: set[int]) -> set[Listener]:
    """The sockets that processes below ``roots`` listen on, outside loopback."""
    import ipaddress

    import psutil

    found: set[Listener] = set()
    for pid in set().union(*(descendants(r) for r in roots)):
        with contextlib.suppress(psutil.Error):  # it exited meanwhile
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                host = str(conn.laddr.ip)
                if conn.status == psutil.CONN_LISTEN and not ipaddress.ip_address(host).is_loopback:
                    found.add(Listener(pid, host, int(conn.laddr.port)))
    return found


@dataclass(frozen=True)
class Probe:
    """What a client without the session's certificate got from one listener."""

    plain_http: bytes | None  # the answer to plain HTTP (None: the connection closed)
    issuer: str | None  # the CN of the issuer of the certificate it showed over TLS
    over_tls: bytes | None  # the answer to a request over TLS without a client certificate
    ports: frozenset[int]  # the probe's own ports (its traffic is no session's)


def probe(listener: Listener) -> Probe | None:
    """Ask ``listener`` as a stranger would; None when it no longer listens."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    request = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    try:
        plain = socket.create_connection(listener.address, timeout=5)
    except ConnectionRefusedError:
        return None
    ports = {plain.getsockname()[1]}
    with plain:
        plain.sendall(request)
        plain_answer = read_all(plain)
    stranger = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts anything, shows no certificate
    stranger.check_hostname = False
    stranger.verify_mode = ssl.CERT_NONE
    issuer = tls_answer = None
    refused = (ConnectionRefusedError, ssl.SSLError, ConnectionResetError)
    with (
        contextlib.suppress(*refused),
        stranger.wrap_socket(socket.create_connection(listener.address, timeout=5)) as tls,
    ):
        ports.add(tls.getsockname()[1])
        der = tls.getpeercert(binary_form=True)
        if der is not None:
            name = x509.load_der_x509_certificate(der).issuer
            issuer = str(name.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)
        tls.sendall(request)
        tls_answer = read_all(tls)
    return Probe(plain_answer or None, issuer, tls_answer or None, frozenset(ports))


def read_all(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):  # reset, a TLS alert: what came before is the answer
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vllm", "command"])
def test_nothing_listens_on_the_network_in_clear(
    pytester: pytest.Pytester, fake_vllm: Path, ssh_nodes: dict[str, Node], engine: str
) -> None:
    """Two nodes over real ssh, one large item that both serve (as in the test above). While
    the session runs, every socket a process of it listens on outside loopback (the
    controller's exchange, the item's server, the servers the other node starts for it:
    vLLM's own, or the TLS fronts of a ``command`` engine that stays on loopback) answers
    neither plain HTTP nor TLS from a client without the session's certificate, and shows a
    certificate of the session's CA; a capture of the interface the nodes talk over holds no
    bearer token going to or from those sockets, only TLS."""
    from tests.serving.test_exchange import command_engine
    from tests.serving.test_replicas import BIG

    if os.geteuid() != 0:
        pytest.skip("the capture needs a packet socket (CAP_NET_RAW): run as root")
    root = pytester.path
    specs = _big_item_on_two_nodes(root)
    if engine == "command":
        command_engine(root)
    args = [
        "benchmarks/", "--model", "m1", "-k", "big", "--dist", "load", *specs,
        "--run-id", "r", "-p", "no:cacheprovider",
    ]  # fmt: skip
    done: list[pytest.RunResult | BaseException] = []

    def run() -> None:
        try:
            done.append(pytester.runpytest_subprocess(*args, timeout=180))
        except BaseException as exc:  # raised again below, in the test's thread
            done.append(exc)

    probes: dict[Listener, Probe] = {}
    capture = Capture()
    thread = threading.Thread(target=run)
    try:
        thread.start()
        while thread.is_alive():  # the session's processes: below this test's (sshd's too)
            for listener in network_listeners({os.getpid()}) - probes.keys():
                found = probe(listener)
                if found is not None:
                    probes[listener] = found
            time.sleep(0.05)
    finally:
        thread.join()
        capture.close()
    (result,) = done
    if isinstance(result, BaseException):
        raise result
    result.assert_outcomes(passed=1)

    # the item's server and the other node's servers (they listen on every interface) and
    # the exchange (in the controller, which runs no server) were all found listening
    servers = starts(fake_vllm)
    if engine == "vllm":
        networked = {s["pid"] for s in servers if s["bind"] == "0.0.0.0"}
    else:  # the engine on loopback, its front in the worker that started it
        assert all(s["bind"] == "127.0.0.1" and not s["keyed"] for s in servers), servers
        networked = {s["ppid"] for s in servers}
        servers = [{**s, "pid": s["ppid"]} for s in servers]
    assert {s["host"] for s in servers if s["pid"] in networked} == set(HOSTS), servers
    missed = networked - {p.pid for p in probes}
    assert len(missed) < len(networked), (servers, probes)  # found listening, live
    # one that started and stopped between two looks of the probe loop (a replica near the
    # end): its own record says it served TLS, required client certificates and the key
    late = [s for s in servers if s["pid"] in missed]
    assert all(s.get("tls") and s.get("client_certs") and s["keyed"] for s in late), late
    assert {p.pid for p in probes} - networked, probes  # the exchange
    # none answers a stranger: no HTTP in clear, nothing over TLS without the certificate
    for listener, found in probes.items():
        assert found.plain_http is None or not found.plain_http.startswith(b"HTTP/"), listener
        assert found.issuer == "modelbench session CA", (listener, found)
        assert found.over_tls is None or b"HTTP/" not in found.over_tls, (listener, found)

    # the nodes' traffic to those sockets was all TLS, and carried no bearer token in clear
    ours = set().union(*(found.ports for found in probes.values()))
    flows = capture.to_and_from({p.port for p in probes}, but=ours)
    keys = {s["key"] for s in servers if s["pid"] in networked and s["key"]}  # vLLM's
    assert sum(map(len, flows.values())) > BIG * 100, "the capture saw the item's requests"
    for ports, data in flows.items():
        assert data[:1] == b"\x16", ports  # each direction opens with a TLS handshake record
        assert b"Bearer" not in data and not any(k.encode() in data for k in keys), ports


def _big_item_on_two_nodes(root: Path) -> list[str]:
    """The replicas project in ``root``, and the ``--tx`` flags of both nodes (two workers each),
    their fake engines slow enough (0.1 s, 4 slots) for one big item to need both."""
    from tests.serving.test_replicas import write_project

    write_project(root, costs={"big": 1000, "small": 200})
    extra = "//env:FAKE_VLLM_LATENCY=0.1//env:FAKE_VLLM_SLOTS=4//env:FAKE_VLLM_LOG_PER_SERVER=1"
    specs: list[str] = []
    for host in HOSTS:
        flag, spec = tx(root, host)
        specs += [flag, spec + extra]
    return specs
