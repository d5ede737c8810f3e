"""KV caches of many prompts in one trie of token blocks, least-recently-used under a byte budget.

A path from the root spells a token sequence in blocks of `block_tokens`; each node holds the
keys and values of its block for every layer. Prompts that share a prefix (Claude Code's system
prompt and tools, a conversation and its next turn) share the nodes of that prefix, so it is
stored once. A node with fewer tokens than a block (a sequence's tail) is always a leaf; it is
dropped when a full block that starts with the same tokens arrives.

Keys at a position depend only on the tokens up to it, so the first `n` tokens of any block are
valid for a request that agrees with those `n` tokens: reuse is token-exact, not block-rounded.

Every method runs on the engine's MLX thread. Arrays stored here are private copies: a batch
that is handed a cache built from them never writes into them. Quantized KV (`--kv-bits`) is
stored as it is held, packed values with their scales and biases (each a tree of arrays with
the token axis at 2), and fetched as the quantized caches the batch continues.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import BatchKVCache, KVCache

from mlxlaunch.engine.runtime.mlx_lm_internals import batch_cache_holding
from mlxlaunch.engine.runtime.quantized_kv import KVQuantization, QuantizedSequenceCache

DEFAULT_BLOCK_TOKENS = 256
# The most of the budget pinned blocks may hold: past it the oldest pins lapse, so pins (any
# client's stored conversations) cannot crowd out everything else.
PIN_SHARE = 0.5

# (keys, values), each (1, heads, tokens, head_dim), or for quantized KV a tuple of such arrays
# (packed values, scales, biases).
LayerKV = tuple[Any, Any]


@dataclass(eq=False)
class _Node:
    tokens: tuple[int, ...]
    layers: list[LayerKV]
    parent: _Node | None
    nbytes: int = 0
    last_used: int = 0
    priority: int = 0  # evicted after every lower-priority block, pinned or not
    # Until this time (time.monotonic) the block ranks above every unpinned one of its
    # priority: a conversation whose next turn continues it by id (server/threads.py). A pin
    # never outranks a higher priority: no side conversation evicts the main session.
    pinned_until: float = 0.0
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)


class ReusedKVCache(KVCache):
    """A layer's KV rebuilt from stored blocks, with room for the tokens about to be added.

    mlx-lm batches a sequence's cache by copying it into a new `BatchKVCache` sized to its
    content, and the first new token then grows that one by copying it again: two copies of
    the whole reused prefix before any work (on a real model, hundreds of MB). A lone sequence
    — a request that continues a long cached prefix, the common case — hands its buffers over
    instead, and the batch writes the new tokens into the spare room. Several sequences are
    batched as mlx-lm does.
    """

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchKVCache:
        if len(caches) != 1 or caches[0].keys is None:
            return BatchKVCache.merge(caches)
        only = caches[0]
        batch = batch_cache_holding(only.keys, only.values, only.offset)
        # No other reference: the batch's in-place writes must not have to copy the buffer.
        only.keys = only.values = None
        return batch


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def is_block_cacheable(caches: Sequence[Any]) -> bool:
    """Whether a model's cache can live in the trie: plain full-attention KV in every layer
    (quantized or not)."""
    return bool(caches) and all(type(c) in (KVCache, QuantizedSequenceCache) for c in caches)


class BlockTrie:
    """Token-block trie of KV caches with LRU eviction under `budget_bytes`."""

    def __init__(
        self,
        budget_bytes: int,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        kv: KVQuantization | None = None,
    ) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        self.kv = kv  # how the stored KV is held (None: in the model's dtype)
        self._root = _Node((), [], None)
        self._tick = 0
        self.nbytes = 0
        self.blocks = 0
        self.evictions = 0
        self._pinned: set[_Node] = set()  # blocks whose pin may still run

    # --- lookups ------------------------------------------------------------------------

    def match(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` have KV here."""
        _, length = self._walk(tokens)
        return length

    def held(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` a fetch can return (the same as match: any
        prefix of a stored sequence can be cut out)."""
        return self.match(tokens)

    def fetch(self, tokens: Sequence[int], length: int, room: int = 0) -> list[Any]:
        """Fresh per-layer caches holding exactly the first `length` tokens' KV, with space
        for `room` more (written in place by the batch that continues them).

        `length` must not exceed `match(tokens)`. The blocks used become most recent.
        """
        path, available = self._walk(tokens)
        if length > available:
            raise ValueError(f"only {available} tokens are cached, not {length}")
        self._tick += 1
        pieces: list[list[LayerKV]] = []
        taken = 0
        for node in path:
            if taken >= length:
                break
            node.last_used = self._tick
            take = min(len(node.tokens), length - taken)
            pieces.append(node.layers if take == len(node.tokens) else _slice(node.layers, 0, take))
            taken += take
        caches: list[Any] = []
        for layer in range(len(pieces[0]) if pieces else 0):
            cache = self._new_cache(room)
            cache.keys = _joined([p[layer][0] for p in pieces], room)
            cache.values = _joined([p[layer][1] for p in pieces], room)
            cache.offset = length
            caches.append(cache)
        return caches

    def _new_cache(self, room: int) -> Any:
        kv = self.kv
        if kv is not None:  # hands its buffers to a lone sequence's batch (no copy)
            return QuantizedSequenceCache(kv.group_size, kv.bits)
        return ReusedKVCache() if room > 0 else KVCache()

    def _walk(self, tokens: Sequence[int]) -> tuple[list[_Node], int]:
        """Nodes along the longest match (the last may match only partly) and its length."""
        size = self.block_tokens
        node, pos, path = self._root, 0, []
        while True:
            block = tuple(tokens[pos : pos + size])
            child = node.children.get(block) if len(block) == size else None
            if child is not None:
                path.append(child)
                node, pos = child, pos + size
                continue
            best, best_len = None, 0
            for candidate in node.children.values():
                common = _common_length(candidate.tokens, block)
                if common > best_len:
                    best, best_len = candidate, common
            if best is not None:
                path.append(best)
            return path, pos + best_len

    # --- storing ------------------------------------------------------------------------

    def store(
        self,
        tokens: Sequence[int],
        caches: Sequence[KVCache],
        priority: int = 0,
        pinned_until: float = 0.0,
    ) -> int:
        """Keep the KV of `tokens` (caches hold at least that many positions); returns the
        number of new tokens stored. Blocks already present are only marked as used.

        Blocks on the path take at least `priority`: the main conversation stores with a
        higher one than side requests, so titles and subagents are evicted before it.
        `pinned_until`: a time before which the path outranks every unpinned block of its
        priority, while the pinned blocks fit PIN_SHARE of the budget (the oldest pins lapse
        first).
        """
        n = min(len(tokens), *(c.offset for c in caches)) if caches else 0
        size = self.block_tokens
        self._tick += 1
        node, pos, added = self._root, 0, 0
        fresh: list[mx.array] = []
        while pos < n:
            block = tuple(tokens[pos : min(pos + size, n)])
            child = node.children.get(block)
            # A tail: nothing to add when a longer sibling already starts with it.
            if (
                child is None
                and len(block) < size
                and any(c.tokens[: len(block)] == block for c in node.children.values())
            ):
                break
            if child is None:
                layers = [_copy(c, pos, pos + len(block)) for c in caches]
                fresh.extend(_arrays(layers))
                child = _Node(block, layers, node, nbytes=_nbytes(layers))
                self._drop_covered_tails(node, block)
                node.children[block] = child
                self.nbytes += child.nbytes
                self.blocks += 1
                added += len(block)
            child.last_used = self._tick
            child.priority = max(child.priority, priority)
            if pinned_until > child.pinned_until:
                child.pinned_until = pinned_until
                self._pinned.add(child)
            node, pos = child, pos + len(block)
        if fresh:
            mx.eval(fresh)  # copy now: the batch's buffers must not stay referenced
        if pinned_until:
            self._bound_pins()
        self.evict()
        return added

    def _bound_pins(self) -> None:
        """Let the oldest pins lapse until the pinned blocks fit PIN_SHARE of the budget."""
        now = time.monotonic()
        self._pinned = {node for node in self._pinned if node.pinned_until > now}
        held = sum(node.nbytes for node in self._pinned)
        budget = self.budget_bytes * PIN_SHARE
        for node in sorted(self._pinned, key=lambda n: (n.pinned_until, n.last_used)):
            if held <= budget:
                break
            node.pinned_until = 0.0
            self._pinned.discard(node)
            held -= node.nbytes

    def _drop_covered_tails(self, parent: _Node, block: tuple[int, ...]) -> None:
        for key, sibling in list(parent.children.items()):
            if len(key) < len(block) and block[: len(key)] == key and not sibling.children:
                self._remove(sibling)

    # --- eviction -----------------------------------------------------------------------

    def evict(self, budget_bytes: int | None = None) -> None:
        """Drop least-recently-used leaves until the trie fits `budget_bytes` (default: its own).

        Order: lower priority first, then unpinned before pinned, then least recently used
        (so a pin orders blocks within a priority, never above it). A node is used (and raised)
        whenever a descendant is, so a parent never goes before its children: evicting leaves
        in that order (a parent joins once it becomes a leaf) drops whole cold branches before
        any block of a warm one.
        """
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        if self.nbytes <= budget:
            return
        now = time.monotonic()

        def rank(node: _Node) -> tuple[int, bool, int, int, _Node]:
            return (node.priority, node.pinned_until > now, node.last_used, id(node), node)

        heap = [rank(leaf) for leaf in self._leaves()]
        heapq.heapify(heap)
        while heap and self.nbytes > budget:
            *_, leaf = heapq.heappop(heap)
            parent = leaf.parent
            self._remove(leaf)
            self.evictions += 1
            if parent is not None and parent is not self._root and not parent.children:
                heapq.heappush(heap, rank(parent))

    def clear(self) -> None:
        """Forget everything."""
        self._root = _Node((), [], None)
        self.nbytes = 0
        self.blocks = 0
        self._pinned.clear()

    def _leaves(self) -> list[_Node]:
        found, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                found.append(node)
        return found

    def _remove(self, node: _Node) -> None:
        parent = node.parent
        if parent is not None and parent.children.get(node.tokens) is node:
            del parent.children[node.tokens]
            self.nbytes -= node.nbytes
            self.blocks -= 1
            self._pinned.discard(node)


def _joined(pieces: list[Any], room: int) -> Any:
    """The pieces end to end along the token axis, then `room` empty positions (one copy)."""

    def join(*parts: mx.array) -> mx.array:
        if room > 0:
            first = parts[0]
            spare = mx.zeros((*first.shape[:2], room, first.shape[3]), first.dtype)
            parts = (*parts, spare)
        return mx.concatenate(list(parts), axis=2)

    return tree_map(join, *pieces)


def _slice(layers: list[LayerKV], start: int, stop: int) -> list[LayerKV]:
    def cut(b: mx.array) -> mx.array:
        return b[..., start:stop, :]

    return [(tree_map(cut, k), tree_map(cut, v)) for k, v in layers]


def _arrays(layers: list[LayerKV]) -> list[mx.array]:
    flat: Any = tree_flatten(layers)
    return [a for _, a in flat]


def _nbytes(layers: list[LayerKV]) -> int:
    return int(sum(a.nbytes for a in _arrays(layers)))


def _copy(cache: Any, start: int, stop: int) -> LayerKV:
    # contiguous() copies a slice into its own buffer, so evicting this block frees memory and
    # the source (a finished request's cache) is not kept alive by a view.
    assert cache.keys is not None and cache.values is not None

    def copy(b: mx.array) -> mx.array:
        return mx.contiguous(b[..., start:stop, :])

    return tree_map(copy, cache.keys), tree_map(copy, cache.values)
