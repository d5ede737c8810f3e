"""How mlx-lm itself would split a model over ranks, asked without loading a weight.

The cluster checks (cluster/preflight.py) plan a serve from these facts; they cannot touch
mlx-lm themselves (DESIGN: only `engine/runtime/` does), so this module builds the architecture
as mlx-lm's `load_model` does but lazily (no weight read or evaluated), runs the model's own
`model.pipeline()` and `shard()` against a stand-in group, and reports what each said: a
problem in words, the share of parameters a tensor rank keeps, the layers a pipeline rank runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_config

from mlxlaunch.engine.runtime.mlx_lm_internals import model_classes


@dataclass(frozen=True)
class ShardProbe:
    """What mlx-lm's own sharding code says about one model on `size` ranks."""

    model_type: str
    tensor_problem: str | None  # why tensor parallelism cannot work; None: it can
    tensor_share: float  # the share of the parameters each tensor rank holds
    has_pipeline: bool  # the model has mlx-lm's `model.pipeline()`
    layer_count: int
    pipeline_error: str | None = None  # `pipeline()` itself failed, in words
    layer_ranges: tuple[tuple[int, int], ...] = ()  # rank r's [start, end): rank 0 runs the last


class _PlanGroup:
    """Stands in for an `mx.distributed.Group` of `size` ranks: `shard()` and `pipeline()`
    only ask its size and rank while they build the sharded modules (no collective runs)."""

    def __init__(self, size: int, rank: int = 0) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def probe_shards(model_dir: Path, size: int) -> ShardProbe:
    """Ask mlx-lm how `size` ranks would split the model in `model_dir`.

    Raises:
        Exception: whatever mlx-lm raises when it cannot build the architecture.
    """
    model, config = _lazy_model(Path(model_dir))
    model_type = str(config.get("model_type", "?"))
    # Pipeline first: its check restores the layers, while shard() replaces modules in place.
    inner: Any = getattr(model, "model", None)
    has_pipeline = inner is not None and hasattr(inner, "pipeline")
    layers = list(inner.layers) if has_pipeline else []
    error, ranges = _pipeline_ranges(inner, model_type, size) if has_pipeline else (None, ())
    problem, share = _tensor_split(model, config, size)
    return ShardProbe(model_type, problem, share, has_pipeline, len(layers), error, ranges)


def _lazy_model(model_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The architecture of `model_dir`, built as mlx-lm's `load_model` builds it but without
    weights: its parameters are lazy arrays that are never evaluated."""
    config = load_config(model_dir)
    model_class, args_class = model_classes(config)
    model = model_class(args_class.from_dict(config))
    quantization = config.get("quantization")
    if isinstance(quantization, dict) and "bits" in quantization:
        # Sharding a quantized layer splits its packed weight and scales: quantize the same
        # way so the divisibility checks see the shapes the real load makes.
        group = int(quantization.get("group_size", 64))
        nn.quantize(
            model,
            group_size=group,
            bits=int(quantization["bits"]),
            mode=quantization.get("mode", "affine"),
            class_predicate=lambda _, m: (
                hasattr(m, "to_quantized") and m.weight.shape[-1] % group == 0
            ),
        )
    return model, config


def _parameter_count(model: Any) -> int:
    leaves: Any = tree_flatten(model.parameters())  # a list of (path, array) pairs
    return sum(int(array.size) for _, array in leaves)


def _head_counts(config: dict[str, Any]) -> tuple[int | None, int | None]:
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else {}
    heads = config.get("num_attention_heads", text.get("num_attention_heads"))
    kv_heads = config.get("num_key_value_heads", text.get("num_key_value_heads", heads))
    return heads, kv_heads


def _tensor_split(model: Any, config: dict[str, Any], size: int) -> tuple[str | None, float]:
    model_type = config.get("model_type", "?")
    if not hasattr(model, "shard"):
        return f"mlx-lm's {model_type} has no tensor parallelism (its Model has no shard()).", 1.0
    heads, kv_heads = _head_counts(config)
    for count, what in ((heads, "attention"), (kv_heads, "key/value")):
        if isinstance(count, int) and count % size:
            return (
                f"tensor parallelism splits the heads over the ranks, and {count} {what} heads "
                f"do not divide by {size} ranks.",
                1.0,
            )
    before = _parameter_count(model)
    try:
        model.shard(_PlanGroup(size))
    except Exception as exc:  # mlx's shard_linear raises ValueError on a dimension that won't split
        return f"mlx-lm's shard() for {model_type} fails on {size} ranks: {exc}", 1.0
    return None, (_parameter_count(model) / before if before else 1.0)


def _pipeline_ranges(
    inner: Any, model_type: str, size: int
) -> tuple[str | None, tuple[tuple[int, int], ...]]:
    """mlx-lm's own split, asked once per rank (none when there are fewer layers than ranks)."""
    layers = list(inner.layers)
    if len(layers) < size:
        return None, ()
    ranges = []
    try:
        for rank in range(size):
            inner.layers = list(layers)
            inner.pipeline(_PlanGroup(size, rank))
            ranges.append((int(inner.start_idx), int(inner.end_idx)))
    except Exception as exc:
        return f"mlx-lm's pipeline() for {model_type} fails on {size} ranks: {exc}", ()
    finally:
        inner.layers = layers
    return None, tuple(ranges)
