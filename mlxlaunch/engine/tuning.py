"""Scheduler settings given as text (CLI flags, user settings) → EngineConfig arguments.

No MLX imports: the CLI and `mlx launch` call this before anything heavy loads.
"""

from __future__ import annotations

from typing import Any

from mlxlaunch.engine.sweeper import parse_duration
from mlxlaunch.errors import ConfigError


def engine_tuning(
    *,
    max_concurrency: int | None,
    idle_clear: str | None,
    keep_alive: str | None,
    memory_fraction: float | None,
) -> dict[str, Any]:
    """EngineConfig keyword arguments for the scheduling options (unset ones are left out)."""
    tuning: dict[str, Any] = {}
    try:
        if idle_clear is not None:
            tuning["idle_clear_s"] = parse_duration(idle_clear)
        if keep_alive is not None:
            tuning["keep_alive_s"] = parse_duration(keep_alive)
    except ValueError as exc:  # e.g. a bad `keep-alive` in the user's settings
        raise ConfigError(f"keep-alive/idle-clear: {exc}") from exc
    if max_concurrency is not None:
        tuning["max_concurrency"] = max_concurrency
    if memory_fraction is not None:
        tuning["memory_fraction"] = memory_fraction
    return tuning
