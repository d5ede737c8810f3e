"""A streaming answer whose client went away closes its frames at once (server/streaming.py).

Starlette stops sending at the first failed send and leaves the body iterator to the garbage
collector; ours closes it, so the generator's `finally` (cancel the engine request, log 499)
runs then, not whenever a collection comes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse

from mlxlaunch.engine.stats import EngineCounters, EngineStats
from mlxlaunch.server.stats_routes import StatsRoutes
from mlxlaunch.server.stats_snapshot import StatsReader
from mlxlaunch.server.streaming import ClosingStreamingResponse, TrailingStreamingResponse


def _frames(closed: list[str]) -> AsyncIterator[bytes]:
    async def frames() -> AsyncIterator[bytes]:
        try:
            for n in range(100):
                yield f"data: {n}\n\n".encode()
        finally:
            closed.append("closed")

    return frames()


async def _gone_after_first_frame(message: dict[str, Any]) -> None:
    if message["type"] == "http.response.body" and message.get("body"):
        raise OSError("the client went away")


async def _receive() -> dict[str, Any]:
    await anyio.sleep_forever()
    return {}


@pytest.mark.parametrize("kind", [ClosingStreamingResponse, TrailingStreamingResponse])
def test_frames_are_closed_when_the_client_goes_away(kind: type) -> None:
    closed: list[str] = []
    frames = _frames(closed)  # held here: the garbage collector cannot be what closes it
    extra = (
        {"trailers": lambda: {}, "trailer_names": ("x",), "headers": {}}
        if kind is TrailingStreamingResponse
        else {}
    )
    response = kind(frames, media_type="text/event-stream", **extra)
    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "extensions": {}}

    async def run() -> None:
        with pytest.raises(ClientDisconnect):
            await response(scope, _receive, _gone_after_first_frame)
        # Inside the loop: at its end asyncio closes every unfinished generator anyway.
        assert closed == ["closed"]
        assert frames is not None

    anyio.run(run)


class _Engine:
    def stats(self) -> EngineStats:
        return EngineStats(
            model=None,
            state="unloaded",
            queue_depth=0,
            running=0,
            counters=EngineCounters(),
            prefill_tps=0.0,
            decode_tps=0.0,
            memory_active_bytes=0,
            memory_cache_bytes=0,
        )


def test_the_stats_stream_closes_its_frames_when_the_client_goes_away() -> None:
    routes = StatsRoutes(StatsReader(_Engine()), interval_s=0.01)
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/stats/stream",
        "headers": [],
        "asgi": {"spec_version": "2.4"},
        "extensions": {},
    }

    async def run() -> None:
        response = await routes.stream(Request(scope, _receive))
        assert isinstance(response, StreamingResponse)
        with pytest.raises(ClientDisconnect):
            await response(scope, _receive, _gone_after_first_frame)
        # A closed async generator has no frame; one left to the collector still has one.
        assert response.body_iterator.ag_frame is None  # type: ignore[attr-defined]

    anyio.run(run)
