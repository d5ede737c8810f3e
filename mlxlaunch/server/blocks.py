"""Engine events → Anthropic content blocks: one state machine for both response paths.

`ContentBlockStream.feed()` turns each engine event into the stream events PROTOCOL.md allows
(message_start, content_block_start/delta/stop with sequential indices and one block open at a
time, message_delta, message_stop). The non-streaming `Message` is the reduction of exactly
those events, so streaming and non-streaming give the same content for the same tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from typing import Any

from pydantic import BaseModel

from mlxlaunch.engine.types import (
    Admitted,
    Done,
    Progress,
    TextDelta,
    ThinkingDelta,
    Timings,
    ToolCallEvent,
    ToolCallStart,
    ToolInputDelta,
)
from mlxlaunch.engine.types import StopReason as EngineStopReason
from mlxlaunch.engine.types import Usage as EngineUsage
from mlxlaunch.protocol.context_management import ContextManagementResponse
from mlxlaunch.protocol.events import (
    ContentBlockDeltaEvent,
    ContentBlockStartEvent,
    ContentBlockStopEvent,
    InputJsonDeltaPart,
    MessageDeltaBody,
    MessageDeltaEvent,
    MessageStartEvent,
    MessageStopEvent,
    SignatureDeltaPart,
    TextDeltaPart,
    ThinkingDeltaPart,
)
from mlxlaunch.protocol.limits import shown
from mlxlaunch.protocol.responses import (
    Message,
    ResponseServerToolUseBlock,
    ResponseTextBlock,
    ResponseThinkingBlock,
    ResponseToolUseBlock,
    ResponseWebSearchToolResultBlock,
    ServerToolUsage,
    StopReason,
    Usage,
    WebSearchResult,
    WebSearchToolResultError,
)
from mlxlaunch.server.call_arguments import model_arguments
from mlxlaunch.server.web_search import (
    SERVER_CALL_PREFIX,
    SearchOutcome,
    ServedEvent,
    encode_page,
    new_server_tool_use_id,
)

log = logging.getLogger("mlxlaunch.server")

BlockEvent = (
    MessageStartEvent
    | ContentBlockStartEvent
    | ContentBlockDeltaEvent
    | ContentBlockStopEvent
    | MessageDeltaEvent
    | MessageStopEvent
)

_STOP_REASONS: dict[EngineStopReason, StopReason] = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_use": "tool_use",
    "context_window": "model_context_window_exceeded",
    "cancelled": "end_turn",  # nobody is listening; any valid value will do
}


def anthropic_stop_reason(reason: EngineStopReason) -> StopReason:
    """The Anthropic `stop_reason` for an engine stop reason."""
    return _STOP_REASONS[reason]


def anthropic_usage(usage: EngineUsage) -> Usage:
    """Honest usage: `input_tokens` is the uncached part, the cached part is a cache read."""
    return Usage(
        input_tokens=usage.prefilled_tokens,
        output_tokens=usage.output_tokens,
        cache_creation_input_tokens=0,
        cache_read_input_tokens=usage.cached_tokens,
    )


# Opt-in per-request timings: with this request header set to 1 the final usage carries
# `mlx_timings`; without it the usage object stays the plain Anthropic one.
TIMINGS_HEADER = "x-mlx-timings"


class MlxTimings(BaseModel):
    queue_s: float
    ttft_s: float
    prefill_tps: float
    decode_tps: float


class TimedUsage(Usage):
    """Usage with the `mlx_timings` extension (built only when the client asked for it)."""

    mlx_timings: MlxTimings


class TimedMessageDeltaEvent(MessageDeltaEvent):
    usage: TimedUsage


def timed_usage(usage: Usage, timings: Timings) -> TimedUsage:
    figures = MlxTimings(
        queue_s=timings.queue_s,
        ttft_s=timings.ttft_s,
        prefill_tps=timings.prefill_tps,
        decode_tps=timings.decode_tps,
    )
    return TimedUsage(**usage.model_dump(), mlx_timings=figures)


def thinking_signature(thinking: str) -> str:
    """An opaque signature for a thinking block (clients only echo it back)."""
    return "mlxlaunch-" + hashlib.sha256(thinking.encode()).hexdigest()[:40]


class ContentBlockStream:
    """Builds one assistant message from engine events.

    Args:
        message_id: the `msg_…` id of the response.
        model: the model id the client asked for (echoed back).
        show_thinking: False for `thinking.display: omitted` — blocks and signatures only.
        timings: add `mlx_timings` to the final usage (the client sent TIMINGS_HEADER).
        context_management: what the request's context edits cleared, for `message_delta`.
        server_tools: names of the request's server tools (`web_search`): a call of one is a
            `server_tool_use` block; its `SearchOutcome` (server/web_search.py) a
            `web_search_tool_result` block.
    """

    def __init__(
        self,
        *,
        message_id: str,
        model: str,
        show_thinking: bool = True,
        timings: bool = False,
        context_management: ContextManagementResponse | None = None,
        server_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.message = Message(id=message_id, model=model)
        self._server_tools = server_tools
        self._context_management = context_management
        self._show_thinking = show_thinking
        self._timings = timings
        self._started = False
        self._finished = False
        self._open: str | None = None  # type of the open block, if any
        self._thinking_text: list[str] = []  # full thinking of the open block, for its signature
        self._streaming_call: str | None = None  # id of the tool call whose input is streaming
        self._input_parts: list[str] = []  # its input so far (the reduction parses it at stop)
        self._searches = 0  # web searches the server ran for this answer

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, event: ServedEvent) -> list[BlockEvent]:
        """The stream events that follow from one engine event (often none or one)."""
        out: list[BlockEvent] = []
        if isinstance(event, Admitted):
            if not self._started:
                usage = EngineUsage(event.prompt_tokens, event.cached_tokens, 0)
                self._start(out, anthropic_usage(usage))
            return out
        if isinstance(event, Progress):
            return out
        if self._finished:
            raise RuntimeError(f"engine event after Done: {event!r}")
        if not self._started:
            self._start(out, Usage())
        if isinstance(event, TextDelta):
            if event.text:
                self._ensure_open(out, "text")
                self._emit(out, self._delta(TextDeltaPart(text=event.text)))
        elif isinstance(event, ThinkingDelta):
            self._ensure_open(out, "thinking")
            self._thinking_text.append(event.text)
            if self._show_thinking and event.text:
                self._emit(out, self._delta(ThinkingDeltaPart(thinking=event.text)))
        elif isinstance(event, ToolCallStart):
            self._start_tool_call(out, event.id, event.name)
        elif isinstance(event, ToolInputDelta):
            if event.id == self._streaming_call and event.partial_json:
                self._input_parts.append(event.partial_json)
                self._emit(out, self._delta(InputJsonDeltaPart(partial_json=event.partial_json)))
        elif isinstance(event, ToolCallEvent):
            self._add_tool_call(out, event)
        elif isinstance(event, SearchOutcome):
            self._add_search_outcome(out, event)
        elif isinstance(event, Done):
            self._close(out)
            stop_reason = anthropic_stop_reason(event.stop_reason)
            kinds = {type(block) for block in self.message.content}
            only_server_calls = ResponseServerToolUseBlock in kinds and (
                ResponseToolUseBlock not in kinds
            )
            if stop_reason == "tool_use" and only_server_calls:
                stop_reason = "end_turn"  # only server tools were called: nothing for the client
            delta = MessageDeltaBody(
                stop_reason=stop_reason,
                stop_sequence=event.stop_sequence,
            )
            final = anthropic_usage(event.usage)
            if self._server_tools:
                final.server_tool_use = ServerToolUsage(web_search_requests=self._searches)
            edits = self._context_management
            if self._timings:
                timed = timed_usage(final, event.timings)
                self._emit(
                    out, TimedMessageDeltaEvent(delta=delta, usage=timed, context_management=edits)
                )
            else:
                self._emit(
                    out, MessageDeltaEvent(delta=delta, usage=final, context_management=edits)
                )
            self._emit(out, MessageStopEvent())
        return out

    # --- block lifecycle --------------------------------------------------------------------

    def _start(self, out: list[BlockEvent], usage: Usage) -> None:
        self._started = True
        self._emit(
            out,
            MessageStartEvent(message=self.message.model_copy(update={"usage": usage}, deep=True)),
        )

    def _ensure_open(self, out: list[BlockEvent], kind: str) -> None:
        if self._open == kind:
            return
        self._close(out)
        block: ResponseTextBlock | ResponseThinkingBlock = (
            ResponseTextBlock() if kind == "text" else ResponseThinkingBlock()
        )
        self._emit(out, ContentBlockStartEvent(index=self._next_index, content_block=block))
        self._open = kind

    def _close(self, out: list[BlockEvent]) -> None:
        if self._open is None:
            return
        if self._open == "thinking":
            signature = thinking_signature("".join(self._thinking_text))
            self._emit(out, self._delta(SignatureDeltaPart(signature=signature)))
            self._thinking_text = []
        if self._open in ("tool_use", "server_tool_use"):
            # The reduction: the block's input is its deltas taken together (as a client's
            # accumulator does), read only once they are complete.
            block = self.message.content[self._next_index - 1]
            assert isinstance(block, ResponseToolUseBlock | ResponseServerToolUseBlock)
            block.input = tool_input("".join(self._input_parts), block.name)
            self._input_parts = []
            self._streaming_call = None
        self._emit(out, ContentBlockStopEvent(index=self._next_index - 1))
        self._open = None

    def _add_search_outcome(self, out: list[BlockEvent], outcome: SearchOutcome) -> None:
        """A search call's result block, whole in its start event (as the API sends it)."""
        self._close(out)
        content: list[WebSearchResult] | WebSearchToolResultError
        if outcome.error is not None:
            content = WebSearchToolResultError(error_code=outcome.error)
        else:
            content = [
                WebSearchResult(
                    url=hit.url,
                    title=hit.title,
                    encrypted_content=encode_page(hit.snippet),
                    page_age=hit.page_age,
                )
                for hit in outcome.results
            ]
            self._searches += 1
        result = ResponseWebSearchToolResultBlock(tool_use_id=outcome.call_id, content=content)
        self._emit(out, ContentBlockStartEvent(index=self._next_index, content_block=result))
        self._emit(out, ContentBlockStopEvent(index=self._next_index - 1))

    def _start_tool_call(self, out: list[BlockEvent], call_id: str, name: str) -> None:
        self._close(out)
        block: ResponseToolUseBlock | ResponseServerToolUseBlock
        if name in self._server_tools:
            # The server tool loop names its calls; without it, a fresh id.
            server_id = call_id if call_id.startswith(SERVER_CALL_PREFIX) else ""
            block = ResponseServerToolUseBlock(
                id=server_id or new_server_tool_use_id(), name=name, input={}
            )
            self._open = "server_tool_use"
        else:
            block = ResponseToolUseBlock(id=call_id or new_tool_use_id(), name=name, input={})
            self._open = "tool_use"
        self._emit(out, ContentBlockStartEvent(index=self._next_index, content_block=block))
        self._streaming_call = call_id

    def _add_tool_call(self, out: list[BlockEvent], call: ToolCallEvent) -> None:
        """A call ends: one that streamed closes (its deltas already are its input, unless it
        sent none); one that arrives whole is sent as one piece."""
        streaming = self._open in ("tool_use", "server_tool_use") and (
            self._streaming_call == call.id
        )
        if streaming and self._input_parts:
            self._close(out)
            return
        if not streaming:
            self._start_tool_call(out, call.id, call.name)
        arguments = tool_input(call.arguments, call.name)
        partial = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        self._input_parts.append(partial)
        self._emit(out, self._delta(InputJsonDeltaPart(partial_json=partial)))
        self._close(out)

    @property
    def _next_index(self) -> int:
        return len(self.message.content)

    def _delta(
        self, part: TextDeltaPart | ThinkingDeltaPart | SignatureDeltaPart | InputJsonDeltaPart
    ) -> ContentBlockDeltaEvent:
        return ContentBlockDeltaEvent(index=self._next_index - 1, delta=part)

    # --- the reduction that builds the non-streaming message ----------------------------------

    def _emit(self, out: list[BlockEvent], event: BlockEvent) -> None:
        apply_event(self.message, event)
        if isinstance(event, MessageStopEvent):
            self._finished = True
        out.append(event)


