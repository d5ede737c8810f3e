"""`POST /v1/chat/completions`: OpenAI's Chat Completions API over the same engine request.

A thin adapter: validate (protocol/openai_chat.py) → map (server/chat_mapping.py) → the
engine's events → `ChatChunkStream`, one state machine for both answers: a stream of
`chat.completion.chunk` lines ending in `data: [DONE]`, or the `chat.completion` that is the
reduction of those chunks, so both give the same content for the same tokens.

Every error is OpenAI's envelope `{"error": {"message", "type", "param", "code"}}` with the
status the engine's error table gives (server/errors.py): 400 for the client's mistakes (a
prompt too long has `code: context_length_exceeded`), 429 with `retry-after` when admission
control refuses, 401 for a missing or wrong token (the shared auth guard answers in
Anthropic's envelope; `in_openai_envelope` rewrites it).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mlxlaunch.engine.types import (
    FREEFORM_INPUT,
    Admitted,
    Done,
    EngineEvent,
    Progress,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolInputDelta,
)
from mlxlaunch.engine.types import StopReason as EngineStopReason
from mlxlaunch.engine.types import Usage as EngineUsage
from mlxlaunch.protocol import limits
from mlxlaunch.protocol.errors import wire_path
from mlxlaunch.protocol.limits import shown
from mlxlaunch.protocol.openai_chat import (
    AssistantOut,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceDelta,
    ChunkChoice,
    CompletionUsage,
    CustomCallOut,
    CustomDelta,
    FinishReason,
    FunctionCallOut,
    FunctionDelta,
    PromptTokensDetails,
    ToolCallDelta,
    ToolCallOut,
)
from mlxlaunch.server.auth import Guard
from mlxlaunch.server.blocks import tool_input
from mlxlaunch.server.bodies import parse_body
from mlxlaunch.server.call_arguments import StringArgumentStream, freeform_input
from mlxlaunch.server.chat_mapping import client_call_id, custom_names, to_generation_request
from mlxlaunch.server.errors import ApiError
from mlxlaunch.server.openai_errors import (
    in_openai_envelope,
    openai_engine_error,
    openai_error,
    openai_error_response,
)
from mlxlaunch.server.request_log import RequestLog, log_refusal
from mlxlaunch.server.settings import ServerSettings, ServingEngine, served_model_info
from mlxlaunch.server.streaming import answer_whole, stream_response, submit
from mlxlaunch.server.web_search import SearchOutcome, ServedEvent

_FINISH_REASONS: dict[EngineStopReason, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "context_window": "length",
    "tool_use": "tool_calls",
    "cancelled": "stop",  # nobody is listening; any valid value will do
}

DONE_LINE = b"data: [DONE]\n\n"
# An SSE comment: keeps the connection alive through a long prefill; SSE readers skip it.
PING_LINE = b": ping\n\n"


def chat_routes(engine: ServingEngine, settings: ServerSettings, guard: Guard) -> list[Route]:
    """The Chat Completions route, behind the server's auth guard."""
    api = ChatCompletionsApi(engine, settings)
    return [
        Route(
            "/v1/chat/completions",
            in_openai_envelope(guard(api.create)),
            methods=["POST"],
        )
    ]


def chat_field_error(exc: ValidationError, raw: Any) -> ApiError:
    """The 400 naming the offending fields, the first as OpenAI's `param`."""
    message, param = describe_chat_error(exc, raw)
    return ApiError("invalid_request_error", message, details={"param": param})


_MAX_REPORTED_ERRORS = 3


