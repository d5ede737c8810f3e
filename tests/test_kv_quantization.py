"""KV caches held quantized (`--kv-bits 8|4`): the batch, the prefix cache, the disk tier.

The batch's quantized rows must compute exactly what mlx-lm's own single-sequence quantized
cache computes (same quantization, same attention), with sequences of different lengths
prefilled together (right padding), joining at different steps, and rolled back by
speculative decoding; the prefix cache must hand back the quantized KV it stored; an engine
that holds its KV at 8 bits must answer, reuse its prefixes, hold fewer bytes, and never load
an entry another setting saved.

Models built in memory (tests/small_models.py) for the batch, the tiny test model for engines.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from engine_helpers import run
from mlx_lm.models.cache import QuantizedKVCache
from small_models import random_qwen3
from test_disk_cache import first_turn, saved_files, second_turn

from mlxlaunch.engine.cache.blocks import BlockTrie
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.decoding.drafting import PromptLookup
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.runtime.memory import MemoryBudget, kv_bytes_per_token, window_that_fits
from mlxlaunch.engine.runtime.quantized_kv import (
    KVQuantization,
    QuantizedSequenceCache,
    new_caches,
    resolve,
)
from mlxlaunch.engine.scheduling.batch import Batch

GROUP = 32  # the in-memory model's heads are 32 wide
KV_SET = (None, 8, 4)  # unquantized, 8 and 4 bits


@pytest.fixture(scope="module")
def model() -> Any:
    return random_qwen3(hidden=128, vocab=96)


def reference(model: Any, prompt: list[int], count: int, kv: KVQuantization) -> list[int]:
    """Greedy tokens of one sequence through mlx-lm's own quantized cache."""
    caches = [QuantizedKVCache(kv.group_size, kv.bits) for _ in model.layers]
    out: list[int] = []
    inputs = mx.array([prompt])
    for _ in range(count):
        token = int(mx.argmax(model(inputs, cache=caches)[:, -1], axis=-1).item())
        out.append(token)
        inputs = mx.array([[token]])
    return out


def batched(
    model: Any,
    prompts: Sequence[list[int]],
    count: int,
    kv: KVQuantization | None,
    *,
    speculate: bool,
    caches: Sequence[tuple[list[Any], list[int]]] | None = None,
) -> tuple[list[list[int]], Batch, int]:
    """Each prompt's greedy tokens through one Batch, a new prompt every other step; the
    batch, and the most bytes its caches held."""
    batch = Batch(model, stop_tokens=(), width=8, prefill_chunk=16, speculate=speculate)
    outputs: dict[int, list[int]] = {}
    waiting = list(range(len(prompts)))
    steps, most = 0, 0
    while waiting or any(len(out) < count for out in outputs.values()):
        if waiting and steps % 2 == 0:
            i = waiting.pop(0)
            cache, held = caches[i] if caches is not None else (new_caches(model, kv), [])
            uid = batch.insert(
                prompts[i][len(held) :],
                max_tokens=count,
                cache=cache,
                held=held,
                drafter=PromptLookup() if speculate else None,
            )
            outputs[uid] = []
        _, emitted = batch.step(16)
        steps += 1
        most = max(most, batch.kv_bytes())
        for event in emitted:
            outputs[event.uid] += event.tokens
        assert steps < 50 * count
    return [outputs[uid] for uid in sorted(outputs)], batch, most


