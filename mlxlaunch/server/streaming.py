"""Reading the engine's event iterator with deadlines, so handlers can send heartbeats.

`EventPump.next(timeout)` waits for the next engine event without cancelling the pending read
when the deadline passes (cancelling it would cancel the request inside the engine).
`TrailingStreamingResponse` and `cache_headers` report prefix-cache reuse in HTTP headers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Final

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from mlxlaunch.engine.types import Admitted, EngineEvent


class _End:
    """Marks the end of the engine's iterator (StopAsyncIteration cannot cross a Task)."""


END: Final = _End()


class EventPump:
    """Pulls events from one engine request's iterator, one pending read at a time."""

    def __init__(self, events: AsyncIterator[EngineEvent]) -> None:
        self._events = events
        self._pending: asyncio.Task[EngineEvent | _End] | None = None
        self.ended = False

    async def next(self, timeout: float | None) -> EngineEvent | _End | None:
        """The next event, `END` when the iterator is exhausted, or None if `timeout` seconds
        passed first (the read stays pending for the next call). Engine errors propagate."""
        if self._pending is None:
            self._pending = asyncio.create_task(self._read())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return None
        task, self._pending = self._pending, None
        result = task.result()
        if isinstance(result, _End):
            self.ended = True
        return result

    async def _read(self) -> EngineEvent | _End:
        try:
            return await anext(self._events)
        except StopAsyncIteration:
            return END

    async def aclose(self) -> None:
        """Stop reading and close the engine iterator; safe to call while being cancelled."""
        with anyio.CancelScope(shield=True):
            pending, self._pending = self._pending, None
            if pending is not None:
                pending.cancel()
                await asyncio.wait({pending})
                if not pending.cancelled():
                    pending.exception()  # consumed so asyncio does not log it
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()


# Prefix-cache reuse, visible without parsing bodies (see README, "What the server speaks").
log = logging.getLogger("mlxlaunch.server")

CACHED_TOKENS_HEADER = "x-cached-tokens"
CLAMPED_HEADER = "x-mlx-max-tokens-clamped"
SESSION_CACHE_HEADER = "x-session-cache"
CACHE_REUSED_HEADER = "x-cache-reused"
TRAILERS_EXTENSION = "http.response.trailers"


def clamp_headers(event: EngineEvent | _End | None) -> dict[str, str]:
    """The clamp header for an Admitted event whose max_tokens was lowered to fit."""
    if isinstance(event, Admitted) and event.clamped:
        return {CLAMPED_HEADER: str(event.max_tokens)}
    return {}


async def cancel_on_disconnect(
    request: Request, cancel: Callable[[str], None], request_id: str
) -> None:
    """Call `cancel(request_id)` as soon as the client disconnects. For answers sent whole
    at the end: until then only the receive side tells that the client left."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            log.info("%s: client disconnected; cancelling", request_id)
            cancel(request_id)
            return


def cache_headers(event: EngineEvent | _End | None) -> dict[str, str]:
    """X-Cached-Tokens, X-Session-Cache (prefix_hit | partial | fresh) and X-Cache-Reused (the
    reused fraction of the prompt, three decimals) for an Admitted event.

    The engine fixes a request's reused prefix at admission, so these are final values.
    """
    if not isinstance(event, Admitted):
        return {}
    reuse = event.cache_reuse or ("prefix_hit" if event.cached_tokens > 0 else "fresh")
    return {
        CACHED_TOKENS_HEADER: str(event.cached_tokens),
        SESSION_CACHE_HEADER: reuse,
        CACHE_REUSED_HEADER: reused_fraction(event.cached_tokens, event.prompt_tokens),
    }


def reused_fraction(cached_tokens: int, prompt_tokens: int) -> str:
    """`cached / prompt` to three decimals, rounded down: a prompt always prefills at least
    one token, so it never reads 1.000."""
    if prompt_tokens <= 0:
        return "0.000"
    thousandths = min(1000, max(0, cached_tokens * 1000 // prompt_tokens))
    return f"{thousandths // 1000}.{thousandths % 1000:03d}"


class TrailingStreamingResponse(StreamingResponse):
    """A streaming response that announces trailers (`Trailer:`) and sends them at the end.

    Trailers go out only where the ASGI server offers the `http.response.trailers` extension:
    uvicorn (0.54) does for HTTP/2 but not for HTTP/1.1, where clients see the announcement
    only — the same figure is in the stream's `message_start` usage and, when the request was
    admitted before the response started, in the headers.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        trailers: Callable[[], dict[str, str]],
        trailer_names: tuple[str, ...],
        headers: dict[str, str],
        media_type: str,
    ) -> None:
        super().__init__(
            content, headers={**headers, "trailer": ", ".join(trailer_names)}, media_type=media_type
        )
        self._trailers = trailers
        self._send_trailers = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._send_trailers = TRAILERS_EXTENSION in (scope.get("extensions") or {})
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        if not self._send_trailers:
            await super().stream_response(send)
            return
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers, "trailers": True})
        async for chunk in self.body_iterator:
            body = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        trailers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self._trailers().items()]
        await send({"type": TRAILERS_EXTENSION, "headers": trailers, "more_trailers": False})
