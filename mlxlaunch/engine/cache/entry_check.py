"""What a disk entry must look like to be used by this model: its cache layout, checked first.

A KV file of another model relabelled with this model's identity passes every checksum; used,
it failed inside the batch ("Cannot broadcast array of shape …"), taking every request of the
batch with it, and it was restored again by each restart. So an entry is compared with the
model's own layout before it is used: the layer count and cache class of each layer, and the
dtype and shape of every array of its state, where only the token axis may differ.

The layout is read off the model's own cache after a one-token forward pass (`of_model`),
which works for any architecture mlx-lm builds, instead of guessing head counts from
config.json. In a state, the token axis is axis 2 of the 4-D arrays of caches that count
positions (`offset`: KVCache and its rotating, quantized and chunked kin, also inside a
CacheList); every other dimension, and every array of other caches (the fixed-size states of
linear-attention layers), must match exactly.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxlaunch.engine.cache.entry_format import (
    SAFETENSORS_DTYPES,
    EntryHeader,
    prompt_cache_contents,
)
from mlxlaunch.engine.runtime.quantized_kv import KVQuantization, new_caches

# The axis of a (batch, heads, tokens, head_dim) array that grows with the prompt.
TOKEN_AXIS = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArraySpec:
    """An array of a cache state: its dtype and shape, None where it grows with tokens."""

    dtype: str
    shape: tuple[int | None, ...]

    def problem(self, dtype: str, shape: Sequence[int]) -> str | None:
        """Why an array of `dtype` and `shape` cannot stand here (None: it can)."""
        fits = len(shape) == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, shape, strict=True)
        )
        if dtype != self.dtype or not fits:
            return f"{dtype}{list(shape)} where the model has {self.dtype}{list(self.shape)}"
        return None


@dataclass(frozen=True)
class KVLayout:
    """The cache layout of one model: what any entry of its KV must hold."""

    classes: tuple[str, ...]
    arrays: tuple[tuple[str, ArraySpec], ...]  # state arrays by flattened name, in order
    scalars: tuple[str, ...]  # the scalar list of the file metadata (names and kinds)
    # Scalars that do not count positions (a rotating window's size, its kept tokens): an
    # entry must have the model's values.
    settings: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of_caches(cls, caches: Sequence[Any], later: Sequence[Any] | None = None) -> KVLayout:
        """The layout of `caches`, a model's cache holding at least one token; `later`, the
        same cache's state one token on, tells positions from settings among its scalars
        (without it every scalar is taken for a position)."""
        arrays, metadata = prompt_cache_contents(caches, {})
        growing = tuple(_counting_states(caches))
        specs = []
        for name, array in arrays.items():
            shape: list[int | None] = list(array.shape)
            if array.ndim == 4 and any(name.startswith(f"{p}.") for p in growing):
                shape[TOKEN_AXIS] = None
            specs.append((name, ArraySpec(SAFETENSORS_DTYPES[array.dtype], tuple(shape))))
        header = EntryHeader({}, metadata)
        settings: list[tuple[str, float]] = []
        if later is not None:
            after = _scalar_values(later)
            for name, value in _scalar_values(caches).items():
                if after.get(name) == value:
                    settings.append((name, value))
        return cls(tuple(header.classes()), tuple(specs), tuple(header.scalars()), tuple(settings))

    @classmethod
    def of_model(cls, model: nn.Module, kv: KVQuantization | None = None) -> KVLayout | None:
        """The layout of `model`'s cache held as `kv` says, read from two one-token forward
        passes (None when the model cannot be run so: then no entry can be checked, and none
        should be used)."""
        try:
            caches = new_caches(model, kv)
            model(mx.array([[0]]), cache=caches)
            mx.eval([c.state for c in caches])
            first = copy.deepcopy(caches)
            model(mx.array([[0]]), cache=caches)
            mx.eval([c.state for c in caches])
            return cls.of_caches(first, caches)
        except Exception as exc:
            log.warning("prefix cache: cannot read the model's cache layout (%s)", exc)
            return None

    def header_problem(self, header: EntryHeader) -> str | None:
        """Why the entry whose data file has `header` is not this model's (None: it may be)."""
        classes = tuple(header.classes())
        if classes != self.classes:
            return f"{len(classes)} layers of {_summary(classes)}, not {_summary(self.classes)}"
        if tuple(header.scalars()) != self.scalars:
            return "its cache state is laid out differently"
        if set(header.tensors) != {name for name, _ in self.arrays}:
            return "its cache state holds other arrays"
        for name, spec in self.arrays:
            info = header.tensors[name]
            problem = spec.problem(info.dtype, info.shape)
            if problem is not None:
                return f"array {name}: {problem}"
        return None

    def cache_problem(self, caches: Sequence[Any], tokens: int) -> str | None:
        """Why loaded `caches` cannot continue `tokens` positions of this model (None: they
        can): the header's check again on the objects built, the model's settings, and each
        counting cache's position equal to the entry's token count."""
        arrays, metadata = prompt_cache_contents(caches, {})
        if tuple(EntryHeader({}, metadata).classes()) != self.classes:
            return "its caches are of other classes"
        specs = dict(self.arrays)
        if set(arrays) != set(specs):
            return "its cache state holds other arrays"
        for name, array in arrays.items():
            problem = specs[name].problem(SAFETENSORS_DTYPES.get(array.dtype, "?"), array.shape)
            if problem is not None:
                return f"array {name}: {problem}"
        values = _scalar_values(caches)
        for name, value in self.settings:
            if values.get(name) != value:
                return f"setting {name} is {values.get(name)}, the model's {value}"
        return positions_problem(caches, tokens)


def positions_problem(caches: Sequence[Any], tokens: int) -> str | None:
    """Why loaded `caches` do not hold exactly `tokens` positions (None: they do)."""
    for cache in _counting_caches(caches):
        if cache.offset != tokens:
            return f"a layer holds {cache.offset} positions, not {tokens}"
        keys = getattr(cache, "keys", None)
        short = isinstance(keys, mx.array) and keys.shape[TOKEN_AXIS] < tokens
        if type(cache).__name__ == "KVCache" and short:
            return f"a layer's keys hold fewer than {tokens} positions"
    return None


def _scalar_values(caches: Sequence[Any]) -> dict[str, float]:
    """The numeric scalars of `caches`' states, by flattened name."""
    leaves: Any = tree_flatten([c.state for c in caches])
    return {
        name: float(value)
        for name, value in leaves
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def _counting_states(caches: Sequence[Any]) -> Iterator[str]:
    """Flattened state names of the caches that count positions (see module docstring)."""
    for index, cache in enumerate(caches):
        yield from _counting_names(str(index), cache)


def _counting_names(prefix: str, cache: Any) -> Iterator[str]:
    inner = getattr(cache, "caches", None)
    if isinstance(inner, (list, tuple)):  # CacheList: state is [(sub-state, class name), …]
        for index, sub in enumerate(inner):
            yield from _counting_names(f"{prefix}.{index}.0", sub)
    elif isinstance(getattr(cache, "offset", None), int):
        yield prefix


def _counting_caches(caches: Sequence[Any]) -> Iterator[Any]:
    for cache in caches:
        inner = getattr(cache, "caches", None)
        if isinstance(inner, (list, tuple)):
            yield from _counting_caches(inner)
        elif isinstance(getattr(cache, "offset", None), int):
            yield cache


def _summary(classes: Sequence[str]) -> str:
    return ",".join(sorted(set(classes))) or "nothing"
