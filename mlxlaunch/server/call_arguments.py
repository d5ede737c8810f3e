"""A tool call's arguments, read the one way all three APIs read them.

Two sources, two answers. `model_arguments`: what the model wrote (the engine promises JSON
text of an object every reader holds, engine/output/json_stream.py); anything else becomes
None, for the caller's fallback, never an exception. `history_arguments`: what a client sends
back as JSON text (Chat Completions' and Responses' `arguments`), read under the same limits
as a request body (protocol/limits.py: nesting, integers past Python's int-string limit), so
a bad one is a 400 naming the field, as the same call inside a Messages body already is.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from mlxlaunch.engine.types import FREEFORM_INPUT, InputGrammar, InvalidRequest, ToolSpec
from mlxlaunch.protocol.limits import RequestLimitError, load_request_json


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # `1e400`: Python's inf, which no JSON writer writes back
        raise ValueError(f"number out of range: {text[:40]}")
    return number


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def model_arguments(text: str) -> dict[str, Any] | None:
    """The arguments object of a call the model wrote, or None when `text` is not one the
    answer can carry: not JSON, not an object, too deep, or holding a number Python cannot
    hold or write back (an integer over the int-string limit, a float past the largest)."""
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    return parsed if isinstance(parsed, dict) else None


def history_arguments(text: str, field: str) -> dict[str, Any]:
    """The arguments object a client sent back as JSON text at `field` (empty text: none).

    Raises:
        InvalidRequest: not JSON, not an object, or past a request limit; the message names
            `field`.
    """
    if not text.strip():
        return {}
    try:
        value = load_request_json(text.encode("utf-8", "surrogatepass"))
    except RequestLimitError as exc:
        raise InvalidRequest(f"{field}: {exc}".replace("request body", "arguments")) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{field}: not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise InvalidRequest(f"{field}: must be a JSON object")
    return value


FREEFORM_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {FREEFORM_INPUT: {"type": "string"}},
    "required": [FREEFORM_INPUT],
    "additionalProperties": False,
}


def freeform_tool(name: str, description: str, grammar: InputGrammar | None) -> ToolSpec:
    """A freeform (`custom`) tool as the model sees it: one string parameter, `input`, whose
    text follows `grammar` (strict, so calls follow it under any tool choice)."""
    return ToolSpec(name, description, FREEFORM_PARAMETERS, grammar is not None, grammar)


def freeform_input(arguments: str) -> str:
    """A freeform tool call's raw text from the engine's arguments: the `input` string (the
    JSON `arguments` themselves when the model wrote something else)."""
    value = (model_arguments(arguments) or {}).get(FREEFORM_INPUT)
    return value if isinstance(value, str) else arguments


_STRING_START = re.compile(r'\{\s*"(?P<key>[^"\\]*)"\s*:\s*"')
_ESCAPE_LENGTH = {"u": 6}  # \uXXXX; every other escape is two characters


class StringArgumentStream:
    """The text of one string argument, decoded as the arguments' JSON text streams in.

    `feed` takes the next piece of the arguments (`{"input": "…`) and returns the text of
    `key`'s string decoded so far and not returned before ("" while an escape is cut in
    two, or when `key` is not the object's first member: the whole call then says it)."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._text = ""
        self._at: int | None = None  # where the string's next unread character is
        self._closed = False

    def feed(self, piece: str) -> str:
        self._text += piece
        if self._closed:
            return ""
        if self._at is None:
            found = _STRING_START.match(self._text)
            if found is None or found["key"] != self._key:
                self._closed = found is not None or len(self._text) > 64 + len(self._key)
                return ""
            self._at = found.end()
        out: list[str] = []
        at, text = self._at, self._text
        while at < len(text):
            char = text[at]
            if char == '"':
                self._closed = True
                break
            if char != "\\":
                out.append(char)
                at += 1
                continue
            if at + 1 >= len(text):
                break
            size = _ESCAPE_LENGTH.get(text[at + 1], 2)
            if size == 6 and at + 6 <= len(text) and _is_high_surrogate(text[at : at + 6]):
                size = 12  # a surrogate pair is decoded whole
            if at + size > len(text):
                break
            try:
                out.append(json.loads(f'"{text[at : at + size]}"'))
            except ValueError:
                self._closed = True  # not JSON after all: the whole call says what it is
                break
            at += size
        self._at = at
        return "".join(out)


def _is_high_surrogate(escape: str) -> bool:
    try:
        return 0xD800 <= int(escape[2:], 16) <= 0xDBFF
    except ValueError:
        return False
