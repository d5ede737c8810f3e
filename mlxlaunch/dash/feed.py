"""The dashboard's only link to the server: its stats stream over HTTP (httpx), like any client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from mlxlaunch.dash.snapshot import StatsSnapshot

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
            return StatsSnapshot.from_json(response.json())

    async def follow(self) -> AsyncIterator[StatsSnapshot]:
        """Snapshots as the server streams them; raises ServerUnreachable when it goes away."""
        async with self._client() as client:
            try:
                async with client.stream("GET", STREAM_PATH) as response:
                    if response.status_code != 200:
                        await response.aread()
                        _check(response)
                    async for data in _sse_data(response.aiter_lines()):
                        try:
                            payload = json.loads(data)
                        except json.JSONDecodeError:
                            continue  # a torn or foreign event: skip it, keep following
                        if isinstance(payload, dict):
                            yield StatsSnapshot.from_json(payload)
            except httpx.HTTPError as exc:
                raise ServerUnreachable(_describe(exc)) from exc
        raise ServerUnreachable("the server closed the stats stream")


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` of each SSE event (multi-line data joined with newlines)."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


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
