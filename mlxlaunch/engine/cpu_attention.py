"""Attention for MLX's CPU backend: blocked over queries, with a vectorised exponential.

On the CPU, `mx.fast.scaled_dot_product_attention` falls back to plain operations whose
exponential is the scalar libm one (about 12 ns a value on this class of machine). With a long
context that exponential is most of the cost of a prefill: 24 new tokens over 12.6k cached
ones spend ~18 of their ~23 ms in it, and a 12.6k-token cold prefill ~3 of its ~5.6 s.

Here the softmax uses 2^x = 2^n · 2^f: the integer part goes straight into the exponent bits,
the fraction through a degree-7 polynomial (relative error ~1e-7, below float32 rounding of
the sums that follow), as one fused elementwise kernel. Queries are processed in blocks sized
so that a block's scores stay in the processor's cache; past that size the extra memory
traffic costs more than the exponential saves.

Installed by the engine when it runs on the CPU (`install`), in place of mlx-lm's
`scaled_dot_product_attention` in its model modules. mlx-lm's batch caches always pass a
boolean mask; for a lone sequence without padding that mask is plain causal attention and is
treated as such (see `plain_mask`). Anything else — a GPU, batches of
several sequences, padded or windowed masks, quantized KV caches, attention sinks — goes to
mlx-lm's own function.
Set MLXLAUNCH_CPU_ATTENTION=0 to keep mlx-lm's everywhere.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

log = logging.getLogger(__name__)

ENV_SWITCH = "MLXLAUNCH_CPU_ATTENTION"
# Bytes of float32 scores one query block may take (all heads): about what stays in a core's
# cache here. On the 2-layer test model at 12.6k keys, 16-row blocks (~3 MiB) were best or level
# among 8, 16, 24 and 32 rows (1.5k new tokens: 563 ms against 652, 826 and 988 ms).
BLOCK_SCORE_BYTES = 3 << 20
# Where this is used, from measurements on Claude Code's real prompt (random tokens flatter
# it): prefill chunks of MIN_QUERIES or more queries (~1.4-2x faster), and single-query decode
# steps over MIN_DECODE_KEYS or more keys (2.46 -> 1.60 ms at 15.6k). A few queries over a long
# cache measured the same as mlx-lm's (~19 ms for 23 over 12.6k), and a decode step over a
# short context slightly slower (560 vs 582 tokens/s in the engine): those stay with mlx-lm's.
MIN_QUERIES = 64
MIN_DECODE_KEYS = 4096
# Bounds on the rows of a block: below 8 the per-block graph overhead dominates.
MIN_BLOCK_ROWS = 8
MAX_BLOCK_ROWS = 256

_LN2 = 0.6931471805599453
_LOG2E = 1.4426950408889634
# Weights below 2^-64 of their row's largest are exactly zero: they cannot change a float32
# sum, and the exponent bits built below stay far from subnormal numbers.
_LOWEST_EXPONENT = -64.0
# Taylor coefficients of e^g, highest first (|g| <= ln2/2 after rounding).
_COEFFICIENTS = (1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0)

Attention = Callable[..., mx.array]


def _exp_parts(scores: mx.array, row_max: mx.array) -> tuple[mx.array, mx.array]:
    """exp(scores - row_max) as (mantissa factor, exponent bits); multiply them (after a
    bit cast of the second) to get the value. Split because a bit cast cannot be compiled
    shapeless."""
    t = mx.maximum((scores - row_max) * _LOG2E, _LOWEST_EXPONENT)
    n = mx.round(t)
    g = (t - n) * _LN2
    poly = mx.array(_COEFFICIENTS[0], dtype=mx.float32)
    for c in _COEFFICIENTS[1:]:
        poly = poly * g + c
    # Masked scores (-inf) and negligible ones weigh exactly zero.
    poly = mx.where(t > _LOWEST_EXPONENT, poly, 0.0)
    return poly, mx.left_shift(n.astype(mx.int32) + 127, 23)


_compiled_exp_parts: Callable[[mx.array, mx.array], tuple[mx.array, mx.array]] | None = None


def _exp_shifted(scores: mx.array, row_max: mx.array) -> mx.array:
    parts = _compiled_exp_parts or _exp_parts
    poly, bits = parts(scores, row_max)
    return poly * bits.view(mx.float32)


def block_rows(heads: int, keys: int) -> int:
    """Query rows per block so that a block's scores fit BLOCK_SCORE_BYTES."""
    rows = BLOCK_SCORE_BYTES // max(1, heads * keys * 4)
    return max(MIN_BLOCK_ROWS, min(MAX_BLOCK_ROWS, rows))


def attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float,
    causal: bool,
) -> mx.array:
    """softmax(scale · q kᵀ) v for (B, H, T, D) queries over (B, KV, S, D) keys; `causal`: the
    last T keys are the queries' own positions and later keys are hidden from each query.

    Grouped-query heads share their keys without copying them. Computed in float32, returned
    in the queries' dtype.
    """
    batch, heads, length, depth = queries.shape
    kv_heads, total = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    q = (queries.astype(mx.float32) * scale).reshape(batch, kv_heads, group, length, depth)
    k = keys.astype(mx.float32)
    v = values.astype(mx.float32)
    if length > 1:
        # A cache's keys are a slice of a larger buffer; for several queries, one copy into
        # their own buffer measured 2x faster overall (20.6 -> 10.3 ms for 23 queries over
        # 12.6k keys); a single query is faster without it.
        k = mx.contiguous(k)
    rows = block_rows(heads, total)
    blocks = []
    for start in range(0, length, rows):
        stop = min(length, start + rows)
        n = stop - start
        # Causal: keys after the block's last query are invisible to the whole block.
        visible = total - length + stop if causal else total
        scores = q[:, :, :, start:stop].reshape(batch, kv_heads, group * n, depth) @ k[
            :, :, :visible
        ].swapaxes(-1, -2)
        if causal and n > 1:
            query_pos = mx.arange(visible - n, visible)[:, None]
            scores = mx.where(
                mx.arange(visible)[None] <= query_pos,
                scores.reshape(batch, kv_heads, group, n, visible),
                -mx.inf,
            ).reshape(batch, kv_heads, group * n, visible)
        weights = _exp_shifted(scores, mx.max(scores, axis=-1, keepdims=True))
        out = (weights @ v[:, :, :visible]) / weights.sum(axis=-1, keepdims=True)
        blocks.append(out.reshape(batch, kv_heads, group, n, -1))
    out = blocks[0] if len(blocks) == 1 else mx.concatenate(blocks, axis=3)
    return out.reshape(batch, heads, length, -1).astype(queries.dtype)


