"""The dashboard's reading of the server: snapshot parsing and the SSE feed."""

from __future__ import annotations

import json

import httpx
import pytest
from rich.text import Text

from mlxlaunch.cli.main import main
from mlxlaunch.dash.feed import ServerAddress, ServerUnreachable, StatsFeed
from mlxlaunch.dash.panels import miss_text, model_card, requests_card, short_id, short_model
from mlxlaunch.dash.snapshot import human_bytes, human_duration
from mlxlaunch.protocol.stats import (
    CacheMiss,
    MissDigests,
    MissExcerpts,
    ModelStatus,
    StatsSnapshot,
)


def test_snapshot_parsing_ignores_unknown_fields_and_reads_missing_ones_as_zero() -> None:
    body = {
        "counters": {"requests_overloaded": 2},
        "recent": [{"prompt_tokens": 7, "added_later": 1}],
        "added_later": {"x": 1},
    }
    snap = StatsSnapshot.model_validate_json(json.dumps(body))
    assert snap.queue_depth == 0 and snap.counters.requests_completed == 0
    assert snap.model.state == "unloaded" and snap.model.name is None
    assert [r.prompt_tokens for r in snap.recent] == [7]
    assert "429 busy" in requests_card(snap) and snap.counters.requests_overloaded == 2


def test_formatting_helpers() -> None:
    assert human_bytes(0) == "0 B" and human_bytes(1536) == "1.5 KiB"
    assert human_duration(75) == "1m15s" and human_duration(3725) == "1h02m"
    assert short_model("/a/b/Qwen3-Coder-30B-A3B-Instruct-4bit") == "Qwen3-Coder-30B-A3B…"
    assert short_id("msg_0123456789abcdef0123") == "…789abcdef0123"
    assert short_id("msg_short") == "msg_short"
    assert "No cache miss" in miss_text(None)
    miss = CacheMiss(request_id="msg_1", kind="main", position=812, request_tokens=9_870)
    assert "at token 812 of 9,870" in miss_text(miss)
    assert "does not share prompt text" in miss_text(miss)
    assert "digests" not in miss_text(miss)  # an older server's miss: none to show
    hashed = miss.model_copy(update={"digests": MissDigests(before="0a1b2c3d", cached="[b]")})
    assert "before #0a1b2c3d" in Text.from_markup(miss_text(hashed)).plain
    assert "earlier #[b]" in Text.from_markup(miss_text(hashed)).plain
    shared = miss.model_copy(update={"excerpts": MissExcerpts(cached="[b]fix", request="find")})
    shown = Text.from_markup(miss_text(shared)).plain  # markup in a prompt shows as typed
    assert "'[b]fix'" in shown and "'find'" in shown and "does not share" not in shown


def test_models_served_beside_the_main_one_show_in_the_model_card() -> None:
    main = StatsSnapshot(model=ModelStatus(name="qwen3-coder-30b", state="loaded"))
    small = StatsSnapshot(
        model=ModelStatus(name="qwen3-4b", state="loaded"),
        role="small",
        running=1,
        queue_depth=2,
        decode_tps=84.4,
    )
    broken = StatsSnapshot(model=ModelStatus(name="nope"), role="extra", failure="not found")
    card = Text.from_markup(model_card(main.model_copy(update={"models": (main, small, broken)})))
    lines = card.plain.splitlines()
    assert any(
        line.split() == ["haiku", "qwen3-4b", "loaded", "1+2", "84", "tok/s"] for line in lines
    )
    assert any(line.split() == ["extra", "nope", "failed"] for line in lines)
    assert "haiku" not in model_card(main)  # one model: the card as before


def _feed(handler: httpx.MockTransport) -> StatsFeed:
    return StatsFeed(ServerAddress("http://server.test", "t"), transport=handler)


async def test_feed_skips_torn_events_and_reports_the_stream_ending() -> None:
    loaded = {"model": {"state": "loaded"}, "running": 2}
    body = (
        "event: stats\ndata: {not json\n\n"
        "event: other\ndata: {}\n\n"
        f"event: stats\ndata: {json.dumps(loaded)}\n\n"
    )

    def reply(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer t"
        assert request.url.path == "/v1/stats/stream"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    seen = []
    with pytest.raises(ServerUnreachable, match="closed"):
        async for snapshot in _feed(httpx.MockTransport(reply)).follow():
            seen.append(snapshot)
    assert [(s.model.state, s.running) for s in seen] == [("loaded", 2)]


async def test_feed_says_when_the_server_speaks_another_snapshot_shape() -> None:
    version_1 = {"version": 1, "model": "/models/qwen", "state": "loaded"}
    body = f"event: stats\ndata: {json.dumps(version_1)}\n\n"
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=body))
    with pytest.raises(ServerUnreachable, match="another mlxlaunch version"):
        async for _ in _feed(transport).follow():
            pass


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
