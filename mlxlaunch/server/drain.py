"""Stopping the server without cutting anyone off: requests in flight finish, or get an error.

`Drain` wraps the ASGI app. `begin(drain_s)` (any thread) starts the drain: new requests are
answered at once, and requests still running when `drain_s` runs out are cancelled and answered
— a JSON 529 `overloaded_error` if nothing was sent yet; on an SSE stream that has begun, an
`error` event and no `message_stop` (PROTOCOL.md) — so a client sees why, never a cut connection.

Why overloaded_error: the SDKs and Claude Code retry it (a server that restarts serves the retry),
and it says "not your fault" where api_error reads as a bug. Why a cancel scope around the app:
the handlers' `finally` blocks run as for a client that left (the engine request is cancelled),
and no CancelledError reaches uvicorn, which prints one as a ~50-line traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxlaunch.protocol.errors import ErrorType, error_body, status_for
from mlxlaunch.protocol.events import ErrorEvent
from mlxlaunch.protocol.limits import shown
from mlxlaunch.protocol.sse import encode_event

log = logging.getLogger("mlxlaunch.server")

SHUTDOWN_ERROR: ErrorType = "overloaded_error"
SHUTDOWN_MESSAGE = "server is shutting down"
# Endless streams a stopping server ends by itself (the dashboard's stats): not "in flight".
UNCOUNTED_PATHS = frozenset({"/v1/stats/stream"})


def shutdown_event(message: str = SHUTDOWN_MESSAGE) -> bytes:
    """The SSE `error` frame a stream in flight ends with when the server stops."""
    return encode_event(ErrorEvent.model_validate(error_body(SHUTDOWN_ERROR, message)))


def shutdown_response(message: str = SHUTDOWN_MESSAGE) -> tuple[Message, Message]:
    """The ASGI messages of the JSON error answer (529, the Anthropic envelope)."""
    body = json.dumps(error_body(SHUTDOWN_ERROR, message)).encode()
    start: Message = {
        "type": "http.response.start",
        "status": status_for(SHUTDOWN_ERROR),
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body, "more_body": False}


class _ResponseWatch:
    """What the app has sent so far on one response."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.event_stream = False
        self.ended = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.event_stream = any(
                name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                for name, value in message.get("headers", ())
            )
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)


class Drain:
    """ASGI middleware that lets requests finish for a bounded time when the server stops."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: set[anyio.CancelScope] = set()
        self._counted = 0
        self._stopping = False
        self.message = SHUTDOWN_MESSAGE  # what the cut-off requests are told (end_now can say why)
        self.cut = 0  # requests answered with the shutdown error

    @property
    def in_flight(self) -> int:
        """Requests running now, stats streams aside (any thread may read it)."""
        return self._counted

    def begin(self, drain_s: float) -> None:
        """Refuse new requests from now on; cut the running ones after `drain_s` seconds.

        Thread-safe; a second call can only bring the cut closer.
        """
        self._stopping = True
        self._on_loop(lambda loop: loop.call_later(max(0.0, drain_s), self._cut_all))

    def end_now(self, message: str | None = None) -> None:
        """Cut every running request now (thread-safe); `message`: what they are told."""
        if message is not None:
            self.message = message
        self._stopping = True
        self._on_loop(lambda loop: self._cut_all())

    def _on_loop(self, call: Callable[[asyncio.AbstractEventLoop], object]) -> None:
        loop = self._loop
        if loop is None:  # no request ever came: nothing to cut
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed: nothing runs
            loop.call_soon_threadsafe(call, loop)

    def _cut_all(self) -> None:
        for scope in list(self._running):
            scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self._loop = asyncio.get_running_loop()
        if self._stopping:
            await _send_all(send, shutdown_response(self.message))
            return
        watch = _ResponseWatch(send)
        counted = int(scope["path"] not in UNCOUNTED_PATHS)
        with anyio.CancelScope() as cancel:
            self._running.add(cancel)
            self._counted += counted
            try:
                await self.app(scope, receive, watch.send)
            finally:
                self._running.discard(cancel)
                self._counted -= counted
        if cancel.cancelled_caught:
            self.cut += 1
            log.info("%s %s: %s; answered %s", scope["method"], shown(scope["path"]),
                     self.message, SHUTDOWN_ERROR)  # fmt: skip
            await _answer_cut(watch, send, self.message)


async def _answer_cut(watch: _ResponseWatch, send: Send, message: str) -> None:
    """Finish a response whose handler was cancelled, as well as what was sent allows."""
    if watch.ended:
        return
    if not watch.started:
        await _send_all(send, shutdown_response(message))
        return
    end: Message = {"type": "http.response.body", "body": b"", "more_body": False}
    if watch.event_stream:
        body = shutdown_event(message)
        frame: Message = {"type": "http.response.body", "body": body, "more_body": True}
        await _send_all(send, (frame, end))
    else:  # half a JSON body cannot become an error: end it, the client sees it cut short
        await _send_all(send, (end,))


async def _send_all(send: Send, messages: tuple[Message, ...]) -> None:
    with contextlib.suppress(OSError):  # the client left meanwhile (uvicorn's ClientDisconnected)
        for message in messages:
            await send(message)
