"""The drive loop every API's handler runs: engine events in, its wire format out.

`submit` starts one engine request and waits (a grace period for a stream) for its first
event, so an early refusal still gets its own HTTP status. Then either `stream_response`
feeds each event to the API's `Encoder` and sends its frames, with a heartbeat during
silence, or `answer_whole` feeds them all and answers with what the encoder built, cancelling
the request when the client disconnects. Both put the admission headers (the clamp and the
cache headers) on the answer, and log the request once (server/request_log.py).

`EventPump.next(timeout)` waits for the next engine event without cancelling the pending read
when the deadline passes (cancelling it would cancel the request inside the engine).
`TrailingStreamingResponse` and `cache_headers` report prefix-cache reuse in HTTP headers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from mlxlaunch.engine.types import Admitted, GenerationRequest
from mlxlaunch.server.errors import ApiError
from mlxlaunch.server.request_log import RequestLog
from mlxlaunch.server.settings import ServerSettings
from mlxlaunch.server.web_search import ServedEvent


class _End:
    """Marks the end of the engine's iterator (StopAsyncIteration cannot cross a Task)."""


END: Final = _End()


class EventPump:
    """Pulls events from one engine request's iterator, one pending read at a time."""

    def __init__(self, events: AsyncIterator[ServedEvent]) -> None:
        self._events = events
        self._pending: asyncio.Task[ServedEvent | _End] | None = None
        self.ended = False

    async def next(self, timeout: float | None) -> ServedEvent | _End | None:
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

    async def _read(self) -> ServedEvent | _End:
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


def clamp_headers(event: ServedEvent | _End | None) -> dict[str, str]:
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


def admission_headers(event: ServedEvent | _End | None) -> dict[str, str]:
    """What every API's answer says about its admission: the clamp and the cache headers."""
    return {**clamp_headers(event), **cache_headers(event)}


def cache_headers(event: ServedEvent | _End | None) -> dict[str, str]:
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


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that closes its frames' generator as soon as it is done sending.

    When the client goes away, starlette stops at the failed send and leaves the generator to
    the garbage collector; the generator's `finally` (cancel the request in the engine, log
    499) then ran whenever a collection came, a minute later or more on a cluster's rank 0.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


class TrailingStreamingResponse(ClosingStreamingResponse):
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


# --- the drive loop -------------------------------------------------------------------------


class RequestRunner(Protocol):
    """What the drive loop runs a request on: the engine, or the web search loop over it
    (server/web_search.py), whose events include its searches' outcomes."""

    def submit(self, req: GenerationRequest) -> AsyncIterator[ServedEvent]: ...

    def cancel(self, request_id: str) -> None: ...


class Encoder(Protocol):
    """One API's answer built from engine events: its stream frames and its whole answer."""

    heartbeat: ClassVar[bytes]  # sent on a stream during silence
    unfinished: ClassVar[str]  # what the answer is called when the events end before it is done

    @property
    def finished(self) -> bool: ...

    def frames(self, event: ServedEvent) -> AsyncIterator[bytes]:
        """Streaming: the frames one event makes. The work due once the answer is done
        (keeping a conversation) runs before its last frames go out, so a client that
        continues the moment it reads them finds it."""
        ...

    def absorb(self, event: ServedEvent) -> None:
        """Not streaming: feed one event to the answer being built."""

    async def settle(self) -> None:
        """Not streaming: the work due once the whole answer is built, before it is sent."""

    def answer(self) -> dict[str, Any]:
        """Not streaming: the answer's JSON body."""
        ...

    def failure(self, error: ApiError) -> list[bytes]:
        """Streaming: the frames that report `error` once the headers are gone."""
        ...


@dataclass
class Generation:
    """One submitted engine request, as the drive loop runs it."""

    pump: EventPump
    first: ServedEvent | _End | None  # what came within the admission grace (None: nothing)
    request_id: str
    record: RequestLog
    engine: RequestRunner
    heartbeat_s: float
    translate: Callable[[Exception], ApiError]  # an error in the API's terms


