"""Bounds on what a grammar may be built from, checked before anything is compiled.

A schema is client input, and the grammar engine's work grows with it: a 10 MB enum took
8 s to be refused, and a 214-byte pattern `^(x{1000}){1000}$` expands to a million-position
regex whose first token mask took 1-2 s on the worker, stalling every running stream. These
checks are a walk over the schemas (linear, cheap) that refuses such input with a 400 naming
the field, before llguidance sees it; llguidance's own `PARSER_LIMITS` (grammar.py) are the
backstop for what no simple count predicts.

Measured with llguidance 1.9 on a Qwen3 vocabulary (busy 2-core box): `x{10000}` costs ~20 ms
for the first mask and ~4 ms per later one; `(x{300}){300}` (90,000 positions) ~150 ms, then
~40 ms per token — too slow for a shared batch. Hence `MAX_PATTERN_REPEAT`. A short pattern can
also need exponentially many lexer states (`.*a.{100}`: admitted, then a 500 on the worker,
"too many states", once sampling explored them); `pattern_states.py` estimates them, hence
`MAX_PATTERN_STATES`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from mlxlaunch.engine.decoding.pattern_states import (
    PatternTooNested,
    class_end,
    escape_end,
    pattern_states,
)
from mlxlaunch.engine.types import InvalidRequest

# All the schemas one grammar is built from, as JSON text (estimated while walking). Claude
# Code's 12 tools are 13 KB; agents with many MCP servers reach a few hundred KB.
MAX_SCHEMA_BYTES = 1 << 20
MAX_SCHEMA_NODES = 100_000
MAX_ENUM_VALUES = 10_000  # per enum (an enum of 10,000 short values compiles in ~25 ms)
# Positions a pattern expands to: each atom counts one, times the bounds of the counted
# repetitions around it (`a{3}` is 3, `(ab){2}c` is 5, `(x{1000}){1000}` is 1,000,000).
MAX_PATTERN_REPEAT = 10_000
# Lexer states the patterns of one grammar may need at worst, all together (pattern_states.py):
# a tenth of llguidance's own bound (grammar.py: `max_lexer_states`), the rest is the JSON's.
MAX_PATTERN_STATES = 10_000
# A freeform tool's grammar, as text. llguidance's own compile of Lark grows faster than its
# size (measured, llguidance 1.9, busy 2-core box: 20,000 literal alternatives, 200 KB, 0.35 s
# to validate; 80,000, 870 KB, 28 s). Codex's apply_patch grammar is 0.6 KB.
MAX_GRAMMAR_BYTES = 64 << 10
# Positions all the patterns of one freeform tool's grammar expand to together: its patterns
# become parser rules over single characters, not lexer states, so only their size counts.
MAX_GRAMMAR_POSITIONS = 10 * MAX_PATTERN_REPEAT

_COUNTED = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")
_HUGE = 10**15  # sizes saturate here: the estimate must never cost more than the pattern


def check_grammar_inputs(schemas: Iterable[tuple[str, Any]]) -> None:
    """Refuse schemas too large or too complex to compile on a shared server.

    Args:
        schemas: (where, schema) pairs; `where` names the field in the client's terms, e.g.
            "tools[Bash].input_schema" or "output_config.format.schema".

    Raises:
        InvalidRequest: naming the field and the bound it exceeds.
    """
    budget = _Budget()
    for where, schema in schemas:
        budget.walk(where, schema)


def check_grammar_text(text: str, patterns: Iterable[str]) -> None:
    """Refuse a freeform tool's grammar (Lark or one regex) past its bounds: its size, and how
    far each of its `patterns` expands (the bound a schema's patterns have), one by one and
    all together.

    Raises:
        ValueError: the bound it exceeds (the caller names the field).
    """
    if len(text.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise ValueError(
            f"grammar too large to constrain output: more than {MAX_GRAMMAR_BYTES >> 10} KiB"
        )
    total = 0
    for pattern in patterns:
        size = pattern_size(pattern)
        total += size
        if size > MAX_PATTERN_REPEAT or total > MAX_GRAMMAR_POSITIONS:
            shown = size if size < _HUGE else f"over {_HUGE}"
            raise ValueError(
                f"pattern {pattern[:60]!r} repeats too much to constrain output: it expands "
                f"to {shown} positions (at most {MAX_PATTERN_REPEAT} each, "
                f"{MAX_GRAMMAR_POSITIONS} in all); use a shorter bound"
            )


# A field's place as a linked list (parent, key): built into text only for an error message,
# so a deeply nested schema costs no quadratic string building.
_Path = tuple[Any, str]


def _text(path: _Path) -> str:
    parts: list[str] = []
    node: Any = path
    while node is not None:
        node, key = node
        parts.append(key)
    text = "".join(reversed(parts))
    return text if len(text) <= 200 else f"{text[:80]}…{text[-100:]}"


class _Budget:
    def __init__(self) -> None:
        self.bytes = 0
        self.nodes = 0
        self.states = 0  # the patterns' lexer states at worst (pattern_states.py)

    def walk(self, where: str, schema: Any) -> None:
        stack: list[tuple[_Path, Any]] = [((None, where), schema)]
        while stack:
            path, node = stack.pop()
            self._count(path, node)
            if isinstance(node, dict):
                for key, value in node.items():
                    key_text = str(key)
                    self.bytes += len(key_text) + 4
                    child = (path, f".{key_text}")
                    if key_text == "enum" and isinstance(value, list):
                        _check_enum(child, value)
                    elif key_text == "pattern" and isinstance(value, str):
                        self._pattern(child, value)
                    elif key_text == "patternProperties" and isinstance(value, dict):
                        for regex in value:
                            self._pattern((child, f"[{str(regex)[:80]!r}]"), str(regex))
                    stack.append((child, value))
            elif isinstance(node, list):
                stack.extend(((path, f"[{i}]"), item) for i, item in enumerate(node))

    def _count(self, path: _Path, node: Any) -> None:
        self.nodes += 1
        self.bytes += len(node) + 2 if isinstance(node, str) else 2 if node is not None else 4
        if self.nodes > MAX_SCHEMA_NODES:
            raise InvalidRequest(
                f"{_text(path)}: schema too large to constrain output: more than "
                f"{MAX_SCHEMA_NODES} nodes in all"
            )
        if self.bytes > MAX_SCHEMA_BYTES:
            raise InvalidRequest(
                f"{_text(path)}: schema too large to constrain output: more than "
                f"{MAX_SCHEMA_BYTES >> 10} KiB in all"
            )

    def _pattern(self, where: _Path, pattern: str) -> None:
        _check_pattern(where, pattern)
        try:
            self.states += pattern_states(pattern)
        except PatternTooNested as exc:
            raise InvalidRequest(f"{_text(where)}: pattern too complex: {exc}") from exc
        if self.states > MAX_PATTERN_STATES:
            raise InvalidRequest(
                f"{_text(where)}: pattern too complex to constrain output: matching it may need "
                f"more than {MAX_PATTERN_STATES} lexer states (an unbounded repetition such as "
                "`.*` before a long counted part that overlaps it, as in `.*a.{100}`); anchor "
                "it with ^, or use a shorter counted part"
            )


def _check_enum(where: _Path, values: list[Any]) -> None:
    if len(values) > MAX_ENUM_VALUES:
        raise InvalidRequest(
            f"{_text(where)}: enum too large to constrain output: {len(values)} values "
            f"(at most {MAX_ENUM_VALUES})"
        )


def _check_pattern(where: _Path, pattern: str) -> None:
    size = pattern_size(pattern)
    if size > MAX_PATTERN_REPEAT:
        shown = size if size < _HUGE else f"over {_HUGE}"
        raise InvalidRequest(
            f"{_text(where)}: pattern repeats too much to constrain output: it expands to {shown} "
            f"positions (at most {MAX_PATTERN_REPEAT}); use a shorter bound or maxLength"
        )


def pattern_size(pattern: str) -> int:
    """How many positions a regex expands to (an estimate; see `MAX_PATTERN_REPEAT`).

    Alternatives add up (an over-estimate, never an under-estimate); `*`, `+` and `?` count
    once, since a lexer handles them as loops; `{m,n}` multiplies its atom by max(m, n).
    Anything this reader does not understand counts as one atom.
    """
    frames: list[list[int]] = [[0, 0]]  # per open group: [total so far, size of the last atom]
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        frame = frames[-1]
        if char == "\\":
            i = escape_end(pattern, i)
            _atom(frame, 1)
            continue
        if char == "[":
            i = class_end(pattern, i)
            _atom(frame, 1)
            continue
        if char == "(":
            frames.append([0, 0])
        elif char == ")" and len(frames) > 1:
            total, last = frames.pop()
            _atom(frames[-1], min(total + last, _HUGE))
        elif char == "|":
            frame[0], frame[1] = min(frame[0] + frame[1], _HUGE), 0
        elif char == "{" and (counted := _COUNTED.match(pattern, i)):
            low, comma, high = counted.groups()
            bound = _bound(high) if comma and high else _bound(low)
            frame[1] = min(frame[1] * bound, _HUGE)
            i = counted.end()
            continue
        elif char not in "*+?^$":
            _atom(frame, 1)
        i += 1
    while len(frames) > 1:  # an unclosed group: llguidance refuses it; count what we saw
        total, last = frames.pop()
        _atom(frames[-1], min(total + last, _HUGE))
    total, last = frames[0]
    return min(total + last, _HUGE)


def _atom(frame: list[int], size: int) -> None:
    frame[0] = min(frame[0] + frame[1], _HUGE)
    frame[1] = size


def _bound(digits: str) -> int:
    # Python refuses int() of more than 4,300 digits; anything past 15 is "huge" anyway.
    return _HUGE if len(digits) > 15 else max(1, int(digits))
