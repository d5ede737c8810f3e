"""The prefix cache: each request prefills only what no earlier request already computed.

The worker asks `plan(tokens)` at admission and gets the longest reusable prefix and a private
cache holding exactly that many tokens' KV; when a request ends it hands its cache back to
`retain`. In memory the KV lives in a trie of token blocks (`blocks`), or, for models
whose caches cannot be cut at any position, as whole snapshots (`snapshots`); both are
least-recently-used under one byte budget, so side requests (titles, subagents) only evict the
main conversation when the budget is truly full.

Prefixes that get reused, and the prompt of a main request that found little to reuse (a
session's first turn, cold), are also written to disk (`disk`) while the engine is idle, and a
new process restores the most recent ones when it loads the model, so the first turn of a new
session does not pay the cold prefill of Claude Code's system prompt and tools again: the
trie reuses any prefix of a restored prompt, so the next session's first prompt, which shares
the system prompt and tools and then differs in its user message, reuses all they share.

Every method runs on the engine's MLX thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import mlx.nn as nn
import numpy as np

from mlxlaunch.engine.cache.blocks import DEFAULT_BLOCK_TOKENS, BlockTrie, is_block_cacheable
from mlxlaunch.engine.cache.disk import DiskCache, EntryWriter, open_disk_cache
from mlxlaunch.engine.cache.misses import Decode, MissTracker
from mlxlaunch.engine.cache.snapshots import SnapshotStore
from mlxlaunch.engine.config import EngineConfig, default_cache_memory
from mlxlaunch.engine.runtime.quantized_kv import KVQuantization, new_caches
from mlxlaunch.engine.stats import CacheFigures

# Eviction priority of the main conversation's blocks (side requests store with 0).
MAIN_PRIORITY = 1
# Reused prefixes shorter than this are not worth a file.
MIN_DISK_TOKENS = 256
# A disk entry is loaded only when it adds at least this many tokens to what memory has.
MIN_DISK_GAIN = 32
# A reused prefix followed by at most ROOM_MAX_NEW new tokens comes with room for them plus
# ROOM_FOR_OUTPUT output tokens, rounded up to the batch cache's growth step (mlx-lm's
# BatchKVCache.step), so neither its prefill nor its first decode steps copy the whole cache
# (see ReusedKVCache). Longer prefills grow the cache as mlx-lm does: measured, a 12.6k-token
# prefill into a pre-sized buffer took 5.0 s against 4.0 s.
ROOM_MAX_NEW = 1024
ROOM_FOR_OUTPUT = 256
ROOM_STEP = 256

SNAPSHOT_WARNING = (
    "this model's cache cannot be trimmed (sliding-window or linear-attention layers): "
    "prefixes are reused only where a snapshot was taken, at the end of earlier prompts"
)

log = logging.getLogger(__name__)


class KVStore(Protocol):
    """What the in-memory tiers have in common."""

    budget_bytes: int
    nbytes: int
    evictions: int

    @property
    def blocks(self) -> int: ...

    def match(self, tokens: Sequence[int]) -> int: ...

    def held(self, tokens: Sequence[int]) -> int: ...

    def fetch(self, tokens: Sequence[int], length: int, room: int = 0) -> list[Any]: ...

    def store(self, tokens: Sequence[int], caches: Sequence[Any], priority: int = 0) -> int: ...

    def clear(self) -> None: ...


@dataclass(frozen=True)
class CacheSettings:
    """Budgets and places of the prefix cache.

    Args:
        memory_bytes: in-memory budget (0 turns the cache off).
        disk_dir: where reused prefixes are saved (None: no disk tier).
        disk_bytes: budget of this model's entries in `disk_dir`.
        block_tokens: tokens per trie block.
        restore: how many of the model's most recent disk entries a new process loads.
        excerpts: keep prompt text in miss records and log lines (`--debug-cache`).
    """

    memory_bytes: int
    disk_dir: Path | None = None
    disk_bytes: int = 0
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    restore: int = 4
    excerpts: bool = False


@dataclass(frozen=True)
class CachePlan:
    """How a request starts: `cached_tokens` of its prompt already in `caches` (None: fresh)."""

    cached_tokens: int
    caches: list[Any] | None


class PrefixCache:
    """Cross-request KV reuse for one loaded model."""

    def __init__(
        self,
        model: nn.Module,
        model_path: str,
        settings: CacheSettings,
        decode: Decode,
        kv: KVQuantization | None = None,
    ) -> None:
        self.settings = settings
        template = new_caches(model, kv)  # `kv`: how the model's caches are held
        self.exact = not is_block_cacheable(template)
        self.memory: KVStore = (
            SnapshotStore(settings.memory_bytes)
            if self.exact
            else BlockTrie(settings.memory_bytes, settings.block_tokens, kv)
        )
        self.warning = SNAPSHOT_WARNING if self.exact else None
        self.disk: DiskCache | None = None
        if settings.disk_dir is not None and settings.disk_bytes > 0 and self.enabled:
            self.disk = open_disk_cache(
                settings.disk_dir, settings.disk_bytes, model, model_path, kv
            )
        self.misses = MissTracker(decode, excerpts=settings.excerpts)
        self._pending_saves: list[tuple[int, ...]] = []
        self._writer: EntryWriter | None = None  # the save under way (see save_step)
        self.lookups = 0
        self.hits = 0

    @property
    def enabled(self) -> bool:
        return self.settings.memory_bytes > 0

    # --- requests -----------------------------------------------------------------------

    def plan(self, tokens: Sequence[int], *, request_id: str = "", kind: str = "") -> CachePlan:
        """The longest reusable prefix of `tokens` and a private cache holding it.

        At least one token is always left to prefill: the generator needs the last prompt
        token's logits, so a full hit is trimmed back by one.
        """
        if not self.enabled or len(tokens) < 2:
            return CachePlan(0, None)
        self.lookups += 1
        limit = len(tokens) - 1
        # The disk index and the miss tracker compare token arrays: converted once (~0.4 ms
        # for Claude Code's prompt), not by each of them.
        ids = np.asarray(tokens, dtype=np.int64)
        found = min(self.memory.match(tokens), limit)
        if self.disk is not None:
            found = max(found, self._load_from_disk(tokens, ids, found, limit))
        self.misses.observe(ids, cached_tokens=found, request_id=request_id, kind=kind)
        if kind == "main":
            self._consider_saving_cold(tokens, ids, found)
        if found == 0:
            return CachePlan(0, None)
        caches = self.memory.fetch(tokens, found, room_for(len(tokens) - found))
        self.hits += 1
        self._consider_saving(tokens[:found], ids[:found])
        return CachePlan(found, caches)

    def retain(
        self,
        tokens: Sequence[int],
        caches: Sequence[Any],
        *,
        main: bool = False,
        pin_s: float = 0.0,
    ) -> None:
        """Keep a finished (or prefilled) request's cache, which holds exactly `tokens`.

        `main`: the request belongs to the main conversation, whose prefix side requests
        (titles, subagents, background calls) must not evict. `pin_s`: for this long the
        prefix outranks everything unpinned of its priority — never the main conversation —
        within the trie's pin budget (blocks.PIN_SHARE; a conversation continued by id, whose
        next turn needs it; the snapshot store of untrimmable models keeps its own order).
        """
        if not self.enabled or not tokens or not caches:
            return
        try:
            if pin_s > 0 and isinstance(self.memory, BlockTrie):
                pinned_until = time.monotonic() + pin_s
                self.memory.store(tokens, caches, MAIN_PRIORITY if main else 0, pinned_until)
                return
            self.memory.store(tokens, caches, MAIN_PRIORITY if main else 0)
        except Exception:  # a cache we cannot keep costs reuse, never the request
            log.exception("prefix cache: could not keep a request's cache")

    # --- disk ---------------------------------------------------------------------------

    def _load_from_disk(
        self, tokens: Sequence[int], ids: np.ndarray, in_memory: int, limit: int
    ) -> int:
        assert self.disk is not None
        entry, shared = self.disk.best(ids)
        if entry is None:
            return 0
        if self.exact and (shared < len(entry) or len(entry) > limit):
            return 0  # a snapshot serves only requests that continue all of it
        if min(shared, limit) - in_memory < MIN_DISK_GAIN:
            return 0
        caches = self.disk.load(entry)
        if caches is None:
            return 0
        self.retain([int(t) for t in entry.tokens], caches, main=True)
        return min(self.memory.match(tokens), limit)

    def _consider_saving(self, prefix: Sequence[int], ids: np.ndarray) -> None:
        # Save what was reused, unless disk already holds most of it: a growing conversation
        # would otherwise rewrite a slightly longer copy of itself after every turn.
        if self.disk is None or len(prefix) < MIN_DISK_TOKENS:
            return
        _, on_disk = self.disk.best(ids)
        if on_disk * 2 < len(prefix):
            self._queue_save(tuple(prefix))

    def _consider_saving_cold(self, tokens: Sequence[int], ids: np.ndarray, found: int) -> None:
        # A main request that reuses less than half its prompt is a session's cold start: its
        # whole prompt is saved once it is answered (the saves wait for an idle worker), for
        # the next process's first session to reuse what the two prompts share. Snapshots
        # serve only prompts that continue all of one, never another session's: not saved.
        if not self.exact and found * 2 < len(tokens):
            self._consider_saving(tokens, ids)

    def _queue_save(self, key: tuple[int, ...]) -> None:
        for i, queued in enumerate(self._pending_saves):
            if queued[: len(key)] == key:
                return  # a queued longer one holds this one (any prefix of an entry is reused)
            if key[: len(queued)] == queued:
                self._pending_saves[i] = key
                return
        self._pending_saves.append(key)

    @property
    def saves_pending(self) -> bool:
        """Whether prefixes are queued for the disk or being written (see save_step)."""
        return self.disk is not None and (bool(self._pending_saves) or self._writer is not None)

    def save_step(self) -> int:
        """Write the next piece of the queued prefixes (call when idle: a step takes a few
        milliseconds, see disk.SAVE_STEP_BYTES); returns how many entries it completed."""
        writer = self._writer or self._next_writer()
        if writer is None:
            return 0
        self._writer = writer
        if not writer.step():
            return 0
        self._writer = None
        return int(writer.entry is not None)

    def save_pending(self) -> int:
        """Write everything queued now (at shutdown or unload, when no request can wait);
        returns how many entries were written."""
        written = 0
        while self.saves_pending:
            written += self.save_step()
        return written

    def _next_writer(self) -> EntryWriter | None:
        while self._pending_saves and self.disk is not None:
            tokens = self._pending_saves.pop(0)
            # What memory still holds of it: all, unless evicted meanwhile or cancelled
            # before its prefill got there.
            held = self.memory.held(tokens)
            if held < MIN_DISK_TOKENS:
                continue
            tokens = tokens[:held]
            _, on_disk = self.disk.best(tokens)
            if on_disk * 2 >= held:
                continue  # most of it was saved since it was queued
            try:
                writer = self.disk.begin(tokens, self.memory.fetch(tokens, held))
            except Exception:
                log.exception("prefix cache: could not save a prefix")
                continue
            if writer is not None:
                log.debug("prefix cache: saving %d tokens", held)
                return writer
        return None

    def restore(self) -> int:
        """Load this model's most recently used disk entries into memory (warm start)."""
        if self.disk is None:
            return 0
        restored = 0
        for entry in self.disk.recent(self.settings.restore):
            if self.memory.nbytes + entry.nbytes > self.memory.budget_bytes:
                continue
            caches = self.disk.load(entry)
            if caches is not None:
                self.retain([int(t) for t in entry.tokens], caches, main=True)
                restored += 1
        return restored

    def restored_prompts(self) -> list[list[int]]:
        """Token sequences of the disk entries a new process restores (newest first), for the
        prompt renderer to remember (see PromptRenderer.warm)."""
        if self.disk is None:
            return []
        return [entry.tokens.tolist() for entry in self.disk.recent(self.settings.restore)]

    def warm_start_cache(self, new_tokens: int) -> list[Any] | None:
        """A private copy of the most recently restored prefix's cache (None if there is
        none), for a throwaway warm-up prefill of `new_tokens` at the context length the first
        request will have. Fetched as a request's would be (same room, so the same buffer
        sizes: freed, MLX keeps them for the first request). Not counted as a lookup."""
        if self.disk is None or self.exact:
            return None
        for entry in self.disk.recent(1):
            tokens = [int(t) for t in entry.tokens]
            found = self.memory.match(tokens)
            if found > 0:
                return self.memory.fetch(tokens, found, room_for(new_tokens))
        return None

    # --- stats --------------------------------------------------------------------------

    def figures(self) -> CacheFigures:
        """The cache's current figures."""
        return CacheFigures(
            bytes=self.memory.nbytes,
            budget_bytes=self.memory.budget_bytes,
            blocks=self.memory.blocks,
            evictions=self.memory.evictions,
            lookups=self.lookups,
            hits=self.hits,
            disk_bytes=self.disk.nbytes if self.disk is not None else 0,
            disk_entries=len(self.disk.entries) if self.disk is not None else 0,
            disk_loads=self.disk.loads if self.disk is not None else 0,
            disk_saves=self.disk.saves if self.disk is not None else 0,
            disk_rejected=self.disk.rejected if self.disk is not None else 0,
            warning=self.warning,
            last_miss=self.misses.last,
        )


def room_for(new_tokens: int) -> int:
    """Positions to reserve after a reused prefix for `new_tokens` more (0: none)."""
    if new_tokens > ROOM_MAX_NEW:
        return 0
    return -(-(new_tokens + ROOM_FOR_OUTPUT) // ROOM_STEP) * ROOM_STEP


def cache_settings(config: EngineConfig) -> CacheSettings:
    """The prefix cache's settings from the engine's configuration."""
    memory = config.cache_memory_bytes
    disk_dir = config.cache_dir
    if disk_dir is not None and config.cluster is not None:  # a rank's entries are its own
        disk_dir = disk_dir / "cluster" / config.cluster.shard_name
    return CacheSettings(
        memory_bytes=default_cache_memory() if memory is None else memory,
        disk_dir=disk_dir,
        disk_bytes=config.cache_disk_bytes,
        block_tokens=config.cache_block_tokens,
        restore=config.cache_restore,
        excerpts=config.debug_cache,
    )
