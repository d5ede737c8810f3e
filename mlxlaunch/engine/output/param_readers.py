"""Streaming readers for tool calls whose arguments are written as parameters (XML-like).

Qwen3-Coder, GLM-4.5/4.6/4.7, LongCat, MiniMax-M2 and DeepSeek-V3.2 ("DSML") write each
argument as its own element, final when its closing tag arrives: the reader sends it then.

One state machine (`ParamSpanReader`) reads them all, generated from the family's
`ParamElements` record (`store/dialects.py`, the same record the constraint grammar is built
from): `reader_markers` turns it into the markers the reader waits for, and its `values`
typing (`param_values`) says how values are read. The span's text is consumed marker by
marker: each `feed` looks only at the new text plus a held-back tail shorter than the longest
marker, so a 50 KB `content` arriving three characters at a time costs time linear in its
length.

Values are converted by the tool's JSON schema the way mlx-lm's parser for the family does,
except where a streamed value cannot be taken back:
- a value mlx-lm refuses (an integer parameter written "1.5") stays the text written, rather
  than failing a call the client is already showing;
- a parameter declared with a type none of these parsers knows stays text, and "null" becomes
  None only where the schema does not say string;
- a repeated parameter name keeps its first value (mlx-lm keeps the last, but the first was
  already sent); later ones are dropped;
- a call the span or the output cuts off before its end tag is ended with the parameters
  finished so far (an unfinished value is dropped).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

from mlxlaunch.engine.output.json_stream import holds
from mlxlaunch.engine.output.param_values import VALUE_READERS, ValueReader, json_or
from mlxlaunch.engine.output.spans import (
    CallArgs,
    CallBegin,
    CallEnd,
    CallPiece,
    SpanReaderFactory,
    arguments_text,
)
from mlxlaunch.engine.types import ToolSpec
from mlxlaunch.store.dialects import DIALECTS, ParamElements

# A call or parameter name longer than this, or one with spaces, is prose, not markup.
_MAX_NAME = 256
_NAME = re.compile(r"[^\s<>\"'{}]+")
# A name, bare (`Bash`) or quoted (`"Bash"`, MiniMax and DSML), then any attributes.
_QUOTED = re.compile(r"""\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))(.*)""", re.DOTALL)
_DSML_STRING = re.compile(r"""string\s*=\s*["']?(true|false)""")


@dataclass(frozen=True)
class ReaderMarkers:
    """A `ParamElements` record as the markers the reader waits for (see `reader_markers`).

    A call is `call_open NAME name_end` (or, when `call_open` is None, the span opens with
    the name), then parameters `param_open KEY key_end [value_open] VALUE value_close`, then
    `call_close` (None: the span's end closes the call; one call per span).
    """

    call_open: str | None
    name_ends: tuple[str, ...]
    param_open: str
    call_close: str | None
    key_ends: tuple[str, ...]
    value_open: str | None
    value_close: str
    trim: Callable[[str], str]  # the value text as the family's parser takes it
    read_value: ValueReader
    # The body may instead be a JSON object ({"name", "arguments"}), or the name followed by
    # one: GLM's and LongCat's parsers accept both.
    json_body: bool = False

    @property
    def between(self) -> tuple[str, ...]:
        return (self.param_open,) if self.call_close is None else (self.param_open, self.call_close)


@functools.cache
def reader_markers(elements: ParamElements) -> ReaderMarkers:
    """What the reader of `elements` waits for: the record's markers, plus the looser ends
    the family's parser takes (a name without `name_close` ends at the gap or the first
    parameter; `lenient` names and keys also end at a newline)."""
    lenient = ("\n",) if elements.lenient else ()
    if elements.name_close:
        name_ends: tuple[str, ...] = (elements.name_close, *lenient)
    else:
        name_ends = tuple(m for m in (elements.gap, elements.param_open) if m)
    return ReaderMarkers(
        call_open=elements.call_open,
        name_ends=name_ends,
        param_open=elements.param_open,
        call_close=elements.call_close,
        key_ends=(elements.key_close, *lenient),
        value_open=elements.value_open or None,
        value_close=elements.value_close,
        trim=_trim(elements),
        read_value=VALUE_READERS[elements.values],
        json_body=elements.json_body,
    )


