"""API keys are never written or printed, even when a gateway echoes them back in an error body."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pytest_modelbench.secrets import REDACTED, redact, remember
from tests.conftest import Project

KEY = "sk-live-9f8e7d6c5b4a39281706ABCDEF"


class EchoingGateway(BaseHTTPRequestHandler):
    """Lists the model, then refuses every request, quoting the key it was sent (as some
    gateways do: ``Incorrect API key provided: sk-...``)."""

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, data: object) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, {"object": "list", "data": [{"id": "sim-model", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        sent = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        message = f"Incorrect API key provided: {sent}. Header was Authorization: Bearer {sent}"
        self._send(401, {"error": {"message": message, "type": "invalid_request_error"}})


@pytest.fixture
def gateway() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoingGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_redact_removes_keys_in_use_and_token_looking_strings() -> None:
    remember("a-private-value-42")
    text = redact("key a-private-value-42, Bearer abc.def-123456789 and sk-proj-0123456789abcdef")
    assert "a-private-value-42" not in text and "abc.def-123456789" not in text
    assert "sk-proj-0123456789abcdef" not in text
    assert text.count(REDACTED) == 3
    assert (
        redact("nothing secret here: sk- alone, bearer") == "nothing secret here: sk- alone, bearer"
    )


def test_a_key_echoing_gateway_leaves_no_key_in_any_artifact(
    project: Project, gateway: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_KEY", KEY)
    project.qa("qa", 6)
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    project.models(
        {
            "alpha": {
                "model": "sim-model",
                "api_base_url": gateway,
                "api_key_var": "GATEWAY_KEY",
                "max_retries": 0,
            }
        }
    )
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--junitxml", "junit.xml", "-rA"
    )
    result.assert_outcomes(errors=1)
    output = result.stdout.str() + result.stderr.str()
    assert "Incorrect API key provided" in output  # the error itself is shown...
    assert KEY not in output  # ...without the key
    (run_dir,) = project.run_dirs()
    written = [p for p in project.root.rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"results.jsonl", "run_manifest.json", "report.html", "junit.xml"} <= names
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
    assert "Incorrect API key provided: [REDACTED]" in (
        next(run_dir.rglob("results.jsonl")).read_text()
    )
    _no_key_in_parquet(run_dir / "results.parquet")


def _no_key_in_parquet(path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    if not path.exists():
        return
    for row in pq.read_table(path).to_pylist():
        assert KEY not in json.dumps(row, default=str)
