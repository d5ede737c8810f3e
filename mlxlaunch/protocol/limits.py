"""Bounds on what one request may ask for, and the rule for the `model` field.

The server runs on the user's own machine, so every limit here is about staying up and
responsive under hostile or broken input, not about quotas: each is far above what Claude Code
sends (measured: ~100 tools, a few hundred messages, schemas nested < 15 deep, max_tokens
≤ 64k), and each violation is a 400 `invalid_request_error` that names the field.

The body size limit (32 MiB, the Anthropic API's own) is enforced by the HTTP layer as bytes
arrive; this module only bounds the shape of what was sent, and parses a large body in pieces
(`load_request_json`) so that no single call holds the GIL for long.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Iterable
from json.decoder import scanstring  # type: ignore[attr-defined]
from json.scanner import NUMBER_RE
from typing import Annotated, Any

from pydantic import Field

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_JSON_DEPTH = 64  # objects/arrays inside each other; tool schemas nest ~10 deep
MAX_MESSAGES = 100_000  # the Anthropic API's own limit
MAX_BLOCKS = 10_000  # content blocks in one message, system blocks, tool_result parts
MAX_TOOLS = 1_000
MAX_STOP_SEQUENCES = 256
MAX_STOP_SEQUENCE_CHARS = 1_000  # the parser holds back this many characters of output
MAX_NAME_CHARS = 256  # model ids, tool names, tool_use ids
MAX_OUTPUT_TOKENS = 1 << 20  # max_tokens and budget_tokens; the engine clamps to the window
MAX_TOP_K = 1_000

# The wire's names and ids as pydantic field types, so each API's models spell the bound once.
Name = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_NAME_CHARS)]
NameOrEmpty = Annotated[str, Field(strict=True, max_length=MAX_NAME_CHARS)]

# Bodies above this are parsed in pieces: json.loads holds the GIL throughout, ~6 ms a MiB (a
# 32 MiB body stopped the event loop for 200 ms); below it, it is the faster way.
LARGE_BODY_BYTES = 4 * 1024 * 1024
JSON_PIECE_CHARS = 1 << 18  # what one C call of the piecewise parse reads: ~1-2 ms

_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:/")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")

MODEL_ID_RULE = (
    "model must be a model id such as 'claude-sonnet-4-5' or 'org/name' (any such id is served "
    "by the loaded model); paths and URLs are refused: a request never selects what is loaded"
)


# What of a client-chosen value (a type, a name, an id) an error message or a log line shows.
SHOWN_CHARS = 80
SHOWN_NAMES = 10  # of a list of them


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`value` as text for an error message or a log line, cut to `limit` characters (and
    saying how long it was)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…({len(text)} chars)"


def shown_names(names: Iterable[str]) -> str:
    """Distinct names, sorted, each `shown`, at most SHOWN_NAMES of them (then how many more)."""
    distinct = sorted({shown(name) for name in names})
    more = len(distinct) - SHOWN_NAMES
    listed = ", ".join(distinct[:SHOWN_NAMES])
    return f"{listed} and {more} more" if more > 0 else listed


class RequestLimitError(ValueError):
    """A request exceeds one of the bounds above; the message says which and by how much."""


def check_model_id(value: str) -> str:
    """Return `value` if it is a plain model id; raise ValueError if it looks like a path/URL.

    Plain ids are what clients send (`claude-haiku-4-5-20251001`,
    `mlx-community/Qwen3-4B-4bit`, `qwen3:8b`). Refused: anything with a URL scheme, a leading
    `/ . ~ \\` or drive letter, a backslash, more than one `/`, an empty or dot-led segment
    around the `/`, control characters, or more than MAX_NAME_CHARS characters.
    """
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"model id is longer than {MAX_NAME_CHARS} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("model id contains control characters")
    looks_like_path = (
        "://" in value
        or _URL_SCHEME.match(value) is not None
        or _WINDOWS_DRIVE.match(value) is not None
        or value.startswith(("/", ".", "~", "\\"))
        or "\\" in value
    )
    if not looks_like_path and "/" in value:
        segments = value.split("/")
        looks_like_path = len(segments) > 2 or any(not s or s.startswith(".") for s in segments)
    if looks_like_path:
        raise ValueError(MODEL_ID_RULE)
    return value


def load_request_json(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a request body, refusing nesting deeper than `max_depth`.

    Raises json.JSONDecodeError / UnicodeDecodeError for bad JSON and RequestLimitError for
    too-deep input (including input so deep that the parser itself gives up) and for values
    Python will not convert (an integer literal over `sys.get_int_max_str_digits()` digits).
    A body over LARGE_BODY_BYTES is parsed in pieces (`PiecewiseJson`): the same value, but
    other threads (the event loop) run between pieces.
    """
    try:
        if len(raw) > LARGE_BODY_BYTES:
            return PiecewiseJson(decoded_body(raw), max_depth).document()
        value = json.loads(raw)
    except RequestLimitError:
        raise
    except RecursionError as exc:
        raise RequestLimitError(
            f"request body is nested too deeply (more than {max_depth} levels)"
        ) from exc
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError as exc:  # valid JSON Python refuses to hold: a 4,300+ digit integer
        raise RequestLimitError(f"request body holds a value out of range: {exc}") from exc
    depth = json_depth(value, stop_after=max_depth)
    if depth > max_depth:
        raise RequestLimitError(f"request body is nested too deeply (more than {max_depth} levels)")
    return value


