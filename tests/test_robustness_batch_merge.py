"""A long prompt joining a batch of streams with logits processors (issue 19, item 11): no stall.

When a logits processor decides the token without reading the logits (scripted output forces
each token), the sampled tokens do not depend on the forward pass, and mlx-lm evaluated only
what they depend on: every decode step's forward pass stayed a lazy graph hanging off the KV
cache, and the first step that read the cache (the long prompt's merge into the batch) ran all
of them at once — ~4 ms per token decoded so far, every stream frozen meanwhile. The batch now
evaluates the decoding caches with each step's samples (`engine/scheduling/decode.py`).

Measured on this machine (2 cores shared with other jobs, so +-50% run to run), medium test
model: plain mlx-lm `BatchGenerator` + `ForcedTokens`, 2,000 tokens decoded, then an
8,000-token prompt: the step after it took 8.4–14 s before, 0.05–0.09 s after. In the engine
(this test: ~1,000 tokens per stream, then a ~2k-token prompt) the streams' longest gap went
from 8.9 s (2,075 normal gaps) to 68 ms (7). The decode step itself: the same within noise
where processors read the logits (the added call costs 4–12 µs on an evaluated batch); with
forced tokens it now costs a real forward pass (3 → 11 ms here) instead of deferring it.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from itertools import pairwise
from pathlib import Path

import mlx.core as mx
import pytest
from engine_helpers import forced_streams, timed_prompt, wait_until

from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.scheduling.batch import Batch
from mlxlaunch.testing.scripted import ForcedTokens, ScriptedOutput

pytestmark = pytest.mark.slow  # the tests load a model

STREAMS = 2
DECODED_BEFORE_MERGE = 1000  # tokens per stream before the long prompt arrives
# ~2.1k tokens through the test tokenizer: a prefill of several paced steps.
LONG_PROMPT_REPEATS = 300
# The longest gap a stream may see around the merge, in normal (median) gaps: a paced prefill
# slice is a few decode steps long. Before the fix it was ~1000x; on a loaded 2-core machine a
# paced slice has measured 32x (a preempted slice), so the bound leaves room for that.
MAX_GAP_IN_STEPS = 60


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in pairwise(times)]


async def test_a_long_prompt_joining_forced_streams_does_not_stall_them(
    medium_engine: tuple[Engine, ScriptedOutput],
) -> None:
    engine, scripted = medium_engine
    async with forced_streams(engine, scripted, STREAMS) as arrivals:
        await wait_until(lambda: all(len(a) >= DECODED_BEFORE_MERGE for a in arrivals), timeout=120)
        normal = statistics.median(gaps(arrivals[0][-200:]))
        # A fresh prompt (nothing from the prefix cache), sampled normally: the queue is empty.
        long_text = f"{uuid.uuid4()} " + "many words in a very long prompt " * LONG_PROMPT_REPEATS
        admitted, admitted_at, first_token_at = await timed_prompt(engine, long_text)
        assert admitted.prompt_tokens > 1500 and admitted.cached_tokens < 100, admitted
        await asyncio.sleep(0.5)  # the merged steps after the prompt's first token

    assert first_token_at, "the long prompt produced no token"
    window = [t for t in arrivals[0] if t >= admitted_at]
    assert len(window) >= 10, (len(window), normal)
    worst = max(gaps(window))
    assert worst <= MAX_GAP_IN_STEPS * normal, (worst, normal, first_token_at - admitted_at)


def test_no_lazy_forward_pass_outlives_a_step(medium_model_dir: Path) -> None:
    """The mechanism, on a bare batch: after each step the decoding caches owe nothing but
    the pass in flight, so whatever reads them next (a merge, a finished sequence's cache)
    waits for no earlier step. Before, reading them after 300 forced tokens ran 300 forward
    passes (0.8–1.7 s here)."""
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model = load(str(medium_model_dir))[0]
    batch = Batch(model, stop_tokens=(), width=4, prefill_chunk=512)
    for _ in range(STREAMS):
        batch.insert(
            [5, 6, 7, 8],
            max_tokens=1000,
            cache=list(make_prompt_cache(model)),
            held=[],
            processors=[ForcedTokens(list(range(100, 1000)), 0)],
        )
    times = []
    for _ in range(300):
        started = time.perf_counter()
        batch.step(512)
        times.append(time.perf_counter() - started)
    batch.decode.resolve_now()  # the last pass, in flight
    caches = batch.decode.caches
    assert caches, "the decoding rows have no caches"
    started = time.perf_counter()
    mx.eval([cache.state for cache in caches])
    owed = time.perf_counter() - started
    assert owed <= 3 * statistics.median(times) + 0.005, (owed, statistics.median(times))
