"""The one blocking HTTP helper: every answer a Reply, no answer Unreachable, proxies only
when asked for."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from pytest_modelbench.running import blocking


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, object]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append(
            {
                "method": self.command,
                "path": self.path,  # absolute (http://...) when sent to a proxy
                "auth": self.headers.get("Authorization"),
                "body": body,
            }
        )
        status = 404 if self.path.endswith("/missing") else 200
        payload = json.dumps({"path": self.path}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict[str, object]]]]:
    seen: list[dict[str, object]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def _dead_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again: nothing listens there


def test_an_error_status_is_a_reply_with_its_body(
    server: tuple[str, list[dict[str, object]]],
) -> None:
    url, _ = server
    reply = blocking.request(f"{url}/v1/missing")
    assert (reply.status, reply.reason) == (404, "Not Found")
    assert json.loads(reply.body) == {"path": "/v1/missing"}
    assert blocking.get(f"{url}/health") == (200, b'{"path": "/health"}')


def test_a_post_carries_its_body_and_headers(server: tuple[str, list[dict[str, object]]]) -> None:
    url, seen = server
    reply = blocking.request(
        f"{url}/want", method="POST", headers={"Authorization": "Bearer t"}, data=b'{"a": 1}'
    )
    assert reply.status == 200
    assert seen == [{"method": "POST", "path": "/want", "auth": "Bearer t", "body": b'{"a": 1}'}]


def test_nothing_listening_is_unreachable_and_get_says_none() -> None:
    url = f"http://127.0.0.1:{_dead_port()}/health"
    with pytest.raises(blocking.Unreachable) as info:
        blocking.request(url, timeout_s=2.0)
    assert "refused" in info.value.reason.lower()
    assert blocking.get(url) is None
    with pytest.raises(blocking.Unreachable):
        blocking.request("not a url")


def test_direct_calls_ignore_the_proxy_and_others_use_it(
    server: tuple[str, list[dict[str, object]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, seen = server  # the recording server plays the proxy: it sees absolute URLs
    target = "http://192.0.2.7:9/v1/models"  # TEST-NET-1: nothing answers there
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    with pytest.raises(blocking.Unreachable):  # straight to the address, not via the proxy
        blocking.request(target, timeout_s=0.3)
    assert seen == []
    reply = blocking.request(target, direct=False)
    assert reply.status == 200
    assert [s["path"] for s in seen] == [target]
    # a loopback address never goes through a proxy, which cannot reach it (and would get
    # the call's key)
    for host in ("127.0.0.1", "localhost", "[::1]"):
        with pytest.raises(blocking.Unreachable):
            blocking.request(f"http://{host}:{_dead_port()}/v1/models", direct=False)
    assert len(seen) == 1


class _Odd(http.server.BaseHTTPRequestHandler):
    """A redirect elsewhere, a body cut short, and not HTTP at all."""

    def do_GET(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://192.0.2.7:9/steal")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/short":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"only this")
        else:
            self.wfile.write(b"SSH-2.0-OpenSSH_9.2\r\n")

    def log_message(self, *args: object) -> None:
        pass


def test_a_redirect_is_the_answer_and_a_broken_answer_is_unreachable() -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Odd)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        reply = blocking.request(f"{url}/redirect", headers={"Authorization": "Bearer k"})
        assert reply.status == 302  # not followed: the key is not carried elsewhere
        for path in ("/short", "/ssh"):
            with pytest.raises(blocking.Unreachable):
                blocking.request(url + path, timeout_s=2.0)
            assert blocking.get(url + path) is None
    finally:
        httpd.shutdown()
        httpd.server_close()
