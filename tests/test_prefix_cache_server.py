"""Prefix-cache reuse over HTTP: usage fields, X-Cached-Tokens / X-Session-Cache, trailers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import served_engine

from mlxlaunch.protocol.sse import parse_frames
from mlxlaunch.server.runner import ServerHandle
from mlxlaunch.server.streaming import TrailingStreamingResponse

TOKEN = "cache-token"
HEADERS = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 8


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerHandle]:
    with served_engine(tiny_model_dir, TOKEN) as (_, handle):
        yield handle


def body(question: str, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4,
        "temperature": 0,
        "stream": stream,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": question}],
    }


def post(server: ServerHandle, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/messages", content=json.dumps(payload), headers=HEADERS, timeout=60
    )


@pytest.mark.slow
def test_json_responses_carry_cached_tokens_headers(server: ServerHandle) -> None:
    fresh = post(server, body("What is a trie? (json)"))
    assert fresh.status_code == 200, fresh.text
    assert fresh.headers["x-session-cache"] == "fresh"
    assert fresh.headers["x-cached-tokens"] == "0"

    hit = post(server, body("What is a heap? (json)"))
    usage = hit.json()["usage"]
    assert hit.headers["x-session-cache"] == "prefix_hit"
    assert int(hit.headers["x-cached-tokens"]) == usage["cache_read_input_tokens"] > 50
    assert usage["input_tokens"] > 0  # the new question, prefilled
    assert fresh.json()["usage"]["cache_read_input_tokens"] == 0


@pytest.mark.slow
def test_streams_announce_the_trailer_and_report_reuse_at_admission(
    server: ServerHandle,
) -> None:
    post(server, body("Prime the cache. (stream)"))
    response = post(server, body("What is a queue? (stream)", stream=True))
    assert response.status_code == 200
    assert response.headers["trailer"].lower() == "x-cached-tokens"
    frames = parse_frames(response.text)
    start = next(json.loads(f.data) for f in frames if f.event == "message_start")
    cached = start["message"]["usage"]["cache_read_input_tokens"]
    assert cached > 50
    # Admitted before the response started: the figure is in the headers as well.
    assert response.headers["x-cached-tokens"] == str(cached)
    assert response.headers["x-session-cache"] == "prefix_hit"


async def test_trailers_are_sent_where_the_server_supports_them() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"event: ping\n\n"

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    cases: list[tuple[dict[str, Any], bool]] = [({"http.response.trailers": {}}, True), ({}, False)]
    for extensions, expect_trailers in cases:
        sent: list[dict[str, Any]] = []

        async def send(message: Any, sent: list[dict[str, Any]] = sent) -> None:
            sent.append(dict(message))

        response = TrailingStreamingResponse(
            chunks(),
            trailers=lambda: {"x-cached-tokens": "42"},
            trailer_names=("x-cached-tokens",),
            headers={},
            media_type="text/event-stream",
        )
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "extensions": extensions}
        await response(scope, receive, send)
        assert (b"trailer", b"x-cached-tokens") in sent[0]["headers"]
        assert sent[0].get("trailers", False) is expect_trailers
        if expect_trailers:
            assert sent[-1] == {
                "type": "http.response.trailers",
                "headers": [(b"x-cached-tokens", b"42")],
                "more_trailers": False,
            }
        else:
            assert sent[-1]["type"] == "http.response.body"
