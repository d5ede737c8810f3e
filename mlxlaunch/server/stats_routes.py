"""Engine stats over HTTP: a JSON snapshot (`GET /v1/stats`) and a live SSE stream of them
(`GET /v1/stats/stream`, one `stats` event about once a second) for `mlx dash`.

The snapshot is built from whatever `engine.stats()` holds today: every field of the stats
dataclass is passed through, so fields added later (admission counters, prefix-cache figures,
miss diagnostics) reach clients without a change here. A few derived keys (`cache`,
`last_miss`, `uptime_s`) are filled from the fields that exist, with neutral defaults.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from enum import Enum
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

Handler = Callable[[Request], Awaitable[Response]]
Guard = Callable[[Handler], Handler]

SNAPSHOT_VERSION = 1
STREAM_INTERVAL_S = 1.0

# Names other rooms may give the prefix-cache figures; the first present one wins.
_CACHE_BYTES = ("cache_bytes", "prefix_cache_bytes")
_CACHE_DISK_BYTES = ("cache_disk_bytes", "prefix_cache_disk_bytes", "disk_cache_bytes")
_CACHE_HIT_RATIO = ("cache_hit_ratio", "prefix_hit_ratio")
_MISS_FIELDS = ("last_miss", "cache_miss", "miss_diagnostics", "cache_misses")

# Every StatsRoutes alive, so a stopping server can end its streams (see `close_streams`).
_ROUTES: weakref.WeakSet[StatsRoutes] = weakref.WeakSet()


def plain(value: Any) -> Any:
    """A JSON-safe copy of a stats value: dataclasses become dicts, enums their values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if isinstance(value, Enum):
        return plain(value.value)
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _first(data: Mapping[str, Any], names: tuple[str, ...], default: Any = None) -> Any:
    for name in names:
        if data.get(name) is not None:
            return data[name]
    return default


def build_snapshot(stats: Any, *, started_at: float, now: float | None = None) -> dict[str, Any]:
    """The JSON snapshot of one `EngineStats` (any dataclass with its fields works)."""
    now = time.time() if now is None else now
    data: dict[str, Any] = plain(stats) if stats is not None else {}
    counters: dict[str, Any] = data.get("counters") or {}
    data["counters"] = counters
    data.setdefault("model", None)
    data.setdefault("state", "unloaded")
    data.setdefault("recent", [])
    for key in ("queue_depth", "running", "memory_active_bytes", "memory_cache_bytes"):
        data.setdefault(key, 0)
    for key in ("prefill_tps", "decode_tps"):
        data.setdefault(key, 0.0)

    prompt = int(counters.get("prompt_tokens", 0) or 0)
    cached = int(counters.get("cached_tokens", 0) or 0)
    given: dict[str, Any] = data["cache"] if isinstance(data.get("cache"), dict) else {}
    hit_ratio = _first(given, ("hit_ratio",), _first(data, _CACHE_HIT_RATIO))
    if hit_ratio is None:  # share of prompt tokens served from the prefix cache
        hit_ratio = cached / prompt if prompt else 0.0
    data["cache"] = {
        **given,
        "hit_ratio": float(hit_ratio),
        "cached_tokens": int(given.get("cached_tokens", cached)),
        "bytes": int(_first(given, ("bytes",), _first(data, _CACHE_BYTES, 0))),
        "disk_bytes": int(_first(given, ("disk_bytes",), _first(data, _CACHE_DISK_BYTES, 0))),
    }
    miss = _first(data, _MISS_FIELDS)
    if isinstance(miss, list):
        miss = miss[-1] if miss else None
    data["last_miss"] = miss
    data["version"] = SNAPSHOT_VERSION
    data["time"] = now
    data["uptime_s"] = max(0.0, now - started_at)
    return data


def sse_frame(snapshot: Mapping[str, Any]) -> bytes:
    """One `stats` event in SSE framing."""
    return f"event: stats\ndata: {json.dumps(snapshot, separators=(',', ':'))}\n\n".encode()


class StatsRoutes:
    """Handlers for the snapshot and the stream, bound to one engine.

    Args:
        engine: anything with a `stats()` method (the engine); without one, the routes
            answer 503.
        interval_s: seconds between two events of the stream.
        clock: wall clock for `time` and `uptime_s`.
    """

    def __init__(
        self,
        engine: object,
        *,
        interval_s: float = STREAM_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.interval_s = interval_s
        self.clock = clock
        self.started_at = clock()
        # Set from any thread to end open streams at once (a server that stops would otherwise
        # wait its graceful-shutdown timeout for a dashboard's never-ending response).
        self.closing = threading.Event()
        _ROUTES.add(self)

    def snapshot_now(self) -> dict[str, Any] | None:
        read = getattr(self.engine, "stats", None)
        if not callable(read):
            return None
        return build_snapshot(read(), started_at=self.started_at, now=self.clock())

    async def snapshot(self, request: Request) -> Response:
        data = self.snapshot_now()
        if data is None:
            return _unavailable()
        return JSONResponse(data)

    async def stream(self, request: Request) -> Response:
        if self.snapshot_now() is None:
            return _unavailable()
        return StreamingResponse(
            self._events(request),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    def close_streams(self) -> None:
        """End every open stream within one interval (thread-safe)."""
        self.closing.set()

    async def _events(self, request: Request) -> AsyncIterator[bytes]:
        while not self.closing.is_set():
            data = self.snapshot_now()
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
        if routes.engine is engine:
            routes.close_streams()


def _unavailable() -> Response:
    body = {
        "type": "error",
        "error": {"type": "api_error", "message": "this engine does not report stats"},
    }
    return JSONResponse(body, status_code=503)


def stats_routes(
    engine: object, guard: Guard, *, interval_s: float = STREAM_INTERVAL_S
) -> list[Route]:
    """The stats and metrics routes, each wrapped by `guard` (the app's auth and errors)."""
    from mlxlaunch.server.metrics import MetricsRoute  # metrics import this module's helpers

    stats = StatsRoutes(engine, interval_s=interval_s)
    metrics = MetricsRoute(engine)
    return [
        Route("/v1/stats", guard(stats.snapshot), methods=["GET"]),
        Route("/v1/stats/stream", guard(stats.stream), methods=["GET"]),
        Route("/metrics", guard(metrics.metrics), methods=["GET"]),
    ]
