"""`POST /v1/responses`: OpenAI's Responses API (Codex CLI's) over the same engine request.

Thin as the Messages handler: validate (protocol/openai_responses.py) → map
(responses_mapping.py) → `engine.submit` through the same `EventPump` → events in the
Responses grammar (responses_stream.py), streamed or reduced to one response object. Every
error a client sees is OpenAI's envelope `{"error": {"message", "type", "param", "code"}}`
with the status the Messages API gives the same failure (a too-long prompt is a 400 with code
`context_length_exceeded`, as Codex expects); errors after the stream started end it with
`response.failed`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mlxlaunch.engine.types import EngineEvent
from mlxlaunch.protocol.errors import describe_validation_error
from mlxlaunch.protocol.limits import LARGE_BODY_BYTES
from mlxlaunch.protocol.openai_responses import (
    InputItem,
    InputItemOrEasy,
    OtherItem,
    OutputFunctionCall,
    OutputMessage,
    OutputReasoning,
    ResponseObject,
    ResponsesRequest,
)
from mlxlaunch.protocol.sse import frame
from mlxlaunch.server.bodies import json_object
from mlxlaunch.server.errors import ApiError, engine_error
from mlxlaunch.server.openai_errors import (
    in_openai_envelope,
    openai_detail,
    openai_engine_error,
    openai_error_response,
)
from mlxlaunch.server.request_log import RequestLog, log_refusal
from mlxlaunch.server.response_store import ResponseStore
from mlxlaunch.server.responses_mapping import to_generation_request
from mlxlaunch.server.responses_stream import ResponseStream, new_response, new_response_id
from mlxlaunch.server.streaming import EventPump, _End, cache_headers, cancel_on_disconnect

if TYPE_CHECKING:
    from mlxlaunch.server.app import ServerSettings, ServingEngine


Handler = Callable[[Request], Awaitable[Response]]
_ITEMS = TypeAdapter(list[InputItemOrEasy])
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: clients skip it, proxies see traffic


def responses_routes(
    engine: ServingEngine,
    settings: ServerSettings,
    guard: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> list[Route]:
    """`POST /v1/responses`, behind the server's auth check (its refusals re-enveloped)."""
    api = ResponsesApi(engine, settings)
    return [Route("/v1/responses", in_openai_envelope(guard(api.create)), methods=["POST"])]


