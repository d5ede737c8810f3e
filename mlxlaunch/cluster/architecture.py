"""Tensor or pipeline parallelism for an architecture, as mlx-lm's `sharded_load` decides.

Asks mlx-lm itself (the model built without weights), so the answer follows the installed
mlx-lm; the store, which must not import mlx-lm, gets the mode from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxlaunch.errors import ConfigError
from mlxlaunch.store.shards import Mode


@dataclass(frozen=True)
class Support:
    """What mlx-lm's `sharded_load` can do with an architecture."""

    tensor: bool  # `hasattr(model, "shard")`
    pipeline: bool  # `hasattr(model.model, "pipeline")`


def architecture_support(config: dict[str, Any]) -> Support | None:
    """mlx-lm's own answer, from the model built without weights (as `sharded_load` builds it:
    arrays stay lazy, nothing is allocated); None when mlx-lm cannot build it."""
    try:
        from mlx_lm.utils import _get_classes

        model_class, args_class = _get_classes(config)
        model = model_class(args_class.from_dict(config))
    except (Exception, SystemExit):  # some model modules exit when an extra is missing
        return None
    inner = getattr(model, "model", None)
    return Support(tensor=hasattr(model, "shard"), pipeline=hasattr(inner, "pipeline"))


def parallel_mode(
    config: dict[str, Any], requested: str = "auto", support: Support | None = None
) -> Mode:
    """Tensor or pipeline, as mlx-lm's rule picks: pipeline when asked for, or when "auto" and
    the architecture has no tensor sharding. An architecture mlx-lm cannot shard either way
    counts as tensor: every rank would need every file.

    Raises:
        ConfigError: an unknown mode, or pipeline asked of an architecture without it.
    """
    if requested not in ("auto", "tensor", "pipeline"):
        raise ConfigError(f"--parallel {requested!r}: one of auto, tensor, pipeline")
    if requested == "tensor":
        return "tensor"
    support = support or architecture_support(config)
    if requested == "pipeline":
        if support is not None and not support.pipeline:
            raise ConfigError(
                f"mlx-lm has no pipeline parallelism for '{config.get('model_type')}'",
                hint="use --parallel tensor (every host then pulls the whole model)",
            )
        return "pipeline"
    if support is not None and not support.tensor and support.pipeline:
        return "pipeline"
    return "tensor"
