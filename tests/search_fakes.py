"""A local search service for tests: one real HTTP server (http.server on a thread) that
speaks SearXNG's JSON API (`GET /search?q=…&format=json`) and Brave's Search API
(`GET /res/v1/web/search?q=…`, `X-Subscription-Token`), with failures on demand.

A pytest plugin (conftest.py): `search_server` is one such server per test module, and
`search_service` the same one reset (answers 200, no delay, no queries seen) for a test."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

BRAVE_TOKEN = "test-brave-token"

# Three hits on three sites, so domain lists have something to keep and to drop.
HITS = [
    {
        "url": "https://ml-explore.github.io/mlx/build/html/index.html",
        "title": "MLX documentation",
        "content": "MLX is an array framework for machine learning on Apple silicon.",
        "publishedDate": "2026-11-30T00:00:00",
    },
    {
        "url": "https://docs.python.org/3/library/asyncio.html",
        "title": "asyncio — Asynchronous I/O",
        "content": "asyncio is a library to write concurrent code.",
    },
    {
        "url": "https://www.example.com/blog/mlx",
        "title": "A blog post on MLX",
        "content": "Notes on running models locally.",
    },
]


@dataclass
class FakeSearch:
    """What the service answers (`status`, a `delay_s` before answering) and what it was
    asked (`queries`, the decoded `q` of each request)."""

    url: str = ""
    status: int = 200
    delay_s: float = 0.0
    queries: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self.status, self.delay_s, self.queries = 200, 0.0, []


def _handler(fake: FakeSearch) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            fake.queries.append(query.get("q", [""])[0])
            if fake.delay_s:
                time.sleep(fake.delay_s)
            if fake.status != 200:
                return self._send(fake.status, {"error": "scripted failure"})
            if parts.path == "/search" and query.get("format") == ["json"]:
                return self._send(200, {"query": query["q"][0], "results": HITS})
            if parts.path == "/res/v1/web/search":
                if self.headers.get("X-Subscription-Token") != BRAVE_TOKEN:
                    return self._send(401, {"error": "bad token"})
                results = [
                    {
                        "url": h["url"],
                        "title": h["title"],
                        "description": h["content"],
                        **({"page_age": h["publishedDate"]} if "publishedDate" in h else {}),
                    }
                    for h in HITS
                ]
                return self._send(200, {"type": "search", "web": {"results": results}})
            return self._send(404, {"error": "not found"})

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the client gave up (a timeout test)
                self.wfile.write(data)

    return Handler


@contextmanager
def fake_search() -> Iterator[FakeSearch]:
    """A running `FakeSearch` on 127.0.0.1 (a free port) for the block."""
    fake = FakeSearch()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def search_server() -> Iterator[FakeSearch]:
    """The module's local search service (for module-scoped fixtures: its URL)."""
    with fake_search() as fake:
        yield fake


@pytest.fixture
def search_service(search_server: FakeSearch) -> FakeSearch:
    """The module's local search service, reset for this test."""
    search_server.reset()
    return search_server
