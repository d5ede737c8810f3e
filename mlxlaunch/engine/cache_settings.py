"""Prefix-cache settings as users write them (`8G`, `auto`), turned into EngineConfig fields.

Free of MLX imports: the CLI and `launch/` parse these before any model loads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mlxlaunch.store.paths import mlxlaunch_home

DEFAULT_CACHE_DISK = "20G"
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in a size like `8G`, `512M`, `1.5GB`, `0` (binary units).

    Raises:
        ValueError: not a size.
    """
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"expected a size like 8G, 512M or 0, not {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


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
