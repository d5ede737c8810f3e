"""An incremental JSON object scanner: forward a tool call's arguments while they are generated.

`JsonObjectStream.feed` takes the next piece of model output and returns the part that can go to
the client now; `close` returns the text that turns everything forwarded into a complete object.

Design: a pushdown validator over the JSON grammar, one character at a time (runs of plain string
characters in one step), so the whole stream costs O(length). It forwards only at *safe points*:
places where what was forwarded so far can be completed by appending closers alone — inside a
value string after a complete character or escape, after a complete value, right after `{` or
`[`. Everything between safe points is held: a key and its colon until the value starts, a comma
until what follows it starts, a half literal (`tru`), a number ending in `-`, `.`, `e` or a sign,
a half escape (`\\`, `\\u12`), a high surrogate waiting for its low half. If the output stops
there, the held text is simply never sent, and the repair is `"` (when the last safe point was
inside a string) plus the closers of the open containers — which never change between a safe
point and the next, because `{` and `[` are safe points themselves.

The first character other than whitespace must be `{` (leading whitespace is not forwarded);
any character the grammar cannot accept marks the stream `broken` and is held with all that
follows it (`rest`). So does what would make the object one a JSON reader cannot hold: a
container nested past `MAX_DEPTH`, or a digit that makes an integer longer than Python's
int-string limit (4,300 digits; jiter, the Anthropic SDK's reader, has the same) or a number
past the largest float (`1e400`). What was forwarded before it still reads back (every digit
of a number is a safe point), so the call ends as JSON that the server, the client and the
next request's own limits all hold, instead of failing one of their parses.
"""

from __future__ import annotations

import math
import re
import sys

# Scanner states (small ints: this loop runs once per character of every argument).
_START = 0  # before the top-level `{`
_OBJECT_OPEN = 1  # after `{`: a key or `}`
_KEY = 2  # after `,` in an object: a key
_COLON = 3  # after a key
_VALUE = 4  # after `:` or after `,` in an array: a value
_ARRAY_OPEN = 5  # after `[`: a value or `]`
_AFTER_VALUE = 6  # after a value: `,` or the container's closer
_STRING = 7
_ESCAPE = 8  # after a backslash in a string
_UNICODE = 9  # inside a \uXXXX escape
_NUMBER = 10
_LITERAL = 11  # inside true / false / null
_DONE = 12
_BROKEN = 13

# Number sub-states; the grammar is -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_E_SIGN, _N_EXP = range(8)
_N_COMPLETE = frozenset({_N_ZERO, _N_INT, _N_FRAC, _N_EXP})  # a valid number ends here

_WHITESPACE = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
# String characters that need no attention: anything but the quote, the backslash and the
# control characters JSON forbids unescaped.
_PLAIN_RUN = re.compile(r'[^"\\\x00-\x1f]+')
# A float is checked against overflow from its integer and fraction digits; this many fraction
# digits decide it (a float has at most 767 significant ones) and more are not kept.
_KEPT_FRACTION_DIGITS = 800
_EXPONENT_CAP = 1_000_000
# Arguments nested deeper are refused: jiter refuses past 200 levels, and a call the model
# wrote must fit the next request's own bound when the client sends it back (a Messages body
# nests at most 64 deep, protocol/limits.py, with a tool_use `input` at level 6).
MAX_DEPTH = 48  # any exponent past this overflows (or underflows) whatever precedes


