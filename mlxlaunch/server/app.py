"""The Anthropic-compatible HTTP app (Starlette).

Handlers are thin: validate → map → call the engine → translate errors into one envelope.
Every error a client can see, including 404/405 and unexpected failures, is the Anthropic
error envelope; bad input never takes the server down.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mlxlaunch.engine.types import (
    EngineEvent,
    GenerationRequest,
    ModelInfo,
)
from mlxlaunch.protocol.errors import describe_validation_error, error_body
from mlxlaunch.protocol.events import ErrorEvent, PingEvent
from mlxlaunch.protocol.limits import (
    LARGE_BODY_BYTES,
    plain_model_id,
)
from mlxlaunch.protocol.requests import CountTokensRequest, MessagesRequest
from mlxlaunch.protocol.responses import CountTokensResponse, ModelEntry, ModelList
from mlxlaunch.protocol.sse import encode_event
from mlxlaunch.server.blocks import TIMINGS_HEADER, ContentBlockStream, new_message_id
from mlxlaunch.server.bodies import json_object
from mlxlaunch.server.chat_completions import chat_routes
from mlxlaunch.server.chat_mapping import openai_list_body, openai_model_body, speaks_openai
from mlxlaunch.server.context_management import manage_context
from mlxlaunch.server.errors import ApiError, engine_error, error_response
from mlxlaunch.server.guards import HttpLimits, RequestGuard
from mlxlaunch.server.mapping import shows_thinking, to_generation_request
from mlxlaunch.server.request_ids import RequestIds
from mlxlaunch.server.request_log import RequestLog, log_refusal
from mlxlaunch.server.responses import responses_routes
from mlxlaunch.server.safeguards import (
    SAFEGUARDS_MIN_PARAMETERS,
    PendingCheck,
    SafetyCheck,
    SafetyCheckSettings,
)
from mlxlaunch.server.stats_routes import stats_routes
from mlxlaunch.server.streaming import (
    CACHED_TOKENS_HEADER,
    EventPump,
    TrailingStreamingResponse,
    _End,
    cache_headers,
    cancel_on_disconnect,
    clamp_headers,
)
from mlxlaunch.server.threads import ThreadLimits, ThreadStore, ThreadTurn

# Set when the engine lowered max_tokens to what fits in the context window: the new value.

ModelT = TypeVar("ModelT", bound=BaseModel)
Handler = Callable[[Request], Awaitable[Response]]


class ServingEngine(Protocol):
    """The part of `mlxlaunch.engine.Engine` the HTTP layer uses."""

    def submit(self, req: GenerationRequest) -> AsyncIterator[EngineEvent]: ...

    def cancel(self, request_id: str) -> None: ...

    async def count_tokens(self, req: GenerationRequest) -> int: ...

    @property
    def model_info(self) -> ModelInfo | None: ...


@dataclass(frozen=True)
class ServerSettings:
    """How the HTTP layer behaves.

    Args:
        host: interface to bind (loopback by default: the server runs code on your machine).
        port: TCP port; 0 picks a free one (the runner reports the real one).
        auth_token: required as `Authorization: Bearer` or `x-api-key`; None disables auth.
        heartbeat_s: longest silence on a stream before a `ping` (Claude Code waits 300 s).
        admission_grace_s: how long to wait for admission before starting the stream anyway;
            errors that arrive within it still get their own HTTP status (400, 429).
    """

    host: str = "127.0.0.1"
    port: int = 0
    auth_token: str | None = None
    heartbeat_s: float = 5.0
    admission_grace_s: float = 2.0
    # Security (server/guards.py, SECURITY.md): beyond loopback only when allowed, with a token.
    allow_remote: bool = False
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed to call (none by default)
    limits: HttpLimits = field(default_factory=HttpLimits)
    # The id /v1/models lists (what the user called the model); None: one made from its path.
    model_id: str | None = None
    # Cache-miss prompt excerpts in /v1/stats: other clients' prompt text, so off by default;
    # `--debug-cache` turns it on (launch/serving.py), with the engine's EngineConfig.debug_cache.
    stats_prompt_excerpts: bool = False
    # Message threads (server/threads.py): their budget, and where they are kept across
    # restarts (None: memory only; `serving_settings` puts them beside the disk KV cache).
    thread_limits: ThreadLimits = field(default_factory=ThreadLimits)
    threads_dir: Path | None = None
    # Claude Code's auto-mode safety check, judged by the loaded model (server/safeguards.py);
    # False (`--no-safeguards`), or a model under the minimum size, answers "unavailable".
    safeguards: bool = True
    safeguards_min_parameters: int = SAFEGUARDS_MIN_PARAMETERS


async def parse_body(request: Request, model: type[ModelT]) -> ModelT:
    """Read and validate a JSON body; any problem is a 400 naming the field."""
    raw = await request.body()
    if len(raw) > LARGE_BODY_BYTES:  # parsed in pieces off the loop: /health stays live
        return await asyncio.to_thread(validate_body, raw, model)
    return validate_body(raw, model)


def validate_body(raw_bytes: bytes, model: type[ModelT]) -> ModelT:
    """Parse and validate `raw_bytes` as `model`, or raise the 400 ApiError naming the field."""
    raw = json_object(raw_bytes)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ApiError("invalid_request_error", describe_validation_error(exc, raw)) from exc


class MessagesApi:
    """Route handlers bound to one engine and one set of settings."""

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
        self.created_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    # --- routes ----------------------------------------------------------------------------

    async def messages(self, request: Request) -> Response:
        body, turn = self.threads.open(await parse_body(request, MessagesRequest))
        try:
            return await self._messages(request, body, turn)
        finally:
            if turn is not None and not body.stream:
                self.threads.release(turn)  # kept by now if it finished (a no-op then)

    async def _messages(
        self, request: Request, body: MessagesRequest, turn: ThreadTurn | None
    ) -> Response:
        message_id = new_message_id()
        try:
            context = await manage_context(body, self.engine, accepts_images=self._accepts_images())
            # Off the event loop: a body of many messages takes seconds to map.
            gen = await asyncio.to_thread(
                partial(
                    to_generation_request,
                    context.body,
                    request_id=message_id,
                    accepts_images=self._accepts_images(),
                )
            )
        except BaseException:
            if turn is not None:
                self.threads.release(turn)
            raise
        if turn is not None:  # its next turn continues this conversation: keep its KV
            gen = replace(gen, pin_prefix_s=self.threads.pin_s)
        blocks = ContentBlockStream(
            message_id=message_id,
            model=body.model,
            show_thinking=shows_thinking(body),
            timings=request.headers.get(TIMINGS_HEADER) == "1",
            context_management=context.applied,
        )
        record = RequestLog(message_id, body.model, time.monotonic())
        check = self.safety.for_request(body)
        try:
            pump = EventPump(self.engine.submit(gen))
            # Non-streaming answers carry errors as statuses at any time: no need to wait here.
            wait = self.settings.admission_grace_s if body.stream else 0.0
            first = await pump.next(wait)
        except Exception as exc:
            if turn is not None:
                self.threads.release(turn)
            error = engine_error(exc)
            record.finish(error.status)
            raise error from exc
        if body.stream:
            return TrailingStreamingResponse(
                self._stream(pump, first, blocks, record, turn, check),
                media_type="text/event-stream",
                headers={
                    "cache-control": "no-cache",
                    "x-accel-buffering": "no",
                    **clamp_headers(first),
                    **cache_headers(first),
                },
                trailers=lambda: cached_trailer(blocks),
                trailer_names=(CACHED_TOKENS_HEADER,),
            )
        return await self._complete(request, pump, first, blocks, record, turn, check)

    async def count_tokens(self, request: Request) -> Response:
        body = await parse_body(request, CountTokensRequest)
        try:
            images = self._accepts_images()
            context = await manage_context(
                body, self.engine, accepts_images=images, count_original=True
            )
            gen = await asyncio.to_thread(
                partial(to_generation_request, context.body, accepts_images=images)
            )
            count = await self.engine.count_tokens(gen)
        except Exception as exc:
            raise engine_error(exc) from exc
        answer = CountTokensResponse(
            input_tokens=count, context_management=context.count_tokens_answer(count)
        )
        return JSONResponse(answer.model_dump())

    async def models(self, request: Request) -> Response:
        entry = self._model_entry(self._loaded_model_id())
        # Each API's clients expect their own shape; the rule is `speaks_openai`'s docstring.
        if speaks_openai(request.headers):
            return JSONResponse(openai_list_body([entry]))
        listing = ModelList(data=[entry], first_id=entry.id, last_id=entry.id)
        return JSONResponse(listing.model_dump())

    async def model(self, request: Request) -> Response:
        # Any id is served by the loaded model, so any id "exists".
        entry = self._model_entry(request.path_params["model_id"])
        if speaks_openai(request.headers):
            return JSONResponse(openai_model_body(entry))
        return JSONResponse(entry.model_dump())

    async def hello(self, request: Request) -> Response:
        return Response(status_code=200)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self._loaded_model_id()})

    # --- generation --------------------------------------------------------------------------

    async def _complete(
        self,
        request: Request,
        pump: EventPump,
        event: EngineEvent | _End | None,
        blocks: ContentBlockStream,
        record: RequestLog,
        turn: ThreadTurn | None = None,
        check: PendingCheck | None = None,
    ) -> Response:
        """Non-streaming: run the same state machine, answer with the message it built."""
        # Nothing is sent until the end, so only the receive side tells that the client left.
        watcher = asyncio.create_task(
            cancel_on_disconnect(request, self.engine.cancel, blocks.message.id)
        )
        headers: dict[str, str] = {}
        try:
            while not isinstance(event, _End):
                if event is not None:
                    record.observe(event)
                    headers.update(clamp_headers(event))
                    headers.update(cache_headers(event))
                    blocks.feed(event)
                if blocks.finished:
                    break
                event = await pump.next(self.settings.heartbeat_s)
            if not blocks.finished:
                raise ApiError("api_error", "generation ended without finishing the message")
        except Exception as exc:
            error = engine_error(exc)
            record.finish(error.status)
            raise error from exc
        finally:
            watcher.cancel()
            await pump.aclose()
        left = watcher.done() and not watcher.cancelled()
        if check is not None and not left:
            await check.attach([], blocks.message)
        record.finish(499 if left else 200)
        if turn is not None and not left:
            await asyncio.to_thread(self.threads.keep, turn, blocks.message)
        # serialize_as_any: keeps the opt-in `usage.mlx_timings` (a Usage subclass) in the body.
        body = blocks.message.model_dump(mode="json", serialize_as_any=True)
        return JSONResponse(body, headers=headers)

    async def _stream(
        self,
        pump: EventPump,
        event: EngineEvent | _End | None,
        blocks: ContentBlockStream,
        record: RequestLog,
        turn: ThreadTurn | None = None,
        check: PendingCheck | None = None,
    ) -> AsyncIterator[bytes]:
        """Streaming: SSE frames in PROTOCOL.md order, with pings during silence.

        A threaded turn's reply is kept before its last frames go out, so a client that
        continues the moment it reads `message_stop` finds it."""
        heartbeat = self.settings.heartbeat_s
        last_sent = time.monotonic()
        status = 200
        try:
            while not isinstance(event, _End):
                if event is not None:
                    record.observe(event)
                    block_events = blocks.feed(event)
                    if blocks.finished and check is not None:  # verdicts ride on message_delta
                        async for ping in check.attach_with_pings(
                            block_events, blocks.message, heartbeat
                        ):
                            yield ping
                    frames = [encode_event(block_event) for block_event in block_events]
                    if blocks.finished and turn is not None:
                        await asyncio.to_thread(self.threads.keep, turn, blocks.message)
                    for frame in frames:
                        yield frame
                        last_sent = time.monotonic()
                if blocks.finished:
                    break
                # Progress events keep arriving during a long prefill: ping on elapsed time,
                # not on the gap since the last engine event.
                if time.monotonic() - last_sent >= heartbeat:
                    yield encode_event(PingEvent())
                    last_sent = time.monotonic()
                event = await pump.next(max(0.0, heartbeat - (time.monotonic() - last_sent)))
            if not blocks.finished:
                raise ApiError("api_error", "generation ended without finishing the message")
        except Exception as exc:
            # Headers are gone; the only way to report is an error event (and no message_stop).
            error = engine_error(exc)
            status = error.status
            yield encode_event(
                ErrorEvent.model_validate(error_body(error.error_type, error.message))
            )
        finally:
            if turn is not None:
                self.threads.release(turn)  # a no-op once kept
            if not blocks.finished:
                self.engine.cancel(blocks.message.id)
                status = status if status != 200 else 499  # client went away
            await pump.aclose()
            record.finish(status)

    # --- helpers ---------------------------------------------------------------------------

    def _accepts_images(self) -> bool:
        info = self.engine.model_info
        return bool(info is not None and info.vision)

    def _loaded_model_id(self) -> str:
        # A plain id: one a client may send back (a path would be refused as `model`), and
        # the unauthenticated /health does not reveal where the model lives on disk.
        info = self.engine.model_info
        if info is None:
            return "unloaded"
        return self.settings.model_id or plain_model_id(info.id)

    def _model_entry(self, model_id: str) -> ModelEntry:
        # The window lets a client such as `mlx launch claude --print-env --url` size itself.
        info = self.engine.model_info
        window = info.context_window if info is not None else None
        return ModelEntry(
            id=model_id,
            display_name=model_id,
            created_at=self.created_at,
            max_input_tokens=window,
            max_tokens=window,
        )


def cached_trailer(blocks: ContentBlockStream) -> dict[str, str]:
    """The X-Cached-Tokens trailer, from the usage the stream reported."""
    return {CACHED_TOKENS_HEADER: str(blocks.message.usage.cache_read_input_tokens or 0)}


# --- auth and error plumbing --------------------------------------------------------------


def _token_matches(request: Request, token: str) -> bool:
    presented: list[str] = []
    authorization = request.headers.get("authorization", "")
    scheme, _, credential = authorization.partition(" ")
    if scheme.lower() == "bearer" and credential:
        presented.append(credential.strip())
    if api_key := request.headers.get("x-api-key"):
        presented.append(api_key.strip())
    expected = token.encode()
    # Evaluate every candidate (no short-circuit) so timing does not tell which one failed.
    matches = [hmac.compare_digest(p.encode(), expected) for p in presented]
    return any(matches)


def guarded(handler: Handler, settings: ServerSettings, *, auth: bool = True) -> Handler:
    """Wrap a handler with the auth check and the one error envelope."""

    async def endpoint(request: Request) -> Response:
        try:
            if auth and settings.auth_token and not _token_matches(request, settings.auth_token):
                raise ApiError("authentication_error", "invalid or missing API key")
            return await handler(request)
        except Exception as exc:  # never let a bug become a non-envelope 500 or a crash
            # Every refusal gets one log line, so a client's rejected request shows in the
            # server log (a Claude Code release adding a field we refuse).
            error = engine_error(exc)
            log_refusal(request, error)
            return error_response(error)

    return endpoint


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        error = ApiError("not_found_error", f"not found: {request.method} {request.url.path}")
    elif exc.status_code == 405:
        error = ApiError(
            "invalid_request_error",
            f"method {request.method} not allowed for {request.url.path}",
            status=405,
            headers=dict(exc.headers or {}),
        )
    else:
        error = ApiError("api_error", str(exc.detail), status=exc.status_code)
    return error_response(error)


async def _unexpected(request: Request, exc: Exception) -> Response:
    return error_response(ApiError("api_error", "internal server error"))


def build_app(engine: ServingEngine, settings: ServerSettings | None = None) -> Starlette:
    """The Starlette app serving `engine` under the Anthropic Messages API."""
    settings = settings or ServerSettings()
    api = MessagesApi(engine, settings)
    routes = [
        Route("/v1/messages", guarded(api.messages, settings), methods=["POST"]),
        Route("/v1/messages/count_tokens", guarded(api.count_tokens, settings), methods=["POST"]),
        Route("/v1/models", guarded(api.models, settings), methods=["GET"]),
        Route("/v1/models/{model_id:path}", guarded(api.model, settings), methods=["GET"]),
        Route("/api/hello", guarded(api.hello, settings, auth=False), methods=["GET", "HEAD"]),
        Route("/health", guarded(api.health, settings, auth=False), methods=["GET"]),
        *stats_routes(
            engine,
            lambda handler: guarded(handler, settings),
            model_id=settings.model_id,
            excerpts=settings.stats_prompt_excerpts,
        ),
        # The OpenAI APIs: thin adapters over the same engine request (one render path, one
        # output parser, one prefix cache).
        *chat_routes(engine, settings, lambda handler: guarded(handler, settings)),
        *responses_routes(engine, settings, lambda handler: guarded(handler, settings)),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: _http_exception,
        Exception: _unexpected,
    }
    guard = Middleware(
        RequestGuard,
        host=settings.host,
        allowed_origins=settings.allowed_origins,
        limits=settings.limits,
    )
    ids = Middleware(RequestIds)  # outermost: the guard's refusals carry one too
    app = Starlette(routes=routes, exception_handlers=handlers, middleware=[ids, guard])
    app.state.api = api
    return app
