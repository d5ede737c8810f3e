"""Streaming span readers for the families whose tool-call arguments are a JSON object.

`json_reader(dialect)` gives a `SpanReader` factory for a dialect whose calls are a
`JsonEnvelope` (`store/dialects.py`: json_tools, llama3_json, kimi_k2, mistral, deepseek_v31),
generated from that record, the one the constraint grammar is built from: each call is
announced (`CallBegin`) as soon as its header is read and its arguments follow piece by piece.

Every family writes a span as a sequence of `header {arguments} trailer`: the header names the
call (and, for Kimi and Mistral, gives its id), the arguments are one JSON object, the trailer
closes the call (`}` of the outer object, `<|tool_call_end|>`, nothing). One reader serves them
all, told by a `_Family` (regexes made from the record's markers) how its headers look:

    buffer ──header matched (ends at the arguments' `{`)──▶ CallBegin, then JsonObjectStream
    JsonObjectStream ──object closed──▶ CallEnd; what follows is buffered as the next header
    anything else (no header yet) ──▶ buffered; read whole at `close` (the family's fallback)

A header is matched only when a `{` arrives (the arguments' `{` ends every header), against the
text since the previous call, so the work stays linear in the span. Forms that cannot be
streamed — Hermes JSON with "arguments" before "name" or written as a JSON string, Mistral's
`[{"name": …}]` list — never match a header and are parsed whole at `close`, as
`BufferedReader` would. After a call was streamed, text that reads as no call is dropped: the
client has the call already, and the rest cannot become text in front of it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from mlxlaunch.engine.output.json_stream import JsonObjectStream
from mlxlaunch.engine.output.spans import (
    CallArgs,
    CallBegin,
    CallEnd,
    CallPiece,
    ParsedCall,
    SpanParser,
    SpanReaderFactory,
)
from mlxlaunch.engine.output.tools import parsed_call
from mlxlaunch.store.dialects import DIALECTS, Dialect, JsonEnvelope

# A header longer than this is not one (real ones are a name, an id and markup): stop
# matching and keep the rest of the span for `close`.
_MAX_HEADER = 1024


@dataclass(frozen=True)
class _Family:
    """How one family writes the text around each call's arguments."""

    first: re.Pattern[str]  # the first call's header, ending right before its arguments' `{`
    next: re.Pattern[str]  # the previous call's trailer and the next call's header
    trailer: re.Pattern[str]  # what may follow the last call (always matches, maybe empty)
    # (name, model id) from a matched header; None: not a usable call.
    describe: Callable[[re.Match[str]], tuple[str, str | None] | None]
    parse: SpanParser  # the whole span, when it could not be streamed


def _family(
    *,
    header: str,
    after_call: str,
    separator: str,
    describe: Callable[[re.Match[str]], tuple[str, str | None] | None],
    parse: SpanParser,
) -> _Family:
    """A family from regex fragments: `header` (ends at the arguments' `{`, not taking it),
    `after_call` (what closes a call after its arguments), `separator` (between calls)."""
    return _Family(
        first=re.compile(rf"\s*{header}(?=\{{)"),
        next=re.compile(rf"{after_call}{separator}{header}(?=\{{)"),
        trailer=re.compile(rf"(?:{after_call})?{separator}"),
        describe=describe,
        parse=parse,
    )


