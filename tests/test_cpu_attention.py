"""The CPU attention (engine/runtime/cpu_attention.py) against MLX's own, and in the engine."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache

from mlxlaunch.engine.runtime import cpu_attention
from mlxlaunch.engine.runtime.cpu_attention import attention, block_rows, covers, plain_mask


@pytest.fixture
def undo_install() -> Iterator[None]:
    """For tests that install the CPU attention: what it patched process-wide is put back."""
    yield
    cpu_attention.uninstall()


def reference(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: object) -> mx.array:
    """Plain float64-free float32 softmax attention with keys repeated per group."""
    group = q.shape[1] // k.shape[1]
    k = mx.repeat(k.astype(mx.float32), group, axis=1)
    v = mx.repeat(v.astype(mx.float32), group, axis=1)
    scores = (q.astype(mx.float32) * scale) @ k.swapaxes(-1, -2)
    length, total = q.shape[2], k.shape[2]
    if mask == "causal":
        allowed = mx.arange(total)[None] <= mx.arange(total - length, total)[:, None]
        scores = mx.where(allowed, scores, -mx.inf)
    elif isinstance(mask, mx.array):
        scores = mx.where(mask, scores, -mx.inf)
    return mx.softmax(scores, axis=-1, precise=True) @ v


def float64_reference(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: object
) -> np.ndarray:
    """The same attention in float64 NumPy: the truth both float32 versions approximate."""
    q64, k64, v64 = (np.array(x.astype(mx.float32), dtype=np.float64) for x in (q, k, v))
    group = q64.shape[1] // k64.shape[1]
    k64, v64 = np.repeat(k64, group, axis=1), np.repeat(v64, group, axis=1)
    scores = (q64 * scale) @ k64.swapaxes(-1, -2)
    length, total = q64.shape[2], k64.shape[2]
    if mask == "causal":
        allowed = np.arange(total)[None] <= np.arange(total - length, total)[:, None]
        scores = np.where(allowed, scores, -np.inf)
    elif mask is not None:
        scores = np.where(np.array(mask), scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ v64


def assert_as_accurate(got: mx.array, want: mx.array, truth: np.ndarray) -> None:
    """`got` is as close to the float64 `truth` as MLX's own float32 result `want` is.

    Two float32 computations of the same sums differ by their reduction order, which depends on
    the BLAS (reference, OpenBLAS, Accelerate) and on block sizes, so a fixed tolerance against
    one of them fails on another machine (seen: 8e-6 over 900 keys without OpenBLAS). Judged
    against float64 instead, ours must be within twice MLX's own error, plus a floor of a few
    float32 ulps of the output's size.
    """
    ours = float(np.abs(np.array(got.astype(mx.float32), dtype=np.float64) - truth).max())
    theirs = float(np.abs(np.array(want.astype(mx.float32), dtype=np.float64) - truth).max())
    floor = 8 * float(np.finfo(np.float32).eps) * float(np.abs(truth).max())
    assert ours <= 2 * theirs + floor, (ours, theirs, floor)


def inputs(
    batch: int, heads: int, kv_heads: int, length: int, total: int, depth: int, dtype: mx.Dtype
) -> tuple[mx.array, mx.array, mx.array]:
    key = mx.random.key(length * 1000 + total)
    q_key, k_key, v_key = mx.random.split(key, 3)
    q = (mx.random.normal((batch, heads, length, depth), key=q_key) * 2).astype(dtype)
    k = (mx.random.normal((batch, kv_heads, total, depth), key=k_key) * 2).astype(dtype)
    v = mx.random.normal((batch, kv_heads, total, depth), key=v_key).astype(dtype)
    return q, k, v


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "length", "total", "mask"),
    [
        (1, 4, 2, 1, 300, None),  # a decode step: one matrix-vector product per head
        (1, 4, 2, 23, 3000, "causal"),  # a few new tokens over a long cache
        (1, 4, 4, 40, 40, "causal"),  # a first chunk: queries are the whole context
        (1, 8, 2, 700, 900, "causal"),  # several query blocks
        (1, 2, 1, 17, 17, None),  # no mask at all
        (2, 4, 2, 5, 64, "causal"),  # two sequences
    ],
)
def test_matches_softmax_attention(
    batch: int, heads: int, kv_heads: int, length: int, total: int, mask: object
) -> None:
    q, k, v = inputs(batch, heads, kv_heads, length, total, 32, mx.float32)
    got = attention(q, k, v, scale=0.3, causal=mask == "causal")
    want = reference(q, k, v, 0.3, mask)
    assert got.shape == want.shape and got.dtype == q.dtype
    assert_as_accurate(got, want, float64_reference(q, k, v, 0.3, mask))


def test_reads_a_caches_slice_of_a_larger_buffer() -> None:
    # What a KV cache hands attention: the filled part of a buffer with room to spare.
    q, k, v = inputs(1, 4, 2, 6, 500, 16, mx.float32)
    spare = mx.zeros((1, 2, 212, 16))
    k_buffer, v_buffer = mx.concatenate([k, spare], axis=2), mx.concatenate([v, spare], axis=2)
    got = attention(q, k_buffer[..., :500, :], v_buffer[..., :500, :], scale=0.25, causal=True)
    want = reference(q, k, v, 0.25, "causal")
    assert_as_accurate(got, want, float64_reference(q, k, v, 0.25, "causal"))


def test_small_blocks_and_threads_give_the_same_answer(
    monkeypatch: pytest.MonkeyPatch, undo_install: None
) -> None:
    # Many blocks of a few rows each, spread over the task threads: the rows of every block
    # must land in their own place, with the causal edge of each block right.
    cpu_attention.install()
    q, k, v = inputs(1, 4, 2, 37, 300, 16, mx.float32)
    monkeypatch.setattr(cpu_attention, "BLOCK_SCORE_BYTES", 2 * 300 * 4 * 3)  # 3-row blocks
    monkeypatch.setattr(cpu_attention, "MIN_PARALLEL_SCORES", 1)
    assert cpu_attention.block_rows(2, 300) == 3
    got = attention(q, k, v, scale=0.3, causal=True)
    want = reference(q, k, v, 0.3, "causal")
    assert_as_accurate(got, want, float64_reference(q, k, v, 0.3, "causal"))


def test_half_precision_is_computed_in_float32() -> None:
    q, k, v = inputs(1, 4, 2, 9, 500, 64, mx.bfloat16)
    got = attention(q, k, v, scale=0.125, causal=True)
    assert got.dtype == mx.bfloat16
    want = reference(q, k, v, 0.125, "causal").astype(mx.bfloat16)
    assert mx.allclose(got.astype(mx.float32), want.astype(mx.float32), atol=1e-2).item()


def test_blocks_keep_scores_within_their_budget() -> None:
    rows = block_rows(2, 12_600)
    assert rows * 2 * 12_600 * 4 <= cpu_attention.BLOCK_SCORE_BYTES
    assert (rows + 1) * 2 * 12_600 * 4 > cpu_attention.BLOCK_SCORE_BYTES
    assert block_rows(64, 10_000_000) == 1


def test_what_it_leaves_to_mlx_lm() -> None:
    q = mx.zeros((1, 2, cpu_attention.MIN_QUERIES_HALF, 8))
    k = mx.zeros((1, 1, cpu_attention.MIN_DECODE_KEYS, 8))
    short = k[:, :, :100]

    class Quantized:
        bits = 4

    assert covers(q, k, None, "causal", None) and covers(q, k, None, None, None)
    assert covers(q[:, :, :1], k, None, None, None)  # a float32 decode step over a long context
    assert not covers(q[:, :, :1], short, None, None, None)  # ... over a short one
    assert covers(q[:, :, :5], short, None, "causal", None)  # a few queries over a short one
    assert covers(q[:, :, :5], k, None, "causal", None)  # a few float32 queries
    half = q.astype(mx.bfloat16)
    assert covers(half, k, None, "causal", None)  # a half-precision prefill chunk
    assert not covers(half[:, :, :5], k, None, "causal", None)  # a few: the copy would dominate
    assert not covers(q, k, None, mx.ones((64, 64), dtype=mx.bool_), None)  # an array mask
    assert not covers(q, k, None, "causal", mx.zeros((2,)))  # attention sinks
    assert not covers(q, k, Quantized(), "causal", None)  # quantized KV cache


def test_numpys_blas_is_held_to_one_thread_beside_the_task_threads(undo_install: None) -> None:
    from threadpoolctl import threadpool_info

    cpu_attention.install()
    if cpu_attention.usable_cores() < 2:
        pytest.skip("one core: no task threads")
    numpy_dir = np.__file__.rsplit("/", 2)[0]
    ours = [i for i in threadpool_info() if i["filepath"].startswith(numpy_dir + "/numpy")]
    if not ours:
        pytest.skip("this NumPy uses a BLAS outside its package")
    assert cpu_attention._pool is not None
    assert all(i["num_threads"] == 1 for i in ours if i["user_api"] == "blas")


def batch_cache(padding: int, keys: mx.array) -> BatchKVCache:
    """mlx-lm's batch cache for one sequence left-padded by `padding`, holding `keys`."""
    cache = BatchKVCache([padding])
    cache.update_and_fetch(keys, keys)
    return cache