def describe_chat_error(exc: ValidationError, raw: Any) -> tuple[str, str | None]:
    """(one line naming each offending field path, the first path as OpenAI's `param`).

    As `describe_validation_error` (protocol/errors.py) does, with the message's `role`
    discriminator left out of the paths too: `messages.0.content`, not
    `messages.0.user.content`."""
    parts: list[str] = []
    params: list[str] = []
    for error in exc.errors(include_url=False)[:_MAX_REPORTED_ERRORS]:
        path = shown(wire_path(_without_role_tags(error["loc"], raw), raw), 200)
        message = shown(str(error["msg"]).removeprefix("Value error, "), 300)
        ctx = error.get("ctx", {})
        tag_field = shown(str(ctx.get("discriminator", "'type'")).strip("'"))
        if error["type"] == "union_tag_not_found":
            path, message = f"{path}.{tag_field}" if path else tag_field, "Field required"
        elif error["type"] == "union_tag_invalid":
            message = f"unknown {tag_field} {shown(repr(ctx.get('tag', '')))} ({message})"
        parts.append(f"{path}: {message}" if path else message)
        params.append(path)
    remaining = exc.error_count() - len(parts)
    if remaining > 0:
        parts.append(f"and {remaining} more error(s)")
    return "; ".join(parts), (params[0] if params and params[0] else None)


def _without_role_tags(loc: tuple[int | str, ...], raw: Any) -> tuple[int | str, ...]:
    kept: list[int | str] = []
    node: Any = raw
    for step in loc:
        if isinstance(node, dict) and node.get("role") == step and step not in node:
            continue  # the union's tag (the message's role), not a field
        kept.append(step)
        if isinstance(node, dict) and isinstance(step, str):
            node = node.get(step)
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            node = node[step]
        else:
            node = None
    return tuple(kept)


# --- events → chunks -------------------------------------------------------------------------


@dataclass
class _Call:
    id: str  # the client's `call_…` id
    name: str
    pieces: list[str] = field(default_factory=list)  # the arguments as streamed
    # A custom tool's call: its raw input, decoded from the arguments as they stream.
    text: StringArgumentStream | None = None
    streamed: str = ""  # the raw input sent so far


