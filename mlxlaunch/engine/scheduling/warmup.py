"""Warm-up at load: one tiny generation so the first real request does not pay MLX's start-up.

The first forward pass in a fresh process is slow for reasons that have nothing to do with the
prompt: MLX builds its kernels and compiled graphs (the sampler's, the activations'), fills
its buffer cache, and mlx-lm sets up its generation stream. After a restart that cost lands on
the user's first turn. Running a few tokens through the same kind of batch generator the
worker uses (`batch.Batch`), right after load, moves it to before the server announces itself.

After a restart the first request also continues a long restored prefix, and the first
prefill at that context length in a process is markedly slower than the next ones (~45 vs
~25 ms for 24 tokens over 12.6k on the 2-layer test model: large temporaries allocated and
touched for the first time). So when prefixes were restored, a second warm-up prefills a few
tokens on top of a private copy of the most recent one.

The warm-up is throwaway: its own generator and KV cache (a fresh one, or a private copy of a
restored prefix's), never the prefix cache itself, on the unwrapped model (test wrappers count
forward passes). It runs on the MLX thread, like
every MLX call. A failure is logged and ignored: a cold first request is better than no model.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import mlx.nn as nn

from mlxlaunch.engine.runtime.quantized_kv import KVQuantization, new_caches
from mlxlaunch.engine.scheduling.batch import Batch

log = logging.getLogger(__name__)

# Prompt tokens of the warm-up: enough for a real (multi-token) prefill, cheap on any model.
WARMUP_PROMPT_TOKENS = 8
# Tokens it generates: the first comes out of prefill, the second takes a decode step.
WARMUP_OUTPUT_TOKENS = 2
# Tokens of the warm-up prefill on top of a restored prefix: about a new session's first message.
RESTORED_WARMUP_TOKENS = 32
# Generator steps before giving up (a prefill chunk per step, then one token per step).
_MAX_STEPS = 32


def warm_up(
    model: nn.Module,
    *,
    width: int,
    prefill_chunk: int,
    sampler: Any = None,
    kv: KVQuantization | None = None,
    cache: list[Any] | None = None,
    prompt_tokens: int = WARMUP_PROMPT_TOKENS,
) -> float | None:
    """Run one small prefill and decode step on `model` with a throwaway cache.

    `width` and `prefill_chunk` are the worker's generator settings (same code paths);
    `sampler` the one most requests use (None: greedy); `cache` a private KV cache to
    continue (default: a fresh one). Returns the seconds it took, or None if it failed
    (logged; the caller carries on).
    """
    start = time.perf_counter()
    # Any ids do (every vocabulary has the first few); the generator has no stop tokens, so
    # it always reaches its decode step.
    prompt = [i % WARMUP_PROMPT_TOKENS for i in range(prompt_tokens)]
    try:
        batch = Batch(model, stop_tokens=(), width=width, prefill_chunk=prefill_chunk)
        batch.insert(
            prompt,
            max_tokens=WARMUP_OUTPUT_TOKENS,
            cache=cache if cache is not None else new_caches(model, kv),
            held=[],
            sampler=sampler,
        )
        for _ in range(_MAX_STEPS):
            _, generated = batch.step(prefill_chunk)
            if any(e.finish_reason is not None for e in generated):
                break
        batch.close()
    except Exception:
        log.warning("model warm-up failed; the first request will be slower", exc_info=True)
        return None
    elapsed = time.perf_counter() - start
    log.debug("warm-up took %.1f ms", elapsed * 1000)
    return elapsed


def warm_up_loaded(
    model: nn.Module,
    *,
    width: int,
    prefill_chunk: int,
    sampler: Any = None,
    kv: KVQuantization | None = None,
    restored: list[Any] | None = None,
) -> None:
    """The engine's warm-up after a load: a tiny generation on a fresh cache, then, when
    prefixes were restored from disk, a few tokens on top of `restored` (a private copy of
    the most recent one), at the context length a first request will continue."""
    warm_up(model, width=width, prefill_chunk=prefill_chunk, sampler=sampler, kv=kv)
    if restored is not None:
        warm_up(
            model,
            width=width,
            prefill_chunk=prefill_chunk,
            sampler=sampler,
            cache=restored,
            prompt_tokens=RESTORED_WARMUP_TOKENS,
        )