def test_a_lone_unpadded_sequences_batch_mask_is_plain_causal_attention() -> None:
    q, k, _ = inputs(1, 4, 2, 6, 40, 8, mx.float32)
    cache = batch_cache(0, k[:, :, :34])
    mask = cache.make_mask(6)
    cache.update_and_fetch(k[:, :, 34:], k[:, :, 34:])
    assert isinstance(mask, mx.array)
    assert plain_mask(q, k, mask, cache) == "causal"
    step = cache.make_mask(1)
    assert plain_mask(q[:, :, -1:], mx.zeros((1, 2, 41, 8)), step, cache) is None  # decode
    padded = batch_cache(3, k[:, :, :34])
    padded_mask = padded.make_mask(6)
    assert plain_mask(q, k, padded_mask, padded) is padded_mask  # left to mlx-lm
    rotating = BatchRotatingKVCache(max_size=16, left_padding=[0])
    assert plain_mask(q, k, mask, rotating) is mask  # windowed layers: left to mlx-lm
    two = mx.concatenate([q, q])
    assert plain_mask(two, k, mask, cache) is mask  # a batch of two


@pytest.mark.parametrize("padding", [0, 3])
def test_the_replacement_matches_mlx_lm_on_batch_masks(padding: int) -> None:
    original = base.scaled_dot_product_attention
    replacement = cpu_attention._replacement(original)
    q, k, v = inputs(1, 4, 2, 70, 90, 16, mx.float32)
    cache = batch_cache(padding, k[:, :, :20])
    mask = cache.make_mask(70)
    got = replacement(q, k, v, cache, 0.25, mask)
    want = original(q, k, v, cache=cache, scale=0.25, mask=mask)
    assert_as_accurate(got, want, float64_reference(q, k, v, 0.25, mask))


