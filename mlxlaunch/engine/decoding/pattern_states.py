"""How many lexer states a schema `pattern` may need: refused before admission when too many.

llguidance builds each pattern's automaton lazily, a state at a time, as masks explore it. A
pattern of a few characters can need exponentially many: `.*a.{100}` must remember, for each
of the last 100 characters, whether it was an `a`, so its states are the subsets of 101
positions. A request with it was admitted, then failed on the worker ("too many states":
a 500) once sampling explored them. `pattern_states` estimates the worst case from the
pattern's shape, with no automaton built: a walk over it, linear in its length.

The rule (a subset construction seen from one loop): after an unbounded loop (`x*`, `x+`,
`x{n,}`, or the implicit `.*` of a pattern not anchored by `^`: JSON Schema patterns search;
without `$`, what follows the shortest match is accepted whatever it is),
a character that both continues the loop and starts what follows it starts a new "thread";
the threads already under way survive where their position takes that character too. When
`k` later positions can each hold a thread and the positions differ in what they take (one
character keeps some threads, ends others), the states are up to 2^k; when all take the same
characters the threads move as one block and the states grow with k only. Groups count as
the positions they expand to; the estimate errs on the large side, never the small.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MAX_CODE = 0x10FFFF
_EXPONENT_CAP = 62  # 2^62: far past any bound, small enough to stay an int

Ranges = list[tuple[int, int]]


@dataclass(frozen=True)
class CharSet:
    """A set of characters as sorted, merged, inclusive code-point ranges."""

    ranges: tuple[tuple[int, int], ...]

    def __and__(self, other: CharSet) -> CharSet:
        mine, theirs = self.ranges, other.ranges
        out: Ranges = []
        i = j = 0
        while i < len(mine) and j < len(theirs):
            low, high = max(mine[i][0], theirs[j][0]), min(mine[i][1], theirs[j][1])
            if low <= high:
                out.append((low, high))
            if mine[i][1] < theirs[j][1]:
                i += 1
            else:
                j += 1
        return CharSet(tuple(out))

    def __bool__(self) -> bool:
        return bool(self.ranges)


def charset(ranges: Ranges, negated: bool = False) -> CharSet:
    """The set of `ranges` (or of every character but them), merged once."""
    merged: Ranges = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    if not negated:
        return CharSet(tuple(merged))
    complement: Ranges = []
    low = 0
    for start, end in merged:
        if start > low:
            complement.append((low, start - 1))
        low = end + 1
    if low <= _MAX_CODE:
        complement.append((low, _MAX_CODE))
    return CharSet(tuple(complement))


def _char(char: str) -> CharSet:
    return CharSet(((ord(char), ord(char)),))


ANY = CharSet(((0, _MAX_CODE),))
NOTHING = CharSet(())
_CLASS_ESCAPES: dict[str, Ranges] = {
    "d": [(0x30, 0x39)],
    "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "s": [(0x09, 0x0D), (0x20, 0x20)],
}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


def escape_end(pattern: str, i: int) -> int:
    """The index past the escape at `i` (`\\x`, or `\\p{..}`/`\\x{..}`/`\\u{..}`)."""
    end = i + 2
    if pattern[i + 1 : i + 2] in ("p", "P", "x", "u") and pattern[end : end + 1] == "{":
        close = pattern.find("}", end, end + 64)  # bounded: `\\p{\\p{…` stays linear
        return close + 1 if close >= 0 else min(end + 1, len(pattern))
    return min(end, len(pattern))


def class_end(pattern: str, i: int) -> int:
    """The index past the character class opened at `i` (a `]` first in it is a member)."""
    j = i + 1
    if pattern[j : j + 1] == "^":
        j += 1
    if pattern[j : j + 1] == "]":
        j += 1
    while j < len(pattern):
        if pattern[j] == "\\":
            j += 2
            continue
        if pattern[j] == "]":
            return j + 1
        j += 1
    return len(pattern)


def _escape_set(pattern: str, i: int) -> tuple[CharSet, int]:
    """The characters the escape at `i` matches, and the index past it. Unicode classes,
    hex escapes and others this reader does not decode match anything (the large side)."""
    end = escape_end(pattern, i)
    letter = pattern[i + 1 : i + 2]
    if letter.lower() in _CLASS_ESCAPES:
        return charset(_CLASS_ESCAPES[letter.lower()], negated=letter.isupper()), end
    if letter in _CONTROL_ESCAPES:
        return _char(_CONTROL_ESCAPES[letter]), end
    if letter in ("p", "P", "x", "u", "b", "B") or not letter:
        return ANY, end
    return _char(letter), end


def _class_set(pattern: str, i: int) -> tuple[CharSet, int]:
    """The characters of the class `[...]` opened at `i`, and the index past it."""
    end = class_end(pattern, i)
    j, stop = i + 1, end - 1
    negated = pattern[j : j + 1] == "^"
    j += negated
    members: Ranges = []
    while j < stop:
        if pattern[j] == "\\":
            escaped, j = _escape_set(pattern, j)
            members.extend(escaped.ranges)
            continue
        low = ord(pattern[j])
        if pattern[j + 1 : j + 2] == "-" and j + 2 < stop and pattern[j + 2] != "\\":
            high = ord(pattern[j + 2])
            members.append((min(low, high), max(low, high)))
            j += 3
            continue
        members.append((low, low))
        j += 1
    return charset(members, negated), end


# A parsed pattern: a group is its alternatives, each a list of items (node, low, high), where
# a node is a CharSet or a group and `high` is None for an unbounded repetition. An anchor is
# an item that takes no position: (NOTHING, 0, 0).
Item = tuple["CharSet | Group", int, int | None]
Group = list[list[Item]]

_ANCHOR: Item = (NOTHING, 0, 0)
_DIGITS = re.compile(r"[0-9]+")
_REPEAT_CAP = 1 << 20
MAX_GROUP_DEPTH = 64  # groups inside groups; the walks below recurse once per level


class PatternTooNested(ValueError):
    """A pattern nests groups deeper than `MAX_GROUP_DEPTH`."""


def parse(pattern: str) -> Group:
    """The pattern as nested groups; what this reader does not understand matches anything.

    Raises:
        PatternTooNested: groups nested past `MAX_GROUP_DEPTH`.
    """
    stack: list[Group] = [[[]]]
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        branch = stack[-1][-1]
        if char == "\\":
            node, i = _escape_set(pattern, i)
            branch.append((node, 1, 1))
        elif char == "[":
            node, i = _class_set(pattern, i)
            branch.append((node, 1, 1))
        elif char == "(":
            if len(stack) > MAX_GROUP_DEPTH:
                raise PatternTooNested(f"groups nest more than {MAX_GROUP_DEPTH} deep")
            i = _group_body(pattern, i + 1)
            stack.append([[]])
        elif char == ")" and len(stack) > 1:
            group = stack.pop()
            stack[-1][-1].append((group, 1, 1))
            i += 1
        elif char == "|":
            stack[-1].append([])
            i += 1
        elif char in "*+?{" and branch and branch[-1] is not _ANCHOR:
            i = _repeat(pattern, i, branch)
        elif char in "^$":
            branch.append(_ANCHOR)
            i += 1
        else:
            branch.append((ANY if char == "." else _char(char), 1, 1))
            i += 1
    while len(stack) > 1:  # unclosed groups: llguidance refuses them; read what was there
        group = stack.pop()
        stack[-1][-1].append((group, 1, 1))
    return stack[0]


def _group_body(pattern: str, i: int) -> int:
    """Where the body of the group whose `(` is before `i` starts (past `?:`, `?<name>`…)."""
    if not pattern.startswith("?", i):
        return i
    if pattern.startswith(("?P<", "?<"), i) and not pattern.startswith(("?<=", "?<!"), i):
        close = pattern.find(">", i, i + 256)
        return close + 1 if close >= 0 else i + 1
    return i + 2  # `?:`, or a flag / lookaround letter: read the rest as the group's body


def _repeat(pattern: str, i: int, branch: list[Item]) -> int:
    """Apply the quantifier at `i` to the branch's last item; the index past it."""
    node, low, high = branch[-1]
    char = pattern[i]
    end = i + 1
    new_high: int | None
    if char == "*":
        new_low, new_high = 0, None
    elif char == "+":
        new_low, new_high = 1, None
    elif char == "?":
        new_low, new_high = 0, 1
    else:
        close = pattern.find("}", i, i + 32)  # bounded: `{{{{…` stays linear
        body = pattern[i + 1 : close] if close > i else ""
        lows, comma, highs = body.partition(",")
        counted = _DIGITS.fullmatch(lows) and (not highs or _DIGITS.fullmatch(highs))
        if close < 0 or not counted:
            branch.append((_char("{"), 1, 1))  # not a counted repetition: a literal brace
            return i + 1
        new_low = _count(lows)
        new_high = None if comma and not highs else _count(highs or lows)
        end = close + 1
    if char != "?" and pattern.startswith(("?", "+"), end):  # lazy or possessive
        end += 1
    repeated = None if high is None or new_high is None else min(_REPEAT_CAP, high * new_high)
    branch[-1] = (node, min(_REPEAT_CAP, low * new_low), repeated)
    return end