class JsonCallReader:
    """A `SpanReader` (see `spans.py`) for one span of a JSON-arguments family."""

    def __init__(self, family: _Family) -> None:
        self._family = family
        self._pending: list[str] = []  # text since the last call: the next header, or the rest
        self._pending_len = 0
        self._streamable = True  # False: the pending text is kept for `close` unmatched
        self._arguments: JsonObjectStream | None = None  # the call being streamed
        self._call_text: list[str] = []  # its forwarded arguments
        self._calls = 0  # calls begun
        self._spoiled = False  # a streamed call broke off: the rest of the span is dropped

    @property
    def committed(self) -> bool:
        return self._calls > 0

    def feed(self, text: str) -> list[CallPiece]:
        pieces: list[CallPiece] = []
        while text and not self._spoiled:
            if self._arguments is None:
                text = self._read_header(text, pieces)
            else:
                text = self._read_arguments(self._arguments, text, pieces)
        return pieces

    def close(self, complete: bool) -> list[CallPiece] | None:
        pieces: list[CallPiece] = []
        if self._arguments is not None:  # cut off inside the arguments: repair them
            self._end_call(pieces, repair=self._arguments.close())
            return pieces
        if self._spoiled:
            return pieces
        rest = "".join(self._pending)
        if self._calls:
            trailer = self._family.trailer.match(rest)
            rest = rest[trailer.end() :] if trailer else rest
            if not complete or not rest.strip():
                return pieces
        elif not complete:
            return None
        calls = self._family.parse(rest)
        if calls is None:
            return pieces if self._calls else None
        for call in calls:
            pieces += [CallBegin(call.name, call.model_id), CallEnd(call.arguments)]
        self._calls += len(calls)
        return pieces

    def _read_header(self, text: str, pieces: list[CallPiece]) -> str:
        """Buffer `text`; when it completes a header, begin the call. Returns the text after
        the header (the arguments' start), or "" when all of it was buffered."""
        self._pending.append(text)
        self._pending_len += len(text)
        if not self._streamable or "{" not in text:
            return ""
        buffered = "".join(self._pending)
        self._pending = [buffered]
        pattern = self._family.next if self._calls else self._family.first
        match = pattern.match(buffered)
        described = self._family.describe(match) if match else None
        if match is None or described is None:
            # Matched but unusable (an empty name), or too long to be a header: stop trying.
            self._streamable = match is None and self._pending_len <= _MAX_HEADER
            return ""
        name, model_id = described
        pieces.append(CallBegin(name, model_id))
        self._calls += 1
        self._pending, self._pending_len = [], 0
        self._arguments = JsonObjectStream()
        self._call_text = []
        return buffered[match.end() :]

    def _read_arguments(self, stream: JsonObjectStream, text: str, pieces: list[CallPiece]) -> str:
        """Stream `text` as arguments; returns what follows them once they closed."""
        self._send(stream.feed(text), pieces)
        if stream.done:
            self._end_call(pieces)
            return stream.rest
        if stream.broken:  # the client has the call: end it with what was valid
            self._end_call(pieces, repair=stream.close())
            self._spoiled = True
        return ""

    def _send(self, text: str, pieces: list[CallPiece]) -> None:
        if text:
            pieces.append(CallArgs(text))
            self._call_text.append(text)

    def _end_call(self, pieces: list[CallPiece], repair: str | None = None) -> None:
        """End the open call; `repair` closes arguments that were cut off or went invalid
        (the parser sends it, marked as incomplete)."""
        text = "".join(self._call_text)
        if repair is None:
            pieces.append(CallEnd(text))
        else:
            pieces.append(CallEnd(text + repair, complete=False))
        self._arguments = None
        self._call_text = []


def json_reader(dialect: Dialect) -> SpanReaderFactory | None:
    """A streaming reader factory for `dialect`'s spans, generated from its `JsonEnvelope`
    record; None when its arguments are not JSON in an envelope (params families, harmony's
    channels, …)."""
    family = _family_of(dialect)
    return None if family is None else functools.partial(JsonCallReader, family)


def json_span_reader(dialect_name: str) -> SpanReaderFactory | None:
    """`json_reader` for the dialect `dialect_name` (None: unknown, or not a JSON envelope)."""
    dialect = DIALECTS.get(dialect_name)
    return None if dialect is None else json_reader(dialect)


# --- whole-span fallbacks ----------------------------------------------------------------------


def json_value_calls(text: str) -> list[ParsedCall] | None:
    """Calls written as JSON values — objects, or lists of objects — one after another
    (separated by whitespace, `;` or `,`); None when any part is not a call."""
    decoder = json.JSONDecoder()
    calls: list[ParsedCall] = []
    position, end = 0, len(text)
    while True:
        while position < end and text[position] in " \t\r\n;,":
            position += 1
        if position == end:
            return calls or None
        try:
            value, position = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):  # not JSON, an integer past int(), too deep
            return None
        for item in value if isinstance(value, list) else [value]:
            call = parsed_call(item)
            if call is None:
                return None
            calls.append(call)


