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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, ClassVar

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mlxlaunch.protocol.openai_responses import (
    InputItem,
    InputItemOrEasy,
    OtherItem,
    OutputCustomToolCall,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputWebSearchCall,
    ResponseObject,
    ResponsesRequest,
)
from mlxlaunch.protocol.sse import frame
from mlxlaunch.server.auth import Guard
from mlxlaunch.server.bodies import parse_body
from mlxlaunch.server.errors import ApiError
from mlxlaunch.server.openai_errors import (
    in_openai_envelope,
    openai_detail,
    openai_engine_error,
    openai_error_response,
)
from mlxlaunch.server.request_log import RequestLog, log_refusal
from mlxlaunch.server.response_store import ResponseStore
from mlxlaunch.server.responses_mapping import search_policies, to_generation_request
from mlxlaunch.server.responses_stream import ResponseStream, new_response, new_response_id
from mlxlaunch.server.sealed_reasoning import INCLUDE_NAME
from mlxlaunch.server.settings import ServerSettings, ServingEngine, served_model_info
from mlxlaunch.server.streaming import answer_whole, stream_response, submit
from mlxlaunch.server.web_search import ServedEvent, request_runner

_ITEMS = TypeAdapter(list[InputItemOrEasy])
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: clients skip it, proxies see traffic


def responses_routes(engine: ServingEngine, settings: ServerSettings, guard: Guard) -> list[Route]:
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
        body = await parse_body(request, ResponsesRequest)
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
        info = await served_model_info(self.engine, body.model)
        policies = search_policies(body)
        gen, names = await asyncio.to_thread(
            partial(
                to_generation_request,
                body,
                items,
                request_id=response_id,
                images=self.settings.image_access(info),
                thinks=info is None or info.has_thinking,  # unknown before the load
                context_window=info.context_window if info else None,
                searches=frozenset(policies),
                seal=self.settings.reasoning_seal,
            )
        )
        store = body.store is not False
        # Pinned only for a client that continues by id (it sent previous_response_id): a
        # stored answer is OpenAI's default, and most are never continued (Codex sends
        # store: false and resends its history). Pins never outrank the main session.
        if store and body.previous_response_id:
            gen = replace(gen, pin_prefix_s=self.store.pin_s)
        sealed = INCLUDE_NAME in (body.include or [])
        stream = ResponseStream(
            _echo(body, response_id, store),
            names,
            frozenset(policies),
            seal=self.settings.reasoning_seal if sealed else None,
        )
        record = RequestLog(response_id, body.model, time.monotonic())
        runner = request_runner(self.engine, policies, self.settings.search)
        generation = await submit(
            runner, gen, record, self.settings, stream=body.stream, translate=_translate
        )
        wire = ResponseWire(stream, partial(self._keep, items if store else None))
        if body.stream:
            return stream_response(generation, wire)
        return await answer_whole(request, generation, wire)

    def _keep(self, items: list[InputItem] | None, response: ResponseObject) -> None:
        """Keep a stored response's conversation (`items`: None when not stored)."""
        if items is None or response.status == "failed":
            return
        # What the prompt is made of: items of types this server does not serve are skipped
        # by the mapping, so they are not kept either (opaque fields are never dumped).
        dumped = [
            i.model_dump(mode="json", by_alias=True, exclude_none=True)
            for i in items
            if not isinstance(i, OtherItem)
        ]
        self.store.keep(response.id, [*dumped, *(as_input_item(o) for o in response.output)])


def _translate(exc: Exception) -> ApiError:
    return openai_engine_error(exc, param="input")


@dataclass
class ResponseWire:
    """The Responses API's encoder for the drive loop: events in the Responses grammar, with
    keep-alive comments during silence, or the response object they build. A stored
    response is kept before its last event goes out (or before the whole answer is sent)."""

    heartbeat: ClassVar[bytes] = KEEPALIVE
    unfinished: ClassVar[str] = "the response"

    stream: ResponseStream
    keep: Callable[[ResponseObject], None]  # a stored response's conversation, once done

    @property
    def finished(self) -> bool:
        return self.stream.finished

    async def frames(self, event: ServedEvent) -> AsyncIterator[bytes]:
        events = self.stream.feed(event)
        if self.stream.finished:
            await asyncio.to_thread(self.keep, self.stream.response)
        for item in events:
            yield frame(item.type, item.model_dump(mode="json"))

    def absorb(self, event: ServedEvent) -> None:
        self.stream.feed(event)

    async def settle(self) -> None:
        await asyncio.to_thread(self.keep, self.stream.response)

    def answer(self) -> dict[str, Any]:
        return self.stream.response.model_dump(mode="json")

    def failure(self, error: ApiError) -> list[bytes]:
        # The stream ends with response.failed carrying the error.
        detail = openai_detail(error)
        failed = self.stream.fail(detail.code or detail.type, detail.message)
        return [frame(item.type, item.model_dump(mode="json")) for item in failed]


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


def as_input_item(item: OutputItem) -> dict[str, Any]:
    """An output item as the next request would send it back."""
    if isinstance(item, OutputWebSearchCall):
        return item.model_dump(mode="json")  # read back as an item not served (no results)
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
    if isinstance(item, OutputCustomToolCall):
        return {
            "type": "custom_tool_call",
            "call_id": item.call_id,
            "name": item.name,
            "input": item.input,
        }
    summary = [{"type": "summary_text", "text": part.text} for part in item.summary]
    return {"type": "reasoning", "summary": summary}