def _count(digits: str) -> int:
    return _REPEAT_CAP if len(digits) > 7 else int(digits)


def pattern_states(pattern: str) -> int:
    """An upper estimate of the lexer states `pattern` may need (see the module docstring).

    Raises:
        PatternTooNested: groups nested past `MAX_GROUP_DEPTH`.
    """
    total = 0
    for branch in parse(pattern):
        items = branch if branch and branch[0] is _ANCHOR else [(ANY, 0, None), *branch]
        if not (branch and branch[-1] is _ANCHOR):
            items = _shortest_match(items)
        total += _sequence_states(items)
    return min(total, 1 << _EXPONENT_CAP)


def _shortest_match(items: list[Item]) -> list[Item]:
    """A branch not anchored at its end (JSON Schema searches): once its shortest match is
    in, whatever follows is accepted, so the positions past it never hold threads."""
    end = len(items)
    while end > 0 and items[end - 1][1] == 0:  # a trailing optional part: matched by nothing
        end -= 1
    if end == 0:
        return []
    node, low, _ = items[end - 1]
    return [*items[: end - 1], (node, low, low)]


def _sequence_states(items: list[Item]) -> int:
    total = 1
    for index, (node, _, high) in enumerate(items):
        if not isinstance(node, CharSet):
            total += sum(_sequence_states(branch) for branch in node)
        if high is None and index + 1 < len(items):
            total += _after_loop(_chars(node), items[index + 1 :])
    return total