def plain_mask(queries: mx.array, keys: Any, mask: Any, cache: Any) -> Any:
    """`mask` as None or "causal" when it is exactly that, else unchanged.

    mlx-lm's `BatchKVCache` always builds a boolean mask. For a lone sequence without padding
    it is plain causal attention: its models build windowed masks only against rotating
    caches (`BatchRotatingKVCache`, left alone here). Decided from the cache, not by reading
    the mask: an evaluation per layer would stall every decode step (measured ~30% slower).
    """
    if not isinstance(mask, mx.array) or type(cache) is not BatchKVCache:
        return mask
    if queries.shape[0] != 1 or mask.shape[-1] != keys.shape[-2]:
        return mask
    if getattr(cache, "_right_padding", None) is not None:
        return mask
    if not _unpadded(cache):
        return mask
    return "causal" if queries.shape[2] > 1 else None


# Attribute under which a batch cache remembers (its left_padding array, whether it is zero).
_VERDICT = "_mlxlaunch_unpadded"


def _unpadded(cache: Any) -> bool:
    """Whether a one-sequence batch cache has no left padding. Reading the array costs an
    evaluation (even of an evaluated array: ~0.35 ms a call, measured), so the answer is kept
    on the cache for as long as its `left_padding` array is the same object (mlx-lm replaces
    it only on merge, filter and extend)."""
    padding = getattr(cache, "left_padding", None)
    if not isinstance(padding, mx.array) or padding.size != 1:
        return False
    seen = getattr(cache, _VERDICT, None)
    if seen is not None and seen[0] is padding:
        return bool(seen[1])
    verdict = padding.item() == 0
    setattr(cache, _VERDICT, (padding, verdict))
    return verdict


def covers(queries: mx.array, keys: Any, cache: Any, mask: Any, sinks: Any) -> bool:
    """Whether `attention` handles this call (else mlx-lm's own function does)."""
    if sinks is not None or hasattr(cache, "bits") or queries.ndim != 4:
        return False
    length = queries.shape[2]
    if (length == 1 and keys.shape[-2] < MIN_DECODE_KEYS) or 1 < length < MIN_QUERIES:
        return False
    if mx.default_device().type != mx.DeviceType.cpu:
        return False
    return mask is None or (isinstance(mask, str) and mask == "causal")


def _replacement(original: Attention) -> Attention:
    def scaled_dot_product_attention(
        queries: mx.array,
        keys: Any,
        values: Any,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: Any = None,
    ) -> mx.array:
        if sinks is None and not hasattr(cache, "bits"):
            mask = plain_mask(queries, keys, mask, cache)
        if covers(queries, keys, cache, mask, sinks):
            return attention(queries, keys, values, scale=scale, causal=mask is not None)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    scaled_dot_product_attention.mlxlaunch_original = original  # type: ignore[attr-defined]
    return scaled_dot_product_attention


def enabled() -> bool:
    """On the CPU backend, unless MLXLAUNCH_CPU_ATTENTION=0."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return bool(mx.default_device().type == mx.DeviceType.cpu)


def install() -> int:
    """Put `attention` behind mlx-lm's `scaled_dot_product_attention` in every loaded
    mlx-lm model module (idempotent). Returns how many modules now use it."""
    global _compiled_exp_parts
    if not enabled():
        return 0
    try:
        from mlx_lm.models import base
    except ImportError:  # pragma: no cover - mlx-lm is a dependency
        return 0
    original = getattr(base, "scaled_dot_product_attention", None)
    if original is None:
        return 0
    if _compiled_exp_parts is None:
        _compiled_exp_parts = _compile_exp_parts()
    replacement = _replacement(original)
    patched = 0
    # `base` keeps mlx-lm's own: it is what the replacement falls back to.
    for name, module in list(sys.modules.items()):
        if not name.startswith("mlx_lm.models.") or module is None or module is base:
            continue
        current = getattr(module, "scaled_dot_product_attention", None)
        if current is original:
            setattr(module, "scaled_dot_product_attention", replacement)  # noqa: B010
            patched += 1
        elif getattr(current, "mlxlaunch_original", None) is original:
            patched += 1
    return patched


def _compile_exp_parts() -> Callable[[mx.array, mx.array], tuple[mx.array, mx.array]] | None:
    """The fused kernel, or None (plain operations) if this MLX cannot compile it."""
    try:
        compiled = mx.compile(_exp_parts, shapeless=True)
        probe = mx.array([[0.0, -1.0, -mx.inf]])
        poly, bits = compiled(probe, mx.zeros((1, 1)))
        mx.eval(poly, bits)
    except Exception as exc:  # a missing JIT toolchain costs speed, not correctness
        log.info("CPU attention: exponential not compiled (%s)", exc)
        return None
    return compiled
