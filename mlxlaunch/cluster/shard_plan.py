"""The shard plan of a cluster serve: which split mlx-lm allows, and what each rank holds.

`shard_plan(model_dir, size, parallel, probe_shards=…)` takes mlx-lm's own answer from the
caller (`probe_shards`, the engine's runtime: this room reads no mlx-lm) and adds the bytes
each rank holds, read from the safetensors headers; a split that cannot work is a plan with
`parallel=None` and a `refusal` in words.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from mlxlaunch.cluster.hosts import Parallel
from mlxlaunch.store.memory import format_bytes

Mode = Literal["tensor", "pipeline"]
INDEX_FILE = "model.safetensors.index.json"
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # as sharded_load matches checkpoint layers


@dataclass(frozen=True)
class ShardPlan:
    """How `size` ranks split a model, or why they cannot.

    `parallel` is None when refused (`refusal` says why); `rank_bytes[r]` is what rank r holds
    of the weights; `layers[r]` is rank r's [start, end) for pipeline parallelism (as mlx-lm's
    `pipeline()` splits them: rank 0 runs the last layers).
    """

    size: int
    asked: Parallel
    parallel: Mode | None
    model_type: str
    weight_bytes: int
    rank_bytes: tuple[int, ...] = ()
    layers: tuple[tuple[int, int], ...] = ()
    tensor_problem: str | None = None
    pipeline_problem: str | None = None

    @property
    def refusal(self) -> str | None:
        """Why the asked mode cannot work, as a sentence; None when the plan stands."""
        if self.parallel is not None:
            return None
        reasons = {
            "tensor": self.tensor_problem,
            "pipeline": self.pipeline_problem,
        }.get(self.asked) or f"{self.tensor_problem} {self.pipeline_problem}"
        how = "" if self.asked == "auto" else f" with {self.asked} parallelism"
        return f"{self.model_type} cannot be sharded over {self.size} ranks{how}: {reasons}"

    def describe(self) -> str:
        """One line: the mode and what each rank holds."""
        if self.parallel is None:
            return f"refused: {self.refusal}"
        each = ", ".join(format_bytes(b) for b in self.rank_bytes)
        text = f"{self.parallel} parallel over {self.size} ranks ({each} per rank)"
        if self.layers:
            text += "; layers " + ", ".join(
                f"r{r}: {a}-{b - 1}" for r, (a, b) in enumerate(self.layers)
            )
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "asked": self.asked,
            "parallel": self.parallel,
            "model_type": self.model_type,
            "weight_bytes": self.weight_bytes,
            "rank_bytes": list(self.rank_bytes),
            "layers": [list(r) for r in self.layers],
            "tensor_problem": self.tensor_problem,
            "pipeline_problem": self.pipeline_problem,
            "refusal": self.refusal,
        }


class ShardProbe(Protocol):
    """What mlx-lm's own sharding code says about a model on some number of ranks (made by
    the engine's runtime, `mlxlaunch.engine.engine.probe_shards`: only there is mlx-lm read)."""

    @property
    def model_type(self) -> str: ...
    @property
    def tensor_problem(self) -> str | None: ...
    @property
    def tensor_share(self) -> float: ...
    @property
    def has_pipeline(self) -> bool: ...
    @property
    def layer_count(self) -> int: ...
    @property
    def pipeline_error(self) -> str | None: ...
    @property
    def layer_ranges(self) -> tuple[tuple[int, int], ...]: ...


# How the caller asks mlx-lm (model directory, rank count → its answer).
ProbeShards = Callable[[Path, int], ShardProbe]


def _tensor_bytes(model_dir: Path) -> dict[str, tuple[str, int]]:
    """Each checkpoint tensor's file and byte size, from the safetensors headers (no data read)."""
    sizes: dict[str, tuple[str, int]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for name, info in header.items():
            if isinstance(info, dict) and "data_offsets" in info:
                start, end = info["data_offsets"]
                sizes[name] = (path.name, int(end) - int(start))
    return sizes


def _pipeline_problem(
    probe: ShardProbe, model_dir: Path, size: int, weights: int
) -> tuple[str | None, tuple[int, ...], tuple[tuple[int, int], ...]]:
    if not probe.has_pipeline:
        return (
            f"mlx-lm's {probe.model_type} has no pipeline parallelism (no model.pipeline()).",
            (),
            (),
        )
    if not (model_dir / INDEX_FILE).is_file():
        return (
            f"pipeline parallelism picks each rank's weights from {INDEX_FILE}, and "
            f"{model_dir} has none; convert the model with mlx_lm.convert to write one.",
            (),
            (),
        )
    count = probe.layer_count
    if count < size:
        return f"{count} layers cannot be split over {size} ranks.", (), ()
    if probe.pipeline_error is not None:
        return probe.pipeline_error, (), ()
    ranges = probe.layer_ranges
    try:
        tensors = _tensor_bytes(model_dir)
    except (OSError, ValueError, struct.error):
        tensors = {}
    found_layers = {int(m.group(1)) for n in tensors if (m := LAYER.search(n))}
    if tensors and (missing := sorted(set(range(count)) - found_layers)):
        return f"the checkpoint has no weights for layers {missing}.", (), ()
    if not tensors:  # headers unreadable: assume layers of equal size
        return None, tuple(weights * (b - a) // count for a, b in ranges), tuple(ranges)
    rank_bytes = []
    for start, end in ranges:
        held = 0
        for name, (_, nbytes) in tensors.items():
            m = LAYER.search(name)
            if m is None or start <= int(m.group(1)) < end:  # embeddings, norm, head: on all
                held += nbytes
        rank_bytes.append(held)
    return None, tuple(rank_bytes), tuple(ranges)


def shard_plan(
    model_dir: Path, size: int, parallel: Parallel = "auto", *, probe_shards: ProbeShards
) -> ShardPlan:
    """How `size` ranks shard the model in `model_dir`, by mlx-lm's rules (see the module
    docstring; `probe_shards` asks mlx-lm): "auto" takes tensor parallelism where it works,
    else pipeline; an explicit mode that cannot work, or neither, gives a plan with
    `parallel=None` and a `refusal`."""
    weights = sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))
    model_dir = Path(model_dir)
    try:
        probe = probe_shards(model_dir, size)
    except Exception as exc:
        reason = f"mlx-lm cannot build the model in {model_dir}: {exc}"
        return ShardPlan(size, parallel, None, "?", weights, (), (), reason, reason)
    pipe_problem, pipe_bytes, ranges = _pipeline_problem(probe, model_dir, size, weights)
    tensor_problem = probe.tensor_problem
    tensor_bytes = (round(weights * probe.tensor_share),) * size
    plan = ShardPlan(
        size, parallel, None, probe.model_type, weights, (), (), tensor_problem, pipe_problem
    )
    if parallel in ("auto", "tensor") and tensor_problem is None:
        return _with(plan, "tensor", tensor_bytes, ())
    if parallel in ("auto", "pipeline") and pipe_problem is None:
        return _with(plan, "pipeline", pipe_bytes, ranges)
    return plan


def _with(
    plan: ShardPlan, mode: Mode, rank_bytes: tuple[int, ...], layers: tuple[tuple[int, int], ...]
) -> ShardPlan:
    return ShardPlan(
        plan.size, plan.asked, mode, plan.model_type, plan.weight_bytes, rank_bytes, layers,
        plan.tensor_problem, plan.pipeline_problem,
    )  # fmt: skip
