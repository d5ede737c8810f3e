"""Reading one tool-call span as it is generated.

The output parser hands everything between a family's `tool_call_start` and `tool_call_end`
(markers excluded) to a `SpanReader`, piece by piece. The reader answers with `CallPiece`s:

    CallBegin(name, model_id)  the call's name is known: the client can show it now
    CallArgs(text)             the next piece of its arguments, JSON text
    CallEnd(arguments, complete)
                               the call ends; `arguments` is the JSON text of the arguments
                               object, and its CallArgs pieces are a prefix of it (the parser
                               sends what they lack). `complete=False`: the output was cut off
                               or turned invalid inside the arguments, and `arguments` is what
                               was valid, closed — not what the model meant to write

Once a reader has sent a `CallBegin` it has *committed*: the call reached the client, so it
must end it (`close` repairs what the output cut off). A reader that has not committed may
give up at `close` (None), and the parser returns the span as text, markers included.

`BufferedReader` is the reader for formats that cannot be read before they end: it keeps the
text and parses the whole span at `close` (with mlx-lm's parser for the family, or one of ours).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mlxlaunch.engine.output.json_stream import holds


@dataclass(frozen=True)
class CallBegin:
    name: str
    model_id: str | None = None  # the id the model wrote for the call, if it writes ids


@dataclass(frozen=True)
class CallArgs:
    text: str


@dataclass(frozen=True)
class CallEnd:
    arguments: str  # JSON text of an object
    complete: bool = True


CallPiece = CallBegin | CallArgs | CallEnd


@dataclass(frozen=True)
class ParsedCall:
    """One call read from a whole span."""

    name: str
    arguments: str  # JSON text of an object
    model_id: str | None = None


class SpanReader(Protocol):
    """Reads one tool-call span (see the module docstring). A reader serves one span."""

    @property
    def committed(self) -> bool:
        """Whether a CallBegin has been returned."""
        ...

    def feed(self, text: str) -> list[CallPiece]:
        """Take the next piece of the span's text."""
        ...

    def close(self, complete: bool) -> list[CallPiece] | None:
        """The span ended: `complete` when its end marker came (or the family has none and
        the output ended), False when generation stopped inside it. Returns the pieces that
        finish it, or None when nothing was committed and the span is not a readable call."""
        ...


# A reader for each new span (readers that need the request's tools close over them).
SpanReaderFactory = Callable[[], SpanReader]
# Parses a whole span: its calls, or None when any part of it is unreadable.
SpanParser = Callable[[str], list[ParsedCall] | None]


class BufferedReader:
    """Keeps the span and parses it whole at `close` (all or nothing)."""

    def __init__(self, parse: SpanParser) -> None:
        self._parse = parse
        self._parts: list[str] = []

    @property
    def committed(self) -> bool:
        return False

    def feed(self, text: str) -> list[CallPiece]:
        self._parts.append(text)
        return []

    def close(self, complete: bool) -> list[CallPiece] | None:
        if not complete:
            return None
        calls = self._parse("".join(self._parts))
        if not calls:
            return None
        pieces: list[CallPiece] = []
        for call in calls:
            pieces += [CallBegin(call.name, call.model_id), CallEnd(call.arguments)]
        return pieces


def arguments_text(arguments: Any) -> str | None:
    """JSON text of a parsed arguments value when it is an object (a JSON string holding an
    object counts) that every reader holds (`json_stream.holds`: the streamed calls' rule),
    else None. NaN and Infinity are refused: they are not JSON."""
    try:
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            return None
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):  # model output: a huge int, deep nesting
        return None
    return text if holds(text) else None
