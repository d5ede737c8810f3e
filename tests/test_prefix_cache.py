"""Prefix cache: the block trie, snapshots, miss diagnostics, and reuse through the real engine."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest
from engine_helpers import AGENT_TOOLS, run
from mlx_lm.models.cache import BatchKVCache, KVCache, RotatingKVCache

from mlxlaunch.engine.cache.blocks import BlockTrie, ReusedKVCache
from mlxlaunch.engine.cache.misses import MissTracker
from mlxlaunch.engine.cache.prefix import SNAPSHOT_WARNING
from mlxlaunch.engine.cache.snapshots import SnapshotStore
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import (
    ChatMessage,
    Done,
    GenerationRequest,
    Sampling,
    ToolSpec,
)

GREEDY = Sampling(temperature=0.0)
BLOCK = 16
MAIN_SYSTEM = "You are a coding agent. Read files, run commands and fix bugs. " * 6
TOOLS = AGENT_TOOLS


# --- the block trie, with synthetic KV ----------------------------------------------------


def kv(tokens: int, layers: int = 2, seed: int = 0) -> list[KVCache]:
    """Caches as a finished request leaves them: (1, heads, tokens, dim) per layer."""
    mx.random.seed(seed)
    caches = []
    for _ in range(layers):
        cache = KVCache()
        cache.keys = mx.random.normal((1, 2, tokens, 4))
        cache.values = mx.random.normal((1, 2, tokens, 4))
        cache.offset = tokens
        caches.append(cache)
    return caches


def arrays(cache: KVCache) -> tuple[mx.array, mx.array]:
    assert cache.keys is not None and cache.values is not None
    return cache.keys, cache.values


def same_kv(a: list[KVCache], b: list[KVCache], length: int) -> bool:
    return all(
        x.offset == length
        and all(
            mx.array_equal(p[..., :length, :], q[..., :length, :]).item()
            for p, q in zip(arrays(x), arrays(y), strict=True)
        )
        for x, y in zip(a, b, strict=True)
    )


def test_trie_returns_exactly_the_stored_kv_for_any_prefix_length() -> None:
    trie = BlockTrie(budget_bytes=1 << 30, block_tokens=BLOCK)
    tokens = list(range(100, 150))  # 3 full blocks and a tail of 2
    source = kv(50)
    trie.store(tokens, source)

    assert trie.match(tokens) == 50
    assert trie.match(tokens[:37] + [999] * 5) == 37  # token-exact inside a block
    assert trie.match([1, 2, 3]) == 0
    for length in (1, 16, 37, 50):
        assert same_kv(trie.fetch(tokens, length), source, length)


def test_trie_stores_a_shared_prefix_once() -> None:
    trie = BlockTrie(budget_bytes=1 << 30, block_tokens=BLOCK)
    first, second = list(range(64)), list(range(48)) + list(range(500, 516))
    trie.store(first, kv(64, seed=1))
    alone = trie.nbytes
    trie.store(second, kv(64, seed=1))
    assert trie.nbytes == alone + alone // 4  # only the one diverging block is new
    assert trie.match(second) == 64 and trie.match(first) == 64


def test_a_longer_sequence_replaces_its_shorter_tail() -> None:
    trie = BlockTrie(budget_bytes=1 << 30, block_tokens=BLOCK)
    tokens = list(range(40))
    source = kv(40)
    trie.store(tokens[:20], source)  # one block and a 4-token tail
    trie.store(tokens, source)
    assert trie.nbytes == sum(c.nbytes for c in source)
    assert same_kv(trie.fetch(tokens, 40), source, 40)


def test_eviction_is_least_recently_used_under_the_byte_budget() -> None:
    one = sum(c.nbytes for c in kv(32))
    trie = BlockTrie(budget_bytes=2 * one, block_tokens=BLOCK)
    a, b, c = list(range(32)), list(range(100, 132)), list(range(200, 232))
    trie.store(a, kv(32))
    trie.store(b, kv(32))
    trie.fetch(a, 31)  # a is now more recent than b
    trie.store(c, kv(32))
    assert trie.nbytes <= 2 * one
    assert trie.match(a) == 32 and trie.match(c) == 32 and trie.match(b) == 0
    assert trie.evictions == 2  # b's two blocks


def test_a_fetched_cache_is_a_private_copy() -> None:
    trie = BlockTrie(budget_bytes=1 << 30, block_tokens=BLOCK)
    tokens, source = list(range(32)), kv(32)
    trie.store(tokens, source)
    fetched = trie.fetch(tokens, 20)
    for cache in fetched:  # what a running request does to its cache
        keys, _ = arrays(cache)
        keys[..., :20, :] = 0.0
        cache.update_and_fetch(mx.ones((1, 2, 5, 4)), mx.ones((1, 2, 5, 4)))
    assert same_kv(trie.fetch(tokens, 32), source, 32)


def test_a_cache_fetched_with_room_is_handed_to_a_lone_batch_without_copies() -> None:
    trie = BlockTrie(budget_bytes=1 << 30, block_tokens=BLOCK)
    tokens, source = list(range(40)), kv(40)
    trie.store(tokens, source)
    fetched = trie.fetch(tokens, 37, room=16)
    assert all(isinstance(c, ReusedKVCache) for c in fetched)
    assert same_kv(fetched, source, 37)
    keys, values = arrays(fetched[0])
    assert keys.shape[2] == 37 + 16
    batch = fetched[0].merge([fetched[0]])
    assert isinstance(batch, BatchKVCache)
    assert batch.keys is keys and batch.values is values  # the same buffers, not copies
    assert fetched[0].keys is None  # the batch holds the only reference
    batch.update_and_fetch(mx.ones((1, 2, 10, 4)), mx.ones((1, 2, 10, 4)))
    assert batch.keys is not None and batch.keys.shape[2] == 37 + 16  # written in the room
    got_keys, _ = batch.keys_and_values()
    assert mx.array_equal(got_keys[..., :37, :], arrays(source[0])[0][..., :37, :]).item()
    assert mx.array_equal(got_keys[..., 37:, :], mx.ones((1, 2, 10, 4))).item()


def test_several_sequences_are_batched_as_mlx_lm_does() -> None:
    trie = BlockTrie(budget_bytes=1 << 30, block_tokens=BLOCK)
    a, b = list(range(30)), list(range(100, 120))
    trie.store(a, kv(30, seed=1))
    trie.store(b, kv(20, seed=2))
    first, second = trie.fetch(a, 30, room=8)[0], trie.fetch(b, 20, room=8)[0]
    merged = first.merge([first, second])
    assert merged.keys is not None and merged.keys.shape[:3] == (2, 2, 30)
    assert mx.array_equal(merged.left_padding, mx.array([0, 10])).item()


# --- snapshots and miss diagnostics -------------------------------------------------------


def test_snapshots_serve_only_requests_that_continue_them() -> None:
    store = SnapshotStore(budget_bytes=1 << 30)
    store.store(list(range(10)), kv(10))
    assert store.match(list(range(12))) == 10
    assert store.match(list(range(10))) == 0  # one token must be left to run
    assert store.match([*range(9), 77, 78]) == 0  # no trimming back to position 9
    assert same_kv(store.fetch(list(range(12)), 10), kv(10), 10)


def test_miss_tracker_names_the_divergence_and_ignores_a_growing_conversation() -> None:
    tracker = MissTracker(decode=lambda ids: "".join(chr(65 + i % 26) for i in ids), excerpts=True)
    base = list(range(100))
    assert tracker.observe(base, cached_tokens=0, request_id="a", kind="main") is None
    grown = base + list(range(100, 140))
    assert tracker.observe(grown, cached_tokens=99, request_id="b", kind="main") is None
    changed = [*grown[:30], 999, *grown[31:]]
    report = tracker.observe(changed, cached_tokens=30, request_id="c", kind="main")
    assert report is not None and report.position == 30
    assert report.excerpts is not None and report.excerpts.cached.startswith("E")
    assert report.excerpts.request != report.excerpts.cached
    assert tracker.last == report


# --- the test model ------------------------------------------------------------------------


@pytest.mark.slow
def test_greedy_decoding_of_the_tiny_model_varies_with_the_prompt(tiny_model_dir: Path) -> None:
    model, tokenizer = mlx_lm.load(str(tiny_model_dir))[:2]
    outputs = []
    for text in ("hi", "Write a python function to sort a list", "import os\nimport sys"):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        tokens = [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=8)]
        outputs.append(tokens)
        assert len(set(tokens)) > 2 and tokenizer.decode(tokens).strip()
    assert len({tuple(t) for t in outputs}) == len(outputs)


# --- through the engine -------------------------------------------------------------------


def req(messages: list[ChatMessage], tools: list[ToolSpec] | None = None, **kw: Any) -> Any:
    return GenerationRequest(
        messages=messages, tools=tools or [], max_tokens=8, sampling=GREEDY, **kw
    )


def conversation(turns: int) -> list[list[ChatMessage]]:
    """The message lists of a growing agent conversation, one per turn."""
    messages = [ChatMessage("system", MAIN_SYSTEM), ChatMessage("user", "Fix the failing test.")]
    out = [list(messages)]
    for turn in range(1, turns):
        messages += [
            ChatMessage("assistant", f"Looking at step {turn}."),
            ChatMessage("user", f"Result {turn}: " + "def f(x): return x + 1\n" * 3),
        ]
        out.append(list(messages))
    return out


def make_engine(model_dir: Path, **kw: Any) -> Engine:
    kw.setdefault("cache_block_tokens", BLOCK)
    return Engine(EngineConfig(model=str(model_dir), **kw))


async def session(engine: Engine, turns: list[list[ChatMessage]]) -> list[tuple[Done, str]]:
    return [await run(engine, req(m, TOOLS, kind="main")) for m in turns]


@pytest.fixture
async def engines(tiny_model_dir: Path) -> AsyncIterator[tuple[Engine, Engine]]:
    cached, uncached = (
        make_engine(tiny_model_dir),
        make_engine(tiny_model_dir, cache_memory_bytes=0),
    )
    yield cached, uncached
    cached.close()
    uncached.close()


@pytest.mark.slow
async def test_each_turn_reuses_the_previous_prompt_and_output_is_unchanged(
    engines: tuple[Engine, Engine],
) -> None:
    cached, uncached = engines
    turns = conversation(4)
    with_cache = await session(cached, turns)
    without = await session(uncached, turns)

    for (before, _), (after, _) in itertools.pairwise(with_cache):
        assert after.usage.cached_tokens >= before.usage.prompt_tokens - BLOCK
        assert after.usage.cached_tokens < after.usage.prompt_tokens
    assert with_cache[0][0].usage.cached_tokens == 0
    assert all(done.usage.cached_tokens == 0 for done, _ in without)
    # Greedy continuations are token-for-token the same with and without reuse.
    assert [text for _, text in with_cache] == [text for _, text in without]
    assert all(text for _, text in with_cache)
    stats = cached.stats()
    assert stats.cache.bytes > 0 and 0 < stats.cache_hit_ratio < 1
    assert stats.counters.cached_tokens == sum(d.usage.cached_tokens for d, _ in with_cache)
    assert [r.cached_tokens for r in stats.recent] == [d.usage.cached_tokens for d, _ in with_cache]


@pytest.mark.slow
async def test_title_and_subagent_requests_do_not_cost_the_main_conversation(
    tiny_model_dir: Path,
) -> None:
    turns = conversation(3)
    probe = make_engine(tiny_model_dir)
    try:
        alone = await session(probe, turns)
        main_bytes = probe.stats().cache.bytes
    finally:
        probe.close()
    # Room for the main conversation and little more: the side requests do not fit beside it.
    engine = make_engine(tiny_model_dir, cache_memory_bytes=main_bytes + 2048)
    try:
        main = [await run(engine, req(turns[0], TOOLS, kind="main"))]
        for messages in turns[1:]:
            title = [ChatMessage("system", "Write a title."), ChatMessage("user", "Fix the test")]
            await run(engine, req(title, kind="title"))
            sub = [ChatMessage("system", "You search code. " * 20), ChatMessage("user", "find f")]
            await run(engine, req(sub, TOOLS[:1], kind="subagent"))
            main.append(await run(engine, req(messages, TOOLS, kind="main")))
        stats = engine.stats()
    finally:
        engine.close()
    assert stats.cache.evictions > 0  # the budget did bite
    reuse = [done.usage.cached_tokens for done, _ in main]
    assert reuse == [done.usage.cached_tokens for done, _ in alone]
    assert [text for _, text in main] == [text for _, text in alone]


@pytest.mark.slow
async def test_a_changed_early_token_reuses_up_to_the_change_and_reports_where(
    tiny_model_dir: Path,
) -> None:
    engine = make_engine(tiny_model_dir)
    try:
        first, _ = await run(engine, req(conversation(1)[0], TOOLS, kind="main"))
        changed = [
            ChatMessage("system", MAIN_SYSTEM.replace("fix bugs", "find bugs", 1)),
            ChatMessage("user", "Fix the failing test."),
        ]
        tokenizer = engine._worker.loaded.tokenizer  # type: ignore[union-attr]
        text_a = tokenizer.encode("You are a coding agent. Read files, run commands and fix")
        second, _ = await run(engine, req(changed, TOOLS, kind="main"))
        stats = engine.stats()
    finally:
        engine.close()
    miss = stats.cache.last_miss
    assert miss is not None
    assert second.usage.cached_tokens == miss.position
    assert len(text_a) <= miss.position < first.usage.prompt_tokens // 2
    # Without --debug-cache the record holds no prompt text, only digests that differ.
    assert miss.excerpts is None and miss.digests.cached != miss.digests.request


@pytest.mark.slow
async def test_untrimmable_caches_reuse_only_snapshots_and_warn(tiny_model_dir: Path) -> None:
    def rotating(model: Any) -> Any:
        # Same model, but its cache is a rotating window (as sliding-window layers have).
        model.make_cache = lambda: [RotatingKVCache(max_size=4096) for _ in model.layers]
        return model

    turns = conversation(3)
    engine = make_engine(tiny_model_dir, model_wrapper=rotating)
    uncached = make_engine(tiny_model_dir, model_wrapper=rotating, cache_memory_bytes=0)
    try:
        with_cache = await session(engine, turns)
        without = await session(uncached, turns)
        stats = engine.stats()
    finally:
        engine.close()
        uncached.close()
    assert stats.cache.warning == SNAPSHOT_WARNING
    for (before, _), (after, _) in itertools.pairwise(with_cache):
        # The snapshot taken at the end of the previous prompt (all but its last token).
        assert after.usage.cached_tokens == before.usage.prompt_tokens - 1
    assert [text for _, text in with_cache] == [text for _, text in without]


def test_cache_sizes_parse_as_the_cli_takes_them(tmp_path: Path) -> None:
    from mlxlaunch.engine.settings import cache_config, parse_size

    assert parse_size("8G") == 8 * 1024**3 and parse_size("512m") == 512 * 1024**2
    assert parse_size("1.5GB") == 3 * 1024**3 // 2 and parse_size("0") == 0
    with pytest.raises(ValueError):
        parse_size("lots")
    options = cache_config("auto", tmp_path, "1G")
    assert options == {
        "cache_memory_bytes": None,
        "cache_dir": tmp_path,
        "cache_disk_bytes": 1024**3,
    }
    assert cache_config("0", None, "0")["cache_dir"].name == "prefix-cache"
