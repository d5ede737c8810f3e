"""Stream timing with a scripted stand-in for the engine (only the `ServingEngine` boundary is
faked; uvicorn, the app and the SDK client are real): pings during silence, admission errors
that arrive late, and cancellation when the stream ends early."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from stream_grammar import check_stream

from mlxlaunch.engine.types import (
    Admitted,
    Done,
    EngineEvent,
    GenerationFailed,
    GenerationRequest,
    ModelInfo,
    Progress,
    TextDelta,
    Usage,
)
from mlxlaunch.protocol.sse import parse_frames
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server

Step = tuple[float, EngineEvent | Exception]  # (delay before, event or error to raise)


class TimedEngine:
    """Plays a list of (delay, event) steps for each request; records cancellations."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.cancelled: list[str] = []
        self.closed_early = 0

    @property
    def model_info(self) -> ModelInfo | None:
        return ModelInfo(id="timed", path="/nowhere", context_window=1000)

    def model_info_for(self, model_id: str) -> ModelInfo | None:
        return self.model_info

    async def submit(self, req: GenerationRequest) -> AsyncIterator[EngineEvent]:
        finished = False
        try:
            for delay, item in self.steps:
                await asyncio.sleep(delay)
                if isinstance(item, Exception):
                    raise item
                yield item
            finished = True
        finally:
            if not finished:
                self.closed_early += 1

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    async def count_tokens(self, req: GenerationRequest) -> int:
        return 1


@pytest.fixture
def timed() -> Iterator[tuple[TimedEngine, ServerHandle]]:
    engine = TimedEngine()
    server = start_server(engine, ServerSettings(heartbeat_s=0.05, admission_grace_s=0.05))
    try:
        yield engine, server
    finally:
        server.stop()


BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 5,
    "messages": [{"role": "user", "content": "x"}],
    "stream": True,
}
DONE = Done(stop_reason="end_turn", usage=Usage(3, 0, 1))


def test_pings_while_waiting_and_prefilling(timed: tuple[TimedEngine, ServerHandle]) -> None:
    engine, server = timed
    engine.steps = [
        (0.3, Admitted("r", 3, 0, 5)),  # admission slower than the grace period
        *[(0.03, Progress(i, 10)) for i in range(10)],  # steady progress, no output
        (0.0, TextDelta("hi")),
        (0.0, DONE),
    ]
    response = httpx.post(server.url + "/v1/messages", json=BODY, timeout=10)
    summary = check_stream(parse_frames(response.text))
    types = summary.event_types
    assert types.index("message_start") > 0 and types[0] == "ping"  # silence before admission
    start = types.index("message_start")
    first_block = types.index("content_block_start")
    assert "ping" in types[start:first_block]  # progress events alone do not hide the silence
    assert summary.blocks == [{"type": "text", "text": "hi"}]


def test_failure_after_grace_is_an_error_event(timed: tuple[TimedEngine, ServerHandle]) -> None:
    engine, server = timed
    engine.steps = [(0.3, GenerationFailed("boom"))]
    response = httpx.post(server.url + "/v1/messages", json=BODY, timeout=10)
    assert response.status_code == 200
    summary = check_stream(parse_frames(response.text))
    assert summary.error == {"type": "api_error", "message": "generation failed: boom"}
    non_streaming = httpx.post(
        server.url + "/v1/messages", json={**BODY, "stream": False}, timeout=10
    )
    assert non_streaming.status_code == 500
    assert non_streaming.json()["error"]["type"] == "api_error"


def test_stream_ending_without_done_is_an_error(timed: tuple[TimedEngine, ServerHandle]) -> None:
    engine, server = timed
    engine.steps = [(0.0, Admitted("r", 3, 0, 5)), (0.0, TextDelta("partial"))]
    response = httpx.post(server.url + "/v1/messages", json=BODY, timeout=10)
    summary = check_stream(parse_frames(response.text))
    assert summary.error is not None and "message_stop" not in summary.event_types


def test_leaving_mid_stream_cancels(timed: tuple[TimedEngine, ServerHandle]) -> None:
    engine, server = timed
    engine.steps = [(0.0, Admitted("r", 3, 0, 5)), (0.0, TextDelta("a")), (30.0, DONE)]
    with httpx.stream("POST", server.url + "/v1/messages", json=BODY, timeout=10) as response:
        for line in response.iter_lines():
            if "text_delta" in line:
                break
    for _ in range(100):
        if engine.cancelled and engine.closed_early:
            break
        time.sleep(0.02)
    assert len(engine.cancelled) == 1 and engine.cancelled[0].startswith("msg_")
    assert engine.closed_early == 1
