"""Streaming clients that time one request: Anthropic Messages SSE and OpenAI chat SSE (the
Responses client, Codex's API, is in `codex_session.py`, on the same `timed_stream`).

Time to first token is the time from sending the request to the first content delta (text,
thinking or tool-call input) — what a user waits for — not to the first byte, because servers
send `message_start` or pings before any token exists.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from mlxlaunch.bench.wire import anthropic_body, openai_body
from mlxlaunch.bench.workloads import Conversation
from mlxlaunch.protocol.sse import aiter_frames


@dataclass
class StreamTiming:
    """What one streamed request measured. Times are seconds from sending the request."""

    ttft_s: float | None = None
    token_times: list[float] = field(default_factory=list)  # arrival of each content delta
    total_s: float = 0.0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None
    # The server's id of the answer (Messages `msg_…`, Responses `resp_…`), and the tool calls
    # it made, each [name, arguments as JSON text] (the replay judges them).
    response_id: str | None = None
    calls: list[list[str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Every raw figure, for the JSON report."""
        return {
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "token_times_s": self.token_times,
            "error": self.error,
        }


class Target(Protocol):
    """A server under test: a name and a way to time one request."""

    name: str

    async def measure(self, conversation: Conversation, max_tokens: int) -> StreamTiming: ...

    async def aclose(self) -> None: ...


# Folds one SSE event (its name, its data) into a timing, at the time it arrived.
EventHandler = Callable[[str, str, StreamTiming, float], None]


async def timed_stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    on_event: EventHandler,
    clock: Callable[[], float],
) -> StreamTiming:
    """POST `body` to `url` and fold each SSE event into a timing (`on_event` knows the API's
    grammar); an HTTP error status or a broken connection is recorded, not raised."""
    timing = StreamTiming()
    start = clock()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                timing.error = f"HTTP {response.status_code}: {text[:300]}"
            else:
                async for frame in aiter_frames(response.aiter_lines()):
                    if frame.data:  # an event without data (a bare ping) says nothing
                        on_event(frame.event or "", frame.data, timing, clock() - start)
    except httpx.HTTPError as exc:
        timing.error = f"{type(exc).__name__}: {exc}"
    timing.total_s = clock() - start
    return timing


def content_arrived(timing: StreamTiming, now: float) -> None:
    """A content delta arrived `now`: the first one is the time to first token."""
    if timing.ttft_s is None:
        timing.ttft_s = now
    timing.token_times.append(now)


def on_anthropic_event(event: str, data: str, timing: StreamTiming, now: float) -> None:
    """Fold one Anthropic SSE event into `timing` (usage from message_start / message_delta)."""
    payload = json.loads(data)
    kind = payload.get("type", event)
    if kind == "message_start":
        usage = payload["message"].get("usage") or {}
        cached = usage.get("cache_read_input_tokens") or 0
        created = usage.get("cache_creation_input_tokens") or 0
        timing.prompt_tokens = (usage.get("input_tokens") or 0) + cached + created
        timing.cached_tokens = cached
        timing.response_id = payload["message"].get("id")
    elif kind == "content_block_start":
        block = payload.get("content_block") or {}
        if block.get("type") == "tool_use":
            timing.calls.append([str(block.get("name", "")), ""])
    elif kind == "content_block_delta":
        content_arrived(timing, now)
        delta = payload.get("delta") or {}
        if delta.get("type") == "input_json_delta" and timing.calls:
            timing.calls[-1][1] += delta.get("partial_json") or ""
    elif kind == "message_delta":
        usage = payload.get("usage") or {}
        if usage.get("output_tokens") is not None:
            timing.output_tokens = usage["output_tokens"]
    elif kind == "error":
        timing.error = json.dumps(payload.get("error"))


def on_openai_event(event: str, data: str, timing: StreamTiming, now: float) -> None:
    """Fold one OpenAI chat-completion chunk into `timing` (usage from the last chunk)."""
    if data == "[DONE]":
        return
    payload = json.loads(data)
    for choice in payload.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning") or delta.get("tool_calls"):
            content_arrived(timing, now)
        for call in delta.get("tool_calls") or []:
            index = call.get("index", len(timing.calls))
            while len(timing.calls) <= index:
                timing.calls.append(["", ""])
            function = call.get("function") or {}
            timing.calls[index][0] += function.get("name") or ""
            timing.calls[index][1] += function.get("arguments") or ""
    usage = payload.get("usage")
    if usage:
        timing.prompt_tokens = usage.get("prompt_tokens")
        timing.output_tokens = usage.get("completion_tokens")
        # None when the server does not say (older mlx-lm releases report no cached tokens).
        timing.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if "error" in payload:
        timing.error = json.dumps(payload["error"])


class HttpTarget:
    """A server the benchmark streams from over HTTP: its name, base URL, connections, clock.

    `auth_token`, when given, goes as a bearer token (what Claude Code and Codex send).
    """

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        auth_token: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._auth_token = auth_token
        self._bearer = {"authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(3600.0, connect=10.0))
        self._clock = clock

    async def _stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str], on_event: EventHandler
    ) -> StreamTiming:
        """Post `body` to `path` as a streaming request and time it."""
        url = f"{self.base_url}{path}"
        return await timed_stream(self._client, url, body, headers, on_event, self._clock)

    async def get_json(self, path: str) -> Any:
        """GET `path` (with the bearer token) and read its JSON body; None when the server
        answers anything but 200 or cannot be reached."""
        try:
            response = await self._client.get(f"{self.base_url}{path}", headers=self._bearer)
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._client.aclose()


class AnthropicTarget(HttpTarget):
    """This project's server (or any Anthropic-compatible one), over `POST /v1/messages`."""

    async def measure(self, conversation: Conversation, max_tokens: int) -> StreamTiming:
        """Send one streaming request and time it."""
        return await self.send(anthropic_body(conversation, max_tokens=max_tokens))

    async def send(self, body: dict[str, Any]) -> StreamTiming:
        """Send a streaming request body as a client built it (a replayed agent's) and time it."""
        key = {"anthropic-version": "2023-06-01", "x-api-key": self._auth_token or "bench"}
        return await self._stream("/v1/messages", body, key | self._bearer, on_anthropic_event)


class OpenAITarget(HttpTarget):
    """mlx-lm's own server, over `POST /v1/chat/completions` with `stream: true`."""

    async def measure(self, conversation: Conversation, max_tokens: int) -> StreamTiming:
        """Send one streaming request and time it."""
        body = openai_body(conversation, max_tokens=max_tokens)
        return await self._stream("/v1/chat/completions", body, {}, on_openai_event)
