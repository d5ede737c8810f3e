"""The dashboard's reading of the server: lenient snapshot parsing and the SSE feed."""

from __future__ import annotations

import json

import httpx
import pytest

from mlxlaunch.cli.main import main
from mlxlaunch.dash.feed import ServerAddress, ServerUnreachable, StatsFeed
from mlxlaunch.dash.panels import miss_text, short_id, short_model
from mlxlaunch.dash.snapshot import StatsSnapshot, human_bytes, human_duration


def test_snapshot_parsing_tolerates_missing_and_odd_fields() -> None:
    snap = StatsSnapshot.from_json(
        {"queue_depth": "x", "counters": [], "recent": [{"prompt_tokens": 7}, "junk"], "new": 1}
    )
    assert snap.queue_depth == 0 and snap.completed == 0 and snap.state == "unloaded"
    assert [r.prompt_tokens for r in snap.recent] == [7]
    assert snap.raw["new"] == 1
    assert snap.too_busy == 0


def test_overloaded_counter_is_preferred_for_429s_when_present() -> None:
    counters = {"requests_refused": 5, "requests_overloaded": 2}
    snap = StatsSnapshot.from_json({"counters": counters})
    assert (snap.refused, snap.too_busy) == (5, 2)


def test_formatting_helpers() -> None:
    assert human_bytes(0) == "0 B" and human_bytes(1536) == "1.5 KiB"
    assert human_duration(75) == "1m15s" and human_duration(3725) == "1h02m"
    assert short_model("/a/b/Qwen3-Coder-30B-A3B-Instruct-4bit") == "Qwen3-Coder-30B-A3B…"
    assert short_id("msg_0123456789abcdef0123") == "…789abcdef0123"
    assert short_id("msg_short") == "msg_short"
    assert "No cache miss" in miss_text(None)
    assert "diverged" in miss_text({"reason": "diverged [at] 10"})


def _feed(handler: httpx.MockTransport) -> StatsFeed:
    return StatsFeed(ServerAddress("http://server.test", "t"), transport=handler)


async def test_feed_skips_torn_events_and_reports_the_stream_ending() -> None:
    body = (
        "event: stats\ndata: {not json\n\n"
        f"event: stats\ndata: {json.dumps({'state': 'loaded', 'running': 2})}\n\n"
    )

    def reply(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer t"
        assert request.url.path == "/v1/stats/stream"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    seen = []
    with pytest.raises(ServerUnreachable, match="closed"):
        async for snapshot in _feed(httpx.MockTransport(reply)).follow():
            seen.append(snapshot)
    assert [(s.state, s.running) for s in seen] == [("loaded", 2)]


@pytest.mark.parametrize(
    ("status", "reason"), [(401, "token"), (404, "no stats endpoint"), (500, "HTTP 500")]
)
async def test_feed_explains_refusals(status: int, reason: str) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json={}))
    with pytest.raises(ServerUnreachable, match=reason):
        async for _ in _feed(transport).follow():
            pass
    with pytest.raises(ServerUnreachable, match=reason):
        await _feed(transport).fetch()


def test_dash_command_is_registered(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dash", "--help"]) == 0
    assert "--token" in capsys.readouterr().out
