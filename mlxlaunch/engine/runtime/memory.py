"""MLX memory limits from the machine, and a per-request memory check.

The engine sets MLX's memory limit to a share of RAM (and, on Apple silicon, the wired limit
so the weights stay resident), keeps the buffer cache to a part of it, and refuses to start a
request whose KV cache alone could never fit in what the weights leave free — that request
fails by itself with a clear message instead of taking the whole batch down with an
allocation failure.

Runs on the worker thread (it calls MLX).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxlaunch.engine.runtime.quantized_kv import KVQuantization, head_dim
from mlxlaunch.engine.types import GenerationFailed

log = logging.getLogger(__name__)

# Share of the memory limit the buffer cache (freed buffers kept for reuse) may hold.
CACHE_SHARE = 0.25
GIB = 1024**3


def total_ram_bytes() -> int:
    """Physical memory of this machine (0 if the OS does not say)."""
    info = mx.device_info()
    size = info.get("memory_size")
    if isinstance(size, int) and size > 0:
        return size
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass(frozen=True)
class MemoryLimits:
    """What was set: bytes MLX may use, may cache, and keep wired (0: not set)."""

    limit: int
    cache: int
    wired: int


def apply_memory_limits(fraction: float) -> MemoryLimits:
    """Set MLX's memory, cache and (where the device has one) wired limits from RAM."""
    ram = total_ram_bytes()
    if ram <= 0:
        return MemoryLimits(0, 0, 0)
    limit = int(ram * fraction)
    mx.set_memory_limit(limit)
    cache = int(limit * CACHE_SHARE)
    mx.set_cache_limit(cache)
    wired = 0
    recommended = mx.device_info().get("max_recommended_working_set_size")
    if isinstance(recommended, int) and recommended > 0:  # Apple silicon (Metal)
        wired = min(limit, recommended)
        mx.set_wired_limit(wired)
    return MemoryLimits(limit, cache, wired)


def _dtype_bytes(model: Any) -> int:
    """Bytes per value of the model's activations (its first floating-point parameter)."""
    for item in tree_flatten(model.parameters()):
        value = item[1] if isinstance(item, tuple) else item
        if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
            return int(value.dtype.size)
    return 2


def kv_bytes_per_token(model: Any, kv: KVQuantization | None = None) -> int:
    """Estimated KV-cache bytes one token of context costs (0 when the model is unusual),
    held as `kv` says (None: in the model's own dtype).

    Counts the model's plain KV caches (keys and values: kv_heads × head_dim each); other
    cache kinds (sliding windows, state-space layers) are bounded, so they are left out.
    """
    args = getattr(model, "args", None)
    if args is None:
        return 0
    heads = getattr(args, "num_attention_heads", None)
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    dim = head_dim(model)
    if not kv_heads or not dim:
        return 0
    layers = sum(isinstance(c, KVCache) for c in make_prompt_cache(model))
    dtype_bytes = _dtype_bytes(model)
    per_value = dtype_bytes if kv is None else kv.bytes_per_value(dtype_bytes)
    return int(layers * 2 * kv_heads * dim * per_value)


@dataclass(frozen=True)
class MemoryBudget:
    """How much KV cache a request may need: the limit minus what the weights hold."""

    limit: int  # bytes MLX may use (0: unknown, nothing is checked)
    weights: int  # bytes in use right after loading
    per_token: int  # KV bytes per token of context

    @property
    def free_for_kv(self) -> int:
        return max(0, self.limit - self.weights)

    def tokens_that_fit(self, shards: int = 1) -> int | None:
        """The longest context whose KV fits what the weights leave free (None: unknown);
        `shards`: ranks of a cluster, each holding its share of every token's KV."""
        if self.limit <= 0 or self.per_token <= 0:
            return None
        return self.free_for_kv * max(1, shards) // self.per_token

    def check(self, context_tokens: int) -> None:
        """Raise GenerationFailed if `context_tokens` of KV could never fit."""
        if self.limit <= 0 or self.per_token <= 0:
            return
        needed = context_tokens * self.per_token
        if needed > self.free_for_kv:
            raise GenerationFailed(
                f"not enough memory for this request: its {context_tokens:,} tokens of "
                f"context need about {_size(needed)} of KV cache, but only "
                f"{_size(self.free_for_kv)} is left under the memory limit "
                "(lower max_tokens, shorten the prompt, or raise --memory-fraction)"
            )


def window_that_fits(
    window: int, budget: MemoryBudget | None, kv: KVQuantization | None, shards: int = 1
) -> int:
    """The context window to serve: the model's `window`, capped by what `budget` holds the
    KV of (logged when it is), so that what clients are told, compact by and are refused
    over (a 400) is what fits, not a window whose last part would fail for memory."""
    fits = budget.tokens_that_fit(shards) if budget is not None else None
    if fits is None or fits >= window:
        return window
    fits = max(2, fits)
    log.warning(
        "serving a %d-token context window, not the model's %d: the %s KV of more does "
        "not fit in the memory the weights leave free%s",
        fits,
        window,
        f"{kv.bits}-bit" if kv is not None else "unquantized",
        "" if kv is not None and kv.bits == 4 else " (try --kv-bits 8 or 4)",
    )
    return fits


def _size(n: int) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / 1024**2:.1f} MiB"


def memory_budget(
    fraction: float | None, model: Any, kv: KVQuantization | None
) -> MemoryBudget | None:
    """Set MLX's memory limits to `fraction` of RAM and measure, right after a load, what the
    KV cache of `model` may use under them (None: no limit is set, nothing is checked)."""
    if fraction is None:
        return None
    limits = apply_memory_limits(fraction)
    return MemoryBudget(limits.limit, int(mx.get_active_memory()), kv_bytes_per_token(model, kv))
