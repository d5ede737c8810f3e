"""`POST /v1/messages` and `/v1/messages/count_tokens`: the Anthropic Messages API.

Thin: validate (protocol/requests.py) → open the message thread, if any (threads.py) → map
(mapping.py) → the engine through the drive loop (streaming.py) → `ContentBlockStream`
(blocks.py), the one state machine for a stream of SSE events in PROTOCOL.md order and for the
message that is their reduction. Errors are Anthropic's envelope (server/errors.py's table),
raised here and answered by the app's guard.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, ClassVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mlxlaunch.protocol.errors import error_body
from mlxlaunch.protocol.events import ErrorEvent, PingEvent
from mlxlaunch.protocol.requests import CountTokensRequest, MessagesRequest
from mlxlaunch.protocol.responses import CountTokensResponse
from mlxlaunch.protocol.sse import encode_event
from mlxlaunch.server.agent_headers import AgentHeaders
from mlxlaunch.server.auth import Guard
from mlxlaunch.server.blocks import TIMINGS_HEADER, ContentBlockStream, new_message_id
from mlxlaunch.server.bodies import parse_body
from mlxlaunch.server.context_management import manage_context
from mlxlaunch.server.errors import ApiError, engine_error
from mlxlaunch.server.mapping import search_policies, shows_thinking, to_generation_request
from mlxlaunch.server.request_log import RequestLog
from mlxlaunch.server.safeguards import PendingCheck, SafetyCheck, SafetyCheckSettings
from mlxlaunch.server.settings import ServerSettings, ServingEngine, served_model_info
from mlxlaunch.server.streaming import CACHED_TOKENS_HEADER, answer_whole, stream_response, submit
from mlxlaunch.server.threads import ThreadStore, ThreadTurn
from mlxlaunch.server.web_search import ServedEvent, request_runner


def messages_routes(engine: ServingEngine, settings: ServerSettings, guard: Guard) -> list[Route]:
    """The Messages API's routes, behind the server's auth guard."""
    api = MessagesApi(engine, settings)
    return [
        Route("/v1/messages", guard(api.messages), methods=["POST"]),
        Route("/v1/messages/count_tokens", guard(api.count_tokens), methods=["POST"]),
    ]


class MessagesApi:
    """The Messages handlers bound to one engine and one set of settings."""

    def __init__(self, engine: ServingEngine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.threads = ThreadStore(settings.thread_limits, settings.threads_dir)
        self.safety = SafetyCheck(
            engine,
            SafetyCheckSettings(
                enabled=settings.safeguards, min_parameters=settings.safeguards_min_parameters
            ),
        )

    async def messages(self, request: Request) -> Response:
        body, turn = self.threads.open(await parse_body(request, MessagesRequest))
        try:
            return await self._messages(request, body, turn)
        except BaseException:
            if turn is not None:
                self.threads.release(turn)
            raise
        finally:
            if turn is not None and not body.stream:
                self.threads.release(turn)  # kept by now if it finished (a no-op then)

    async def _messages(
        self, request: Request, body: MessagesRequest, turn: ThreadTurn | None
    ) -> Response:
        message_id = new_message_id()
        images = self.settings.image_access(await served_model_info(self.engine, body.model))
        context = await manage_context(body, self.engine, images=images)
        # Off the event loop: a body of many messages takes seconds to map.
        gen = await asyncio.to_thread(
            partial(
                to_generation_request,
                context.body,
                request_id=message_id,
                images=images,
                agent=AgentHeaders.of(request.headers),
            )
        )
        if turn is not None:  # its next turn continues this conversation: keep its KV
            gen = replace(gen, pin_prefix_s=self.threads.pin_s)
        policies = search_policies(body)
        blocks = ContentBlockStream(
            message_id=message_id,
            model=body.model,
            show_thinking=shows_thinking(body),
            timings=request.headers.get(TIMINGS_HEADER) == "1",
            context_management=context.applied,
            server_tools=frozenset(policies),
        )
        record = RequestLog(message_id, body.model, time.monotonic())
        runner = request_runner(self.engine, policies, self.settings.search)
        generation = await submit(
            runner, gen, record, self.settings, stream=body.stream, translate=engine_error
        )
        check = self.safety.for_request(body)
        wire = MessageWire(blocks, self.threads, turn, check, self.settings.heartbeat_s)
        if not body.stream:
            return await answer_whole(request, generation, wire)
        release = partial(self.threads.release, turn) if turn is not None else None
        return stream_response(
            generation, wire, on_close=release, trailers=partial(cached_trailer, blocks)
        )

    async def count_tokens(self, request: Request) -> Response:
        body = await parse_body(request, CountTokensRequest)
        try:
            images = self.settings.image_access(await served_model_info(self.engine, body.model))
            context = await manage_context(body, self.engine, images=images, count_original=True)
            gen = await asyncio.to_thread(
                partial(to_generation_request, context.body, images=images)
            )
            count = await self.engine.count_tokens(gen)
        except Exception as exc:
            raise engine_error(exc) from exc
        answer = CountTokensResponse(
            input_tokens=count, context_management=context.count_tokens_answer(count)
        )
        return JSONResponse(answer.model_dump())


@dataclass
class MessageWire:
    """The Messages API's encoder for the drive loop: SSE events in PROTOCOL.md order, or the
    message they reduce to; a threaded turn's reply is kept, the safety check's verdicts
    ride on the reply (its `message_delta` on a stream)."""

    heartbeat: ClassVar[bytes] = encode_event(PingEvent())
    unfinished: ClassVar[str] = "the message"

    blocks: ContentBlockStream
    threads: ThreadStore
    turn: ThreadTurn | None
    check: PendingCheck | None
    heartbeat_s: float  # how often the safety check's wait pings

    @property
    def finished(self) -> bool:
        return self.blocks.finished

    async def frames(self, event: ServedEvent) -> AsyncIterator[bytes]:
        block_events = self.blocks.feed(event)
        if self.blocks.finished and self.check is not None:  # verdicts ride on message_delta
            async for ping in self.check.attach_with_pings(
                block_events, self.blocks.message, self.heartbeat_s
            ):
                yield ping
        frames = [encode_event(block_event) for block_event in block_events]
        if self.blocks.finished and self.turn is not None:
            await asyncio.to_thread(self.threads.keep, self.turn, self.blocks.message)
        for frame in frames:
            yield frame

    def absorb(self, event: ServedEvent) -> None:
        self.blocks.feed(event)

    async def settle(self) -> None:
        if self.check is not None:
            await self.check.attach([], self.blocks.message)
        if self.turn is not None:
            await asyncio.to_thread(self.threads.keep, self.turn, self.blocks.message)

    def answer(self) -> dict[str, Any]:
        # serialize_as_any: keeps the opt-in `usage.mlx_timings` (a Usage subclass) in the body.
        return self.blocks.message.model_dump(mode="json", serialize_as_any=True)

    def failure(self, error: ApiError) -> list[bytes]:
        body = error_body(error.error_type, error.message)
        return [encode_event(ErrorEvent.model_validate(body))]  # an error, and no message_stop


def cached_trailer(blocks: ContentBlockStream) -> dict[str, str]:
    """The X-Cached-Tokens trailer, from the usage the stream reported."""
    return {CACHED_TOKENS_HEADER: str(blocks.message.usage.cache_read_input_tokens or 0)}
