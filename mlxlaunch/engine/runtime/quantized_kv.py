"""KV caches held quantized (`--kv-bits 8|4`): a long session in a fraction of the memory.

Each token's key and value vectors are quantized as they are written (`mx.quantize`: groups of
`group_size` values along the head dimension, each with a scale and a bias), and attention
reads them packed: mlx-lm's `scaled_dot_product_attention` takes its quantized path
(`mx.quantized_matmul`) for any cache that has `bits`. Quantizing per token keeps everything
the engine does with positions exact: a row is cut, rolled back (speculative decoding),
padded, stored in prefix-cache blocks and saved to disk at any token, as with plain caches.

Two classes: `QuantizedSequenceCache`, one sequence (what a request starts from, what the
prefix cache stores and the disk tier saves: mlx-lm's `QuantizedKVCache` layout, which can
also merge into a batch), and `QuantizedRowKVCache`, the batch's (prefill and decode: the
per-row ends of `RowKVCache` over packed buffers).

Only plain full-attention layers (`KVCache`) are quantized; rotating windows and recurrent
states stay as the model makes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

from mlxlaunch.engine.runtime.row_cache import RowKVCache
from mlxlaunch.engine.settings import KV_BITS
from mlxlaunch.engine.settings import KV_GROUP_SIZES as GROUP_SIZES
from mlxlaunch.store.memory import DEFAULT_KV_GROUP_SIZE as DEFAULT_GROUP_SIZE
from mlxlaunch.store.memory import kv_value_bytes


@dataclass(frozen=True)
class KVQuantization:
    """How the KV caches are held: `bits` per value in groups of `group_size`."""

    bits: int
    group_size: int = DEFAULT_GROUP_SIZE

    def __post_init__(self) -> None:
        if self.bits not in KV_BITS:
            raise ValueError(f"kv bits must be one of {', '.join(map(str, KV_BITS))}")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"kv group size must be one of {', '.join(map(str, GROUP_SIZES))}")

    @property
    def label(self) -> str:
        """Names the setting where entries are keyed by it (disk identity, logs)."""
        return f"kv{self.bits}g{self.group_size}"

    def bytes_per_value(self, dtype_bytes: int) -> float:
        """Bytes one cached value costs: its packed bits, and its share of its group's scale
        and bias (stored in the activations' dtype)."""
        return kv_value_bytes(self.bits, self.group_size, dtype_bytes)


def resolve(
    bits: int | None, group_size: int | None, head_dim: int | None
) -> KVQuantization | None:
    """The quantization for a model whose attention heads are `head_dim` wide (None: the
    model's own precision; `head_dim` None: unknown, not checked).

    Without a group size: the default where it divides the head dimension, else the largest
    that does. Raises ValueError for a group size that does not divide it.
    """
    if bits is None:
        return None
    if group_size is None:
        fitting = [g for g in GROUP_SIZES if head_dim is None or head_dim % g == 0]
        if not fitting:
            raise ValueError(
                f"no kv group size ({', '.join(map(str, GROUP_SIZES))}) divides "
                f"the model's head dimension {head_dim}"
            )
        group_size = DEFAULT_GROUP_SIZE if DEFAULT_GROUP_SIZE in fitting else max(fitting)
    if head_dim is not None and head_dim % group_size:
        raise ValueError(
            f"kv group size {group_size} does not divide the model's head dimension {head_dim}"
        )
    return KVQuantization(bits, group_size)


def head_dim(model: Any) -> int | None:
    """The width of `model`'s attention heads, from its arguments (None: it does not say)."""
    args = getattr(model, "args", None)
    dim = getattr(args, "head_dim", None)
    heads = getattr(args, "num_attention_heads", None)
    hidden = getattr(args, "hidden_size", None)
    if dim is None and heads and hidden:
        dim = hidden // heads
    return int(dim) if isinstance(dim, int) and dim > 0 else None


def new_caches(model: Any, kv: KVQuantization | None) -> list[Any]:
    """A fresh cache per layer of `model`, its plain KV layers quantized by `kv`."""
    caches = list(make_prompt_cache(model))
    if kv is None:
        return caches
    return [
        QuantizedSequenceCache(kv.group_size, kv.bits) if type(c) is KVCache else c for c in caches
    ]


def is_quantized(cache: Any) -> bool:
    return hasattr(cache, "bits") and hasattr(cache, "group_size")


class QuantizedSequenceCache(QuantizedKVCache):
    """One sequence's quantized KV (mlx-lm's layout), which mlx-lm's prompt batch can merge.

    Its state holds exactly its `offset` positions (mlx-lm's quantized cache would hand its
    whole buffer, spare room included, to whoever saves it). Saved to disk as mlx-lm's class,
    whose layout it keeps (`adopted` turns a loaded one back into this)."""

    SAVED_AS = "QuantizedKVCache"

    @property
    def state(self) -> tuple[Any, ...]:
        if self.keys is None:
            return self.keys, self.values, self.offset, self.group_size, self.bits
        used = self.offset

        def cut(b: mx.array) -> mx.array:
            return b if b.shape[2] == used else b[..., :used, :]

        keys, values = tree_map(cut, self.keys), tree_map(cut, self.values)
        return keys, values, self.offset, self.group_size, self.bits

    @state.setter
    def state(self, v: Any) -> None:
        self.keys, self.values, self.offset, self.group_size, self.bits = v

    @classmethod
    def merge(cls, caches: list[Any]) -> QuantizedRowKVCache:
        return QuantizedRowKVCache.of_sequences(caches)


def adopted(caches: list[Any]) -> list[Any]:
    """Loaded caches with mlx-lm's quantized ones as `QuantizedSequenceCache` (no copy)."""
    out = []
    for cache in caches:
        if type(cache) is QuantizedKVCache:
            mine = QuantizedSequenceCache(int(cache.group_size), int(cache.bits))
            keys: Any = cache.keys
            values: Any = cache.values
            mine.keys, mine.values = tuple(keys), tuple(values)  # type: ignore[assignment]
            mine.offset = int(cache.offset)
            cache = mine
        out.append(cache)
    return out


class QuantizedRowKVCache(RowKVCache):
    """The rows of a batch, each ending where it ends, with keys and values quantized."""

    def __init__(
        self, lefts: Sequence[int], ends: Sequence[int], *, group_size: int, bits: int
    ) -> None:
        self.group_size = group_size
        self.bits = bits
        super().__init__(lefts, ends)

    @classmethod
    def of_sequences(cls, caches: Sequence[Any]) -> QuantizedRowKVCache:
        """Rows for single-sequence quantized caches, right-aligned; a lone sequence hands
        its buffers over (the batch writes its next tokens into their spare room)."""
        first = caches[0]
        group_size, bits = first.group_size, first.bits
        if any((c.group_size, c.bits) != (group_size, bits) for c in caches):
            raise ValueError("sequences quantized differently cannot share a batch")
        lengths = [int(c.offset) if c.keys is not None else 0 for c in caches]
        longest = max(lengths)
        if longest == 0:
            return cls([0] * len(caches), [0] * len(caches), group_size=group_size, bits=bits)
        if len(caches) == 1:
            row = cls([0], [longest], group_size=group_size, bits=bits)
            row.keys, row.values = first.keys, first.values
            # No other reference: the batch's in-place writes must not have to copy.
            first.keys = first.values = None
            return row
        padding = [longest - n for n in lengths]
        row = cls(padding, [longest] * len(caches), group_size=group_size, bits=bits)
        sample = next(c for c in caches if c.keys is not None)

        def zeros(b: mx.array) -> mx.array:
            return mx.zeros((len(caches), b.shape[1], longest, b.shape[3]), b.dtype)

        keys, values = tree_map(zeros, sample.keys), tree_map(zeros, sample.values)
        for i, (pad, cache, n) in enumerate(zip(padding, caches, lengths, strict=True)):
            if cache.keys is None:
                continue

            def put(
                buffer: mx.array, part: mx.array, i: int = i, pad: int = pad, n: int = n
            ) -> mx.array:
                buffer[i : i + 1, :, pad:, :] = part[..., :n, :]
                return buffer

            keys = tree_map(put, keys, cache.keys)
            values = tree_map(put, values, cache.values)
        row.keys, row.values = keys, values
        return row

    def _encode(self, x: mx.array) -> Any:
        return tuple(mx.quantize(x, group_size=self.group_size, bits=self.bits))

    def _single(self) -> QuantizedSequenceCache:
        return QuantizedSequenceCache(self.group_size, self.bits)

    def extend(self, other: Any) -> None:
        if not isinstance(other, QuantizedRowKVCache):
            raise TypeError("a quantized batch extends only with quantized rows")
        super().extend(other)