def _trim(elements: ParamElements) -> Callable[[str], str]:
    """The value's text as the family's parser takes it: without its `pad` (one on each side:
    Qwen3-Coder writes a value on its own lines), stripped, or as written."""
    pad = elements.pad
    if pad:
        return lambda text: text.removeprefix(pad).removesuffix(pad)
    return str.strip if elements.strip_values else str


def param_reader(elements: ParamElements, tools: Sequence[ToolSpec]) -> SpanReaderFactory:
    """A factory of streaming readers for calls written as `elements`, converting values by
    the request's `tools`."""
    return functools.partial(ParamSpanReader, reader_markers(elements), _properties_by_tool(tools))


def param_span_reader(dialect_name: str, tools: Sequence[ToolSpec]) -> SpanReaderFactory | None:
    """`param_reader` for the dialect `dialect_name`; None when our reader does not read it
    (its arguments are not parameters, or mlx-lm's parser reads them)."""
    dialect = DIALECTS.get(dialect_name)
    markup = dialect.markup if dialect is not None else None
    if not isinstance(markup, ParamElements) or not markup.streamed:
        return None
    return param_reader(markup, tools)


# --- the reader ----------------------------------------------------------------------------


class _At(Enum):
    CALL_OPEN = auto()  # before a call's opening tag
    NAME = auto()  # in the call's name
    BETWEEN = auto()  # in a call, between parameters
    KEY = auto()  # in a parameter's name (and attributes)
    VALUE_OPEN = auto()  # between a parameter's name and its value (GLM's <arg_value>)
    VALUE = auto()
    JSON = auto()  # the body is a JSON object, read whole at close
    SKIP = auto()  # unreadable from here on: the rest of the span is ignored


@dataclass
class _Call:
    """The call being read: its schema, the argument pieces sent, the parameter now open."""

    properties: Mapping[str, Any]
    args: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    key: str | None = None  # None: the open parameter is unreadable and will be dropped
    hint: str | None = None


