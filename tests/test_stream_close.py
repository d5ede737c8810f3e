"""A streaming answer whose client went away closes its frames at once (server/streaming.py).

Starlette stops sending at the first failed send and leaves the body iterator to the garbage
collector; ours closes it, so the generator's `finally` (cancel the engine request, log 499)
runs then, not whenever a collection comes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from starlette.requests import ClientDisconnect

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
