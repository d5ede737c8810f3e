"""Harmony (gpt-oss) output: channel messages in; thinking, text and streamed tool calls out.

gpt-oss writes no markup inside free text: its whole output is a sequence of messages, each a
header and a body, and `HarmonyParser` has the public interface of `OutputParser`.

    <|channel|>analysis<|message|>REASONING<|end|>                     ThinkingDelta
    <|start|>assistant<|channel|>commentary<|message|>PREAMBLE<|end|>  TextDelta (a preamble)
    <|start|>assistant<|channel|>commentary to=functions.Bash <|constrain|>json<|message|>{…}
                               ToolCallStart at `{`, ToolInputDelta pieces, ToolCallEvent
    <|start|>assistant<|channel|>final<|message|>ANSWER                TextDelta

What the parser is fed (measured on the real template and the detokenizer): the prompt ends with
`<|start|>assistant`, so the first header usually starts at `<|channel|>` (or ` to=functions.X`,
the recipient-first form the template renders history in, or plain text: a final answer with no
header at all). Special tokens stay in the decoded text, except the one that ended generation:
`<|return|>` and `<|call|>` are end-of-sequence tokens, so the end of the output (`finish`) also
ends the message it is in.

    IDLE ──<|start|> / <|channel|> / " to="──▶ HEADER ──<|message|>──▶ BODY ──<|end|>──▶ IDLE
    IDLE ──other text──▶ BODY (final)        BODY ──<|start|> / <|channel|>──▶ HEADER
    BODY (text) ──stop sequence──▶ DONE      BODY (call) ──max_tool_calls──▶ DONE

Policies (those of `OutputParser` where they apply):
- Recipients: only `functions.NAME` is a client tool. A call's body streams as ToolInputDelta
  pieces through `JsonObjectStream` (only text some suffix can still complete) and the call ends
  when its object closes, at the next marker, or at the end of the output, repaired so the
  pieces concatenate to a JSON object. The call starts (ToolCallStart) at the body's first
  character when that is `{`; a body that is not an object is text, and so is the body of any
  other recipient (`browser.search`, `python`) and every body when tools are disabled. A call
  the output cuts off is repaired even when calls are forced (`calls_forced` is not needed):
  the end of the output is how every harmony call ends.
- Channels: analysis is thinking; final and recipient-less commentary (a preamble) are text.
  Stop sequences apply to text bodies only, scanned in stream order.
- Markup never reaches the client. A header that is not one (words it cannot hold, a newline,
  over `_HEADER_LIMIT` characters, or cut short by a marker) comes back as its words (as text,
  without the role); a marker out of place is dropped (`<|end|>` between messages) or, inside
  a text body, reads as a space (`<|message|>`, `<|constrain|>`). Nothing raises on any input,
  and the events do not depend on how the output was split into pieces.
- Whitespace: each body is a run, trimmed as `OutputParser` trims its runs (text keeps the
  indentation of its first line; thinking is stripped); two text (or thinking) messages in a row
  are joined by a blank line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from mlxlaunch.engine.output.json_stream import JsonObjectStream
from mlxlaunch.engine.output.markers import MarkerKind, MarkerMatch, MarkerSet
from mlxlaunch.engine.output.parser import ParserConfig, StreamingParser, TextRun, declared_name
from mlxlaunch.engine.tool_ids import client_tool_id
from mlxlaunch.engine.types import (
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolInputDelta,
)

HarmonyEvent = TextDelta | ThinkingDelta | ToolCallStart | ToolInputDelta | ToolCallEvent

START = "<|start|>"
END = "<|end|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
CALL = "<|call|>"
RETURN = "<|return|>"
# Markers that end a message. `<|call|>` and `<|return|>` normally end generation and are not
# fed at all; `<|endoftext|>` is the tokenizer's pad/eos token.
_MESSAGE_ENDS = frozenset({END, CALL, RETURN, "<|endoftext|>"})
_MARKUP = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN, "<|endoftext|>")

CHANNELS = ("analysis", "commentary", "final")
FUNCTIONS = "functions."  # the namespace of the client's tools
_HEADER_LIMIT = 200  # characters; a real header is a few words
_HEADER_WORD = re.compile(r"[A-Za-z0-9_.:/=\-]+")
_RECIPIENT = re.compile(r"to=[A-Za-z0-9_.:/\-]+")
_ROLE = "assistant"


@dataclass(frozen=True)
class Header:
    """What a message header says: its channel and recipient (either may be missing)."""

    channel: str | None = None
    recipient: str | None = None


def read_header(raw: str, *, with_role: bool, partial: bool = False) -> Header | None:
    """The header in `raw` (from the message start to `<|message|>`, its `<|channel|>` and
    `<|constrain|>` markers included), or None when `raw` is not a header.

    Args:
        raw: the header text.
        with_role: `raw` follows `<|start|>`, so its first word may be the author's role.
        partial: `raw` may still grow, so its last word may be unfinished.
    """
    if len(raw) > _HEADER_LIMIT or "\n" in raw or "\r" in raw:
        return None
    words = raw.replace(CHANNEL, f" {CHANNEL} ").replace(CONSTRAIN, f" {CONSTRAIN} ").split()
    if partial and words and not raw[-1].isspace() and not raw.endswith((CHANNEL, CONSTRAIN)):
        last = words.pop()  # unfinished: only its characters can be checked
        if not _HEADER_WORD.fullmatch(last):
            return None
        if words and words[-1] == CHANNEL and not any(c.startswith(last) for c in CHANNELS):
            return None
    channel: str | None = None
    recipient: str | None = None
    role_open, content_type = with_role, False
    expect: str | None = None  # the word a marker announced: "channel" or "type"
    for word in words:
        if expect == "channel":
            if word not in CHANNELS:
                return None
            channel, expect = word, None
        elif expect == "type":
            if not _HEADER_WORD.fullmatch(word):
                return None
            content_type, expect = True, None
        elif word == CHANNEL:
            if channel is not None:
                return None
            expect, role_open = "channel", False
        elif word == CONSTRAIN:
            if content_type:
                return None
            expect, role_open = "type", False
        elif word.startswith("to="):
            if recipient is not None or not _RECIPIENT.fullmatch(word):
                return None
            recipient, role_open = word[3:], False
        elif role_open and _HEADER_WORD.fullmatch(word):
            role_open = False
        elif channel is not None and not content_type and _HEADER_WORD.fullmatch(word):
            content_type = True  # `commentary json`, as the template renders calls
        else:
            return None
    if expect is not None and not partial:
        return None
    return Header(channel, recipient)


def header_words(raw: str, *, with_role: bool) -> str:
    """The text of something that looked like a header and was not: its words, without the
    markers and the author's role."""
    text = raw.replace(CHANNEL, " ").replace(CONSTRAIN, " ")
    if with_role and text.startswith(_ROLE):
        text = text[len(_ROLE) :]
    return text