class ParamSpanReader:
    """Reads one span of a parameter-style family (a `SpanReader`, see `spans.py`)."""

    def __init__(self, markers: ReaderMarkers, properties: Mapping[str, Mapping[str, Any]]):
        self._markers = markers
        self._properties = properties  # tool name -> parameter name -> schema
        self._scan = _MarkerScanner()
        self._at = _At.NAME if markers.call_open is None else _At.CALL_OPEN
        self._call: _Call | None = None
        self._committed = False

    @property
    def committed(self) -> bool:
        return self._committed

    def feed(self, text: str) -> list[CallPiece]:
        if not text or self._at is _At.SKIP:
            return []
        self._scan.push(text)
        pieces: list[CallPiece] = []
        while self._step(pieces):
            pass
        return pieces

    def close(self, complete: bool) -> list[CallPiece] | None:
        at, self._at = self._at, _At.SKIP
        if not self._committed:
            whole: list[CallPiece] | None = None
            if complete and at is _At.JSON:
                whole = _json_call(self._scan.text(), self._markers, self._properties)
            elif complete and at is _At.NAME and self._markers.call_open is None:
                whole = self._name_only_call()
            self._committed = whole is not None
            return whole
        call, self._call = self._call, None
        if call is None:
            return []
        if at is _At.BETWEEN and self._markers.json_body and not call.args:
            arguments = _json_arguments(self._scan.text(), self._markers, call.properties)
            if arguments is not None:
                return [CallArgs(arguments), CallEnd(arguments)]
        # Cut off, or a value left half written: the call is not what the model meant.
        return _end(call, complete=complete and at is not _At.VALUE)

    # --- one marker at a time ------------------------------------------------------------

    def _step(self, pieces: list[CallPiece]) -> bool:
        """Consume up to the next marker of the current state; False when it has not come."""
        markers, at = self._markers, self._at
        if at is _At.VALUE:  # first: where long text arrives
            found = self._scan.until((markers.value_close,))
            if found is None:
                return False
            pieces += self._param(found[1])
            self._at = _At.BETWEEN
            return True
        if at is _At.CALL_OPEN:
            assert markers.call_open is not None
            return self._advance(self._scan.until((markers.call_open,), keep=False), _At.NAME)
        if at is _At.NAME:
            return self._name(pieces)
        if at is _At.BETWEEN:
            assert self._call is not None
            # Text between a GLM name and its first parameter is kept: it may be JSON.
            keep = markers.json_body and not self._call.args
            found = self._scan.until(markers.between, keep=keep)
            if found is None:
                return False
            if found[0] == markers.param_open:
                self._at = _At.KEY
            else:
                pieces += _end(self._call)
                self._call = None
                self._at = _At.CALL_OPEN
            return True
        if at is _At.KEY:
            return self._key()
        if at is _At.VALUE_OPEN:
            assert markers.value_open is not None
            return self._advance(self._scan.until((markers.value_open,), keep=False), _At.VALUE)
        if at is _At.JSON:
            self._scan.until((), keep=True)  # settle the text: a long body is not re-copied
        return False  # JSON and SKIP wait for close

    def _advance(self, found: tuple[str, str] | None, to: _At) -> bool:
        if found is None:
            return False
        self._at = to
        return True

    def _name(self, pieces: list[CallPiece]) -> bool:
        markers = self._markers
        if markers.json_body and not self._committed and self._scan.text().lstrip()[:1] == "{":
            self._at = _At.JSON
            return False
        found = self._scan.until(markers.name_ends)
        if found is None:
            if self._scan.size() > _MAX_NAME:
                self._skip()
            return False
        marker, text = found
        if not text.strip() and marker.isspace():
            return True  # a blank line before the name
        name = _name_of(text)
        if name is None:
            self._skip()
            return False
        self._call = _Call(self._properties.get(name, {}))
        self._committed = True
        pieces.append(CallBegin(name))
        self._at = _At.KEY if marker == markers.param_open else _At.BETWEEN
        return True

    def _key(self) -> bool:
        assert self._call is not None
        found = self._scan.until(self._markers.key_ends)
        if found is None:
            if self._scan.size() > _MAX_NAME:
                self._skip()  # no key ends in sight: the rest cannot be trusted
            return False
        marker, text = found
        if not text.strip() and marker.isspace():
            return True
        key = _key_of(text)
        self._call.key, self._call.hint = key if key is not None else (None, None)
        self._at = _At.VALUE if self._markers.value_open is None else _At.VALUE_OPEN
        return True

    def _param(self, raw: str) -> list[CallPiece]:
        """The open parameter's value is complete: its piece of the arguments object."""
        call = self._call
        assert call is not None
        key = call.key
        if key is None or key in call.seen:
            return []  # unreadable name, or a repeat: the first value was already sent
        call.seen.add(key)
        text = self._markers.trim(raw)
        value = self._markers.read_value(text, call.hint, call.properties.get(key))
        piece = ("{" if not call.args else ", ") + f"{_dumps(key)}: {_value_json(value, text)}"
        call.args.append(piece)
        return [CallArgs(piece)]

    def _name_only_call(self) -> list[CallPiece] | None:
        """A GLM span that is only a name (a call without arguments)."""
        name = _name_of(self._scan.text())
        if name is None:
            return None
        return [CallBegin(name), CallArgs("{}"), CallEnd("{}")]

    def _skip(self) -> None:
        self._at = _At.SKIP
        self._scan = _MarkerScanner()  # nothing more is read: let the text go


def _end(call: _Call, complete: bool = True) -> list[CallPiece]:
    """End `call`; an incomplete one leaves its closing to the parser, which flags it."""
    closing = "}" if call.args else "{}"
    arguments = "".join(call.args) + closing
    if not complete:
        return [CallEnd(arguments, complete=False)]
    return [CallArgs(closing), CallEnd(arguments)]


# --- the text, consumed marker by marker ---------------------------------------------------


class _MarkerScanner:
    """The span's text not yet consumed: settled text (surely before the next marker) as a
    list, so a long value grows without copying, and a short pending tail plus the newest
    piece, the only text each search looks at."""

    def __init__(self) -> None:
        self._settled: list[str] = []
        self._settled_size = 0
        self._pending = ""

    def push(self, text: str) -> None:
        self._pending += text

    def until(self, markers: tuple[str, ...], *, keep: bool = True) -> tuple[str, str] | None:
        """(marker, text before it) for the earliest of `markers`, both consumed; None when
        none has arrived yet. Text that cannot be part of a marker is kept for the answer,
        or dropped when `keep` is False."""
        found = _earliest(self._pending, markers)
        if found is None:
            cut = len(self._pending) - _held_back(self._pending, markers)
            if cut:
                if keep:
                    self._settled.append(self._pending[:cut])
                    self._settled_size += cut
                self._pending = self._pending[cut:]
            return None
        start, marker = found
        before = "".join(self._settled) + self._pending[:start]
        self._settled, self._settled_size = [], 0
        self._pending = self._pending[start + len(marker) :]
        return marker, before

    def size(self) -> int:
        return self._settled_size + len(self._pending)

    def text(self) -> str:
        return "".join(self._settled) + self._pending