def decoded_body(raw: bytes, piece_bytes: int = 1 << 20) -> str:
    """`raw` as json.loads decodes bytes (its detected encoding, surrogates passed), a piece
    at a time (decoding 32 MiB at once held the GIL 60 ms)."""
    decoder = codecs.getincrementaldecoder(json.detect_encoding(raw))("surrogatepass")
    view = memoryview(raw)
    parts = [decoder.decode(view[i : i + piece_bytes]) for i in range(0, len(raw), piece_bytes)]
    parts.append(decoder.decode(b"", final=True))
    return "".join(parts)


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_CONSTANTS: tuple[tuple[str, Any], ...] = (
    ("null", None),
    ("true", True),
    ("false", False),
    ("NaN", math.nan),
    ("Infinity", math.inf),
    ("-Infinity", -math.inf),
)
_NUMBER_CHARS = 1 << 16
_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")
_LOW_SURROGATE = re.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")


class PiecewiseJson:
    """Parses one JSON document as json.loads does (same values, same errors, NaN and
    Infinity accepted), in calls that each read at most about `piece` characters: a string
    literal of megabytes is decoded a piece at a time, cut where no escape is split.

    Containers are walked in Python, so this is slower than json.loads (~3x on many small
    values), but the GIL changes hands between calls. Nesting beyond `max_depth` raises
    RequestLimitError as soon as it is reached."""

    def __init__(self, text: str, max_depth: int, piece: int = JSON_PIECE_CHARS) -> None:
        self.text = text
        self.max_depth = max_depth
        self.piece = piece

    def document(self) -> Any:
        value, end = self._value(self._skip(0), 0)
        end = self._skip(end)
        if end != len(self.text):
            raise json.JSONDecodeError("Extra data", self.text, end)
        return value

    def _skip(self, idx: int) -> int:
        """The index of the first non-whitespace character at or after `idx`."""
        while True:
            stop = idx + self.piece
            end = _WHITESPACE.match(self.text, idx, stop).end()  # type: ignore[union-attr]
            if end < stop or end >= len(self.text):
                return end
            idx = end

    def _value(self, idx: int, depth: int) -> tuple[Any, int]:
        s = self.text
        char = s[idx : idx + 1]
        if char == '"':
            return self._string(idx + 1)
        if char == "{":
            return self._object(idx + 1, depth + 1)
        if char == "[":
            return self._array(idx + 1, depth + 1)
        for word, constant in _CONSTANTS[:3]:
            if s.startswith(word, idx):
                return constant, idx + len(word)
        number = NUMBER_RE.match(s, idx, idx + _NUMBER_CHARS)
        if number is not None:
            if number.end() - idx >= _NUMBER_CHARS:  # Python holds no such int; nobody sends it
                raise ValueError(f"a number literal of {_NUMBER_CHARS} characters or more")
            integer, fraction, exponent = number.groups()
            if fraction or exponent:
                return float(integer + (fraction or "") + (exponent or "")), number.end()
            return int(integer), number.end()
        for word, constant in _CONSTANTS[3:]:
            if s.startswith(word, idx):
                return constant, idx + len(word)
        raise json.JSONDecodeError("Expecting value", s, idx)

    def _enter(self, depth: int) -> None:
        if depth > self.max_depth:
            raise RequestLimitError(
                f"request body is nested too deeply (more than {self.max_depth} levels)"
            )

    def _object(self, idx: int, depth: int) -> tuple[dict[str, Any], int]:
        self._enter(depth)
        s = self.text
        result: dict[str, Any] = {}
        idx = self._skip(idx)
        if s[idx : idx + 1] == "}":
            return result, idx + 1
        while True:
            if s[idx : idx + 1] != '"':
                raise json.JSONDecodeError(
                    "Expecting property name enclosed in double quotes", s, idx
                )
            key, idx = self._string(idx + 1)
            idx = self._skip(idx)
            if s[idx : idx + 1] != ":":
                raise json.JSONDecodeError("Expecting ':' delimiter", s, idx)
            result[key], idx = self._value(self._skip(idx + 1), depth)
            idx, more = self._after_item(idx, "}")
            if not more:
                return result, idx

    def _array(self, idx: int, depth: int) -> tuple[list[Any], int]:
        self._enter(depth)
        s = self.text
        result: list[Any] = []
        idx = self._skip(idx)
        if s[idx : idx + 1] == "]":
            return result, idx + 1
        while True:
            value, idx = self._value(idx, depth)
            result.append(value)
            idx, more = self._after_item(idx, "]")
            if not more:
                return result, idx

    def _after_item(self, idx: int, close: str) -> tuple[int, bool]:
        """After an object's or array's item: past `close` and False when it ends there,
        else past the comma (and blanks) and True."""
        idx = self._skip(idx)
        char = self.text[idx : idx + 1]
        if char == close:
            return idx + 1, False
        if char != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", self.text, idx)
        return self._skip(idx + 1), True

    def _string(self, idx: int) -> tuple[str, int]:
        """The string literal whose content starts at `idx`, and the index past its quote."""
        s = self.text
        end = self._terminator(idx)
        if end is not None:  # the common case: a short literal, read in place
            return scanstring(s, idx, True)
        parts: list[str] = []
        start = idx
        while True:
            window = s[start : start + self.piece]
            try:
                value, end = scanstring(window, 0, True)
            except json.JSONDecodeError as exc:
                unterminated = exc.msg.startswith("Unterminated string")
                at_cut = unterminated or exc.pos >= len(window) - 16
                if start + len(window) >= len(s) or not at_cut:  # an error of the document's
                    raise json.JSONDecodeError(
                        exc.msg, s, idx - 1 if unterminated else start + exc.pos
                    ) from None
                cut = self._cut(start, start + len(window) - 16)
                if cut is None:  # no escape-free place to cut: read the rest in one call
                    value, end = scanstring(s, start, True)
                    parts.append(value)
                    return "".join(parts), end
                parts.append(self._part(start, cut))
                start = cut
                continue
            parts.append(value)
            return "".join(parts), start + end

    def _terminator(self, idx: int, tries: int = 64) -> int | None:
        """The index of the quote that ends the literal starting at `idx`, where it is within
        `piece` characters and found by looking at a few quotes; else None."""
        s = self.text
        stop = idx + self.piece
        quote = s.find('"', idx, stop)
        while quote >= 0 and tries > 0:
            escapes = quote - 1
            while escapes >= idx and s[escapes] == "\\":
                escapes -= 1
            if (quote - 1 - escapes) % 2 == 0:  # not itself escaped
                return quote
            tries -= 1
            quote = s.find('"', quote + 1, stop)
        return None

    def _part(self, start: int, cut: int) -> str:
        """The decoded content s[start:cut] of a string literal (no escape split at `cut`)."""
        try:
            return str(scanstring(self.text[start:cut] + '"', 0, True)[0])
        except json.JSONDecodeError as exc:
            raise json.JSONDecodeError(exc.msg, self.text, start + exc.pos) from None

    def _cut(self, low: int, target: int) -> int | None:
        """A place at or before `target` (after `low`, a place where decoding starts afresh)
        where a string literal can be cut without splitting an escape or a surrogate pair:
        no backslash in the 12 characters before it, or it starts an escape (a backslash
        after a character that is none) other than the second half of a pair."""
        s = self.text
        for place in range(target, max(low, target - 4096), -1):
            if s.find("\\", max(low, place - 12), place) < 0:
                return place
            if s[place] == "\\" and s[place - 1] != "\\":
                pair = _LOW_SURROGATE.match(s, place) and _HIGH_SURROGATE.match(s, place - 6)
                if not pair:
                    return place
        return None


def json_depth(value: Any, *, stop_after: int | None = None) -> int:
    """Nesting depth of parsed JSON (a scalar is 0, `[]` is 1); iterative, so deep input is safe.

    With `stop_after`, returns as soon as the depth is known to exceed it.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if stop_after is not None and deepest > stop_after:
                return deepest
        stack.extend((child, depth) for child in children if isinstance(child, dict | list))
    return deepest


def plain_model_id(name: str) -> str:
    """A model id clients may send for a model named `name` on the command line: the name
    itself when it is a plain id, else the last part of the path (`./models/qwen` → `qwen`)."""
    try:
        return check_model_id(name)
    except ValueError:
        last = name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lstrip(".~")
        return last[:MAX_NAME_CHARS] or "local-model"
