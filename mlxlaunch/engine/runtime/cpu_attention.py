"""Attention for MLX's CPU backend, computed by NumPy on MLX's own buffers.

`install` puts it behind mlx-lm's `scaled_dot_product_attention` in the loaded model modules
when the engine runs on the CPU; `uninstall` puts back everything `install` changed.

On the CPU, `mx.fast.scaled_dot_product_attention` falls back to plain MLX operations whose
exponential runs at ~12 ns a value here; NumPy's is vectorised (AVX2/AVX-512 where the processor
has them) at ~0.55 ns. With a long context the exponential is most of the cost of attention:
measured on 23 queries over 12.6k keys (4 heads), MLX's function takes ~18 ms, 13.5 of them in
`exp`; this one ~2.5 ms. A 2048-token prefill chunk over 12.6k keys: 1.5 s against ~0.25 s.

The arrays are read in place (an evaluated MLX array exposes its buffer, strides included, so a
cache's slice of a larger buffer is not copied); scores go into a per-thread scratch buffer that
is reused, so no call pays fresh page faults for them. Queries are processed in blocks whose
scores fit BLOCK_SCORE_BYTES, one KV head and block per task, the tasks spread over a thread
per core: NumPy releases the GIL in its loops and its BLAS, and its exponential is
single-threaded, so this scales with cores (23 queries over 12.6k keys: 3.3 ms on one thread,
1.9 ms on two). NumPy's own BLAS is held to one thread for that (`threadpoolctl`): BLAS
threads of its own on top of these oversubscribe the cores, and MLX's BLAS spinning beside it
made timings erratic (a 24-token prefill varied between 10 and 36 ms).

Installed by the engine when it runs on the CPU (`install`), in place of mlx-lm's
`scaled_dot_product_attention` in its model modules (the names it rebinds are listed in
`mlx_lm_internals`). mlx-lm's batch caches always pass a
boolean mask; for a lone sequence without padding that mask is plain causal attention and is
treated as such (see `plain_mask`). Anything else — a GPU, batches of several sequences,
padded or windowed masks, quantized KV caches, attention sinks — goes to mlx-lm's own function,
as do a few queries over a half-precision cache (NumPy would need a float32 copy of the whole
cache for them). Set MLXLAUNCH_CPU_ATTENTION=0 to keep mlx-lm's everywhere.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache

from mlxlaunch.engine.runtime import mlx_lm_internals as internals
from mlxlaunch.engine.runtime.row_cache import RowKVCache

ENV_SWITCH = "MLXLAUNCH_CPU_ATTENTION"
# Bytes of float32 scores one query block may take (one KV head's group of query heads).
# Measured on two threads, 2048 queries over 12.6k keys: 1 MiB blocks 170 ms, 4 MiB 119 ms,
# 64 MiB 143 ms; 23 queries over 12.6k: 2.7, 1.9 and 1.9 ms.
BLOCK_SCORE_BYTES = 4 << 20
# Below this many scores in all (heads x queries x keys), one thread does the whole call: a
# decode step over a few thousand keys costs less than handing its heads to other threads.
MIN_PARALLEL_SCORES = 1 << 18
# Fewer query rows than this (a decode step's few heads) take one matrix-vector product each:
# OpenBLAS's matrix product is slow for a handful of rows (2 rows over 12.6k keys of depth 32:
# 224 us; two matrix-vector products: 58 us).
GEMV_ROWS = 8
# Decode steps over fewer keys than this keep mlx-lm's: its attention is cheap there, and
# left lazy it lets mlx-lm build the next step while this one runs, which evaluating each
# layer's inputs here prevents (short chat on the test model: 820 against 434 tokens/s). At
# 12.6k keys this one wins: a step takes 2.6 ms against 4.5.
MIN_DECODE_KEYS = 4096
# Half-precision caches: queries from which a float32 copy of the keys and values (NumPy has
# no bfloat16) costs little next to the attention itself. Fewer go to mlx-lm's function.
MIN_QUERIES_HALF = 64

_scratch = threading.local()
_forward = threading.local()  # .last: the last layer's cache of this thread's forward pass
_pool: ThreadPoolExecutor | None = None
# What install changed outside this module, for uninstall: model class -> its own __call__
# (or _INHERITED), and NumPy BLAS library controller -> its thread count before.
_INHERITED = object()
_wrapped_forwards: dict[type, Any] = {}
_held_blas: dict[Any, int] = {}

Attention = Callable[..., mx.array]


def _scores_buffer(size: int) -> np.ndarray:
    """A float32 buffer of `size` values, reused by this thread's later calls."""
    buffer: np.ndarray | None = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.size < size:
        buffer = np.empty(size, dtype=np.float32)
        _scratch.buffer = buffer
    return buffer[:size]


