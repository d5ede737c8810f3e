"""Stopping the server: requests in flight finish or get `server is shutting down`, never a cut.

The drain alone, around small ASGI apps (a stream that never ends, an answer that never comes),
then a real server on a real socket with the tiny model and the anthropic SDK as the client.
`test_serve_shutdown.py` has `mlx serve` and a real Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from mlxlaunch.engine.engine import Engine
from mlxlaunch.protocol.sse import parse_frames
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.drain import SHUTDOWN_MESSAGE, Drain
from mlxlaunch.server.runner import ServerHandle, start_server
from mlxlaunch.testing.scripted import ScriptedOutput

SCOPE: Scope = {"type": "http", "method": "POST", "path": "/v1/messages", "headers": []}
SSE_START: Message = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
}
PING: Message = {
    "type": "http.response.body",
    "body": b"event: ping\ndata: {}\n\n",
    "more_body": True,
}
WAIT_S = 30.0  # a hang, not a measurement


class Responses:
    """The ASGI messages one request's response sent."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])

    @property
    def complete(self) -> bool:
        last = self.messages[-1] if self.messages else {}
        return last.get("type") == "http.response.body" and not last.get("more_body", False)


async def _no_body() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


class EndlessStream:
    """Starts an SSE response and never ends it; records whether its cleanup ran."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cleaned_up = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(SSE_START)
            await send(PING)
            self.started.set()
            await asyncio.Event().wait()
        finally:
            self.cleaned_up = True


async def never_answers(scope: Scope, receive: Receive, send: Send) -> None:
    await asyncio.Event().wait()


async def answers_quickly(scope: Scope, receive: Receive, send: Send) -> None:
    await asyncio.sleep(0.05)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"done", "more_body": False})


async def test_a_stream_still_running_when_the_drain_ends_gets_an_error_event() -> None:
    app = EndlessStream()
    drain = Drain(app)
    out = Responses()
    request = asyncio.create_task(drain(SCOPE, _no_body, out.send))
    await asyncio.wait_for(app.started.wait(), WAIT_S)
    assert drain.in_flight == 1
    drain.begin(0.05)
    await asyncio.wait_for(request, WAIT_S)
    assert app.cleaned_up  # the handler's finally ran, as for a client that left
    assert out.complete and drain.in_flight == 0 and drain.cut == 1
    frames = parse_frames(out.body.decode())
    assert [f.event for f in frames] == ["ping", "error"]  # no message_stop after it
    assert frames[-1].json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": SHUTDOWN_MESSAGE},
    }


async def test_a_request_with_no_answer_yet_gets_a_529_envelope() -> None:
    drain = Drain(never_answers)
    out = Responses()
    request = asyncio.create_task(drain(SCOPE, _no_body, out.send))
    await asyncio.sleep(0.05)
    drain.begin(0.05)
    await asyncio.wait_for(request, WAIT_S)
    assert out.status == 529 and out.complete
    body = json.loads(out.body)
    assert body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": SHUTDOWN_MESSAGE},
    }


async def test_requests_that_finish_within_the_drain_are_untouched_and_new_ones_refused() -> None:
    drain = Drain(answers_quickly)
    first = Responses()
    request = asyncio.create_task(drain(SCOPE, _no_body, first.send))
    await asyncio.sleep(0)
    drain.begin(WAIT_S)
    late = Responses()
    await drain(SCOPE, _no_body, late.send)  # arrives while draining
    await asyncio.wait_for(request, WAIT_S)
    assert first.status == 200 and first.body == b"done"
    assert late.status == 529 and SHUTDOWN_MESSAGE in late.body.decode()
    assert drain.cut == 0


async def test_end_now_cuts_without_waiting_for_the_drain() -> None:
    app = EndlessStream()
    drain = Drain(app)
    out = Responses()
    request = asyncio.create_task(drain(SCOPE, _no_body, out.send))
    await asyncio.wait_for(app.started.wait(), WAIT_S)
    drain.begin(3600)
    drain.end_now()
    await asyncio.wait_for(request, WAIT_S)
    assert parse_frames(out.body.decode())[-1].event == "error"


async def test_the_dashboards_stats_stream_is_not_a_request_in_flight() -> None:
    app = EndlessStream()
    drain = Drain(app)
    stats = {**SCOPE, "method": "GET", "path": "/v1/stats/stream"}
    request = asyncio.create_task(drain(stats, _no_body, Responses().send))
    await asyncio.wait_for(app.started.wait(), WAIT_S)
    assert drain.in_flight == 0  # `stopping: 1 request in flight` would be wrong
    drain.end_now()
    await asyncio.wait_for(request, WAIT_S)


# --- a real server --------------------------------------------------------------------------


@pytest.fixture
def server(engine: Engine, scripted: ScriptedOutput) -> Iterator[ServerHandle]:
    # Thousands of forced tokens (no early EOS): still running when the server stops.
    scripted.enqueue("word " * 20_000)
    handle = start_server(engine, ServerSettings())
    yield handle
    handle.stop(1)


def _stop_soon(handle: ServerHandle, drain_s: float) -> threading.Thread:
    stopper = threading.Thread(target=handle.stop, args=(drain_s,))
    stopper.start()
    return stopper


LONG: dict[str, Any] = {
    "model": "claude-x",
    "max_tokens": 30_000,
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.mark.slow
def test_stopping_the_server_ends_a_running_stream_with_an_overloaded_error_event(
    server: ServerHandle,
) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    seen: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError, match=SHUTDOWN_MESSAGE) as failed,
        client.messages.stream(**LONG) as stream,
    ):
        for event in stream:
            seen.append(event.type)
            if event.type == "content_block_delta" and seen.count(event.type) == 3:
                stopper = _stop_soon(server, 0.5)
    stopper.join(WAIT_S)
    assert not stopper.is_alive() and not server.running
    body = failed.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "overloaded_error"
    assert "message_stop" not in seen


@pytest.mark.slow
def test_a_non_streaming_request_cut_by_the_stop_gets_a_529(server: ServerHandle) -> None:
    answer: list[httpx.Response] = []
    asking = threading.Thread(
        target=lambda: answer.append(
            httpx.post(server.url + "/v1/messages", json=LONG, timeout=WAIT_S * 2)
        )
    )
    asking.start()
    deadline = time.monotonic() + WAIT_S
    while server.in_flight == 0:
        assert time.monotonic() < deadline, "the request never arrived"
        time.sleep(0.02)
    time.sleep(0.3)  # generating by now
    started = time.monotonic()
    server.stop(0.5)
    stop_s = time.monotonic() - started
    asking.join(WAIT_S)
    [response] = answer
    assert response.status_code == 529
    assert response.json()["error"] == {"type": "overloaded_error", "message": SHUTDOWN_MESSAGE}
    assert stop_s < WAIT_S


@pytest.mark.slow
def test_a_second_ctrl_c_while_stopping_ends_the_drain_at_once(server: ServerHandle) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    outcome: list[BaseException] = []

    def stream() -> None:
        try:
            with client.messages.stream(**LONG) as events:
                for _ in events:
                    pass
        except anthropic.APIError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=stream)
    reader.start()
    deadline = time.monotonic() + WAIT_S
    while server.in_flight == 0:
        assert time.monotonic() < deadline, "the request never arrived"
        time.sleep(0.02)
    # Ctrl-C lands on the main thread, here inside stop(): as it does in `mlx serve`.
    ctrl_c = threading.Timer(
        0.5, signal.pthread_kill, args=(threading.main_thread().ident, signal.SIGINT)
    )
    ctrl_c.start()
    started = time.monotonic()
    server.stop(3600)  # a drain nobody waits for
    assert time.monotonic() - started < WAIT_S
    reader.join(WAIT_S)
    [error] = outcome
    assert SHUTDOWN_MESSAGE in str(error)
