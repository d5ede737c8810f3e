"""Engine stats over HTTP: a JSON snapshot (`GET /v1/stats`) and a live SSE stream of them
(`GET /v1/stats/stream`, one `stats` event about once a second) for `mlx dash`, plus the
Prometheus scrape (`GET /metrics`) over the same snapshots.

The body is the stats wire type (`protocol/stats.py`), made from `engine.stats()` by
`server/stats_snapshot.py`; `server/metrics.py` reads the same snapshots, so the three routes
always agree.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mlxlaunch.protocol.sse import frame
from mlxlaunch.protocol.stats import STATS_EVENT, StatsSnapshot
from mlxlaunch.server.metrics import MetricsRoute
from mlxlaunch.server.stats_snapshot import StatsReader
from mlxlaunch.server.streaming import ClosingStreamingResponse

Handler = Callable[[Request], Awaitable[Response]]
Guard = Callable[[Handler], Handler]

STREAM_INTERVAL_S = 1.0

# Every StatsRoutes alive, so a stopping server can end its streams (see `close_streams`).
_ROUTES: weakref.WeakSet[StatsRoutes] = weakref.WeakSet()


def sse_frame(snapshot: StatsSnapshot) -> bytes:
    """One `stats` event in SSE framing."""
    return frame(STATS_EVENT, snapshot.model_dump(mode="json"))


class StatsRoutes:
    """Handlers for the snapshot and the stream, over one engine's snapshots.

    Args:
        reader: the engine's snapshots; when it has none (an engine without `stats()`), the
            routes answer 503.
        interval_s: seconds between two events of the stream.
    """

    def __init__(self, reader: StatsReader, *, interval_s: float = STREAM_INTERVAL_S) -> None:
        self.reader = reader
        self.interval_s = interval_s
        # Set from any thread to end open streams at once (a server that stops would otherwise
        # wait its graceful-shutdown timeout for a dashboard's never-ending response).
        self.closing = threading.Event()
        _ROUTES.add(self)

    async def snapshot(self, request: Request) -> Response:
        data = self.reader.read()
        if data is None:
            return _unavailable()
        return JSONResponse(data.model_dump(mode="json"))

    async def stream(self, request: Request) -> Response:
        if self.reader.read() is None:
            return _unavailable()
        return ClosingStreamingResponse(
            self._events(request),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    def close_streams(self) -> None:
        """End every open stream within one interval (thread-safe)."""
        self.closing.set()

    async def _events(self, request: Request) -> AsyncIterator[bytes]:
        while not self.closing.is_set():
            data = self.reader.read()
            if data is None:
                return
            yield sse_frame(data)
            if await _disconnected_within(request, self.interval_s, self.closing):
                return


async def _disconnected_within(request: Request, seconds: float, closing: threading.Event) -> bool:
    """Wait up to `seconds`; True as soon as the client is gone or the streams are closing."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if closing.is_set() or await request.is_disconnected():
            return True
        await asyncio.sleep(min(0.2, left))
    return closing.is_set()


def close_streams(engine: object) -> None:
    """End the open stats streams of every app serving `engine` (call before stopping it)."""
    for routes in list(_ROUTES):
        if routes.reader.engine is engine:
            routes.close_streams()


def _unavailable() -> Response:
    body = {
        "type": "error",
        "error": {"type": "api_error", "message": "this engine does not report stats"},
    }
    return JSONResponse(body, status_code=503)


def stats_routes(
    engine: object,
    guard: Guard,
    *,
    model_id: str | None = None,
    excerpts: bool = False,
    interval_s: float = STREAM_INTERVAL_S,
) -> list[Route]:
    """The stats and metrics routes, each wrapped by `guard` (the app's auth and errors).

    Args:
        engine: the engine whose `stats()` they report.
        guard: wraps each handler (auth, error envelope).
        model_id: the name the model is listed under (None: its path's last part).
        excerpts: share cache-miss prompt excerpts (other clients' prompt text) when the
            engine kept them (`EngineConfig.debug_cache`).
        interval_s: seconds between two events of the stream.
    """
    reader = StatsReader(engine, model_id=model_id, excerpts=excerpts)
    stats = StatsRoutes(reader, interval_s=interval_s)
    metrics = MetricsRoute(reader.read)
    return [
        Route("/v1/stats", guard(stats.snapshot), methods=["GET"]),
        Route("/v1/stats/stream", guard(stats.stream), methods=["GET"]),
        Route("/metrics", guard(metrics.metrics), methods=["GET"]),
    ]
