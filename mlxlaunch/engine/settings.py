"""Engine settings as users write them (`8G`, `auto`, `30m`, `never`) → EngineConfig arguments.

One place for the text forms of the cache sizes and directory, the scheduling options, the
durations of the idle sweeper, and the context window a model is served with. Free of MLX
imports: the CLI, the user's config file and `launch/` read these before any model loads.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from mlxlaunch.errors import ConfigError
from mlxlaunch.store.facts import context_window
from mlxlaunch.store.paths import mlxlaunch_home

DEFAULT_CACHE_DISK = "20G"
# KV cache quantization (`--kv-bits`, `--kv-group-size`; engine/runtime/quantized_kv.py):
# the bits mx.quantize packs a cached value in, and the group sizes it accepts.
KV_BITS = (8, 4)
KV_GROUP_SIZES = (32, 64, 128)
# The context window served when a model's config names none (rare; old or unusual checkpoints).
FALLBACK_CONTEXT_WINDOW = 4096
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)

_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_FOREVER = {"never", "forever", "always", "inf", "-1", "none"}


def parse_size(text: str) -> int:
    """Bytes in a size like `8G`, `512M`, `1.5GB`, `0` (binary units).

    Raises:
        ValueError: not a size.
    """
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"expected a size like 8G, 512M or 0, not {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


def parse_duration(text: str | None) -> float | None:
    """Seconds for a duration like `30m`, `90s`, `1.5h`, `2d` or `45`; None for "never".

    `never` (also `forever`, `-1`, or no value) means keep loaded; `0` means unload as soon as
    the engine is idle. Raises ValueError for anything else.
    """
    if text is None or text.strip().lower() in _FOREVER:
        return None
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(
            f"not a duration: {text!r} (use e.g. 30s, 30m, 2h, 0 for at once, never to keep)"
        )
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    if not math.isfinite(seconds):
        raise ValueError(f"not a duration: {text!r}")
    return seconds


def context_window_of(model_config: dict[str, Any], override: int | None = None) -> int:
    """The context window the engine serves: `override` (`--context-length`) if given, else what
    the model's config.json states (the store's one rule), else FALLBACK_CONTEXT_WINDOW."""
    if override is not None:
        return override
    stated = context_window(model_config)
    return FALLBACK_CONTEXT_WINDOW if stated is None else stated


def default_cache_dir() -> Path:
    """Where reused prefixes are saved by default: `<mlxlaunch home>/prefix-cache`."""
    return mlxlaunch_home() / "prefix-cache"


def cache_config(cache_memory: str, cache_dir: Path | None, cache_disk: str) -> dict[str, Any]:
    """EngineConfig keyword arguments for the cache options (`auto` memory: the default).

    Raises:
        ValueError: a size that does not parse.
    """
    memory = None if cache_memory.strip().lower() == "auto" else parse_size(cache_memory)
    return {
        "cache_memory_bytes": memory,
        "cache_dir": cache_dir.expanduser() if cache_dir is not None else default_cache_dir(),
        "cache_disk_bytes": parse_size(cache_disk),
    }


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