def block_rows(group: int, keys: int) -> int:
    """Query rows per block so that a block's scores (all `group` heads) fit
    BLOCK_SCORE_BYTES; at least one."""
    return max(1, BLOCK_SCORE_BYTES // max(1, group * keys * 4))


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

    Grouped-query heads share their keys without copying them. Computed in float32 (the
    inputs are evaluated here), returned in the queries' dtype.
    """
    # One evaluation for all three (a float32 copy first where NumPy needs one), then NumPy
    # views of their buffers.
    inputs = [a if a.dtype == mx.float32 else a.astype(mx.float32) for a in (queries, keys, values)]
    mx.eval(*inputs)
    q, k, v = (np.asarray(a) for a in inputs)
    batch, heads, length, _ = q.shape
    kv_heads, total = k.shape[1], k.shape[2]
    group = heads // kv_heads
    out = np.empty((batch, heads, length, v.shape[-1]), dtype=np.float32)
    rows = block_rows(group, total)
    tasks = []
    for b in range(batch):
        for h in range(kv_heads):
            heads_of_h = slice(h * group, (h + 1) * group)
            for start in range(0, length, rows):
                block = slice(start, min(length, start + rows))
                tasks.append(
                    (q[b, heads_of_h], k[b, h], v[b, h], out[b, heads_of_h], block, scale, causal)
                )
    pool = _pool
    if pool is None or len(tasks) < 2 or heads * length * total < MIN_PARALLEL_SCORES:
        for task in tasks:
            _attend(*task)
    else:
        for future in [pool.submit(_attend, *task) for task in tasks]:
            future.result()
    result = mx.array(out)
    return result if queries.dtype == mx.float32 else result.astype(queries.dtype)


def _attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    block: slice,
    scale: float,
    causal: bool,
) -> None:
    """Rows `block` of one KV head: (G, T, D) queries over (S, D) keys and values, into the
    same rows of (G, T, Dv) `out`."""
    group, length, depth = q.shape
    start, stop = block.start, block.stop
    n = stop - start
    # Causal: keys after the block's last query are invisible to the whole block.
    visible = k.shape[0] - length + stop if causal else k.shape[0]
    queries = (q[:, block] * np.float32(scale)).reshape(group * n, depth)
    scores = _scores_buffer(group * n * visible).reshape(group * n, visible)
    if group * n < GEMV_ROWS:
        for row in range(group * n):  # see GEMV_ROWS
            np.matmul(k[:visible], queries[row], out=scores[row])
    else:
        np.matmul(queries, k[:visible].T, out=scores)
    if causal and n > 1:
        # Query i of the block sits at key visible - n + i and sees no key after it.
        own = scores.reshape(group, n, visible)[:, :, visible - n :]
        own[:, np.triu(np.ones((n, n), dtype=bool), 1)] = -np.inf
    np.subtract(scores, scores.max(axis=-1, keepdims=True), out=scores)
    np.exp(scores, out=scores)
    sums = scores.sum(axis=-1, keepdims=True)
    weighted = scores @ v[:visible]
    weighted /= sums
    out[:, block] = weighted.reshape(group, n, -1)


def plain_mask(queries: mx.array, keys: Any, mask: Any, cache: Any) -> Any:
    """`mask` as None or "causal" when it is exactly that, else unchanged.

    mlx-lm's `BatchKVCache` (and the decoding rows' `RowKVCache`) always builds a boolean
    mask. For a lone sequence without padding it is plain causal attention: its models build
    windowed masks only against rotating caches (`BatchRotatingKVCache`, left alone here).
    Decided from the cache, not by reading the mask: an evaluation per layer would stall
    every decode step (measured ~30% slower).
    """
    if not isinstance(mask, mx.array):
        return mask
    if queries.shape[0] != 1 or mask.shape[-1] != keys.shape[-2]:
        return mask
    if isinstance(cache, RowKVCache):  # its rows' padding is known on the host
        if not cache.single_unpadded:
            return mask
        return "causal" if queries.shape[2] > 1 else None
    if type(cache) is not BatchKVCache:
        return mask
    if internals.right_padding(cache) is not None:
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
    padding = internals.left_padding(cache)
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
    if queries.dtype != mx.float32 and queries.shape[2] < MIN_QUERIES_HALF:
        return False
    if queries.shape[2] == 1 and keys.shape[-2] < MIN_DECODE_KEYS:
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
        if covers(queries, keys, cache, mask, sinks) and not _output_unread(queries, cache):
            return attention(queries, keys, values, scale=scale, causal=mask is not None)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    scaled_dot_product_attention.mlxlaunch_original = original  # type: ignore[attr-defined]
    return scaled_dot_product_attention


def _output_unread(queries: mx.array, cache: Any) -> bool:
    """Whether this is the last layer of a multi-token pass: mlx-lm prefills by evaluating
    only the caches, so that layer's attention output is never read, and MLX's lazy
    evaluation skips it, where this module's eager attention would compute it (one layer
    in L of a prefill's attention). MLX's own function keeps it lazy; should anything read
    it after all (a speculative decoder's verification pass), it is computed then."""
    return queries.shape[2] > 1 and cache is not None and cache is getattr(_forward, "last", None)


def _track_last_layer(model_class: type) -> None:
    """Make `model_class`'s forward pass note its last layer's cache for `_output_unread`."""
    forward = model_class.__call__
    if getattr(forward, "mlxlaunch_forward", False):
        return

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        caches = internals.forward_cache(args, kwargs)
        outer = getattr(_forward, "last", None)
        _forward.last = caches[-1] if isinstance(caches, list | tuple) and caches else None
        try:
            return forward(self, *args, **kwargs)
        finally:
            _forward.last = outer

    __call__.mlxlaunch_forward = True  # type: ignore[attr-defined]
    __call__.__wrapped__ = forward  # type: ignore[attr-defined]  # its signature, for inspect
    # What uninstall puts back: the class's own entry, or nothing where it inherited one.
    _wrapped_forwards.setdefault(model_class, vars(model_class).get("__call__", _INHERITED))
    model_class.__call__ = __call__  # type: ignore[method-assign]


def enabled() -> bool:
    """On the CPU backend, unless MLXLAUNCH_CPU_ATTENTION=0."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return bool(mx.default_device().type == mx.DeviceType.cpu)


def install(model: Any = None) -> int:
    """Put `attention` behind mlx-lm's `scaled_dot_product_attention` in every loaded
    mlx-lm model module (idempotent). Returns how many modules now use it. `model`: the
    loaded model, whose forward pass then tells which layer is its last (see
    `_output_unread`). `uninstall` undoes all of it."""
    if not enabled():
        return 0
    if model is not None:
        _track_last_layer(type(model))
    original = internals.base_attention()
    if original is None:
        return 0
    _start_threads()
    replacement = _replacement(original)
    patched = 0
    # `base` keeps mlx-lm's own: it is what the replacement falls back to.
    for module in internals.model_modules():
        current = internals.bound_attention(module)
        if current is original:
            internals.bind_attention(module, replacement)
            patched += 1
        elif getattr(current, "mlxlaunch_original", None) is original:
            patched += 1
    return patched


def uninstall() -> int:
    """Undo every `install`: each model module calls mlx-lm's own attention again, wrapped
    forward passes are the classes' own again, the task threads end and NumPy's BLAS gets its
    thread count back. Returns how many modules were restored."""
    global _pool
    restored = 0
    for module in internals.model_modules():
        original = getattr(internals.bound_attention(module), "mlxlaunch_original", None)
        if original is not None:
            internals.bind_attention(module, original)
            restored += 1
    for model_class, own in _wrapped_forwards.items():
        if own is _INHERITED:
            del model_class.__call__
        else:
            model_class.__call__ = own  # type: ignore[method-assign]
    _wrapped_forwards.clear()
    pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True)
    for library, threads in _held_blas.items():
        if isinstance(threads, int):
            library.set_num_threads(threads)
    _held_blas.clear()
    return restored


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _start_threads() -> None:
    """The task threads, if NumPy's BLAS can be held to one thread (else one thread does all,
    with NumPy's BLAS threaded as it is)."""
    global _pool
    if _pool is not None:
        return
    cores = usable_cores()
    if cores < 2 or not _single_threaded_numpy_blas():
        return
    _pool = ThreadPoolExecutor(max_workers=cores, thread_name_prefix="mlxlaunch-attention")


def _single_threaded_numpy_blas() -> bool:
    """Hold the BLAS inside NumPy's own package (a wheel bundles it) to one thread. A BLAS
    shared with MLX is left alone: MLX's matrix products need its threads. True if held."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a dependency
        return False
    package = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    held = False
    for library in ThreadpoolController().lib_controllers:
        if library.user_api != "blas":
            continue
        path = os.path.abspath(library.filepath)
        if path.startswith(os.path.join(package, "numpy")):  # numpy/ or numpy.libs/
            _held_blas.setdefault(library, library.num_threads)
            library.set_num_threads(1)
            held = True
    return held
