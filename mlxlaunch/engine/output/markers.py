"""Finding markers (think/tool-call delimiters, stop sequences) in a streamed text buffer.

A `MarkerSet` answers two questions about the not-yet-emitted part of the output:
which marker completes first in it, and how much of its end must be held back because it
could still grow into a marker. Both only look at the buffer handed in, which the parser keeps
short (held-back text plus the newest piece).

Memory is the markers themselves, sorted: a request may bring 256 stop sequences of 1,000
characters, and a table of their prefixes (what this once kept) is O(total length²) — 150 MB a
request. A suffix of the buffer is a prefix of some marker exactly when the first marker not
below it in sorted order starts with it, so one bisection answers each candidate.
"""

from __future__ import annotations

from bisect import bisect_left
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
        self._sorted = sorted(self._kinds)
        self._initials = frozenset(m[0] for m in self._kinds)  # skips most candidate suffixes
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
            if len(marker) > len(buffer):
                continue
            start = buffer.find(marker)
            if start < 0:
                continue
            end = start + len(marker)
            if best is None or end < best.end or (end == best.end and start < best.start):
                best = MarkerMatch(start, end, marker, kind)
        return best

    def held_back(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some marker.

        Call it only when `first_match` found nothing (so no suffix is a whole marker); that
        suffix is the only part of the buffer a future piece can still turn into a marker.

        Candidates are tried longest first and the search stops at the first hit; every
        candidate that misses starts before the held-back tail, so the parser emits it and it is
        never tried again: over a stream, each position is tried about once, at O(marker length
        · log markers) character comparisons in C.
        """
        markers, initials = self._sorted, self._initials
        for start in range(max(0, len(buffer) - self._longest_prefix), len(buffer)):
            if buffer[start] not in initials:
                continue
            suffix = buffer[start:]
            index = bisect_left(markers, suffix)
            if index < len(markers) and markers[index].startswith(suffix):
                return len(buffer) - start
        return 0
