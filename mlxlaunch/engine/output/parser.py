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
each `feed` costs O(piece).

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
  client (Claude Code) answers it with a tool error the model can read and correct.
- Whitespace: each text run (at the start, after thinking, after a tool call) loses its leading
  blank lines (indentation of its first line is kept) and its trailing whitespace; text that is
  only whitespace produces nothing. Thinking runs are stripped on both ends. Text right before a
  stop sequence keeps its trailing whitespace (Anthropic returns exactly the text before it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from mlxlaunch.engine.output.markers import MarkerKind, MarkerMatch, MarkerSet
from mlxlaunch.engine.output.tools import ToolParser, parse_tool_calls, parser_tools
from mlxlaunch.engine.types import (
    GenerationRequest,
    ModelInfo,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
)

ParsedEvent = TextDelta | ThinkingDelta | ToolCallEvent


@dataclass
class ParserConfig:
    """What the parser needs to know about the model and the request."""

    think_start: str | None = None  # e.g. "<think>"; None: the model has no thinking syntax
    think_end: str | None = None
    start_in_thinking: bool = False  # the rendered prompt already opened a think span
    tool_call_start: str | None = None  # e.g. "<tool_call>"
    tool_call_end: str | None = None  # "" or None: the span runs to the end of the output
    tool_parser: ToolParser | None = None  # mlx-lm's parse_tool_call(text, tools)
    tools: list[ToolSpec] = field(default_factory=list)
    tools_enabled: bool = True  # False: tool-call markup is returned as text
    stop_sequences: list[str] = field(default_factory=list)
    # None: unlimited. N: after the N-th call the parser is `done` (the engine stops generating
    # and ends the turn with "tool_use"); further calls in the same span are dropped.
    max_tool_calls: int | None = None
    # True: the output is constrained to tool calls (tool_choice any/tool), so a call that the
    # end of generation (max_tokens) cuts off is dropped: its markup is not text anyone wrote.
    calls_forced: bool = False


def parser_config(
    info: ModelInfo,
    tool_parser: ToolParser | None,
    request: GenerationRequest,
    *,
    opens_thinking: bool,
) -> ParserConfig:
    """What the parser needs for one request: the model's markup (`info`, and its tokenizer's
    `tool_parser`), the request's tools and stops, and whether its prompt opened a think span."""
    return ParserConfig(
        think_start=info.think_start,
        think_end=info.think_end,
        start_in_thinking=opens_thinking,
        tool_call_start=info.tool_call_start,
        tool_call_end=info.tool_call_end,
        tool_parser=tool_parser,
        tools=list(request.tools),
        # Markup is a call only when tools were offered and calls are allowed; else it is text.
        tools_enabled=bool(request.tools) and request.tool_choice.mode != "none",
        stop_sequences=list(request.stop_sequences),
        # Without parallel calls the turn ends after the first one.
        max_tool_calls=None if request.tool_choice.parallel else 1,
        calls_forced=bool(request.tools) and request.tool_choice.mode in ("any", "tool"),
    )


class _State(Enum):
    TEXT = "text"
    THINKING = "thinking"
    TOOL_CALL = "tool_call"
    DONE = "done"


class _Run:
    """Whitespace trimming for one run of text or thinking.

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


class OutputParser:
    """Feed decoded text with `feed`; call `finish` at the end of generation.

    Both return events in output order. After `done` becomes true the engine should stop
    generating: `stopped` (a stop sequence matched, `stopped_by` says which; stop_reason
    "stop_sequence") or `tool_limit_reached` (`max_tool_calls` calls emitted; stop_reason
    "tool_use"). Later `feed`/`finish` calls return nothing.
    """

    def __init__(self, config: ParserConfig) -> None:
        if config.max_tool_calls is not None and config.max_tool_calls < 1:
            raise ValueError("max_tool_calls must be None or at least 1")
        self.config = config
        self.stopped_by: str | None = None  # the stop sequence that matched, if any
        self.tool_limit_reached = False
        self.tool_calls_emitted = 0

        thinking = bool(config.think_start and config.think_end)
        self._tool_parser = config.tool_parser if config.tools_enabled else None
        self._tool_start = (config.tool_call_start or "") if self._tool_parser else ""
        self._tool_end = config.tool_call_end or ""
        self._parser_tools = parser_tools(config.tools)

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
        self._buffer = ""  # not yet classified: held-back tail plus the newest piece
        self._tool_body: list[str] = []
        self._text = _Run(keep_indent=True)
        self._thinking = _Run(keep_indent=False)
        self._events: list[ParsedEvent] = []

    @property
    def stopped(self) -> bool:
        """True once a stop sequence matched."""
        return self.stopped_by is not None

    @property
    def done(self) -> bool:
        """True once the output is complete for the client: stop generating."""
        return self.stopped or self.tool_limit_reached

    def feed(self, text: str) -> list[ParsedEvent]:
        """Take the next decoded piece; return the events it completes."""
        if self._state is _State.DONE or not text:
            return []
        self._buffer += text
        self._advance(final=False)
        return self._take_events()

    def finish(self) -> list[ParsedEvent]:
        """End of generation: release held-back text and settle any open span."""
        if self._state is _State.DONE:
            return []
        self._advance(final=True)
        if self._state is _State.TOOL_CALL:
            if self._tool_end and self.config.calls_forced:  # cut off: nothing to keep
                self._tool_body = []
                self._state = _State.TEXT
            elif self._tool_end:  # the end marker never came: the call is incomplete
                self._state = _State.TEXT
                self._emit_text(self._text.add(self._tool_start + "".join(self._tool_body)))
            else:
                self._complete_tool_call(end_marker="")
        self._emit_text(self._text.end(keep_trailing=False))
        self._thinking.end(keep_trailing=False)
        self._state = _State.DONE
        return self._take_events()

    # --- the state machine ---------------------------------------------------------------

    def _advance(self, final: bool) -> None:
        """Classify as much of the buffer as can be decided; at `final`, all of it."""
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
            self._tool_body = []
            self._state = _State.TOOL_CALL
        elif kind is MarkerKind.TOOL_END:
            self._complete_tool_call(end_marker=match.marker)
        # Otherwise a stray think marker (start inside thinking, end inside text): dropped.

    def _complete_tool_call(self, end_marker: str) -> None:
        body = "".join(self._tool_body)
        self._tool_body = []
        self._state = _State.TEXT
        assert self._tool_parser is not None
        calls = parse_tool_calls(body, self._tool_parser, self._parser_tools)
        if calls is None:
            self._emit_text(self._text.add(self._tool_start + body + end_marker))
            return
        self._text.end(keep_trailing=False)  # whitespace before a call is only formatting
        limit = self.config.max_tool_calls
        for call in calls:
            self._events.append(call)
            self.tool_calls_emitted += 1
            if limit is not None and self.tool_calls_emitted >= limit:
                self.tool_limit_reached = True
                self._finish_early()
                return

    def _finish_early(self) -> None:
        self._state = _State.DONE
        self._buffer = ""
        self._tool_body = []

    # --- events ----------------------------------------------------------------------------

    def _emit_text(self, text: str) -> None:
        if not text:
            return
        last = self._events[-1] if self._events else None
        if isinstance(last, TextDelta):
            self._events[-1] = TextDelta(last.text + text)
        else:
            self._events.append(TextDelta(text))

    def _emit_thinking(self, text: str) -> None:
        if not text:
            return
        last = self._events[-1] if self._events else None
        if isinstance(last, ThinkingDelta):
            self._events[-1] = ThinkingDelta(last.text + text)
        else:
            self._events.append(ThinkingDelta(text))

    def _take_events(self) -> list[ParsedEvent]:
        events, self._events = self._events, []
        return events
