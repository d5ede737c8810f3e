"""The dashboard's only link to the server: its stats stream over HTTP (httpx), like any client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from mlxlaunch.protocol.sse import aiter_frames
from mlxlaunch.protocol.stats import STATS_EVENT, StatsSnapshot

STREAM_PATH = "/v1/stats/stream"
SNAPSHOT_PATH = "/v1/stats"
# The server sends an event about once a second; this much silence means it is gone or stuck.
SILENCE_S = 6.0


class ServerUnreachable(Exception):
    """The server cannot be reached or refused us; `reason` says why, for the status line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ServerAddress:
    """Where the server is and the token it wants."""

    url: str
    token: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}


class StatsFeed:
    """Snapshots from one server's SSE stats stream.

    Args:
        address: the server's base URL and token.
        silence_s: read timeout; a stream quiet for this long counts as gone.
        transport: test seam for httpx.
    """

    def __init__(
        self,
        address: ServerAddress,
        *,
        silence_s: float = SILENCE_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.address = address
        self.silence_s = silence_s
        self.transport = transport

    def _client(self) -> httpx.AsyncClient:
        timeout = httpx.Timeout(self.silence_s, connect=3.0)
        return httpx.AsyncClient(
            base_url=self.address.url.rstrip("/"),
            headers=self.address.headers,
            timeout=timeout,
            transport=self.transport,
        )

    async def fetch(self) -> StatsSnapshot:
        """One snapshot from `GET /v1/stats`."""
        async with self._client() as client:
            try:
                response = await client.get(SNAPSHOT_PATH)
            except httpx.HTTPError as exc:
                raise ServerUnreachable(_describe(exc)) from exc
            _check(response)
            snapshot = _parse(response.text)
            if snapshot is None:
                raise ServerUnreachable("the server sent a torn stats snapshot")
            return snapshot

    async def follow(self) -> AsyncIterator[StatsSnapshot]:
        """Snapshots as the server streams them; raises ServerUnreachable when it goes away."""
        async with self._client() as client:
            try:
                async with client.stream("GET", STREAM_PATH) as response:
                    if response.status_code != 200:
                        await response.aread()
                        _check(response)
                    async for frame in aiter_frames(response.aiter_lines()):
                        if frame.event != STATS_EVENT:
                            continue  # a foreign event: skip it, keep following
                        snapshot = _parse(frame.data)
                        if snapshot is not None:  # None: a torn event, skipped
                            yield snapshot
            except httpx.HTTPError as exc:
                raise ServerUnreachable(_describe(exc)) from exc
        raise ServerUnreachable("the server closed the stats stream")


def _parse(data: str) -> StatsSnapshot | None:
    """The snapshot in `data`; None when it is not JSON (torn). JSON that is not a snapshot
    means a server of another version: ServerUnreachable says so."""
    try:
        return StatsSnapshot.model_validate_json(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(e["type"] == "json_invalid" for e in errors):
            return None
        where = ".".join(str(part) for part in errors[0]["loc"]) or "snapshot"
        raise ServerUnreachable(
            f"the server's stats do not read as this dashboard's ({where}: {errors[0]['msg']});"
            " is it another mlxlaunch version?"
        ) from exc


def _check(response: httpx.Response) -> None:
    if response.status_code in (401, 403):
        raise ServerUnreachable("the server refused the token (pass --token)")
    if response.status_code == 404:
        raise ServerUnreachable("this server has no stats endpoint (is it an mlx server?)")
    if response.status_code != 200:
        raise ServerUnreachable(f"the server answered HTTP {response.status_code}")


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "the server is not running (connection refused)"
    if isinstance(exc, httpx.TimeoutException):
        return "the server stopped answering"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "the server went away"
    return f"the server cannot be reached ({type(exc).__name__})"
