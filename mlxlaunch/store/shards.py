"""Which files one rank of a pipeline-parallel cluster needs, and the marker of a shard pull.

mlx-lm's `sharded_load` fetches, on each pipeline rank, the non-weight files plus only the
safetensors files that hold that rank's layers (per `model.safetensors.index.json`) and every
file with non-layer weights (embeddings, final norm, head). `mlx models pull --shard R/N` and
`--hosts` fetch the same set ahead of time, so a host never downloads weights it will not load.
With tensor parallelism every rank loads every weight, so there is nothing to save.

The layer split here must be exactly the one each architecture's `pipeline()` makes in mlx-lm
(`mlx_lm/models/pipeline.py` and the models that override it): a different split would leave a
rank without a file it loads. tests/test_store_shards.py checks it against mlx-lm itself.

Tensor or pipeline follows mlx-lm's rule (tensor where the model has `shard`), asked of mlx-lm
itself by building the model without weights, as `sharded_load` does: unlike the rest of the
store this imports MLX, and only for a `--hosts` pull, where a wrong guess costs a whole model.

A pull of part of a model leaves `MARKER_FILE` in the model directory, naming the ranks and the
weight files they need; the inventory and `verify` read it to judge the directory by those
files (a shard is not a broken model, nor one a single process can serve).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mlxlaunch.errors import ConfigError
from mlxlaunch.store.errors import BadShardSpec
from mlxlaunch.store.facts import mlx_lm_model_module

Mode = Literal["tensor", "pipeline"]

# sharded_load's own test for "this weight belongs to layer N" (sanitize can rename the rest).
LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")
WEIGHT_SUFFIX = ".safetensors"
INDEX_FILE = "model.safetensors.index.json"
MARKER_FILE = ".mlxlaunch-shard.json"


@dataclass(frozen=True)
class ShardSpec:
    """The pipeline ranks one host holds, of `size` ranks in all."""

    ranks: tuple[int, ...]
    size: int

    @property
    def label(self) -> str:
        """`1/2`, or `0,1/3` for a host holding several ranks (what `--shard` takes)."""
        return ",".join(str(r) for r in self.ranks) + f"/{self.size}"

    @property
    def whole(self) -> bool:
        """The ranks are all of them: the whole model."""
        return set(self.ranks) == set(range(self.size))


def parse_shard(text: str) -> ShardSpec:
    """`R/N` or `R1,R2/N` → the spec.

    Raises:
        ConfigError: not of that form, N < 1, or a rank outside 0…N-1.
    """
    ranks_text, slash, size_text = text.partition("/")
    try:
        size = int(size_text)
        ranks = tuple(sorted({int(r) for r in ranks_text.split(",")}))
    except ValueError:
        ranks, size = (), 0
    if not slash or size < 1 or not ranks:
        raise BadShardSpec(text)
    if any(not 0 <= r < size for r in ranks):
        raise BadShardSpec(text, size)
    return ShardSpec(ranks, size)


# ---- the layer split -------------------------------------------------------------------------


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def layer_count(config: dict[str, Any]) -> int:
    """Decoder layers of the language model (`len(model.model.layers)` in mlx-lm).

    Raises:
        ConfigError: config.json gives no layer count.
    """
    text = _text_config(config)
    if isinstance(types := text.get("layer_types"), list) and "num_hidden_layers" not in text:
        return len(types)
    count = text.get("num_hidden_layers", config.get("num_hidden_layers"))
    if not isinstance(count, int) or count < 1:
        raise ConfigError("config.json has no num_hidden_layers: cannot split it into a pipeline")
    return count


def _even_split(layers: int, size: int) -> list[int]:
    # PipelineMixin.pipeline: an even split, the low ranks get the extra layers.
    base, extra = divmod(layers, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


def _grouped_split(layers: int, size: int, group: int) -> list[int]:
    # bailing_hybrid: whole layer groups per rank (each needs an MLA layer), the tail on rank 0.
    n_groups, tail = divmod(layers, group)
    base, extra = divmod(n_groups, size)
    split = [(base + (1 if r < extra else 0)) * group for r in range(size)]
    split[0] += tail
    return split


def _front_split(layers: int, size: int) -> list[int]:
    # kimi_k3's own pipeline(): segments counted from the first layer get the extra layers, and
    # segment s is rank size-1-s.
    base, extra = divmod(layers, size)
    return [base + (1 if size - r - 1 < extra else 0) for r in range(size)]


def pipeline_split(config: dict[str, Any], size: int) -> list[int]:
    """Layers per rank (rank order) as the architecture's `pipeline()` splits them.

    Rank r runs the layers after those of ranks r+1 … size-1: rank 0 holds the last layers.

    Raises:
        ConfigError: the model has fewer layers (or layer groups) than ranks.
    """
    if size < 1:
        raise ConfigError(f"a pipeline needs at least one rank, not {size}")
    layers = layer_count(config)
    module = mlx_lm_model_module(config)
    if module == "bailing_hybrid":
        text = _text_config(config)
        group = text.get("layer_group_size", config.get("layer_group_size"))
        if not isinstance(group, int) or group < 1:
            raise ConfigError("config.json has no layer_group_size (bailing_hybrid)")
        split = _grouped_split(layers, size, group)
    elif module == "kimi_k3":
        split = _front_split(layers, size)
    else:
        split = _even_split(layers, size)
    if any(s <= 0 for s in split):
        raise ConfigError(
            f"{layers} layers cannot be split over {size} pipeline ranks (split {split})",
            hint="use fewer hosts",
        )
    return split


def layer_range(config: dict[str, Any], rank: int, size: int) -> tuple[int, int]:
    """[start, end) of the layers pipeline rank `rank` of `size` runs."""
    if not 0 <= rank < size:
        raise ConfigError(f"rank {rank} is not one of 0…{size - 1}")
    split = pipeline_split(config, size)
    start = sum(split[rank + 1 :])
    return start, start + split[rank]


def rank_files(
    config: dict[str, Any], weight_map: dict[str, str], rank: int, size: int
) -> set[str]:
    """The weight files pipeline rank `rank` of `size` loads, from the index's weight map.

    Raises:
        ConfigError: the index has no weights for some layer (mlx-lm refuses to pipeline it).
    """
    start, end = layer_range(config, rank, size)
    files: set[str] = set()
    seen: set[int] = set()
    for key, file in weight_map.items():
        match = LAYER_KEY.search(key)
        if match is None:
            files.add(file)  # every stage keeps the embeddings, the final norm and the head
            continue
        layer = int(match.group(1))
        seen.add(layer)
        if start <= layer < end:
            files.add(file)
    if missing := sorted(set(range(layer_count(config))) - seen):
        raise ConfigError(
            f"the checkpoint has no weights for layers {missing}: mlx-lm cannot pipeline it",
            hint="convert the model with mlx_lm.convert first, or pull it whole",
        )
    return files


def files_for_ranks(
    config: dict[str, Any],
    weight_map: dict[str, str],
    repo_files: Iterable[str],
    spec: ShardSpec,
) -> set[str]:
    """The files of `repo_files` (what a pull fetches) the ranks of `spec` need: every file
    that is not weights, and the weight files of their layers. Without an index there is one
    way to have the weights: all of them."""
    names = set(repo_files)
    weights = {n for n in names if n.endswith(WEIGHT_SUFFIX)}
    if not weight_map:
        return names
    needed: set[str] = set()
    for rank in spec.ranks:
        needed |= rank_files(config, weight_map, rank, spec.size)
    return (names - weights) | (weights & needed)


def files_for_rank(
    config: dict[str, Any],
    weight_map: dict[str, str],
    repo_files: Iterable[str],
    rank: int,
    size: int,
) -> set[str]:
    """`files_for_ranks` for one rank."""
    return files_for_ranks(config, weight_map, repo_files, ShardSpec((rank,), size))


# ---- the marker of a shard pull --------------------------------------------------------------


@dataclass(frozen=True)
class ShardMarker:
    """What a shard pull left in a model directory: its ranks and the weight files they need."""

    spec: ShardSpec
    weight_files: tuple[str, ...]

    def merged(self, other: ShardMarker) -> ShardMarker:
        """Both pulls' files; the ranks of both when they split the model the same way."""
        files = tuple(sorted({*self.weight_files, *other.weight_files}))
        if other.spec.size != self.spec.size:
            return ShardMarker(other.spec, files)
        ranks = tuple(sorted({*self.spec.ranks, *other.spec.ranks}))
        return ShardMarker(ShardSpec(ranks, self.spec.size), files)


def read_marker(path: Path) -> ShardMarker | None:
    """The shard marker of model directory `path`; None for a whole model (or a bad marker)."""
    try:
        data = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
        spec = ShardSpec(tuple(int(r) for r in data["ranks"]), int(data["size"]))
        files = tuple(str(f) for f in data["weight_files"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return ShardMarker(spec, files)


def write_marker(path: Path, marker: ShardMarker | None) -> None:
    """Record `marker` in `path` (atomically), or remove it when the model is whole (None)."""
    file = path / MARKER_FILE
    if marker is None:
        file.unlink(missing_ok=True)
        return
    data = {
        "ranks": list(marker.spec.ranks),
        "size": marker.spec.size,
        "weight_files": list(marker.weight_files),
    }
    tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, file)