class ChatChunkStream:
    """Builds one completion from engine events, as chunks and as their reduction.

    Args:
        completion_id: the `chatcmpl-…` id of the answer.
        model: the model id the client asked for (echoed back).
        created: Unix seconds, the same on every chunk.
        include_usage: end the stream with the usage chunk (`stream_options.include_usage`).
        custom: the names of the custom tools, whose calls carry raw text (`custom.input`).
    """

    def __init__(
        self,
        *,
        completion_id: str,
        model: str,
        created: int,
        include_usage: bool = False,
        custom: set[str] | None = None,
    ) -> None:
        self.custom = custom or set()
        self.completion_id = completion_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.started = False
        self.finished = False
        self.finish_reason: FinishReason | None = None
        self.usage = CompletionUsage()
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[_Call] = []
        self._open_call: dict[str, int] = {}  # engine id → index, while its arguments stream

    def feed(self, event: EngineEvent) -> list[ChatCompletionChunk]:
        """The chunks that follow from one engine event (often none or one)."""
        out: list[ChatCompletionChunk] = []
        if isinstance(event, Admitted):
            self.usage = openai_usage(EngineUsage(event.prompt_tokens, event.cached_tokens, 0))
            self._start(out)
            return out
        if isinstance(event, Progress):
            return out
        if self.finished:
            raise RuntimeError(f"engine event after Done: {event!r}")
        self._start(out)
        if isinstance(event, TextDelta):
            if event.text:
                self._content.append(event.text)
                out.append(self._chunk(ChoiceDelta(content=event.text)))
        elif isinstance(event, ThinkingDelta):
            if event.text:
                self._reasoning.append(event.text)
                out.append(self._chunk(ChoiceDelta(reasoning_content=event.text)))
        elif isinstance(event, ToolCallStart):
            out.append(self._begin_call(event.id, event.name, ""))
        elif isinstance(event, ToolInputDelta):
            index = self._open_call.get(event.id)
            if index is not None and event.partial_json:
                self._calls[index].pieces.append(event.partial_json)
                piece = self._piece(index, event.partial_json)
                if piece is not None:
                    out.append(self._chunk(ChoiceDelta(tool_calls=[piece])))
        elif isinstance(event, ToolCallEvent):
            out.extend(self._end_call(event))
        elif isinstance(event, Done):
            self.finished = True
            self.finish_reason = _FINISH_REASONS[event.stop_reason]
            self.usage = openai_usage(event.usage)
            out.append(self._chunk(ChoiceDelta(), finish_reason=self.finish_reason))
            if self.include_usage:
                out.append(self._base(choices=[], usage=self.usage))
        return out

    def _start(self, out: list[ChatCompletionChunk]) -> None:
        if not self.started:
            self.started = True
            out.append(self._chunk(ChoiceDelta(role="assistant", content="")))

    def _piece(self, index: int, arguments: str) -> ToolCallDelta | None:
        """The delta of the next piece of call `index`'s arguments (None: nothing to send)."""
        call = self._calls[index]
        if call.text is None:
            return ToolCallDelta(index=index, function=FunctionDelta(arguments=arguments))
        text = call.text.feed(arguments)
        call.streamed += text
        return ToolCallDelta(index=index, custom=CustomDelta(input=text)) if text else None

    def _begin_call(self, engine_id: str, name: str, arguments: str) -> ChatCompletionChunk:
        index = len(self._calls)
        call = _Call(client_call_id(engine_id), name, [arguments] if arguments else [])
        self._calls.append(call)
        self._open_call = {engine_id: index}
        if name in self.custom:
            call.text = StringArgumentStream(FREEFORM_INPUT)
            call.streamed = freeform_input(arguments) if arguments else ""
            custom = CustomDelta(name=name, input=call.streamed)
            first = ToolCallDelta(index=index, id=call.id, type="custom", custom=custom)
        else:
            function = FunctionDelta(name=name, arguments=arguments)
            first = ToolCallDelta(index=index, id=call.id, type="function", function=function)
        return self._chunk(ChoiceDelta(tool_calls=[first]))

    def _end_call(self, event: ToolCallEvent) -> list[ChatCompletionChunk]:
        """A call ends: one that streamed is complete (its pieces are its arguments); one
        that arrives whole, or streamed no piece, is sent as one normalised piece."""
        arguments = json.dumps(
            tool_input(event.arguments, event.name), ensure_ascii=False, separators=(",", ":")
        )
        index = self._open_call.pop(event.id, None)
        if index is None:
            return [self._begin_call(event.id, event.name, arguments)]
        call = self._calls[index]
        if call.text is not None:  # a custom call sends what its pieces did not
            rest = freeform_input(event.arguments).removeprefix(call.streamed)
            call.pieces[:] = [event.arguments]
            if not rest:
                return []
            call.streamed += rest
            piece = ToolCallDelta(index=index, custom=CustomDelta(input=rest))
            return [self._chunk(ChoiceDelta(tool_calls=[piece]))]
        if call.pieces:
            return []
        call.pieces.append(arguments)
        piece = ToolCallDelta(index=index, function=FunctionDelta(arguments=arguments))
        return [self._chunk(ChoiceDelta(tool_calls=[piece]))]

    def _chunk(
        self, delta: ChoiceDelta, finish_reason: FinishReason | None = None
    ) -> ChatCompletionChunk:
        return self._base(choices=[ChunkChoice(delta=delta, finish_reason=finish_reason)])

    def _base(
        self, *, choices: list[ChunkChoice], usage: CompletionUsage | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.completion_id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
        )

    def _call_out(self, call: _Call) -> ToolCallOut:
        arguments = "".join(call.pieces)
        if call.name in self.custom:
            custom = CustomCallOut(name=call.name, input=freeform_input(arguments))
            return ToolCallOut(id=call.id, type="custom", custom=custom)
        normalised = json.dumps(
            tool_input(arguments, call.name), ensure_ascii=False, separators=(",", ":")
        )
        return ToolCallOut(
            id=call.id, function=FunctionCallOut(name=call.name, arguments=normalised)
        )

    def completion(self) -> ChatCompletion:
        """The reduction of every chunk so far: the non-streaming answer."""
        calls = [self._call_out(call) for call in self._calls]
        content = "".join(self._content)
        message = AssistantOut(
            content=content if content or not calls else None,
            tool_calls=calls or None,
            reasoning_content="".join(self._reasoning) if self._reasoning else None,
        )
        return ChatCompletion(
            id=self.completion_id,
            created=self.created,
            model=self.model,
            choices=[Choice(message=message, finish_reason=self.finish_reason)],
            usage=self.usage,
        )


