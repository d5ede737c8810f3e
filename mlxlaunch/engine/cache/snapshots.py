"""Whole-cache snapshots for models whose caches cannot be cut at an arbitrary position.

Rotating-window attention keeps only the last window of keys, and linear-attention or hybrid
layers fold the whole history into a fixed-size state; neither can be trimmed back to an
earlier position. Such a cache is reusable only by a request that continues exactly the
tokens it was taken at, so each snapshot is kept whole and matched as a whole.

Every method runs on the engine's MLX thread.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten


@dataclass(eq=False)
class _Snapshot:
    tokens: tuple[int, ...]
    caches: list[Any]
    nbytes: int
    last_used: int
    priority: int = 0


def _nbytes(caches: Sequence[Any]) -> int:
    return int(sum(getattr(c, "nbytes", 0) for c in caches))


class SnapshotStore:
    """Exact-position snapshots with LRU eviction under `budget_bytes`."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._snapshots: list[_Snapshot] = []
        self._tick = 0
        self.nbytes = 0
        self.evictions = 0

    @property
    def blocks(self) -> int:
        return len(self._snapshots)

    def _best(self, tokens: Sequence[int]) -> _Snapshot | None:
        best: _Snapshot | None = None
        for snap in self._snapshots:
            n = len(snap.tokens)
            # A snapshot at the request's last token is no use: one token must remain to run.
            longer = best is None or n > len(best.tokens)
            if longer and n < len(tokens) and tuple(tokens[:n]) == snap.tokens:
                best = snap
        return best

    def match(self, tokens: Sequence[int]) -> int:
        """Length of the longest snapshot that `tokens` continues (0 if none)."""
        best = self._best(tokens)
        return len(best.tokens) if best is not None else 0

    def held(self, tokens: Sequence[int]) -> int:
        """Length of the longest snapshot that is `tokens` or a prefix of it: what a fetch
        of `tokens` itself can return (match, for a request, leaves one token to run)."""
        lengths = [
            len(s.tokens)
            for s in self._snapshots
            if len(s.tokens) <= len(tokens) and tuple(tokens[: len(s.tokens)]) == s.tokens
        ]
        return max(lengths, default=0)

    def fetch(self, tokens: Sequence[int], length: int, room: int = 0) -> list[Any]:
        """A private copy of the snapshot of exactly `length` tokens that `tokens` continues
        (`room` is ignored: these caches grow as mlx-lm's own do)."""
        for snap in self._snapshots:
            if len(snap.tokens) == length and tuple(tokens[:length]) == snap.tokens:
                self._tick += 1
                snap.last_used = self._tick
                return copy.deepcopy(snap.caches)
        raise ValueError(f"no snapshot of {length} tokens matches")

    def store(self, tokens: Sequence[int], caches: Sequence[Any], priority: int = 0) -> int:
        """Keep `caches`, taken after exactly `tokens`; returns the tokens newly covered.

        Lower `priority` snapshots are evicted first (side requests before the main one).
        """
        key = tuple(tokens)
        if not key:
            return 0
        self._tick += 1
        for snap in self._snapshots:
            if snap.tokens == key:
                snap.last_used = self._tick
                snap.priority = max(snap.priority, priority)
                return 0
        kept = copy.deepcopy(list(caches))
        leaves: Any = tree_flatten([c.state for c in kept])
        mx.eval([a for _, a in leaves if isinstance(a, mx.array)])
        snap = _Snapshot(key, kept, _nbytes(kept), self._tick, priority)
        self._snapshots.append(snap)
        self.nbytes += snap.nbytes
        self.evict()
        return len(key)

    def evict(self, budget_bytes: int | None = None) -> None:
        """Drop least-recently-used snapshots until the store fits its budget."""
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        self._snapshots.sort(key=lambda s: (s.priority, s.last_used))
        while self._snapshots and self.nbytes > budget:
            gone = self._snapshots.pop(0)
            self.nbytes -= gone.nbytes
            self.evictions += 1

    def clear(self) -> None:
        """Forget everything."""
        self._snapshots.clear()
        self.nbytes = 0