class JsonObjectStream:
    """Validates one JSON object as it streams in and says what may be forwarded.

    `feed(text)` returns the forwardable continuation; `done` once the top-level object closed
    (`rest` holds what followed it); `broken` once the text stopped being JSON (`rest` holds the
    rejected text onward); `close()` returns the repair suffix. Whenever forwarding started
    (`started`), the forwarded text plus `close()` is a JSON object.
    """

    def __init__(self) -> None:
        self._state = _START
        self._closers: list[str] = []  # "}" or "]" for each open container, outermost first
        self._held: list[str] = []  # consumed but not forwarded: text since the last safe point
        self._in_key = False  # the open string is an object key
        self._number = _N_MINUS
        self._literal = ""  # the rest of the literal being read
        self._hex_left = 0  # hex digits still expected in a \u escape
        self._code = 0  # the \u escape's value so far
        self._high_surrogate = False  # the last escape was a high surrogate, still unpaired
        self._repair_quote = False  # the last safe point was inside a value string
        self._rest: list[str] = []
        self.started = False  # the top-level `{` came (and was forwarded)
        # The open number, to refuse one no reader holds (see the module docstring).
        self._max_int_digits = sys.get_int_max_str_digits() or None  # 0: no limit
        self._mantissa: list[str] = []  # its sign, integer and (kept) fraction digits
        self._int_digits = 0
        self._fraction_digits = 0
        self._exponent = 0
        self._exponent_negative = False

    @property
    def done(self) -> bool:
        """The top-level object closed."""
        return self._state == _DONE

    @property
    def broken(self) -> bool:
        """The text stopped being a JSON object; nothing more will be forwarded."""
        return self._state == _BROKEN

    @property
    def rest(self) -> str:
        """Text after the closing brace (when done) or from the rejected character on (when
        broken); empty otherwise."""
        return "".join(self._rest)

    def feed(self, text: str) -> str:
        """Take the next piece; return the part that can be forwarded now."""
        if self._state in (_DONE, _BROKEN):
            if text:
                self._rest.append(text)
            return ""
        out: list[str] = []
        mark = 0  # text[mark:i] is consumed and not yet forwarded
        i, n = 0, len(text)
        while i < n:
            state = self._state
            if state == _STRING:
                run = _PLAIN_RUN.match(text, i)
                if run is not None:
                    i = run.end()
                    self._high_surrogate = False
                    if not self._in_key:
                        mark = self._forward(out, text, mark, i)
                    continue
            c = text[i]
            if state == _START and c in _WHITESPACE:
                i += 1
                mark = i  # whitespace before the object is not forwarded
                continue
            if not self._step(c):
                self._state = _BROKEN
                self._held = []
                self._rest.append(text[i:])
                return "".join(out)
            i += 1
            if self._state == _DONE:
                mark = self._forward(out, text, mark, i)
                if i < n:
                    self._rest.append(text[i:])
                return "".join(out)
            if self._is_safe():
                mark = self._forward(out, text, mark, i)
        if mark < n and self.started:
            self._held.append(text[mark:])
        return "".join(out)

    def close(self) -> str:
        """The suffix that completes what was forwarded into a JSON object ("" when the object
        closed, or when nothing was forwarded)."""
        if not self.started or self._state == _DONE:
            return ""
        quote = '"' if self._repair_quote else ""
        return quote + "".join(reversed(self._closers))

    # --- the grammar -------------------------------------------------------------------------

    def _forward(self, out: list[str], text: str, mark: int, end: int) -> int:
        """A safe point after text[:end]: send what was held and text[mark:end]."""
        if self._held:
            out.append("".join(self._held))
            self._held = []
        if end > mark:
            out.append(text[mark:end])
        self._repair_quote = self._state == _STRING
        return end

    def _is_safe(self) -> bool:
        state = self._state
        if state == _STRING:
            return not self._in_key and not self._high_surrogate
        if state == _NUMBER:
            return self._number in _N_COMPLETE
        return state in (_AFTER_VALUE, _OBJECT_OPEN, _ARRAY_OPEN)

    def _step(self, c: str) -> bool:
        """Consume one character; False when the grammar cannot accept it."""
        state = self._state
        if state == _STRING:
            return self._string_char(c)
        if state == _ESCAPE:
            return self._escape_char(c)
        if state == _UNICODE:
            return self._unicode_char(c)
        if state == _NUMBER:
            if self._number_char(c):
                return True
            if self._number not in _N_COMPLETE:
                return False
            self._state = state = _AFTER_VALUE  # the number ended; `c` is what follows it
        if state == _LITERAL:
            if c != self._literal[0]:
                return False
            self._literal = self._literal[1:]
            if not self._literal:
                self._state = _AFTER_VALUE
            return True
        if c in _WHITESPACE:
            return True
        if state == _START:
            if c != "{":
                return False
            self.started = True
            self._closers.append("}")
            self._state = _OBJECT_OPEN
            return True
        if state == _AFTER_VALUE:
            return self._after_value(c)
        if state in (_OBJECT_OPEN, _KEY):
            if c == '"':
                self._open_string(key=True)
                return True
            return state == _OBJECT_OPEN and c == "}" and self._close_container(c)
        if state == _COLON:
            if c != ":":
                return False
            self._state = _VALUE
            return True
        if state == _ARRAY_OPEN and c == "]":
            return self._close_container(c)
        return self._value_start(c)  # _VALUE or _ARRAY_OPEN

    def _value_start(self, c: str) -> bool:
        if c == '"':
            self._open_string(key=False)
        elif c in "{[":
            if len(self._closers) >= MAX_DEPTH:
                return False
            self._closers.append("}" if c == "{" else "]")
            self._state = _OBJECT_OPEN if c == "{" else _ARRAY_OPEN
        elif c == "-" or c in _DIGITS:
            self._state = _NUMBER
            self._number = _N_MINUS if c == "-" else _N_ZERO if c == "0" else _N_INT
            self._mantissa = [c]
            self._int_digits = int(c != "-")
            self._fraction_digits = self._exponent = 0
            self._exponent_negative = False
        elif c in _LITERALS:
            self._state, self._literal = _LITERAL, _LITERALS[c]
        else:
            return False
        return True

    def _after_value(self, c: str) -> bool:
        if c == ",":
            self._state = _KEY if self._closers[-1] == "}" else _VALUE
            return True
        return self._close_container(c)

    def _close_container(self, c: str) -> bool:
        if c != self._closers[-1]:
            return False
        self._closers.pop()
        self._state = _AFTER_VALUE if self._closers else _DONE
        return True

    def _open_string(self, key: bool) -> None:
        self._state = _STRING
        self._in_key = key
        self._high_surrogate = False

    def _string_char(self, c: str) -> bool:
        if c == '"':
            self._state = _COLON if self._in_key else _AFTER_VALUE
            return True
        if c == "\\":
            self._state = _ESCAPE
            return True
        return False  # a control character (plain characters went by as runs)

    def _escape_char(self, c: str) -> bool:
        if c == "u":
            self._state, self._hex_left, self._code = _UNICODE, 4, 0
            return True
        if c not in _SIMPLE_ESCAPES:
            return False
        self._state = _STRING
        self._high_surrogate = False
        return True

    def _unicode_char(self, c: str) -> bool:
        if c not in _HEX:
            return False
        self._code = self._code * 16 + int(c, 16)
        self._hex_left -= 1
        if self._hex_left == 0:
            self._state = _STRING
            # Hold a high surrogate until its pair: cut off alone, it would be dropped whole.
            self._high_surrogate = 0xD800 <= self._code <= 0xDBFF
        return True

    def _number_char(self, c: str) -> bool:
        """Advance the number by `c`; False when `c` is not part of it (or would make it a
        number no reader holds: then it is rejected as what follows the number)."""
        number = self._number
        if c in _DIGITS:
            if number == _N_ZERO:
                return False  # leading zeros are not JSON; `c` will be rejected after it
            if number in (_N_MINUS, _N_INT):
                if self._max_int_digits is not None and self._int_digits >= self._max_int_digits:
                    return False  # no int() past Python's limit (nor jiter's)
                self._number = _N_ZERO if number == _N_MINUS and c == "0" else _N_INT
                self._int_digits += 1
                self._mantissa.append(c)
            elif number in (_N_DOT, _N_FRAC):
                self._number = _N_FRAC
                if self._fraction_digits < _KEPT_FRACTION_DIGITS:
                    self._fraction_digits += 1
                    self._mantissa.append(c)
            else:
                self._number = _N_EXP
                exponent = min(_EXPONENT_CAP, self._exponent * 10 + int(c))
                grows = exponent != self._exponent and not self._exponent_negative
                if grows and self._overflows(exponent):
                    return False
                self._exponent = exponent
            return True
        if c == "." and number in (_N_ZERO, _N_INT):
            if self._overflows(0):
                return False
            self._number = _N_DOT
            self._mantissa.append(c)
        elif c in "eE" and number in (_N_ZERO, _N_INT, _N_FRAC):
            if self._overflows(0):
                return False
            self._number = _N_E
        elif c in "+-" and number == _N_E:
            self._number = _N_E_SIGN
            self._exponent_negative = c == "-"
        else:
            return False
        return True

    def _overflows(self, exponent: int) -> bool:
        """Whether the number so far, read as a float with `exponent`, is past the largest
        float (Python reads it as inf, which no JSON writer writes back)."""
        mantissa = "".join(self._mantissa).rstrip(".")
        return math.isinf(float(f"{mantissa}e{exponent}"))


def holds(text: str) -> bool:
    """Whether `text` is one JSON object that this scanner accepts whole: the arguments every
    reader holds (see the module docstring); for calls that are read whole, not streamed."""
    stream = JsonObjectStream()
    stream.feed(text)
    return stream.done and not stream.rest.strip()