def test_install_replaces_mlx_lm_attention_in_model_modules(
    monkeypatch: pytest.MonkeyPatch, undo_install: None
) -> None:
    import mlx_lm.models.qwen3 as qwen3

    original = base.scaled_dot_product_attention
    monkeypatch.setattr(qwen3, "scaled_dot_product_attention", original)
    assert cpu_attention.install() >= 1
    replaced = qwen3.scaled_dot_product_attention
    assert replaced is not original
    assert getattr(replaced, "mlxlaunch_original", None) is original
    assert cpu_attention.install() >= 1  # idempotent: not wrapped twice
    assert qwen3.scaled_dot_product_attention is replaced
    monkeypatch.setattr(qwen3, "scaled_dot_product_attention", original)
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "0")
    assert cpu_attention.install() == 0
    assert sys.modules["mlx_lm.models.qwen3"].scaled_dot_product_attention is original


@pytest.mark.slow
def test_a_prefills_last_layer_is_left_lazy_and_right_if_read(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, undo_install: None
) -> None:
    # mlx-lm prefills by evaluating the caches only: the last layer's attention output is
    # never read, and MLX's lazy graph skips it. Eager attention there would be wasted work.
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model = load(str(tiny_model_dir))[0]  # one layer: it is the last
    cpu_attention.install(model)
    eager: list[int] = []
    real = cpu_attention.attention

    def counted(queries: mx.array, *args: object, **kwargs: object) -> mx.array:
        eager.append(queries.shape[2])
        return real(queries, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_attention, "attention", counted)
    monkeypatch.setattr(cpu_attention, "MIN_DECODE_KEYS", 1)  # decode steps here too
    prompt = mx.array([[5, 6, 7, 8, 9, 10]])
    cache = make_prompt_cache(model)
    logits = model(prompt, cache=cache)
    mx.eval([c.state for c in cache])
    assert eager == []
    step = model(mx.array([[11]]), cache=cache)
    mx.eval(step)
    assert eager == [1]  # a decode step's output is read: computed here
    # Read after all, the lazy output is what a plain forward pass gives.
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "0")
    fresh = make_prompt_cache(model)
    with_original = base.scaled_dot_product_attention
    import mlx_lm.models.qwen3 as qwen3

    monkeypatch.setattr(qwen3, "scaled_dot_product_attention", with_original)
    want = model(prompt, cache=fresh)
    assert mx.allclose(logits, want, rtol=1e-4, atol=1e-5).item()