def openai_usage(usage: EngineUsage) -> CompletionUsage:
    """OpenAI's usage: the prompt counts its cached part, which the details name."""
    return CompletionUsage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.output_tokens,
        total_tokens=usage.prompt_tokens + usage.output_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


def sse_line(payload: BaseModel) -> bytes:
    """One `data:` line of the stream (no `event:` names in this API)."""
    return b"data: " + payload.model_dump_json().encode() + b"\n\n"


def new_completion_id() -> str:
    """A fresh `chatcmpl-…` id (also the engine request id)."""
    return "chatcmpl-" + secrets.token_hex(12)


# --- the handler -----------------------------------------------------------------------------


class ChatCompletionsApi:
    """The Chat Completions handler, bound to one engine and one set of settings."""

    def __init__(self, engine: ServingEngine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings

    async def create(self, request: Request) -> Response:
        try:
            return await self._create(request)
        except Exception as exc:  # never let a bug become a non-envelope 500 or a crash
            error = openai_engine_error(exc)
            log_refusal(request, error)
            return openai_error_response(error)

    async def _create(self, request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest, chat_field_error)
        completion_id = new_completion_id()
        info = await served_model_info(self.engine, body.model)
        try:
            gen = await asyncio.to_thread(
                partial(
                    to_generation_request,
                    body,
                    request_id=completion_id,
                    # Before the first load nothing is known: the engine lowers the cap to
                    # what fits, and a thinking request goes to the template as it is.
                    context_window=info.context_window if info else limits.MAX_OUTPUT_TOKENS,
                    images=self.settings.image_access(info),
                    model_thinks=info is None or info.has_thinking,
                )
            )
        except Exception as exc:
            raise openai_engine_error(exc) from exc
        chunks = ChatChunkStream(
            completion_id=completion_id,
            model=body.model,
            created=int(time.time()),
            include_usage=body.include_usage,
            custom=custom_names(body.tools or []),
        )
        record = RequestLog(completion_id, body.model, time.monotonic())
        generation = await submit(
            self.engine, gen, record, self.settings, stream=body.stream,
            translate=openai_engine_error,
        )  # fmt: skip
        wire = ChatWire(chunks)
        if body.stream:
            return stream_response(generation, wire)
        return await answer_whole(request, generation, wire)


@dataclass
class ChatWire:
    """Chat Completions' encoder for the drive loop: chunk lines ending in `data: [DONE]`, a
    ping comment during silence, or the completion that is the chunks' reduction."""

    heartbeat: ClassVar[bytes] = PING_LINE
    unfinished: ClassVar[str] = "the completion"

    chunks: ChatChunkStream

    @property
    def finished(self) -> bool:
        return self.chunks.finished

    async def frames(self, event: ServedEvent) -> AsyncIterator[bytes]:
        if isinstance(event, SearchOutcome):
            return  # never comes: this API offers no server tools
        for chunk in self.chunks.feed(event):
            yield sse_line(chunk)
        if self.chunks.finished:
            yield DONE_LINE

    def absorb(self, event: ServedEvent) -> None:
        if not isinstance(event, SearchOutcome):  # never one: this API offers no server tools
            self.chunks.feed(event)

    async def settle(self) -> None:
        return None

    def answer(self) -> dict[str, Any]:
        return self.chunks.completion().model_dump(mode="json")

    def failure(self, error: ApiError) -> list[bytes]:
        # The error goes in the stream, as OpenAI's SDKs read it.
        return [sse_line(openai_error(error)), DONE_LINE]