def _after_loop(loop: CharSet, following: list[Item]) -> int:
    """The states the positions after a loop that takes `loop` may need."""
    node, low, high = following[0]
    if isinstance(node, list) and len(node) > 1:  # alternatives: each goes on on its own
        again: list[Item] = [] if high == 1 else [(node, max(0, low - 1), _less(high))]
        return sum(_after_loop(loop, [([b], 1, 1), *again, *following[1:]]) for b in node)
    starts = _first(following) & loop
    if not starts:
        return 1
    holding = [(chars, count) for chars, count in _positions(following) if chars & starts]
    threads = sum(count for _, count in holding)
    if threads >= 2 and len({chars for chars, _ in holding}) > 1:
        return 1 << min(threads, _EXPONENT_CAP)
    return threads + 1


def _less(high: int | None) -> int | None:
    return None if high is None else high - 1


def _positions(items: list[Item]) -> list[tuple[CharSet, int]]:
    """The positions the items expand to, up to the next unbounded loop (which takes the
    threads over: its own count starts there). A group's alternatives share their places:
    the n-th position of each is one place that takes what any of them takes there."""
    out: list[tuple[CharSet, int]] = []
    for node, _, high in items:
        if high == 0:
            continue
        if high is None:
            out.append((_chars(node), 1))
            return out
        if isinstance(node, CharSet):
            out.append((node, high))
            continue
        places = [_expanded(_positions(branch)) for branch in node]
        merged = [
            charset([r for place in places if n < len(place) for r in place[n].ranges])
            for n in range(max(map(len, places), default=0))
        ]
        out.extend((chars, high) for chars in merged)
    return out


def _expanded(positions: list[tuple[CharSet, int]]) -> list[CharSet]:
    """One entry per place, as far as the estimate can tell places apart."""
    out: list[CharSet] = []
    for chars, count in positions:
        out.extend([chars] * min(count, _EXPONENT_CAP + 1 - len(out)))
        if len(out) > _EXPONENT_CAP:
            break
    return out


def _first(items: list[Item]) -> CharSet:
    """The characters the items can start with."""
    ranges: Ranges = []
    for node, low, high in items:
        if high == 0:
            continue
        if isinstance(node, CharSet):
            ranges.extend(node.ranges)
        else:
            for branch in node:
                ranges.extend(_first(branch).ranges)
        if low > 0:
            break
    return charset(ranges)


def _chars(node: CharSet | Group) -> CharSet:
    """Every character the node can take."""
    if isinstance(node, CharSet):
        return node
    ranges: Ranges = []
    stack: list[Group] = [node]
    while stack:
        for branch in stack.pop():
            for item, _, high in branch:
                if high == 0:
                    continue
                if isinstance(item, CharSet):
                    ranges.extend(item.ranges)
                else:
                    stack.append(item)
    return charset(ranges)