def _earliest(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, marker)
    return best


def _held_back(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that could still become one of `markers`."""
    longest = 0
    for marker in markers:
        # Only where the marker's first character occurs in the last len(marker)-1 characters.
        at = text.find(marker[0], max(len(text) - len(marker) + 1, 0))
        while at >= 0 and len(text) - at > longest:
            if marker.startswith(text[at:]):
                longest = len(text) - at
                break
            at = text.find(marker[0], at + 1)
    return longest


# --- names -----------------------------------------------------------------------------------


def _name_of(text: str) -> str | None:
    """A call's name from `Bash` or `"Bash"`, or None when the text is not only a name."""
    found = _quoted(text)
    return found[0] if found is not None and not found[1].strip() else None


def _key_of(text: str) -> tuple[str, str | None] | None:
    """(name, DSML's string="true|false" or None) from a parameter's opening tag."""
    found = _quoted(text)
    if found is None:
        return None
    hint = _DSML_STRING.search(found[1])
    return found[0], hint.group(1) if hint else None


def _quoted(text: str) -> tuple[str, str] | None:
    """(name, the text after it) from `name attributes…` or `"name" attributes…`."""
    match = _QUOTED.match(text)
    if match is None:
        return None
    name = next(g for g in match.groups()[:3] if g is not None)
    ok = len(name) <= _MAX_NAME and _NAME.fullmatch(name)
    return (name, match.group(4)) if ok else None


def _dumps(value: Any) -> str:
    # allow_nan=False: NaN and Infinity are not JSON and would break the client's parser.
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _value_json(value: Any, text: str) -> str:
    """JSON text of a converted value; the written text when the value has no JSON form (a
    Python literal such as a set or bytes) or one some reader cannot hold (too deep, a huge
    integer from a Python literal: `json_stream.holds`)."""
    try:
        dumped = _dumps(value)
    except (TypeError, ValueError, RecursionError):
        return _dumps(text)
    return dumped if holds(f'{{"v": {dumped}}}') else _dumps(text)


# --- bodies that are JSON (GLM, LongCat) ----------------------------------------------------


def _json_call(
    text: str, markers: ReaderMarkers, properties: Mapping[str, Mapping[str, Any]]
) -> list[CallPiece] | None:
    """A whole body written as `{"name": …, "arguments": {…}}`."""
    parsed = json_or(text, None)
    if isinstance(parsed, list) and parsed and isinstance(parsed[0], dict):
        parsed = parsed[0]
    if not isinstance(parsed, dict):
        return None
    name = parsed.get("name")
    if not isinstance(name, str) or _name_of(name) is None:
        return None
    raw = parsed.get("arguments", parsed.get("parameters"))
    arguments = _json_arguments(
        "{}" if raw is None else raw if isinstance(raw, str) else _value_json(raw, ""),
        markers,
        properties.get(name.strip(), {}),
    )
    if arguments is None:
        return None
    return [CallBegin(name.strip()), CallArgs(arguments), CallEnd(arguments)]


def _json_arguments(text: str, markers: ReaderMarkers, properties: Mapping[str, Any]) -> str | None:
    """JSON text of an arguments object written as JSON, its string values read by schema."""
    parsed = json_or(text.strip(), None)
    if not isinstance(parsed, dict):
        return None
    for key, value in parsed.items():
        if isinstance(value, str):
            parsed[key] = markers.read_value(value, None, properties.get(key))
    return arguments_text(parsed)


# --- the families ------------------------------------------------------------------------------


def _properties_by_tool(tools: Sequence[ToolSpec]) -> dict[str, Mapping[str, Any]]:
    """Tool name -> its parameters' schemas (the first tool of a name wins, as in mlx-lm)."""
    found: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        properties = (
            tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
        )
        found.setdefault(tool.name, properties if isinstance(properties, dict) else {})
    return found
