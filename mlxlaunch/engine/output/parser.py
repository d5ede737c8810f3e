"""Streaming output parser: turns decoded text into thinking, text and tool-call events.

The engine feeds decoded text piece by piece (`feed`) and calls `finish` at the end. The parser is
a small state machine over the raw text:

    TEXT ──think_start──▶ THINKING ──think_end──▶ TEXT
    TEXT ──tool_call_start──▶ TOOL_CALL ──tool_call_end──▶ TEXT   (parse the span)
    THINKING ──tool_call_start──▶ TOOL_CALL      (a call opened before </think>, as mlx-lm allows)
    TEXT ──stop sequence──▶ DONE                 (`stopped_by` set)
    TOOL_CALL ──(max_tool_calls reached)──▶ DONE (`tool_limit_reached` set)

In each state a `MarkerSet` lists the strings that leave it; the earliest-completing one wins, and
a tail of the buffer that could still become a marker is held back until the next piece settles
it, so markers split across pieces ("<thi" + "nk>") are still recognised and never leak.
The buffer only ever holds that tail plus the newest piece (tool-call bodies move to a list), so
each `feed` costs O(piece + longest marker) per marker, and memory is the markers themselves.

Policies the server relies on (see also `OutputParser`):
- Stop sequences apply to visible text only — not inside thinking spans and not inside tool-call
  markup — matching Anthropic, which applies them to the text output. Text is scanned in stream
  order, so "text STOP <tool_call>…" stops at STOP and no call is produced.
- Markers never reach the client: a stray `think_start` inside thinking and a stray `think_end` in
  text are dropped. With `tools_enabled=False` tool-call markup is ordinary text.
- A tool-call span the family parser cannot read (it raises, bad JSON, no name, arguments not an
  object) comes back verbatim — markers included — as text. So does a span left open at the end
  when the family has an explicit end marker; families without one (mistral: `tool_call_end=""`)
  run to the end of the output and are parsed at `finish`.
- Tool names are not checked against `config.tools`: an unknown name is still emitted, and the
  client (Claude Code) answers it with a tool error the model can read and correct. A name that
  differs from one declared tool only in case (`bash` for `Bash`) is that tool's name.
- Whitespace: each text run (at the start, after thinking, after a tool call) loses its leading
  blank lines (indentation of its first line is kept) and its trailing whitespace; text that is
  only whitespace produces nothing. Thinking runs are stripped on both ends. Text right before a
  stop sequence keeps its trailing whitespace (Anthropic returns exactly the text before it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from mlxlaunch.engine.output.markers import MarkerKind, MarkerMatch, MarkerSet
from mlxlaunch.engine.output.spans import (
    BufferedReader,
    CallArgs,
    CallBegin,
    CallEnd,
    CallPiece,
    SpanReader,
    SpanReaderFactory,
)
from mlxlaunch.engine.output.tools import ToolParser, mlx_lm_span_parser
from mlxlaunch.engine.tool_ids import client_tool_id
from mlxlaunch.engine.types import (
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolInputDelta,
    ToolSpec,
)

ParsedEvent = TextDelta | ThinkingDelta | ToolCallStart | ToolInputDelta | ToolCallEvent
EventT = TypeVar("EventT")


@dataclass
class ParserConfig:
    """What the parser needs to know about the model and the request."""

    think_start: str | None = None  # e.g. "<think>"; None: the model has no thinking syntax
    think_end: str | None = None
    start_in_thinking: bool = False  # the rendered prompt already opened a think span
    tool_call_start: str | None = None  # e.g. "<tool_call>"
    tool_call_end: str | None = None  # "" or None: the span runs to the end of the output
    tool_parser: ToolParser | None = None  # mlx-lm's parse_tool_call(text, tools)
    # Reads each tool-call span as it arrives (streaming families); None: `tool_parser` reads
    # the whole span at its end.
    span_reader: SpanReaderFactory | None = None
    # The output is one tool-call span when it starts with this (Llama 3's bare JSON call).
    leading_call: str | None = None
    tools: list[ToolSpec] = field(default_factory=list)
    tools_enabled: bool = True  # False: tool-call markup is returned as text
    stop_sequences: list[str] = field(default_factory=list)
    # None: unlimited. N: after the N-th call the parser is `done` (the engine stops generating
    # and ends the turn with "tool_use"); further calls in the same span are dropped.
    max_tool_calls: int | None = None
    # True: the output is constrained to tool calls (tool_choice any/tool), so a call that the
    # end of generation (max_tokens) cuts off is dropped: its markup is not text anyone wrote.
    calls_forced: bool = False


class _State(Enum):
    TEXT = "text"
    THINKING = "thinking"
    TOOL_CALL = "tool_call"
    DONE = "done"


class TextRun:
    """Whitespace trimming for one run of text or thinking (harmony's message bodies too).

    Trailing whitespace is held until non-whitespace follows, so a run that turns out to be only
    whitespace (e.g. "\\n\\n" before a tool call) never produces an event.
    """

    def __init__(self, keep_indent: bool) -> None:
        self._keep_indent = keep_indent
        self._pending: list[str] = []  # whitespace seen since the last emitted character
        self.started = False  # something of this run has been emitted

    def add(self, text: str) -> str:
        """Take more of the run; return what can be emitted now."""
        body = text.rstrip()
        if not body:
            self._pending.append(text)  # a list, so long whitespace runs stay linear
            return ""
        out = "".join(self._pending) + body
        self._pending = [text[len(body) :]]
        if not self.started:
            out = self._trim_leading(out)
            self.started = True
        return out

    def end(self, keep_trailing: bool) -> str:
        """Close the run; return its held trailing whitespace if asked to keep it."""
        tail = "".join(self._pending) if keep_trailing and self.started else ""
        self._pending = []
        self.started = False
        return tail

    def _trim_leading(self, text: str) -> str:
        if not self._keep_indent:
            return text.lstrip()
        lead = text[: len(text) - len(text.lstrip())]
        cut = max(lead.rfind("\n"), lead.rfind("\r")) + 1  # drop blank lines, keep indentation
        return text[cut:]


class StreamingParser(Generic[EventT]):
    """What the output parsers share: the stop flags, `feed`, and the event queue.

    A parser keeps unclassified text in `_buffer`, moves it on in `_advance` and queues what it
    completes in `_events`; once `_ended` it takes no more text.
    """

    def __init__(self, config: ParserConfig) -> None:
        if config.max_tool_calls is not None and config.max_tool_calls < 1:
            raise ValueError("max_tool_calls must be None or at least 1")
        self.config = config
        self.stopped_by: str | None = None  # the stop sequence that matched, if any
        self.tool_limit_reached = False
        self.tool_calls_emitted = 0
        self._buffer = ""  # not yet classified: held-back tail plus the newest piece
        self._events: list[EventT] = []

    @property
    def stopped(self) -> bool:
        """True once a stop sequence matched."""
        return self.stopped_by is not None

    @property
    def done(self) -> bool:
        """True once the output is complete for the client: stop generating."""
        return self.stopped or self.tool_limit_reached

    def feed(self, text: str) -> list[EventT]:
        """Take the next decoded piece; return the events it completes."""
        if self._ended() or not text:
            return []
        self._buffer += text
        self._advance(final=False)
        return self._take_events()

    def finish(self) -> list[EventT]:
        """End of generation: settle what is open; return the events that completes."""
        if self._ended():
            return []
        self._advance(final=True)
        self._settle()
        return self._take_events()

    def _ended(self) -> bool:
        raise NotImplementedError

    def _settle(self) -> None:
        raise NotImplementedError

    def _advance(self, final: bool) -> None:
        raise NotImplementedError

    def _take_events(self) -> list[EventT]:
        events, self._events = self._events, []
        return events


class OutputParser(StreamingParser[ParsedEvent]):
    """Feed decoded text with `feed`; call `finish` at the end of generation.

    Both return events in output order. After `done` becomes true the engine should stop
    generating: `stopped` (a stop sequence matched, `stopped_by` says which; stop_reason
    "stop_sequence") or `tool_limit_reached` (`max_tool_calls` calls emitted; stop_reason
    "tool_use"). Later `feed`/`finish` calls return nothing.
    """

    def __init__(self, config: ParserConfig) -> None:
        super().__init__(config)
        thinking = bool(config.think_start and config.think_end)
        self._readers = _reader_factory(config) if config.tools_enabled else None
        self._tool_start = (config.tool_call_start or "") if self._readers else ""
        self._tool_end = config.tool_call_end or ""
        self._reader: SpanReader | None = None  # the open span's reader
        self._call: ToolCallStart | None = None  # the call the reader is inside
        self._announced = False  # its ToolCallStart was sent
        self._call_sent: list[str] = []  # its arguments as sent so far
        self._ids_used: set[str] = set()  # tool-use ids of this output
        # Before any output: the whole output may turn out to be a call (`leading_call`).
        self._leading = config.leading_call if self._readers else None

        think_markers: list[tuple[str, MarkerKind]] = []
        if thinking:
            assert config.think_start and config.think_end
            think_markers = [
                (config.think_start, MarkerKind.THINK_START),
                (config.think_end, MarkerKind.THINK_END),
            ]
        tool_markers = [(self._tool_start, MarkerKind.TOOL_START)]
        stop_markers = [(stop, MarkerKind.STOP) for stop in config.stop_sequences]
        self._markers = {
            _State.TEXT: MarkerSet(think_markers + tool_markers + stop_markers),
            _State.THINKING: MarkerSet(think_markers + tool_markers),
            _State.TOOL_CALL: MarkerSet([(self._tool_end, MarkerKind.TOOL_END)]),
        }

        self._state = _State.THINKING if thinking and config.start_in_thinking else _State.TEXT
        self._tool_body: list[str] = []
        self._text = TextRun(keep_indent=True)
        self._thinking = TextRun(keep_indent=False)

    def _ended(self) -> bool:
        return self._state is _State.DONE

    def _settle(self) -> None:
        """Release held-back text and settle any open span."""
        if self._state is _State.TOOL_CALL:
            assert self._reader is not None
            if not self._tool_end:  # the span runs to the end of the output: it is complete
                self._complete_tool_call(end_marker="")
            elif self._reader.committed:  # cut off after the client saw it start: end it
                self._take_pieces(self._reader.close(complete=False) or [])
                self._state = _State.TEXT if self._state is _State.TOOL_CALL else self._state
            elif self.config.calls_forced:  # cut off: nothing to keep
                self._tool_body = []
                self._state = _State.TEXT
            else:  # the end marker never came: the call is incomplete
                self._state = _State.TEXT
                self._emit_text(self._text.add(self._span_text()))
        self._emit_text(self._text.end(keep_trailing=False))
        self._thinking.end(keep_trailing=False)
        self._state = _State.DONE

    # --- the state machine ---------------------------------------------------------------

    def _advance(self, final: bool) -> None:
        """Classify as much of the buffer as can be decided; at `final`, all of it."""
        if self._leading is not None and not self._leading_settled(final):
            return
        while self._state is not _State.DONE:
            markers = self._markers[self._state]
            match = markers.first_match(self._buffer)
            if match is None:
                keep = 0 if final else markers.held_back(self._buffer)
                cut = len(self._buffer) - keep
                self._content(self._buffer[:cut])
                self._buffer = self._buffer[cut:]
                return
            self._content(self._buffer[: match.start])
            self._buffer = self._buffer[match.end :]
            self._on_marker(match)

    def _content(self, text: str) -> None:
        if not text:
            return
        if self._state is _State.TEXT:
            self._emit_text(self._text.add(text))
        elif self._state is _State.THINKING:
            self._emit_thinking(self._thinking.add(text))
        elif self._state is _State.TOOL_CALL:
            self._tool_body.append(text)
            assert self._reader is not None
            self._take_pieces(self._reader.feed(text))

    def _on_marker(self, match: MarkerMatch) -> None:
        kind, state = match.kind, self._state
        if kind is MarkerKind.STOP:
            self.stopped_by = match.marker
            self._emit_text(self._text.end(keep_trailing=True))
            self._finish_early()
        elif kind is MarkerKind.THINK_START and state is _State.TEXT:
            self._text.end(keep_trailing=False)
            self._state = _State.THINKING
        elif kind is MarkerKind.THINK_END and state is _State.THINKING:
            self._thinking.end(keep_trailing=False)
            self._state = _State.TEXT
        elif kind is MarkerKind.TOOL_START:
            # The text run stays open: if the span is malformed it continues as text.
            self._thinking.end(keep_trailing=False)
            self._open_span()
        elif kind is MarkerKind.TOOL_END:
            self._complete_tool_call(end_marker=match.marker)
        # Otherwise a stray think marker (start inside thinking, end inside text): dropped.

    def _leading_settled(self, final: bool) -> bool:
        """Whether the output's start decided if it is a call (`leading_call`); if it is, the
        whole output from there on is the span. False: wait for more text."""
        assert self._leading is not None
        head = self._buffer.lstrip()
        if not head and not final:
            return False
        if len(head) < len(self._leading) and self._leading.startswith(head) and not final:
            return False
        leading, self._leading = self._leading, None
        if head.startswith(leading):
            self._buffer = head
            self._open_span()
        return True

    def _open_span(self) -> None:
        assert self._readers is not None
        self._tool_body = []
        self._reader = self._readers()
        self._state = _State.TOOL_CALL

    def _span_text(self) -> str:
        return self._tool_start + "".join(self._tool_body)

    def _complete_tool_call(self, end_marker: str) -> None:
        assert self._reader is not None
        committed = self._reader.committed
        pieces = self._reader.close(complete=True)
        self._state = _State.TEXT
        if pieces is None and not committed:
            self._emit_text(self._text.add(self._span_text() + end_marker))
            self._tool_body = []
            return
        self._tool_body = []
        self._take_pieces(pieces or [])

    def _take_pieces(self, pieces: list[CallPiece]) -> None:
        """Turn a reader's pieces into events; stop at the call limit.

        A call is announced (`ToolCallStart`) only when it stays open past this batch of
        pieces or its arguments stream: a call read whole arrives as one `ToolCallEvent`."""
        for piece in pieces:
            if self._state is _State.DONE:
                return
            if isinstance(piece, CallBegin):
                self._text.end(keep_trailing=False)  # whitespace before a call is formatting
                call_id = client_tool_id(piece.model_id)
                if call_id in self._ids_used:  # a model repeating an id: keep ids unique
                    call_id = client_tool_id(None)
                self._ids_used.add(call_id)
                self._call = ToolCallStart(call_id, declared_name(piece.name, self.config.tools))
                self._announced = False
                self._call_sent = []
            elif isinstance(piece, CallArgs):
                if self._call is not None and piece.text:
                    self._announce()
                    self._events.append(ToolInputDelta(self._call.id, piece.text))
                    self._call_sent.append(piece.text)
            elif isinstance(piece, CallEnd) and self._call is not None:
                call, self._call = self._call, None
                sent, self._call_sent = "".join(self._call_sent), []
                arguments = piece.arguments if piece.complete else flag_incomplete(piece.arguments)
                if sent and arguments.startswith(sent) and len(arguments) > len(sent):
                    self._events.append(ToolInputDelta(call.id, arguments[len(sent) :]))
                self._events.append(ToolCallEvent(call.id, call.name, arguments))
                self.tool_calls_emitted += 1
                limit = self.config.max_tool_calls
                if limit is not None and self.tool_calls_emitted >= limit:
                    self.tool_limit_reached = True
                    self._finish_early()
        if self._call is not None and self._state is not _State.DONE:
            self._announce()

    def _announce(self) -> None:
        if self._call is not None and not self._announced:
            self._events.append(self._call)
            self._announced = True

    def _finish_early(self) -> None:
        self._state = _State.DONE
        self._buffer = ""
        self._tool_body = []

    # --- events ----------------------------------------------------------------------------

    def _emit_text(self, text: str) -> None:
        self._emit(TextDelta, text)

    def _emit_thinking(self, text: str) -> None:
        self._emit(ThinkingDelta, text)

    def _emit(self, kind: type[TextDelta] | type[ThinkingDelta], text: str) -> None:
        """Text or thinking, joined to the last event when that is of the same kind."""
        if not text:
            return
        last = self._events[-1] if self._events else None
        if type(last) is kind:
            assert isinstance(last, TextDelta | ThinkingDelta)
            self._events[-1] = kind(last.text + text)
        else:
            self._events.append(kind(text))


# Added to the arguments of a call the output cut off or spoiled: the client's schema check
# (Claude Code's tools allow no other keys) then refuses the call and tells the model, instead
# of running a shortened command or writing half a file.
INCOMPLETE_KEY = "mlxlaunch_error"
INCOMPLETE_NOTE = "the tool call's arguments were cut off before they were complete"


def flag_incomplete(arguments: str) -> str:
    """`arguments` (a JSON object's text) with the incomplete-call note as its last key."""
    body = arguments.rstrip()
    assert body.endswith("}")
    body = body[:-1]
    separator = "" if body.rstrip().endswith("{") else ", "
    return f"{body}{separator}{json.dumps(INCOMPLETE_KEY)}: {json.dumps(INCOMPLETE_NOTE)}}}"


def declared_name(name: str, tools: list[ToolSpec]) -> str:
    """`name` as the request declared it: exact, else the one tool it matches ignoring case."""
    if not tools or any(tool.name == name for tool in tools):
        return name
    folded = [tool.name for tool in tools if tool.name.casefold() == name.casefold()]
    return folded[0] if len(folded) == 1 else name


def _reader_factory(config: ParserConfig) -> SpanReaderFactory | None:
    """How this request's tool-call spans are read: the family's streaming reader, or its
    mlx-lm parser over the whole span; None when the model has no tool-call syntax."""
    if config.span_reader is not None:
        return config.span_reader
    parser = config.tool_parser
    if parser is None:
        return None
    parse = mlx_lm_span_parser(parser, config.tools)
    return lambda: BufferedReader(parse)
