"""Finding markers (think/tool-call delimiters, stop sequences) in a streamed text buffer.

A `MarkerSet` answers two questions about the not-yet-emitted part of the output:
which marker completes first in it, and how much of its end must be held back because it
could still grow into a marker. Both only look at the buffer handed in, which the parser keeps
short (held-back text plus the newest piece), so the cost per piece is O(piece + marker length).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class MarkerKind(Enum):
    THINK_START = "think_start"
    THINK_END = "think_end"
    TOOL_START = "tool_start"
    TOOL_END = "tool_end"
    STOP = "stop"


@dataclass(frozen=True)
class MarkerMatch:
    """A complete marker at buffer[start:end]."""

    start: int
    end: int
    marker: str
    kind: MarkerKind


class MarkerSet:
    """The markers that end the parser's current state.

    Later entries override earlier ones for the same string, so callers list stop sequences
    last: a stop sequence that equals a markup marker stops the output.
    """

    def __init__(self, markers: list[tuple[str, MarkerKind]]) -> None:
        self._kinds: dict[str, MarkerKind] = {}
        for marker, kind in markers:
            if marker:  # an empty marker (e.g. mistral's implicit tool_call_end) never matches
                self._kinds[marker] = kind
        self._prefixes = {m[:n] for m in self._kinds for n in range(1, len(m))}
        self._longest_prefix = max((len(m) - 1 for m in self._kinds), default=0)

    def __bool__(self) -> bool:
        return bool(self._kinds)

    def first_match(self, buffer: str) -> MarkerMatch | None:
        """The marker that completes earliest in `buffer` (ties: the one that starts earlier).

        Ranking by end position is what a token-by-token stream would see first, so the result
        does not depend on how the output was split into pieces.
        """
        best: MarkerMatch | None = None
        for marker, kind in self._kinds.items():
            start = buffer.find(marker)
            if start < 0:
                continue
            end = start + len(marker)
            if best is None or end < best.end or (end == best.end and start < best.start):
                best = MarkerMatch(start, end, marker, kind)
        return best

    def held_back(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some marker.

        Call it only when `first_match` found nothing; that suffix is the only part of the buffer
        a future piece can still turn into a marker.
        """
        for size in range(min(len(buffer), self._longest_prefix), 0, -1):
            if buffer[-size:] in self._prefixes:
                return size
        return 0
