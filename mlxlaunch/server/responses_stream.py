"""Engine events → Responses output items and stream events: one state machine, both paths.

`ResponseStream.feed()` turns each engine event into the events of the Responses grammar
(response.created and .in_progress first; each output item added, its parts and deltas, then
done, one item open at a time; response.completed or .incomplete last) and folds them into
`response`, so the non-streaming answer is the reduction of the same events.

Thinking is a `reasoning` item whose summary is the thinking text (a local model's thinking
is not secret); the client sends it back and the next prompt renders it where the model
wrote it. Tool-call arguments stream as the engine's deltas, which join to JSON text; a custom
(freeform) tool's call streams the raw text of its one `input` argument, decoded as it comes.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from typing import Any

from mlxlaunch.engine.types import (
    FREEFORM_INPUT,
    Admitted,
    Done,
    Progress,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolInputDelta,
)
from mlxlaunch.engine.types import Usage as EngineUsage
from mlxlaunch.protocol.limits import shown
from mlxlaunch.protocol.openai_responses import (
    ArgumentsDoneEvent,
    ContentPartEvent,
    CustomInputDoneEvent,
    IncompleteDetails,
    InputTokensDetails,
    ItemDeltaEvent,
    OutputCustomToolCall,
    OutputFunctionCall,
    OutputItem,
    OutputItemEvent,
    OutputMessage,
    OutputReasoning,
    OutputTextPart,
    OutputWebSearchCall,
    ResponseError,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponseUsage,
    SearchSource,
    StreamEvent,
    SummaryDeltaEvent,
    SummaryDoneEvent,
    SummaryPart,
    SummaryPartEvent,
    TextDeltaEvent,
    TextDoneEvent,
    WebSearchCallEvent,
)
from mlxlaunch.server.call_arguments import StringArgumentStream, freeform_input, model_arguments
from mlxlaunch.server.responses_mapping import ToolNames, client_call_id
from mlxlaunch.server.sealed_reasoning import ReasoningSeal
from mlxlaunch.server.web_search import SERVER_CALL_PREFIX, SearchOutcome, ServedEvent

log = logging.getLogger("mlxlaunch.server")


def new_response_id() -> str:
    """A fresh `resp_…` id (the store names its files by it)."""
    return "resp_" + secrets.token_hex(12)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def response_usage(usage: EngineUsage) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
        output_tokens=usage.output_tokens,
        total_tokens=usage.prompt_tokens + usage.output_tokens,
    )


def new_response(response_id: str, model: str, **fields: Any) -> ResponseObject:
    return ResponseObject(id=response_id, created_at=int(time.time()), model=model, **fields)


class ResponseStream:
    """Builds one response from engine events.

    Args:
        response: the response object to fill (its id, model and echoed request fields set).
        names: the request's tool names, to answer calls under the client's names.
        server_tools: names of the tools the server runs (web search): a call of one is a
            `web_search_call` item, done when its `SearchOutcome` comes.
        seal: where the client asked for `reasoning.encrypted_content`, what seals each
            reasoning item's text into it (server/sealed_reasoning.py).
    """

    def __init__(
        self,
        response: ResponseObject,
        names: ToolNames,
        server_tools: frozenset[str] = frozenset(),
        seal: ReasoningSeal | None = None,
    ) -> None:
        self.response = response
        self._names = names
        self._server_tools = server_tools
        self._seal = seal  # seals each reasoning item's text into it (`include` asked)
        self._searches: dict[str, OutputWebSearchCall] = {}  # srvtoolu_ id → its item
        self._sequence = 0
        self._started = False
        self._finished = False
        self._open: OutputItem | None = None
        self._engine_call: str | None = None  # the engine id of the open function call
        self._streamed = False  # the open call has had argument deltas
        self._input: StringArgumentStream | None = None  # the open custom call's input

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, event: ServedEvent) -> list[StreamEvent]:
        """The stream events that follow from one engine event (often none or one)."""
        out: list[StreamEvent] = []
        if isinstance(event, Progress):
            return out
        if self._finished:
            raise RuntimeError(f"engine event after Done: {event!r}")
        if not self._started:
            self._start(out)
        if isinstance(event, Admitted):
            usage = EngineUsage(event.prompt_tokens, event.cached_tokens, 0)
            self.response.usage = response_usage(usage)
        elif isinstance(event, TextDelta):
            if event.text:
                self._text(out, event.text)
        elif isinstance(event, ThinkingDelta):
            if event.text:
                self._thinking(out, event.text)
        elif isinstance(event, ToolCallStart | ToolCallEvent) and event.name in self._server_tools:
            self._search_call(out, event)
        elif isinstance(event, SearchOutcome):
            self._search_done(out, event)
        elif isinstance(event, ToolCallStart):
            self._open_call(out, event.id, event.name)
        elif isinstance(event, ToolInputDelta):
            if event.id == self._engine_call and event.partial_json:
                self._arguments(out, event.partial_json)
        elif isinstance(event, ToolCallEvent):
            self._end_call(out, event)
        elif isinstance(event, Done):
            self._finish(out, event)
        return out

    def fail(self, code: str, message: str) -> list[StreamEvent]:
        """response.failed, after the items so far are closed."""
        out: list[StreamEvent] = []
        if not self._started:
            self._start(out)
        try:
            self._close(out)
        except Exception:  # whatever failed the response must not stop its `response.failed`
            log.exception("closing the open output item of a failed response")
            self._open = None
        self.response.status = "failed"
        self.response.error = ResponseError(code=code, message=message)
        self._finished = True
        self._emit(out, ResponseLifecycleEvent(type="response.failed", response=self._snapshot()))
        return out

    # --- items ------------------------------------------------------------------------------

    def _start(self, out: list[StreamEvent]) -> None:
        self._started = True
        for kind in ("response.created", "response.in_progress"):
            self._emit(out, ResponseLifecycleEvent(type=kind, response=self._snapshot()))

    def _add(self, out: list[StreamEvent], item: OutputItem) -> None:
        self._close(out)
        self.response.output.append(item)
        self._open = item
        self._emit(
            out,
            OutputItemEvent(
                type="response.output_item.added",
                output_index=self._index,
                item=item.model_copy(deep=True),
            ),
        )

    def _text(self, out: list[StreamEvent], text: str) -> None:
        if not isinstance(self._open, OutputMessage):
            self._add(out, OutputMessage(id=_item_id("msg")))
            assert isinstance(self._open, OutputMessage)
            self._open.content.append(OutputTextPart())
            self._emit(out, self._part_event("response.content_part.added", OutputTextPart()))
        message = self._open
        message.content[0].text += text
        self._emit(
            out,
            TextDeltaEvent(
                type="response.output_text.delta",
                item_id=message.id,
                output_index=self._index,
                content_index=0,
                delta=text,
            ),
        )

    def _thinking(self, out: list[StreamEvent], text: str) -> None:
        if not isinstance(self._open, OutputReasoning):
            self._add(out, OutputReasoning(id=_item_id("rs")))
            assert isinstance(self._open, OutputReasoning)
            self._open.summary.append(SummaryPart())
            self._emit(out, self._summary_event("response.reasoning_summary_part.added"))
        reasoning = self._open
        reasoning.summary[0].text += text
        self._emit(
            out,
            SummaryDeltaEvent(
                type="response.reasoning_summary_text.delta",
                item_id=reasoning.id,
                output_index=self._index,
                summary_index=0,
                delta=text,
            ),
        )

    def _search_call(self, out: list[StreamEvent], event: ToolCallStart | ToolCallEvent) -> None:
        """A web search call: its item is added at the call's start (in_progress), and is
        searching once the call is whole (its query known); its arguments never stream."""
        item = self._searches.get(event.id)
        if item is None:
            item = OutputWebSearchCall(id="ws_" + event.id.removeprefix(SERVER_CALL_PREFIX))
            self._searches[event.id] = item
            self._add(out, item)
            self._search_event(out, "response.web_search_call.in_progress", item)
        if isinstance(event, ToolCallEvent):
            query = (model_arguments(event.arguments) or {}).get("query")
            item.action.query = query if isinstance(query, str) else ""
            item.status = "searching"
            self._search_event(out, "response.web_search_call.searching", item)

    def _search_done(self, out: list[StreamEvent], outcome: SearchOutcome) -> None:
        item = self._searches.get(outcome.call_id)
        if item is None:  # the loop answers only calls it saw: never
            log.warning("responses: a search outcome for an unknown call %s", outcome.call_id)
            return
        item.action.sources = [SearchSource(url=hit.url) for hit in outcome.results]
        item.status = "failed" if outcome.error is not None else "completed"
        self._search_event(out, "response.web_search_call.completed", item)
        if self._open is item:
            self._close(out)

    def _search_event(self, out: list[StreamEvent], kind: str, item: OutputWebSearchCall) -> None:
        index = self.response.output.index(item)
        self._emit(out, WebSearchCallEvent(type=kind, item_id=item.id, output_index=index))

    def _open_call(self, out: list[StreamEvent], engine_id: str, model_name: str) -> None:
        namespace, name = self._names.for_client(model_name)
        call_id = client_call_id(engine_id)
        if model_name in self._names.custom:
            self._add(out, OutputCustomToolCall(id=_item_id("ctc"), call_id=call_id, name=name))
            self._input = StringArgumentStream(FREEFORM_INPUT)
        else:
            call = OutputFunctionCall(
                id=_item_id("fc"), call_id=call_id, name=name, namespace=namespace
            )
            self._add(out, call)
        self._engine_call = engine_id
        self._streamed = False

    def _arguments(self, out: list[StreamEvent], piece: str) -> None:
        call = self._open
        if isinstance(call, OutputCustomToolCall):
            assert self._input is not None
            self._input_text(out, call, self._input.feed(piece))
            return
        assert isinstance(call, OutputFunctionCall)
        call.arguments += piece
        self._streamed = True
        self._item_delta(out, "response.function_call_arguments.delta", call.id, piece)

    def _input_text(self, out: list[StreamEvent], call: OutputCustomToolCall, text: str) -> None:
        if text:
            call.input += text
            self._item_delta(out, "response.custom_tool_call_input.delta", call.id, text)

    def _item_delta(self, out: list[StreamEvent], kind: str, item_id: str, piece: str) -> None:
        delta = ItemDeltaEvent(type=kind, item_id=item_id, output_index=self._index, delta=piece)
        self._emit(out, delta)

    def _end_call(self, out: list[StreamEvent], event: ToolCallEvent) -> None:
        """A call ends: one that streamed closes; one that arrives whole is sent as one delta."""
        open_call = isinstance(self._open, OutputFunctionCall | OutputCustomToolCall)
        if not (open_call and self._engine_call == event.id):
            self._open_call(out, event.id, event.name)
        call = self._open
        if isinstance(call, OutputCustomToolCall):
            text = freeform_input(event.arguments)
            if text.startswith(call.input):
                self._input_text(out, call, text[len(call.input) :])
            else:  # the streamed pieces read otherwise than the whole: the whole is the call
                log.warning("custom tool call %s: streamed input differs", shown(call.name))
                call.input = text
        elif not self._streamed:
            arguments = model_arguments(event.arguments)
            if arguments is None:
                log.warning(
                    "tool call %s: arguments are not a JSON object; sending {}", shown(event.name)
                )
                arguments = {}
            self._arguments(out, json.dumps(arguments, ensure_ascii=False))
        self._close(out)

    def _close(self, out: list[StreamEvent]) -> None:
        item = self._open
        if item is None:
            return
        index = self._index
        if isinstance(item, OutputMessage):
            text = item.content[0].text
            self._emit(
                out,
                TextDoneEvent(
                    type="response.output_text.done",
                    item_id=item.id,
                    output_index=index,
                    content_index=0,
                    text=text,
                ),
            )
            self._emit(out, self._part_event("response.content_part.done", item.content[0]))
        elif isinstance(item, OutputReasoning):
            text = item.summary[0].text
            self._emit(
                out,
                SummaryDoneEvent(
                    type="response.reasoning_summary_text.done",
                    item_id=item.id,
                    output_index=index,
                    summary_index=0,
                    text=text,
                ),
            )
            self._emit(out, self._summary_event("response.reasoning_summary_part.done"))
            if self._seal is not None:
                item.encrypted_content = self._seal.seal(text)
        elif isinstance(item, OutputCustomToolCall):
            self._emit(
                out,
                CustomInputDoneEvent(
                    type="response.custom_tool_call_input.done",
                    item_id=item.id,
                    output_index=index,
                    input=item.input,
                ),
            )
            self._engine_call = None
            self._input = None
        elif isinstance(item, OutputFunctionCall):
            if model_arguments(item.arguments) is None:  # the engine promises JSON; if not, {}
                log.warning(
                    "tool call %s: arguments are not a JSON object; sending {}", shown(item.name)
                )
                item.arguments = "{}"
            self._emit(
                out,
                ArgumentsDoneEvent(
                    type="response.function_call_arguments.done",
                    item_id=item.id,
                    output_index=index,
                    name=item.name,
                    arguments=item.arguments,
                ),
            )
            self._engine_call = None
        if not isinstance(item, OutputWebSearchCall):  # a search's status is its outcome's
            item.status = "completed"
        self._open = None
        self._emit(
            out,
            OutputItemEvent(
                type="response.output_item.done",
                output_index=index,
                item=item.model_copy(deep=True),
            ),
        )

    def _finish(self, out: list[StreamEvent], done: Done) -> None:
        self._close(out)
        self.response.usage = response_usage(done.usage)
        if done.stop_reason in ("max_tokens", "context_window"):
            self.response.status = "incomplete"
            self.response.incomplete_details = IncompleteDetails(reason="max_output_tokens")
            kind = "response.incomplete"
        else:
            self.response.status = "completed"
            kind = "response.completed"
        self._finished = True
        self._emit(out, ResponseLifecycleEvent(type=kind, response=self._snapshot()))

    # --- helpers ----------------------------------------------------------------------------

    @property
    def _index(self) -> int:
        return len(self.response.output) - 1

    def _part_event(self, kind: str, part: OutputTextPart) -> ContentPartEvent:
        assert self._open is not None
        return ContentPartEvent(
            type=kind,
            item_id=self._open.id,
            output_index=self._index,
            content_index=0,
            part=part.model_copy(),
        )

    def _summary_event(self, kind: str) -> SummaryPartEvent:
        assert isinstance(self._open, OutputReasoning)
        return SummaryPartEvent(
            type=kind,
            item_id=self._open.id,
            output_index=self._index,
            summary_index=0,
            part=self._open.summary[0].model_copy(),
        )

    def _snapshot(self) -> ResponseObject:
        return self.response.model_copy(deep=True)

    def _emit(self, out: list[StreamEvent], event: StreamEvent) -> None:
        event.sequence_number = self._sequence
        self._sequence += 1
        out.append(event)
