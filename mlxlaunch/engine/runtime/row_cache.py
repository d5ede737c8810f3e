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
rotating window, a quantized cache or a recurrent state cannot be rolled back by moving an end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache

# Growth of the buffer, in positions (as BatchKVCache: a reallocation every 256 tokens).
STEP = 256


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
        self._right_padding = None
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

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        n = int(keys.shape[2])
        self._reserve(keys, values, max(self.ends) + n)
        assert self.keys is not None and self.values is not None
        if self.aligned:
            start = self.ends[0]
            self.keys[..., start : start + n, :] = keys
            self.values[..., start : start + n, :] = values
        else:  # one slice per row (a scatter costs more here, measured)
            for row, start in enumerate(self.ends):
                self.keys[row : row + 1, :, start : start + n, :] = keys[row : row + 1]
                self.values[row : row + 1, :, start : start + n, :] = values[row : row + 1]
        self.ends = [e + n for e in self.ends]
        self.offset = self.offset + n
        self._idx = max(self.ends)
        return self.keys[..., : self._idx, :], self.values[..., : self._idx, :]

    def _reserve(self, keys: mx.array, values: mx.array, needed: int) -> None:
        """Grow the buffers (in STEP positions past the rows' last end) so `needed` fit."""
        held = 0 if self.keys is None else int(self.keys.shape[2])
        if needed <= held:
            return
        used = max(self.ends, default=0) if self.keys is not None else 0
        batch, heads, _, k_dim = keys.shape
        grow = ((needed - used + STEP - 1) // STEP) * STEP
        new_k = mx.zeros((batch, heads, grow, k_dim), keys.dtype)
        new_v = mx.zeros((batch, heads, grow, values.shape[3]), values.dtype)
        if self.keys is None or self.values is None:
            self.keys, self.values = new_k, new_v
        else:
            self.keys = mx.concatenate([self.keys[..., :used, :], new_k], axis=2)
            self.values = mx.concatenate([self.values[..., :used, :], new_v], axis=2)

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
        return int(self.keys.nbytes + self.values.nbytes)

    def filter(self, batch_indices: Sequence[int]) -> None:
        """Keep the rows `batch_indices` (in that order), dropping padding no row needs."""
        keep = list(batch_indices)
        lefts = [self.lefts[i] for i in keep]
        ends = [self.ends[i] for i in keep]
        shift = min(lefts, default=0)
        if self.keys is not None and self.values is not None:
            index = mx.array(keep)
            self.keys = self.keys[index][..., shift:, :]
            self.values = self.values[index][..., shift:, :]
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
        rows: list[tuple[mx.array, mx.array]] = []
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
        self.keys = mx.concatenate([k for k, _ in rows])
        self.values = mx.concatenate([v for _, v in rows])
        self.lefts, self.ends = lefts, ends
        self._sync()

    def _padded(self, sample: mx.array, shift: int, used: int) -> tuple[mx.array, mx.array]:
        """This cache's first `used - shift` positions moved right by `shift` (zeros before)."""
        rows = len(self.lefts)
        if self.keys is None or self.values is None:
            shape = (rows, sample.shape[1], used, sample.shape[3])
            return mx.zeros(shape, sample.dtype), mx.zeros(shape, sample.dtype)
        keys = self.keys[..., : used - shift, :]
        values = self.values[..., : used - shift, :]
        if shift:
            pad = [(0, 0), (0, 0), (shift, 0), (0, 0)]
            keys, values = mx.pad(keys, pad), mx.pad(values, pad)
        return keys, values

    def extract(self, idx: int, end: int | None = None) -> KVCache:
        """Row `idx` as a single-sequence cache (a copy), up to `end` (default: its end)."""
        cache = KVCache()
        stop = self.ends[idx] if end is None else min(end, self.ends[idx])
        if self.keys is not None and self.values is not None:
            start = self.lefts[idx]
            cache.keys = mx.contiguous(self.keys[idx : idx + 1, :, start:stop])
            cache.values = mx.contiguous(self.values[idx : idx + 1, :, start:stop])
            cache.offset = stop - start
        return cache

    def length(self, idx: int) -> int:
        """Positions row `idx` holds."""
        return self.ends[idx] - self.lefts[idx]

    def prepare(self, **kwargs: Any) -> None:
        raise NotImplementedError("rows are prefilled in mlx-lm's batch cache, then held here")

    def finalize(self) -> None:
        raise NotImplementedError("rows are prefilled in mlx-lm's batch cache, then held here")