async def submit(
    engine: RequestRunner,
    request: GenerationRequest,
    record: RequestLog,
    settings: ServerSettings,
    *,
    stream: bool,
    translate: Callable[[Exception], ApiError],
) -> Generation:
    """Submit `request` and wait for its first event: for a stream, up to the admission
    grace, so a refusal within it still gets its own status (a whole answer carries errors as
    statuses at any time: no need to wait). An error here is raised in the API's terms."""
    pump: EventPump | None = None
    try:
        pump = EventPump(engine.submit(request))
        first = await pump.next(settings.admission_grace_s if stream else 0.0)
    except Exception as exc:
        if pump is not None:
            await pump.aclose()
        error = translate(exc)
        record.finish(error.status)
        raise error from exc
    return Generation(
        pump, first, request.request_id, record, engine, settings.heartbeat_s, translate
    )


def stream_response(
    generation: Generation,
    encoder: Encoder,
    *,
    on_close: Callable[[], None] | None = None,
    trailers: Callable[[], dict[str, str]] | None = None,
) -> Response:
    """The SSE answer: `encoder`'s frames as the events come. `on_close` runs when the
    stream ends, however it ends; `trailers` (Messages) are the cached-tokens trailer."""
    content = _frames(generation, encoder, on_close)
    headers = {
        "cache-control": "no-cache",
        "x-accel-buffering": "no",
        **admission_headers(generation.first),
    }
    if trailers is None:
        return ClosingStreamingResponse(content, media_type="text/event-stream", headers=headers)
    return TrailingStreamingResponse(
        content,
        media_type="text/event-stream",
        headers=headers,
        trailers=trailers,
        trailer_names=(CACHED_TOKENS_HEADER,),
    )


async def _frames(
    generation: Generation, encoder: Encoder, on_close: Callable[[], None] | None
) -> AsyncIterator[bytes]:
    heartbeat = generation.heartbeat_s
    event = generation.first
    last_sent = time.monotonic()
    status = 200
    try:
        while not isinstance(event, _End):
            if event is not None:
                generation.record.observe(event)
                async for chunk in encoder.frames(event):
                    yield chunk
                    last_sent = time.monotonic()
            if encoder.finished:
                break
            # Progress events keep arriving during a long prefill: the heartbeat goes on
            # elapsed time, not on the gap since the last engine event.
            if time.monotonic() - last_sent >= heartbeat:
                yield encoder.heartbeat
                last_sent = time.monotonic()
            event = await generation.pump.next(max(0.0, heartbeat - (time.monotonic() - last_sent)))
        if not encoder.finished:
            raise ApiError("api_error", f"generation ended without finishing {encoder.unfinished}")
    except Exception as exc:
        # Headers are gone: the only way to report is in the stream.
        error = generation.translate(exc)
        status = error.status
        for chunk in encoder.failure(error):
            yield chunk
    finally:
        if on_close is not None:
            on_close()
        if not encoder.finished:
            generation.engine.cancel(generation.request_id)
            status = status if status != 200 else 499  # the client went away
        await generation.pump.aclose()
        generation.record.finish(status)


async def answer_whole(request: Request, generation: Generation, encoder: Encoder) -> Response:
    """The whole answer, once `encoder` has it; the request is cancelled if the client
    disconnects first (then nobody reads the answer, and the log says 499)."""
    # Nothing is sent until the end, so only the receive side tells that the client left.
    watcher = asyncio.create_task(
        cancel_on_disconnect(request, generation.engine.cancel, generation.request_id)
    )
    event = generation.first
    headers: dict[str, str] = {}
    try:
        while not isinstance(event, _End):
            if event is not None:
                generation.record.observe(event)
                headers.update(admission_headers(event))
                encoder.absorb(event)
            if encoder.finished:
                break
            event = await generation.pump.next(generation.heartbeat_s)
        if not encoder.finished:
            raise ApiError("api_error", f"generation ended without finishing {encoder.unfinished}")
    except Exception as exc:
        error = generation.translate(exc)
        generation.record.finish(error.status)
        raise error from exc
    finally:
        watcher.cancel()
        await generation.pump.aclose()
    left = watcher.done() and not watcher.cancelled()
    if not left:
        await encoder.settle()
    generation.record.finish(499 if left else 200)
    return JSONResponse(encoder.answer(), headers=headers)