def prompts_of(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    runs = [[rng.randrange(96) for _ in range(rng.randrange(4, 30))] for _ in range(count)]
    return [r * 3 for r in runs]  # repeated runs: the prompt-lookup drafter finds drafts


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("speculate", [False, True])
def test_quantized_rows_compute_what_mlx_lm_quantized_cache_computes(
    model: Any, bits: int, speculate: bool
) -> None:
    kv = KVQuantization(bits, GROUP)
    prompts = prompts_of(bits, 4)
    got, batch, _ = batched(model, prompts, 20, kv, speculate=speculate)
    assert got == [reference(model, p, 20, kv) for p in prompts]
    if speculate:  # drafts were verified and rejected ones rolled back
        assert batch.counters.drafted_tokens > batch.counters.accepted_tokens > 0


def test_the_batch_holds_quantized_rows_in_fewer_bytes(model: Any) -> None:
    prompts = prompts_of(3, 3)
    held = {}
    for bits in (None, 8, 4):
        kv = KVQuantization(bits, GROUP) if bits else None
        _, batch, held[bits] = batched(model, prompts, 12, kv, speculate=False)
        assert batch.kv_bytes() == 0  # every sequence finished and left
    # float32 model: 4 bytes a value, against 1 (or 0.5) and a scale and bias per 32 values.
    print(f"\nbatch KV bytes at most, 16/8/4 bits: {held}")
    assert held[8] < held[None] * 0.45 and held[4] < held[8] * 0.7


def test_the_prefix_trie_stores_and_returns_quantized_kv(model: Any) -> None:
    kv = KVQuantization(8, GROUP)
    prompt = prompts_of(5, 1)[0]
    caches = new_caches(model, kv)
    model(mx.array([prompt]), cache=caches)
    trie = BlockTrie(1 << 30, block_tokens=16, kv=kv)
    trie.store(prompt, caches)
    assert trie.match(prompt) == len(prompt)
    assert 0 < trie.nbytes <= sum(c.nbytes for c in caches)
    for room in (0, 64):
        fetched = trie.fetch(prompt, 40, room=room)
        assert all(type(c) is QuantizedSequenceCache and c.offset == 40 for c in fetched)
        for mine, stored in zip(fetched, caches, strict=True):
            for a, b in zip(mine.state[0], stored.keys, strict=True):
                assert mx.array_equal(a, b[..., :40, :])
    # A reused prefix decodes exactly as the whole prompt prefilled fresh would.
    reuse = [(trie.fetch(p, 30, room=64), p[:30]) for p in [prompt, prompt]]
    got, _, _ = batched(model, [prompt, prompt], 10, kv, speculate=False, caches=reuse)
    assert got == [reference(model, prompt, 10, kv)] * 2


def test_a_group_size_must_divide_the_heads() -> None:
    assert resolve(None, None, 128) is None
    assert resolve(8, None, 128) == KVQuantization(8, 64)
    assert resolve(4, None, 32) == KVQuantization(4, 32)  # the largest that divides
    with pytest.raises(ValueError, match="does not divide the model's head dimension 32"):
        resolve(8, 64, 32)
    with pytest.raises(ValueError, match="kv_bits must be one of 8, 4"):
        EngineConfig(model="m", kv_bits=6)


@pytest.mark.slow
async def test_an_8_bit_engine_answers_reuses_its_prefixes_and_holds_fewer_bytes(
    tiny_model_dir: Path,
) -> None:
    figures = {}
    texts = {}
    for bits in (None, 8):
        engine = Engine(
            EngineConfig(model=str(tiny_model_dir), cache_block_tokens=16, kv_bits=bits)
        )
        try:
            first, _ = await run(engine, first_turn("Task A: fix the parser."))
            done, text = await run(engine, second_turn("Task A: fix the parser."))
            stats = engine.stats()
        finally:
            engine.close()
        assert done.usage.cached_tokens > 0 and first.usage.output_tokens > 0
        assert stats.kv_bits == (bits or 16) and stats.kv_cache_bytes >= stats.cache.bytes > 0
        figures[bits], texts[bits] = stats.cache.bytes, text
    assert figures[8] < figures[None] * 0.6  # the prefix cache holds the quantized KV
    fresh = Engine(EngineConfig(model=str(tiny_model_dir), cache_memory_bytes=0, kv_bits=8))
    try:
        _, expected = await run(fresh, second_turn("Task A: fix the parser."))
    finally:
        fresh.close()
    assert texts[8] == expected  # reused quantized KV: what a fresh quantized prefill computes


@pytest.mark.slow
async def test_disk_entries_are_keyed_by_the_kv_setting(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    async def session(bits: int | None) -> None:
        engine = Engine(
            EngineConfig(
                model=str(tiny_model_dir), cache_dir=tmp_path, cache_block_tokens=16, kv_bits=bits
            )
        )
        try:
            await run(engine, first_turn("Task A: fix the parser."))
            await run(engine, second_turn("Task A: fix the parser."))
        finally:
            engine.close()  # pending saves are written

    async def restored(bits: int | None) -> int:
        engine = Engine(EngineConfig(model=str(tiny_model_dir), cache_dir=tmp_path, kv_bits=bits))
        try:
            await engine.load()
            return engine.stats().cache.disk_loads
        finally:
            engine.close()

    await session(None)
    assert len(saved_files(tmp_path)) == 2
    assert await restored(8) == 0  # a 16-bit entry never loads into an 8-bit server
    await session(8)
    assert len(saved_files(tmp_path)) == 4  # its own entry, in a directory of its own
    assert await restored(8) == 1 and await restored(None) == 1
    assert await restored(4) == 0  # other bits


def test_the_served_window_is_what_memory_holds_at_the_chosen_bits(model: Any) -> None:
    per_token = {bits: kv_bytes_per_token(model, resolve(bits, GROUP, 32)) for bits in KV_SET}
    # float32: 4 bytes a value; 8 bits: 1 byte and 8 bytes of scale and bias per 32 values.
    assert per_token[None] == 2 * 2 * 2 * 32 * 4  # layers x keys and values x heads x dims
    assert per_token[8] == per_token[None] * 1.25 / 4
    assert per_token[4] == per_token[None] * 0.75 / 4
    free = 1000 * per_token[None]
    windows = {
        bits: window_that_fits(40_960, MemoryBudget(free + 10, 10, per_token[bits]), None)
        for bits in KV_SET
    }
    assert windows == {None: 1000, 8: 3200, 4: 5333}
    assert window_that_fits(2048, MemoryBudget(free + 10, 10, per_token[8]), None) == 2048
    assert window_that_fits(40_960, MemoryBudget(0, 10, per_token[8]), None) == 40_960  # unknown
    assert window_that_fits(40_960, MemoryBudget(free + 10, 10, per_token[None]), None, 2) == 2000


def test_every_rank_of_a_cluster_is_told_the_kv_setting() -> None:
    from mlxlaunch.launch.cluster_rank import RankSpec
    from mlxlaunch.launch.options import EngineOptions

    options = EngineOptions(kv_bits=4, kv_group_size=32)
    spec = RankSpec(model="m", parallel="tensor", engine=options)
    told = RankSpec.decoded(spec.encoded()).engine
    config = EngineConfig(model="m", **told.config_arguments())
    assert (config.kv_bits, config.kv_group_size) == (4, 32)


def test_the_kv_figures_are_measured_at_every_precision(model: Any) -> None:
    from mlxlaunch.engine.scheduling.kv_figures import measure, report

    figures = measure(model, prompt_tokens=96, decode=12)
    print("\n" + report(figures, 64 << 20))
    by_bits = {f.bits: f for f in figures}
    assert set(by_bits) == {16, 8, 4}
    unquantized = by_bits[16]
    assert unquantized.agreement == 12 and unquantized.max_logit_error == 0.0
    # float32 values, groups of 32: 4 bytes, against 1 + 8/32 and 0.5 + 8/32.
    assert by_bits[8].bytes_per_token == unquantized.bytes_per_token * 1.25 / 4
    assert by_bits[4].bytes_per_token == unquantized.bytes_per_token * 0.75 / 4
    assert (
        by_bits[4].tokens_in(64 << 20)
        > by_bits[8].tokens_in(64 << 20)
        > (unquantized.tokens_in(64 << 20))
    )
    assert 0 < by_bits[8].max_logit_error <= by_bits[4].max_logit_error
