"""One step of the batch generator, its forward pass computed before the step ends.

The worker steps mlx-lm's `BatchGenerator` through `step`, which sets the step's prefill
slice, runs `next()`, and then evaluates the decoding sequences' KV caches.

Why: MLX is lazy, and mlx-lm's `GenerationBatch` evaluates only what the sampled tokens
depend on. A logits processor that decides the next token without reading the logits (a
forced token: scripted output, `mlxlaunch/testing/scripted.py`; any processor of the kind a
client or a later feature adds) cuts the forward pass out of that graph, so the pass is never
run: its KV-cache writes pile up as a lazy graph, one whole forward pass per decoded token.
Something that finally reads the cache — a long prompt joining the batch (the caches are
padded and concatenated), a finished sequence's cache being kept — then runs every deferred
pass at once. On the medium test model that was ~4 ms per token decoded since the sequence
joined: 8.4 s for 2,000 tokens in one step, while every stream in the batch waited (17–29 s in
the engine under paced prefill, whose streams decode thousands of tokens during a prefill).
The deferred graph also holds memory that grows with every token.

Evaluating the caches each step runs that pass when its step runs, so no lazy graph outlives a
step. Where the sampled tokens do depend on the logits (no processor, grammars, thinking
budgets, penalties) the caches were already evaluated with them, and the call costs only a
look at each array's state.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from mlxlaunch.engine.runtime.mlx_lm_internals import decoding_caches, set_prefill_slice


def batch_generator(loaded: Any, config: Any, sampler: Any = None) -> BatchGenerator:
    """The batch generator of the worker, and of every follower rank of a cluster: one shape
    for all (the same batch widths and chunk mean the same collectives on every rank).
    `loaded`: the LoadedModel; `config`: the EngineConfig; `sampler`: the shared one (None:
    mlx-lm's greedy)."""
    width = config.max_concurrency
    return BatchGenerator(
        loaded.model,
        sampler=sampler,
        stop_tokens=[[eos] for eos in loaded.info.eos_token_ids],
        completion_batch_size=width,
        prefill_batch_size=width,
        prefill_step_size=config.prefill_chunk,
    )


def step(generator: Any, prefill_tokens: int) -> tuple[list[Any], list[Any]]:
    """One `generator.next()` that prefills at most `prefill_tokens` tokens of each prompt (0:
    a decode step alone): its prompt and generation responses. Raises what the step raises,
    the deferred computation included."""
    set_prefill_slice(generator, prefill_tokens)
    responses = generator.next()
    settle(generator)
    return responses


def settle(generator: Any) -> None:
    """Start computing whatever the decoding sequences' caches still owe (see the module
    docstring); on the CPU backend this returns once it is done."""
    caches = decoding_caches(generator)
    if caches:
        mx.async_eval([cache.state for cache in caches])