class ResponsesApi:
    """The Responses route bound to one engine and one set of settings."""

    def __init__(self, engine: ServingEngine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        directory = settings.threads_dir.parent / "responses" if settings.threads_dir else None
        self.store = ResponseStore(settings.thread_limits, directory)

    async def create(self, request: Request) -> Response:
        try:
            return await self._create(request)
        except Exception as exc:  # never a 500 page or a crash: OpenAI's envelope
            error = openai_engine_error(exc, param="input")
            log_refusal(request, error)
            return openai_error_response(error)

    async def _create(self, request: Request) -> Response:
        body = await parse_request(request)
        history: list[InputItem] = []
        if body.previous_response_id:
            held = self.store.lookup(body.previous_response_id)
            if held is None:
                raise ApiError(
                    "invalid_request_error",
                    f"Previous response with id '{body.previous_response_id}' not found.",
                    details={
                        "code": "previous_response_not_found",
                        "param": "previous_response_id",
                    },
                )
            history = _ITEMS.validate_python(held)
        items = [*history, *body.items]
        response_id = new_response_id()
        info = self.engine.model_info
        gen, names = await asyncio.to_thread(
            partial(
                to_generation_request,
                body,
                items,
                request_id=response_id,
                accepts_images=bool(info and info.vision),
                thinks=info is None or info.has_thinking,  # unknown before the load
                context_window=info.context_window if info else None,
            )
        )
        store = body.store is not False
        # Pinned only for a client that continues by id (it sent previous_response_id): a
        # stored answer is OpenAI's default, and most are never continued (Codex sends
        # store: false and resends its history). Pins never outrank the main session.
        if store and body.previous_response_id:
            gen = replace(gen, pin_prefix_s=self.store.pin_s)
        stream = ResponseStream(_echo(body, response_id, store), names)
        turn = _Turn(response_id, body.model, items if store else None, time.monotonic())
        pump = EventPump(self.engine.submit(gen))
        try:
            first = await pump.next(self.settings.admission_grace_s if body.stream else 0.0)
        except Exception as exc:
            await pump.aclose()
            turn.finish(engine_error(exc).status)
            raise
        if body.stream:
            return StreamingResponse(
                self._stream(pump, first, stream, turn),
                media_type="text/event-stream",
                headers={
                    "cache-control": "no-cache",
                    "x-accel-buffering": "no",
                    **cache_headers(first),
                },
            )
        return await self._complete(request, pump, first, stream, turn)

    async def _complete(
        self,
        request: Request,
        pump: EventPump,
        event: EngineEvent | _End | None,
        stream: ResponseStream,
        turn: _Turn,
    ) -> Response:
        watcher = asyncio.create_task(
            cancel_on_disconnect(request, self.engine.cancel, turn.request_id)
        )
        headers: dict[str, str] = {}
        try:
            while not isinstance(event, _End):
                if event is not None:
                    turn.observe(event)
                    headers.update(cache_headers(event))
                    stream.feed(event)
                if stream.finished:
                    break
                event = await pump.next(self.settings.heartbeat_s)
            if not stream.finished:
                raise ApiError("api_error", "generation ended without finishing the response")
        except Exception as exc:
            turn.finish(engine_error(exc).status)
            raise
        finally:
            watcher.cancel()
            await pump.aclose()
        left = watcher.done() and not watcher.cancelled()
        if not left:
            await asyncio.to_thread(self._keep, turn, stream.response)
        turn.finish(499 if left else 200)
        return JSONResponse(stream.response.model_dump(mode="json"), headers=headers)

    async def _stream(
        self,
        pump: EventPump,
        event: EngineEvent | _End | None,
        stream: ResponseStream,
        turn: _Turn,
    ) -> AsyncIterator[bytes]:
        """SSE frames in the Responses grammar, with keep-alive comments during silence.

        A stored response is kept before its last event goes out, so a client that
        continues the moment it reads `response.completed` finds it."""
        heartbeat = self.settings.heartbeat_s
        last_sent = time.monotonic()
        status = 200
        try:
            while not isinstance(event, _End):
                if event is not None:
                    turn.observe(event)
                    events = stream.feed(event)
                    if stream.finished:
                        await asyncio.to_thread(self._keep, turn, stream.response)
                    for item in events:
                        yield frame(item.type, item.model_dump(mode="json"))
                        last_sent = time.monotonic()
                if stream.finished:
                    break
                if time.monotonic() - last_sent >= heartbeat:
                    yield KEEPALIVE
                    last_sent = time.monotonic()
                event = await pump.next(max(0.0, heartbeat - (time.monotonic() - last_sent)))
            if not stream.finished:
                raise ApiError("api_error", "generation ended without finishing the response")
        except Exception as exc:
            # Headers are gone: the stream ends with response.failed carrying the error.
            error = openai_engine_error(exc, param="input")
            status = error.status
            detail = openai_detail(error)
            for item in stream.fail(detail.code or detail.type, detail.message):
                yield frame(item.type, item.model_dump(mode="json"))
        finally:
            if not stream.finished:
                self.engine.cancel(turn.request_id)
                status = status if status != 200 else 499
            await pump.aclose()
            turn.finish(status)

    def _keep(self, turn: _Turn, response: ResponseObject) -> None:
        if turn.items is None or response.status == "failed":
            return
        # What the prompt is made of: items of types this server does not serve are skipped
        # by the mapping, so they are not kept either (opaque fields are never dumped).
        dumped = [
            i.model_dump(mode="json", by_alias=True, exclude_none=True)
            for i in turn.items
            if not isinstance(i, OtherItem)
        ]
        self.store.keep(response.id, [*dumped, *(as_input_item(o) for o in response.output)])


class _Turn(RequestLog):
    """One request's log line (the same as the other APIs'), and the items a stored response
    keeps (None: not stored)."""

    def __init__(
        self, response_id: str, model: str, items: list[InputItem] | None, started: float
    ) -> None:
        super().__init__(response_id, model, started)
        self.items = items


def _echo(body: ResponsesRequest, response_id: str, store: bool) -> ResponseObject:
    """The response object with the request's settings echoed, as OpenAI's are."""
    return new_response(
        response_id,
        body.model,
        instructions=body.instructions,
        tool_choice=body.tool_choice if isinstance(body.tool_choice, str) else "auto",
        parallel_tool_calls=body.parallel_tool_calls is not False,
        max_output_tokens=body.max_output_tokens,
        previous_response_id=body.previous_response_id,
        store=store,
        temperature=body.temperature,
        top_p=body.top_p,
        metadata=body.metadata or {},
        reasoning=body.reasoning.model_dump() if body.reasoning else None,
    )


def as_input_item(item: OutputMessage | OutputFunctionCall | OutputReasoning) -> dict[str, Any]:
    """An output item as the next request would send it back."""
    if isinstance(item, OutputMessage):
        content = [{"type": "output_text", "text": part.text} for part in item.content]
        return {"type": "message", "role": "assistant", "content": content}
    if isinstance(item, OutputFunctionCall):
        call: dict[str, Any] = {
            "type": "function_call",
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments,
        }
        return call | ({"namespace": item.namespace} if item.namespace else {})
    summary = [{"type": "summary_text", "text": part.text} for part in item.summary]
    return {"type": "reasoning", "summary": summary}


# --- parsing and errors -------------------------------------------------------------------


async def parse_request(request: Request) -> ResponsesRequest:
    raw = await request.body()
    if len(raw) > LARGE_BODY_BYTES:  # parsed off the loop: /health stays live
        return await asyncio.to_thread(validate_request, raw)
    return validate_request(raw)


def validate_request(raw_bytes: bytes) -> ResponsesRequest:
    """The body as a `ResponsesRequest`, or the 400 naming the field."""
    raw = json_object(raw_bytes)
    try:
        return ResponsesRequest.model_validate(raw)
    except ValidationError as exc:
        raise ApiError("invalid_request_error", describe_validation_error(exc, raw)) from exc
