"""``modelbench view RUN``: a read-only viewer of a run's examples, served on 127.0.0.1.

For runs whose examples are too large to embed in ``report.html``. It serves the same
page with the examples read from the run store on demand: ``GET /`` is the report,
``GET /api/examples?item=&outcome=&q=&ex=&offset=&limit=`` a page of matching examples
(full text, nothing clipped). Only GET; only loopback, and only requests addressed to it
(the ``Host`` check stops a web page from reading the run through DNS rebinding). Standard
library only: nothing to install.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pytest_modelbench.reporting.examples import PAGE_SIZE, Query, haystack, item_meta, iter_records
from pytest_modelbench.reporting.html import render_report
from pytest_modelbench.reporting.model import load_run
from pytest_modelbench.reporting.rows import parquet_inputs_key

HOST = "127.0.0.1"
DEFAULT_PORT = 8765
MAX_LIMIT = 500


class ExampleIndex:
    """The run's example records in memory, reloaded when a journal changes (cheap check:
    each journal's size and modification time)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._key: str | None = None
        self._items: list[dict[str, Any]] = []
        self._records: list[dict[str, Any]] = []
        self._text: list[str] = []

    def _current(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
        with self._lock:
            run = load_run(self.run_dir)
            key = parquet_inputs_key(run)
            if key != self._key:
                self._records = list(iter_records(run, clip=None))
                self._text = [haystack(r) for r in self._records]
                self._items = item_meta(run)
                self._key = key
            return self._items, self._records, self._text

    def query(self, query: Query, offset: int, limit: int) -> dict[str, Any]:
        """``{"total": matches, "rows": the records offset..offset+limit}``."""
        items, records, text = self._current()
        needle = query.q.lower()
        plain = Query(query.item, query.outcome, "", query.ex)
        found = [
            r
            for r, t in zip(records, text, strict=True)
            if plain.matches(r, items) and (not needle or needle in t)
        ]
        return {"total": len(found), "rows": found[offset : offset + limit]}


def _number(params: Mapping[str, list[str]], name: str, default: int, high: int) -> int:
    try:
        value = int(params.get(name, [str(default)])[0])
    except ValueError:
        return default
    return max(0, min(value, high))


def make_handler(run_dir: Path, index: ExampleIndex, hint: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "modelbench-view"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the terminal shows the address and Ctrl-C only

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _local_host(self) -> bool:
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
            return host in (HOST, "localhost")

        def do_GET(self) -> None:
            if not self._local_host():
                self._send(HTTPStatus.FORBIDDEN, b"only http://127.0.0.1 is served\n", "text/plain")
                return
            url = urlsplit(self.path)
            if url.path == "/":
                page = render_report(load_run(run_dir), examples_source="api", run_hint=hint)
                self._send(
                    HTTPStatus.OK,
                    page.encode("utf-8", "backslashreplace"),
                    "text/html; charset=utf-8",
                )
            elif url.path == "/api/examples":
                params = parse_qs(url.query)
                query = Query(*(params.get(k, [""])[0] for k in ("item", "outcome", "q", "ex")))
                offset = _number(params, "offset", 0, 1 << 31)
                limit = _number(params, "limit", PAGE_SIZE, MAX_LIMIT)
                body = json.dumps(index.query(query, offset, limit), ensure_ascii=False)
                self._send(
                    HTTPStatus.OK, body.encode("utf-8", "backslashreplace"), "application/json"
                )
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

        do_HEAD = do_GET

    return Handler


def make_server(run_dir: Path, port: int = DEFAULT_PORT, hint: str = "") -> ThreadingHTTPServer:
    """The viewer bound to 127.0.0.1:``port`` (0: any free port); call ``serve_forever``."""
    handler = make_handler(run_dir, ExampleIndex(run_dir), hint or run_dir.name)
    server = ThreadingHTTPServer((HOST, port), handler)
    server.daemon_threads = True
    return server