def _numpy_blas_threads() -> dict[str, int]:
    from threadpoolctl import threadpool_info

    numpy_dir = np.__file__.rsplit("/", 2)[0]
    return {
        i["filepath"]: i["num_threads"]
        for i in threadpool_info()
        if i["user_api"] == "blas" and i["filepath"].startswith(numpy_dir + "/numpy")
    }


@pytest.mark.slow
def test_uninstall_puts_back_everything_install_changed(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, undo_install: None
) -> None:
    import mlx_lm.models.qwen3 as qwen3
    from mlx_lm import load

    if not cpu_attention.enabled():
        pytest.skip("CPU attention is for the CPU backend")
    cpu_attention.uninstall()  # whatever an earlier engine in this process installed
    original = base.scaled_dot_product_attention
    assert qwen3.scaled_dot_product_attention is original
    model = load(str(tiny_model_dir))[0]
    model_class = type(model)
    own_forward = vars(model_class)["__call__"]
    threads = _numpy_blas_threads()
    assert cpu_attention.install(model) >= 1
    assert qwen3.scaled_dot_product_attention is not original
    assert model_class.__call__ is not own_forward
    assert cpu_attention.uninstall() >= 1
    assert qwen3.scaled_dot_product_attention is original
    assert vars(model_class)["__call__"] is own_forward
    assert _numpy_blas_threads() == threads
    assert cpu_attention.uninstall() == 0  # nothing left to undo
    # And it can be installed again, as the next model load does.
    assert cpu_attention.install(model) >= 1
    assert model_class.__call__ is not own_forward


def test_uninstall_leaves_an_inherited_forward_inherited(undo_install: None) -> None:
    if not cpu_attention.enabled():
        pytest.skip("CPU attention is for the CPU backend")

    class Parent:
        def __call__(self, inputs: object, cache: object = None) -> str:
            return "parent"

    class Child(Parent):
        pass

    cpu_attention.install(Child())
    assert "__call__" in vars(Child)
    cpu_attention.uninstall()
    assert "__call__" not in vars(Child)
    assert Child()(1) == "parent"
