"""A batch KV cache whose sequences may end at different positions: per-row rollback.

mlx-lm's `BatchKVCache` keeps every sequence of a batch right-aligned: one write position for
all rows, earlier starts covered by left padding. Speculative decoding writes a run of drafted
tokens for every row in one forward pass and then keeps a different number of them per row, so
each row's valid keys must be able to end where that row's accepted run ends. `RowKVCache`
keeps a host-side end per row: a row's keys are the positions `[left, end)` of its buffer row,
anything after `end` is stale (masked out, and overwritten by the row's next write). Rolling a
row back is moving its end: no data moves, whatever the context length (shifting rows to keep
them aligned would copy the whole cache every step: gigabytes on a real model).

While all rows end together (no speculation, or equal acceptance) it writes, masks and
positions exactly as `BatchKVCache` does; only after unequal rollbacks does a write become one
slice per row and the mask carry each row's end.

Only layers whose cache is a plain `KVCache` can be held this way (`rollback_capable`): a
rotating window or a recurrent state cannot be rolled back by moving an end. A layer's keys
and values are a tree of buffers with the token axis at 2: one array each here, the packed
values with their scales and biases in the quantized subclass (runtime/quantized_kv.py), which
is also prefilled here (`prepare` / `finalize`, the right padding of mlx-lm's prompt batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache, KVCache, dynamic_roll, make_prompt_cache

# Growth of the buffer, in positions (as BatchKVCache: a reallocation every 256 tokens).
STEP = 256

Buffers = Any  # one layer's keys (or values): an array, or a tuple of arrays (quantized)


def _leaves(tree: Buffers) -> list[mx.array]:
    flat: Any = tree_flatten(tree)
    return [leaf for _, leaf in flat]


def _write(buffer: mx.array, new: mx.array, row: int | None, start: int) -> mx.array:
    """`new` written into `buffer` at token `start` (of one row, or of all: row None)."""
    n = int(new.shape[2])
    if row is None:
        buffer[..., start : start + n, :] = new
    else:
        buffer[row : row + 1, :, start : start + n, :] = new[row : row + 1]
    return buffer


def rollback_capable(model: Any) -> str | None:
    """None when every layer of `model` keeps a plain KV cache (rows can be rolled back),
    else why not, in words for a log line."""
    kinds = {type(cache).__name__ for cache in make_prompt_cache(model)}
    if kinds == {"KVCache"}:
        return None
    other = sorted(kinds - {"KVCache"})
    return f"its layers keep {', '.join(other)} caches, which cannot be rolled back"


class RowKVCache(BatchKVCache):
    """One layer's keys and values for a batch of sequences, each ending where it ends.

    Models read `offset` (each row's position, for RoPE), call `update_and_fetch` and build
    their mask with `make_mask`, as with mlx-lm's batch cache. `rollback(counts)` drops each
    row's last `counts[i]` positions.
    """

    def __init__(self, lefts: Sequence[int], ends: Sequence[int]) -> None:
        # BatchKVCache.__init__ is not called: every field it sets is set here.
        self.keys: mx.array | None = None  # type: ignore[assignment]
        self.values: mx.array | None = None  # type: ignore[assignment]
        self.lefts = list(lefts)
        self.ends = list(ends)
        self._right_padding: list[int] | None = None  # type: ignore[assignment]
        self._sync()

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def of_batch(cls, cache: BatchKVCache) -> RowKVCache:
        """The rows of a right-aligned mlx-lm batch cache (same buffers, no copy)."""
        lefts = [int(x) for x in cast(list[int], cache.left_padding.tolist())]
        end = int(cache._idx)
        row = cls(lefts, [end] * len(lefts))
        row.keys, row.values = cache.keys, cache.values
        return row

    @classmethod
    def of_sequences(cls, caches: Sequence[KVCache]) -> RowKVCache:
        """Rows for single-sequence caches; a lone sequence keeps its buffers (no copy)."""
        if len(caches) == 1:
            only = caches[0]
            row = cls([0], [int(only.offset)])
            if only.keys is not None:
                row.keys, row.values = only.keys, only.values
            return row
        return cls.of_batch(BatchKVCache.merge(list(caches)))

    def _sync(self) -> None:
        """Refresh the device-side figures the model reads from the host-side rows."""
        self.offset = mx.array([e - left for e, left in zip(self.ends, self.lefts, strict=True)])
        self.left_padding = mx.array(self.lefts)
        self._idx = max(self.ends, default=0)

    # --- what the model calls -------------------------------------------------------------

    @property
    def aligned(self) -> bool:
        """Every row ends at the same position (the mlx-lm batch cache's layout)."""
        return len(set(self.ends)) <= 1

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        n = int(keys.shape[2])
        keys, values = self._encode(keys), self._encode(values)
        self._reserve(keys, values, max(self.ends) + n)
        assert self.keys is not None and self.values is not None
        if self.aligned:
            self._put(keys, values, None, self.ends[0])
        else:  # one slice per row (a scatter costs more here, measured)
            for row, start in enumerate(self.ends):
                self._put(keys, values, row, start)
        self.ends = [e + n for e in self.ends]
        self.offset = self.offset + n
        self._idx = max(self.ends)
        used = self._idx
        return (
            tree_map(lambda b: b[..., :used, :], self.keys),
            tree_map(lambda b: b[..., :used, :], self.values),
        )

    def _put(self, keys: Buffers, values: Buffers, row: int | None, start: int) -> None:
        def write(buffer: mx.array, new: mx.array) -> mx.array:
            return _write(buffer, new, row, start)

        self.keys = tree_map(write, self.keys, keys)
        self.values = tree_map(write, self.values, values)

    def _encode(self, x: mx.array) -> Buffers:
        """New keys or values as the buffers hold them (here: as they are)."""
        return x

    def _single(self) -> Any:
        """An empty single-sequence cache of the kind a row is extracted as."""
        return KVCache()

    def _reserve(self, keys: Buffers, values: Buffers, needed: int) -> None:
        """Grow the buffers (in STEP positions past the rows' last end) so `needed` fit."""
        held = 0 if self.keys is None else int(_leaves(self.keys)[0].shape[2])
        if needed <= held:
            return
        used = max(self.ends, default=0) if self.keys is not None else 0
        grow = ((needed - used + STEP - 1) // STEP) * STEP
        new_k, new_v = _zeros(keys, grow), _zeros(values, grow)
        if self.keys is None or self.values is None:
            self.keys, self.values = new_k, new_v
        else:
            self.keys = tree_map(
                lambda b, z: mx.concatenate([b[..., :used, :], z], axis=2), self.keys, new_k
            )
            self.values = tree_map(
                lambda b, z: mx.concatenate([b[..., :used, :], z], axis=2), self.values, new_v
            )

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None, **kwargs: Any
    ) -> mx.array:
        if self.aligned:
            return create_causal_mask(
                N, offset=self._idx, left_padding=self.left_padding, window_size=window_size
            )
        # Query j of row r sits at ends[r] + j and sees keys lefts[r] .. ends[r] + j.
        positions = mx.arange(self._idx + N)[None, None, :]
        queries = (mx.array(self.ends)[:, None] + mx.arange(N)[None, :])[:, :, None]
        mask = (positions >= mx.array(self.lefts)[:, None, None]) & (positions <= queries)
        if window_size is not None:
            mask = mask & (queries < positions + window_size)
        return mask[:, None]

    @property
    def single_unpadded(self) -> bool:
        """One row with no padding: its mask is plain causal attention (see cpu_attention)."""
        return len(self.lefts) == 1 and self.lefts[0] == 0

    # --- what the batch calls -------------------------------------------------------------

    def rollback(self, counts: Sequence[int]) -> None:
        """Drop the last `counts[r]` positions of each row `r` (0: keep it as it is)."""
        if not any(counts):
            return
        rows = zip(self.ends, self.lefts, counts, strict=True)
        self.ends = [max(left, e - c) for e, left, c in rows]
        self._sync()

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(n, min((self.length(i) for i in range(len(self.ends))), default=0))
        self.rollback([n] * len(self.ends))
        return n

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding

    @state.setter
    def state(self, v: Any) -> None:
        raise NotImplementedError("a RowKVCache is built with of_batch / of_sequences")

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return int(sum(a.nbytes for a in _leaves((self.keys, self.values))))

    def filter(self, batch_indices: Sequence[int]) -> None:
        """Keep the rows `batch_indices` (in that order), dropping padding no row needs."""
        keep = list(batch_indices)
        lefts = [self.lefts[i] for i in keep]
        ends = [self.ends[i] for i in keep]
        shift = min(lefts, default=0)
        if self.keys is not None and self.values is not None:
            index = mx.array(keep)
            self.keys = tree_map(lambda b: b[index][..., shift:, :], self.keys)
            self.values = tree_map(lambda b: b[index][..., shift:, :], self.values)
        self.lefts = [left - shift for left in lefts]
        self.ends = [e - shift for e in ends]
        self._sync()

    def extend(self, other: Any) -> None:
        """Append `other`'s rows (a RowKVCache or an mlx-lm BatchKVCache) after these."""
        if not isinstance(other, RowKVCache):
            other = RowKVCache.of_batch(other)
        if other.keys is None and self.keys is None:
            self.lefts += other.lefts
            self.ends += other.ends
            self._sync()
            return
        used = max(self._idx, other._idx)
        rows: list[tuple[Buffers, Buffers]] = []
        sample = self.keys if self.keys is not None else other.keys
        assert sample is not None
        lefts: list[int] = []
        ends: list[int] = []
        for part in (self, other):
            shift = used - part._idx  # right-align both on the longer one's last position
            keys, values = part._padded(sample, shift, used)
            rows.append((keys, values))
            lefts += [left + shift for left in part.lefts]
            ends += [e + shift for e in part.ends]
        self.keys = tree_map(lambda *parts: mx.concatenate(list(parts)), *[k for k, _ in rows])
        self.values = tree_map(lambda *parts: mx.concatenate(list(parts)), *[v for _, v in rows])
        self.lefts, self.ends = lefts, ends
        self._sync()

    def _padded(self, sample: Buffers, shift: int, used: int) -> tuple[Buffers, Buffers]:
        """This cache's first `used - shift` positions moved right by `shift` (zeros before).
        `sample`: another cache's keys (what an empty one's rows are shaped after)."""
        rows = len(self.lefts)
        if self.keys is None or self.values is None:
            empty = _zeros(tree_map(lambda b: b[:1], sample), used, rows)
            return empty, empty
        pad = [(0, 0), (0, 0), (shift, 0), (0, 0)]

        def cut(b: mx.array) -> mx.array:
            b = b[..., : used - shift, :]
            return mx.pad(b, pad) if shift else b

        return tree_map(cut, self.keys), tree_map(cut, self.values)

    def extract(self, idx: int, end: int | None = None) -> KVCache:
        """Row `idx` as a single-sequence cache (a copy), up to `end` (default: its end)."""
        cache = self._single()
        stop = self.ends[idx] if end is None else min(end, self.ends[idx])
        if self.keys is not None and self.values is not None:
            start = self.lefts[idx]

            def row(b: mx.array) -> mx.array:
                return mx.contiguous(b[idx : idx + 1, :, start:stop])

            cache.keys = tree_map(row, self.keys)
            cache.values = tree_map(row, self.values)
            cache.offset = stop - start
        return cache

    def length(self, idx: int) -> int:
        """Positions row `idx` holds."""
        return self.ends[idx] - self.lefts[idx]

    # --- prompt processing (mlx-lm's PromptProcessingBatch) -------------------------------

    def prepare(
        self,
        *,
        left_padding: Sequence[int] | None = None,
        lengths: Sequence[int] | None = None,
        right_padding: Sequence[int] | None = None,
    ) -> None:
        """Before a right-padded prompt chunk: remember each row's padding (see finalize)."""
        if left_padding is not None:
            raise NotImplementedError("rows join with their padding already known")
        if right_padding is not None and max(right_padding, default=0) > 0:
            self._right_padding = list(right_padding)

    def finalize(self) -> None:
        """After a right-padded chunk: move each row's padding to its left (as mlx-lm's batch
        cache does), so every row ends at the same position again."""
        padding = self._right_padding
        if padding is None:
            return
        self._right_padding = None
        if self.keys is not None and self.values is not None:
            shifts = mx.array(padding)[:, None]
            self.keys = tree_map(lambda b: dynamic_roll(b, shifts, axis=2), self.keys)
            self.values = tree_map(lambda b: dynamic_roll(b, shifts, axis=2), self.values)
        self.lefts = [left + p for left, p in zip(self.lefts, padding, strict=True)]
        self._sync()


def _zeros(sample: Buffers, positions: int, rows: int | None = None) -> Buffers:
    """Empty buffers shaped as `sample`'s (rows, heads, ·, dim) for `positions` tokens."""

    def zeros(b: mx.array) -> mx.array:
        count = int(b.shape[0]) if rows is None else rows
        return mx.zeros((count, b.shape[1], positions, b.shape[3]), b.dtype)

    return tree_map(zeros, sample)