class _State(Enum):
    IDLE = "idle"  # between messages, or at the start of the output
    HEADER = "header"
    BODY = "body"
    DONE = "done"


class _Body(Enum):
    THINKING = "thinking"
    TEXT = "text"
    CALL = "call"
    SKIP = "skip"  # what follows a call's closed object, up to the message's end


class HarmonyParser(StreamingParser[HarmonyEvent]):
    """Feed decoded gpt-oss output with `feed`; call `finish` at the end of generation.

    The same contract as `OutputParser`: both return events in output order; once `done`
    (`stopped`, with `stopped_by`, or `tool_limit_reached`) the engine stops generating and
    later calls return nothing.
    """

    def __init__(self, config: ParserConfig) -> None:
        super().__init__(config)
        # The kind is unused for markup (the marker's text says which it is); stops come last
        # so a stop sequence equal to a marker stops the output.
        markup = [(m, MarkerKind.TOOL_END) for m in _MARKUP]
        stops = [(s, MarkerKind.STOP) for s in config.stop_sequences]
        self._markup = MarkerSet(markup)
        self._text_markers = MarkerSet(markup + stops)

        self._state = _State.IDLE
        self._idle = ""  # text between messages, until it shows whether it is a header
        self._header = ""
        self._with_role = False  # the header follows <|start|> (not the prompt's)
        self._body = _Body.TEXT
        self._run = TextRun(keep_indent=True)
        self._call_name = ""
        self._call_id: str | None = None  # set once the call reached the client
        self._call_json = JsonObjectStream()
        self._call_args: list[str] = []
        self._call_lead = ""  # whitespace before the arguments' `{`
        self._last_block: type | None = None  # the kind of the last event emitted

    def _ended(self) -> bool:
        return self._state is _State.DONE

    def _settle(self) -> None:
        """End of generation (the end-of-sequence token is not fed): settle the open message."""
        if self._state is _State.IDLE and self._idle.strip():
            self._open_body(_Body.TEXT, push_back=self._idle)
            self._advance(final=True)
        elif self._state is _State.HEADER and self._header_ended():
            self._advance(final=True)
        if self._state is _State.BODY:
            self._close_body()
        if self._state is not _State.DONE:
            self._finish_early()

    # --- the state machine ---------------------------------------------------------------

    def _advance(self, final: bool) -> None:
        """Classify as much of the buffer as can be decided; at `final`, all of it."""
        while self._state is not _State.DONE:
            text_body = self._state is _State.BODY and self._body is _Body.TEXT
            markers = self._text_markers if text_body else self._markup
            match = markers.first_match(self._buffer)
            if match is None:
                keep = 0 if final else markers.held_back(self._buffer)
                cut = len(self._buffer) - keep
                content, self._buffer = self._buffer[:cut], self._buffer[cut:]
                if not self._content(content):
                    return
                continue  # the content changed state and came back to the buffer
            content, rest = self._buffer[: match.start], self._buffer[match.start :]
            self._buffer = rest  # the marker stays until the content before it is settled
            if self._content(content):
                continue  # read again in the new state, marker and all
            if self._state is _State.DONE:  # the content completed the last allowed call
                return
            self._buffer = self._buffer[len(match.marker) :]
            self._on_marker(match)

    def _content(self, text: str) -> bool:
        """Take text between markers. True when it was handed back to the buffer (to be read
        again in a new state)."""
        if not text:
            return False
        state = self._state
        if state is _State.IDLE:
            return self._idle_content(text)
        if state is _State.HEADER:
            self._header += text
            return self._check_header()
        body = self._body
        if body is _Body.TEXT:
            self._body_text(TextDelta, text)
        elif body is _Body.THINKING:
            self._body_text(ThinkingDelta, text)
        elif body is _Body.CALL:
            return self._call_content(text)
        return False

    def _idle_content(self, text: str) -> bool:
        self._idle += text
        lead = self._idle.lstrip()
        if lead.startswith("to="):  # the recipient-first header: ` to=functions.X<|channel|>…`
            return self._open_header(self._idle, with_role=False)
        if not "to=".startswith(lead):  # neither a header nor still possibly one: text
            self._open_body(_Body.TEXT, push_back=self._idle)
            return True
        return False

    def _on_marker(self, match: MarkerMatch) -> None:
        marker, state = match.marker, self._state
        if match.kind is MarkerKind.STOP:
            self.stopped_by = marker
            self._emit(TextDelta, self._run.end(keep_trailing=True), new_message=False)
            self._finish_early()
            return
        if state is _State.IDLE:
            self._idle_marker(marker)
        elif state is _State.HEADER:
            self._header_marker(marker)
        elif marker in _MESSAGE_ENDS:
            self._close_body()
        elif marker == START:
            self._close_body()
            self._open_header("", with_role=True)
        elif marker == CHANNEL:  # a new header without <|end|><|start|>assistant
            self._close_body()
            self._open_header(CHANNEL, with_role=False)
        elif self._body in (_Body.TEXT, _Body.THINKING):
            # <|message|> or <|constrain|> out of place (after a header that turned out to be
            # text, say): it separated words, so it reads as a space.
            self._content(" ")

    def _idle_marker(self, marker: str) -> None:
        if self._idle.strip():
            # Text ("t", "to") that waited to see if it began ` to=`: it did not.
            self._open_body(_Body.TEXT, push_back=self._idle + marker)
        elif marker == START:
            self._open_header("", with_role=True)
        elif marker in (CHANNEL, CONSTRAIN):
            self._open_header(marker, with_role=False)
        elif marker == MESSAGE:  # a body with no header at all: final text
            self._open_body(_Body.TEXT)
        # A message end between messages: out of place, dropped.

    def _header_marker(self, marker: str) -> None:
        if marker in (CHANNEL, CONSTRAIN):
            self._header += marker
            self._check_header()
            return
        header = read_header(self._header, with_role=self._with_role)
        if marker == MESSAGE:
            if header is None:  # its words, then the body, as one text
                words = self._header_text().rstrip()
                self._open_body(
                    _Body.TEXT, push_back=words + " " if words else "", keep_indent=False
                )
            else:
                written = (header.recipient or "")[len(FUNCTIONS) :]
                self._call_name = declared_name(written, self.config.tools)
                self._open_body(self._body_for(header))
            return
        # Cut short by <|start|> or a message end: markup, dropped, if it reads as a header
        # with its last word finished; else its words are text.
        self._buffer = marker + self._buffer
        if self._header_ended():
            return  # its words, then the marker, are read again as text
        self._buffer = self._buffer[len(marker) :]
        if marker == START:
            self._open_header("", with_role=True)
        else:
            self._state, self._idle = _State.IDLE, ""

    def _body_for(self, header: Header) -> _Body:
        recipient = header.recipient
        if recipient is not None and recipient.startswith(FUNCTIONS):
            tool = recipient[len(FUNCTIONS) :]
            if tool and self.config.tools_enabled:
                return _Body.CALL
            return _Body.TEXT  # the model was told there are no tools: its arguments are text
        if header.channel == "analysis" and recipient is None:
            return _Body.THINKING
        return _Body.TEXT

    def _open_header(self, raw: str, *, with_role: bool) -> bool:
        """Start a header with `raw`; True when that is already no header (see
        `_check_header`)."""
        self._state, self._idle = _State.HEADER, ""
        self._header, self._with_role = raw, with_role
        return self._check_header()

    def _header_ended(self) -> bool:
        """The header ends without its `<|message|>`: True when it turned out to be text (its
        words are back in the buffer)."""
        self._header += " "  # its last word is complete
        return self._check_header()

    def _check_header(self) -> bool:
        """After the header grew: when it can no longer be one, its words go back to the
        buffer as the text of a final message (True)."""
        if read_header(self._header, with_role=self._with_role, partial=True) is not None:
            return False
        self._open_body(_Body.TEXT, push_back=self._header_text(), keep_indent=False)
        return True

    def _header_text(self) -> str:
        return header_words(self._header, with_role=self._with_role)

    def _open_body(self, body: _Body, push_back: str = "", *, keep_indent: bool = True) -> None:
        """Start a message body; `push_back` is text to read again as its first content.
        `keep_indent=False` for the words of a failed header: where they start depends on
        where the header failed, so leading whitespace is dropped whatever the split."""
        self._state, self._body = _State.BODY, body
        self._idle = ""
        self._run = TextRun(keep_indent=keep_indent and body is not _Body.THINKING)
        if body is _Body.CALL:
            self._call_id, self._call_json, self._call_args = None, JsonObjectStream(), []
            self._call_lead = ""
        self._buffer = push_back + self._buffer

    def _close_body(self) -> None:
        """The message ended (a marker, or the end of the output)."""
        if self._body is _Body.CALL and self._call_id is not None:
            self._complete_call()
            if self._state is _State.DONE:
                return
        self._run.end(keep_trailing=False)
        self._state, self._idle = _State.IDLE, ""

    # --- tool calls ----------------------------------------------------------------------

    def _call_content(self, text: str) -> bool:
        if self._call_id is None:
            lead = text.lstrip()
            if not lead:
                self._call_lead += text  # whitespace before the arguments
                return False
            if lead[0] != "{":  # not a JSON object: the body is text
                self._open_body(_Body.TEXT, push_back=self._call_lead + text)
                return True
            self._call_id = client_tool_id(None)
            self._add_event(ToolCallStart(self._call_id, self._call_name))
        self._forward_args(self._call_json.feed(text))
        if self._call_json.done or self._call_json.broken:
            self._complete_call()
            if self._state is not _State.DONE:
                self._body = _Body.SKIP  # the rest of the message is not the client's
        return False

    def _forward_args(self, text: str) -> None:
        if not text or self._call_id is None:
            return
        self._call_args.append(text)
        last = self._events[-1] if self._events else None
        if isinstance(last, ToolInputDelta) and last.id == self._call_id:
            self._events[-1] = ToolInputDelta(last.id, last.partial_json + text)
        else:
            self._add_event(ToolInputDelta(self._call_id, text))

    def _complete_call(self) -> None:
        """End the started call: repair what the output cut off, emit it, count it."""
        call_id = self._call_id
        assert call_id is not None
        self._forward_args(self._call_json.close())
        self._add_event(ToolCallEvent(call_id, self._call_name, "".join(self._call_args)))
        self._call_id, self._call_args = None, []
        self.tool_calls_emitted += 1
        limit = self.config.max_tool_calls
        if limit is not None and self.tool_calls_emitted >= limit:
            self.tool_limit_reached = True
            self._finish_early()

    def _finish_early(self) -> None:
        self._state = _State.DONE
        self._buffer = ""

    # --- events ----------------------------------------------------------------------------

    def _body_text(self, kind: type[TextDelta] | type[ThinkingDelta], text: str) -> None:
        new_message = not self._run.started
        self._emit(kind, self._run.add(text), new_message=new_message)

    def _emit(
        self, kind: type[TextDelta] | type[ThinkingDelta], text: str, *, new_message: bool
    ) -> None:
        """Text or thinking; a message's first piece is set off by a blank line from the
        message before it when that was of the same kind (two preambles, two analyses)."""
        if not text:
            return
        if new_message and self._last_block is kind:
            text = "\n\n" + text
        last = self._events[-1] if self._events else None
        if isinstance(last, TextDelta | ThinkingDelta) and type(last) is kind:
            self._events[-1] = kind(last.text + text)
        else:
            self._add_event(kind(text))

    def _add_event(self, event: HarmonyEvent) -> None:
        self._events.append(event)
        self._last_block = type(event)