def apply_event(message: Message, event: BlockEvent) -> None:
    """Fold one stream event into `message` (what a client's stream accumulator does)."""
    if isinstance(event, MessageStartEvent):
        message.usage = event.message.usage.model_copy()
    elif isinstance(event, ContentBlockStartEvent):
        message.content.append(event.content_block.model_copy(deep=True))
    elif isinstance(event, ContentBlockDeltaEvent):
        block = message.content[event.index]
        delta = event.delta
        if isinstance(delta, TextDeltaPart) and isinstance(block, ResponseTextBlock):
            block.text += delta.text
        elif isinstance(delta, ThinkingDeltaPart) and isinstance(block, ResponseThinkingBlock):
            block.thinking += delta.thinking
        elif isinstance(delta, SignatureDeltaPart) and isinstance(block, ResponseThinkingBlock):
            block.signature = delta.signature
        # Tool input: `ContentBlockStream` sets it at the block's stop, from all its deltas.
    elif isinstance(event, MessageDeltaEvent):
        message.stop_reason = event.delta.stop_reason
        message.stop_sequence = event.delta.stop_sequence
        message.usage = event.usage.model_copy()
        if event.context_management is not None:
            message.context_management = event.context_management


def tool_input(arguments: str, name: str) -> dict[str, Any]:
    """The arguments object of a tool call. The engine promises JSON text of an object every
    reader holds; if it ever is not, send `{}` rather than fail the answer."""
    parsed = model_arguments(arguments)
    if parsed is None:
        log.warning("tool call %s: arguments are not a JSON object we can send; sending {}",
                    shown(name))  # fmt: skip
        return {}
    return parsed


def new_tool_use_id() -> str:
    """A fresh `toolu_…` id."""
    return "toolu_" + secrets.token_hex(12)


def new_message_id() -> str:
    """A fresh `msg_…` id."""
    return "msg_" + secrets.token_hex(12)