def _no_calls(text: str) -> list[ParsedCall] | None:
    """For families whose every readable call streams: what did not is not a call."""
    return None


# --- the families ------------------------------------------------------------------------------

# A JSON string, and an object member whose value is not a container (`"type": "function"`).
_STRING = r'"(?:[^"\\\x00-\x1f]|\\.)*"'
_MEMBER = rf"{_STRING}\s*:\s*(?:{_STRING}|-?\d[\d.eE+-]*|true|false|null)"


def _json_name(match: re.Match[str]) -> tuple[str, str | None] | None:
    try:
        name = json.loads(match["name"])
    except ValueError:
        return None
    name = name.strip()
    return (name, None) if name else None


# {"name": "Bash", "arguments": {…}}; other scalar members may come before or between.
_JSON_OBJECTS = _family(
    header=(
        rf'\{{\s*(?:{_MEMBER}\s*,\s*)*"name"\s*:\s*(?P<name>{_STRING})\s*,\s*'
        rf'(?:{_MEMBER}\s*,\s*)*"(?:arguments|parameters)"\s*:\s*'
    ),
    after_call=rf"(?:\s*,\s*{_MEMBER})*\s*\}}",
    separator=r"[\s;,]*",
    describe=_json_name,
    parse=json_value_calls,
)


def _tagged_name(match: re.Match[str]) -> tuple[str, str | None] | None:
    groups = match.groupdict()
    name = (groups.get("name") or groups.get("fenced") or "").strip()
    return (name, groups.get("id") or None) if name else None


def _indexed_name(match: re.Match[str]) -> tuple[str, str | None] | None:
    """Kimi's `functions.NAME:INDEX`: the whole text is the call's id."""
    written = match["id"].strip()
    parts = re.fullmatch(r"(?:functions\.)?(?P<name>.+?)(?P<index>:\d+)?", written)
    if parts is None or not parts["name"].strip():
        return None
    # A bare name is no id: two calls would share it.
    return parts["name"].strip(), written if parts["index"] else None


@functools.cache
def _family_of(dialect: Dialect) -> _Family | None:
    """The reader's regexes for `dialect`'s `JsonEnvelope`: its markers, with whitespace
    allowed between the parts. A name between two markers may hold anything but markup
    (`[^<]`); a bare name before the arguments' marker (Mistral's) is one word."""
    envelope = dialect.markup
    if not isinstance(envelope, JsonEnvelope):
        return None
    if envelope.named_object is not None:
        return _JSON_OBJECTS
    esc = re.escape
    if dialect.id_style == "functions_index":
        name = r"(?P<id>[^<]*?)"
    elif envelope.call_open:
        name = r"(?P<name>[^<]+?)\s*"
    else:
        name = r'(?P<name>[^\s\[\]{}<>"]+)\s*'
    if envelope.call_id:
        name += rf"(?:{esc(envelope.call_id)}\s*(?P<id>[^\s\[\]{{}}]*)\s*)?"
    header = rf"{name}{esc(envelope.arguments_open)}\s*"
    if envelope.fenced:  # V3/R1: function<sep>NAME ```json {…}```
        header = (
            rf"(?:{header}|function\s*{esc(envelope.arguments_open)}\s*"
            r"(?P<fenced>[^\s<`]+)\s*```(?:json)?\s*)"
        )
    if envelope.call_open:
        header = rf"{esc(envelope.call_open)}\s*{header}"
    fence = r"\s*(?:```)?" if envelope.fenced else ""
    after_call = rf"{fence}\s*{esc(envelope.call_close)}" if envelope.call_close else ""
    # Calls whose span runs to the output's end each open again with the span's marker.
    reopen = not dialect.section and not dialect.tool_call_end and dialect.tool_call_start
    separator = rf"\s*(?:{esc(dialect.tool_call_start or '')}\s*)?" if reopen else r"\s*"
    return _family(
        header=header,
        after_call=after_call,
        separator=separator,
        describe=_indexed_name if dialect.id_style == "functions_index" else _tagged_name,
        parse=json_value_calls if envelope.reads_json_values else _no_calls,
    )
